"""Crash-state harness for the WAL and snapshot code (issue 17).

1. **Record.** A scenario drives ``consensus.storage.wal`` and ``consensus.storage.snapshot`` the way
   ``consensus/runtime/node.py`` does (append, group commit, rotation, snapshot then
   compaction, a peer snapshot install, a process crash and restart) on a real
   directory, with the ``os`` module of both modules replaced by a recording proxy:
   every ``mkdir``, ``open(O_CREAT)``, ``write``, ``ftruncate``, ``fsync``/
   ``fdatasync`` (of a file or a directory), ``rename``/``replace`` and ``unlink`` is
   logged, together with the scenario's own events: how many items it has handed to
   storage, and how many are acknowledged (a sync covering them has returned).
2. **Generate.** For every prefix of the log (a crash after each operation) a model
   file system computes the states a crash may leave. Durable = what an fsync
   covered (a file's data by its fsync, a directory's entries by the directory's
   fsync). Not durable, and so free to be lost:
   - directory changes not yet covered by their directory's fsync: any subset of
     them (all subsets up to 5 pending changes, else every prefix, every "all but
     one" and every single change);
   - file writes not yet covered by the file's fsync: every prefix of the writes
     (whole writes in order), and on top of each prefix (``--full``; the last prefix
     only by default) every single 4 KiB page *dropped* (its old contents, zeros past
     the old size: a later page kept, an earlier lost), *torn* (its first 2 KiB new,
     the rest old) and every *zero-filled tail* (all pages from one on old/zero).
   A state is tagged ``ext4`` when ext4 (data=ordered) can also produce it: the
   directory changes are a prefix of the pending ones in operation order and include
   every change made before the last fsync of anything (a journal commit), and each
   file is a whole-write prefix. (An approximation of ext4, documented in
   docs/storage.md.) The state with everything applied is the *process crash* (the
   page cache survives).
3. **Check.** Each distinct state is written to a scratch directory and recovered
   as the node would (``WAL.open`` + ``load_latest``, replaying records by item
   index on top of the snapshot). It must start (no exception), every acknowledged
   item must come back, nothing never handed to storage may come back, every item
   that comes back must hold the value written, and the recovered store must take
   one more append, sync and reopen.

Run ``python3 -m tests.storage.crash_states`` (the default suite's short version) or
``python3 -m tests.storage.crash_states --full`` (every page variant on every write
prefix, pairs of lost directory changes, and a process crash injected before every
operation of every scenario, the restarted process's crash states included);
``--scenario NAME`` runs one. It prints, per scenario: runs (1 + injected process
crashes), recorded operations, crash states enumerated, distinct states checked,
ext4-tagged and process-crash states among them, and failures (exit status 1 if any).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import consensus.storage.snapshot as snapmod
import consensus.storage.wal as walmod
from consensus.storage.snapshot import Snapshot, keep_only, load_latest, write_snapshot
from consensus.storage.wal import WAL, makedirs_durable

PAGE = 4096
SECTOR_SPLIT = PAGE // 2
_real_os = os


class ProcessCrash(Exception):
    """Injected: the process dies before this operation."""


# --- recording ----------------------------------------------------------------------


@dataclass
class Recorder:
    root: str
    ops: list[tuple] = field(default_factory=list)
    crash_at: int | None = None  # raise ProcessCrash before the operation with this index
    _fds: dict[int, str] = field(default_factory=dict)

    def rel(self, path: str | os.PathLike[str]) -> str:
        return os.path.relpath(os.path.abspath(os.fspath(path)), self.root)

    def event(self, *op) -> None:
        self.ops.append(op)

    def op(self, *op) -> None:
        if self.crash_at is not None and len(self.ops) >= self.crash_at:
            self.crash_at = None
            raise ProcessCrash(f"injected before {op[0]} {op[1] if len(op) > 1 else ''}")
        self.ops.append(op)


class RecordingOS:
    """Stands in for the ``os`` module inside consensus.storage.wal and consensus.storage.snapshot."""

    def __init__(self, rec: Recorder) -> None:
        self._rec = rec

    def __getattr__(self, name):
        return getattr(_real_os, name)

    def open(self, path, flags, mode=0o777, *, dir_fd=None):
        rec = self._rec
        creating = bool(flags & _real_os.O_CREAT) and not _real_os.path.exists(path)
        if creating:
            rec.op("create", rec.rel(path))
        fd = _real_os.open(path, flags, mode)
        rec._fds[fd] = rec.rel(path)
        return fd

    def close(self, fd):
        self._rec._fds.pop(fd, None)
        return _real_os.close(fd)

    def write(self, fd, data):
        rec = self._rec
        data = bytes(data)
        if rec._fds.get(fd, "").endswith("LOCK"):
            return _real_os.write(fd, data)
        offset = _real_os.lseek(fd, 0, _real_os.SEEK_CUR)
        rec.op("write", rec._fds[fd], offset, data)
        return _real_os.write(fd, data)

    def ftruncate(self, fd, size):
        self._rec.op("truncate", self._rec._fds[fd], size)
        return _real_os.ftruncate(fd, size)

    def fsync(self, fd):
        rec = self._rec
        path = rec._fds[fd]
        rec.op("fsync_dir" if _real_os.path.isdir(os.path.join(rec.root, path)) else "fsync", path)
        return _real_os.fsync(fd)

    def fdatasync(self, fd):
        self._rec.op("fsync", self._rec._fds[fd])
        return _real_os.fdatasync(fd)

    def replace(self, src, dst):
        self._rec.op("rename", self._rec.rel(src), self._rec.rel(dst))
        return _real_os.replace(src, dst)

    rename = replace

    def unlink(self, path):
        self._rec.op("unlink", self._rec.rel(path))
        return _real_os.unlink(path)

    def mkdir(self, path, mode=0o777):
        self._rec.op("mkdir", self._rec.rel(path))
        return _real_os.mkdir(path, mode)

    def makedirs(self, path, mode=0o777, exist_ok=False):
        path = _real_os.path.abspath(path)
        parent = _real_os.path.dirname(path)
        if parent != path and not _real_os.path.isdir(parent):
            self.makedirs(parent, mode, exist_ok=True)
        if _real_os.path.isdir(path):
            if not exist_ok:
                raise FileExistsError(path)
            return
        self.mkdir(path, mode)


@contextmanager
def recording(rec: Recorder) -> Iterator[None]:
    proxy = RecordingOS(rec)
    saved = (walmod.os, snapmod.os, walmod._fdatasync)
    walmod.os, snapmod.os, walmod._fdatasync = proxy, proxy, proxy.fdatasync
    try:
        yield
    finally:
        walmod.os, snapmod.os, walmod._fdatasync = saved


# --- the store under test, driven like node.py drives it --------------------------------


@functools.lru_cache(maxsize=None)
def item(i: int) -> bytes:
    """Item i (1-based): the same value in every run, 40..400 bytes (cached: every
    recovered state compares each item it brings back with this)."""
    n = 40 + (i * 131) % 360
    return (hashlib.sha256(str(i).encode()).digest() * (n // 32 + 1))[:n]


def record(i: int) -> bytes:
    return struct.pack(">I", i) + item(i)


def body_of(n: int) -> bytes:
    return json.dumps([item(i).hex() for i in range(1, n + 1)]).encode()


def live_of(first: int, last: int) -> bytes:
    """A snapshot's live records: the records of items ``first..last``."""
    return json.dumps([record(i).hex() for i in range(first, last + 1)]).encode()


def open_store(data: str, mode: str, seg: int, write_buffer_bytes_max: int = walmod.WRITE_BUFFER_BYTES_MAX_DEFAULT
               ) -> tuple[WAL, Snapshot | None, Iterator[bytes]]:
    """Recover as ``Node.open`` does: the latest snapshot, then (if it carries live
    records) those records and the WAL records after its seq, else the whole WAL; a
    WAL that ends below such a snapshot's seq goes on after it (``restart_at``).
    Returns the WAL, the snapshot and the record payloads to replay, in order."""
    makedirs_durable(data)
    wal, records = WAL.open(os.path.join(data, "wal"), fsync=mode, segment_bytes_max=seg, stream=True,
                            write_buffer_bytes_max=write_buffer_bytes_max)
    try:  # a crash injected below ends this process: its WAL (and lock) with it
        snapdir = os.path.join(data, "snapshots")
        makedirs_durable(snapdir)
        snap = load_latest(snapdir)
        after = snap.seq if snap is not None and snap.live else 0
        payloads = [payload for seq, payload in records if seq > after]
        if after and wal.last_seq < after:
            keep_only(snapdir, snap)
            wal.restart_at(after + 1)
    except BaseException:
        wal.abandon()
        raise
    live = [bytes.fromhex(h) for h in json.loads(snap.live)] if after else []
    return wal, snap, itertools.chain(live, payloads)


class Store:
    """The node's storage calls (consensus/runtime/node.py: open, _carry_out,
    _fork_snapshot + _save_forked_snapshot, _store_installed) over a logical log of
    items: a WAL record carries an item index and its value, a snapshot the items
    up to its slot (the executed ones) and, as its live records, the records of the
    items handed after them up to its seq (accepted, not executed)."""

    def __init__(self, root: str, rec: Recorder, fsync: str, segment_bytes_max: int,
                 write_buffer_bytes_max: int = walmod.WRITE_BUFFER_BYTES_MAX_DEFAULT) -> None:
        self.root, self.rec, self.fsync, self.segment_bytes_max = root, rec, fsync, segment_bytes_max
        self.write_buffer_bytes_max = write_buffer_bytes_max
        self.seq_items: list[tuple[int, int]] = []  # (wal seq, items handed) after each put
        self.data = os.path.join(root, "data")
        self.snapdir = os.path.join(self.data, "snapshots")
        self.snap_seqs: list[int | None] = []  # Node._snap_seqs
        self.wal: WAL | None = None

    def open(self) -> None:
        self.wal, snap, payloads = open_store(self.data, self.fsync, self.segment_bytes_max,
                                              self.write_buffer_bytes_max)
        self.n = snap.slot if snap is not None else 0
        for payload in payloads:
            i = struct.unpack_from(">I", payload)[0]
            if i == self.n + 1:
                self.n = i
        self.snap_seqs = [snap.seq if snap.live else None] if snap is not None else []

    def put(self, k: int) -> None:
        first = self.n + 1
        self.n += k
        self.rec.event("handed", self.n)
        self.wal.append_many([record(i) for i in range(first, self.n + 1)])
        self.seq_items.append((self.wal.last_seq, self.n))

    def sync(self) -> None:
        self.wal.sync()
        self._ack()

    def _ack(self) -> None:
        durable = self.wal.durable_seq
        acked = max([n for seq, n in self.seq_items if seq <= durable], default=0)
        if acked:
            self.rec.event("ack", acked)

    def sync_overlapped(self, k: int) -> None:
        """GroupCommitter's split: the fsync runs while ``k`` more items are appended
        (and, with a small write buffer, written; maybe rotating the segment)."""
        ticket = self.wal.prepare_sync()
        self.put(k)
        if ticket is not None:
            self.wal.perform_sync(ticket)
            self.wal.complete_sync(ticket)
        self._ack()

    def snapshot(self, keep: int = 2, during: int = 0, lag: int = 3, durable_first: bool = True) -> None:
        """Our own snapshot, as the forked child and _save_forked_snapshot make it:
        at seq = the last appended record, the items executed so far (all but the
        last ``lag``) and the live records of the others; ``during`` more items are
        appended (and synced) while the child works; stored once seq is durable
        (``durable_first=False``: at once, so a crash may leave a WAL that ends
        below seq, which ``restart_at`` handles); then the WAL segments that only
        the older retained snapshot needed go."""
        makedirs_durable(self.snapdir)
        seq, executed = self.wal.last_seq, max(0, self.n - lag)
        snap = Snapshot(seq, json.dumps({"slot": executed}).encode(), body_of(executed), slot=executed,
                        live=live_of(executed + 1, self.n))
        tmp = os.path.join(self.snapdir, f"snap-fork-{seq}.snap.tmp")
        snapmod.write_file_synced(tmp, snapmod.encode_snapshot(snap))  # the child
        if during:
            self.put(during)
            self.sync()
        if durable_first and self.wal.durable_seq < seq:
            self.sync()
        snapmod.place_snapshot(self.snapdir, tmp, snap, keep=keep)
        self._compact(snap.seq, installed=False)

    def install(self, upto: int) -> None:
        """A peer's snapshot at item ``upto`` (ahead of us), as _store_installed does:
        our live records at our last seq (here the last item's) go in the file."""
        self.rec.event("handed", upto)
        snap = Snapshot(self.wal.last_seq, json.dumps({"slot": upto}).encode(), body_of(upto), slot=upto,
                        live=live_of(upto, upto))
        write_snapshot(self.snapdir, snap, keep=1)
        self.n = upto
        self._compact(snap.seq, installed=True)
        self.rec.event("ack", self.n)

    def _compact(self, seq: int, installed: bool) -> None:
        if installed:
            self.snap_seqs.clear()
        self.snap_seqs.append(seq)
        if len(self.snap_seqs) > 2:
            del self.snap_seqs[0]
        if len(self.snap_seqs) == 2 and self.snap_seqs[0] is not None:
            self.wal.compact(self.snap_seqs[0])

    def crash(self, write_buffer: bool = False) -> None:
        """The process dies (its page cache survives) and restarts."""
        self.wal.abandon(write_buffer=write_buffer)
        self.open()

    def close(self) -> None:
        self.wal.close()


# --- scenarios ----------------------------------------------------------------------------

Scenario = Callable[[Store], None]


def sc_append_sync(s: Store) -> None:
    for k in (3, 1, 12, 5, 30, 2, 9, 60, 25):
        s.put(k)
        s.sync()
    s.put(4)  # never synced


def sc_overlapped(s: Store) -> None:
    for k in (5, 17, 3, 30, 9, 26, 12):
        s.put(k)
        s.sync_overlapped(k + 4)
    s.sync()


def sc_rotation(s: Store) -> None:
    for k in (6, 20, 3, 34, 8, 21, 15, 40, 5):
        s.put(k)
        s.sync()


def sc_snapshot_compact(s: Store) -> None:
    for r in range(3):
        s.put(15)
        s.sync()
        s.put(4)
        s.snapshot(durable_first=False)
    s.put(5)
    s.sync()


def sc_compact_many(s: Store) -> None:
    """Each compaction deletes several segments at once."""
    for r in range(3):
        for k in (9, 14, 11):
            s.put(k)
            s.sync()
        s.snapshot()
    s.put(6)
    s.sync()


def sc_snapshot_overlap(s: Store) -> None:
    """Items appended while the child makes the snapshot (after its seq, before it
    is stored); each compaction drops the segments below the older one's seq."""
    for r in range(4):
        s.put(13)
        s.sync()
        s.put(3)
        s.snapshot(during=7)
    s.put(4)
    s.sync()


def sc_install(s: Store) -> None:
    s.put(10)
    s.sync()
    s.snapshot()
    s.put(6)
    s.sync()
    s.install(s.n + 40)
    s.put(8)
    s.sync()
    s.snapshot()
    s.put(3)
    s.sync()


def sc_restart(s: Store) -> None:
    s.put(14)
    s.sync()
    s.put(9)
    s.sync()
    s.crash(write_buffer=True)
    s.put(12)
    s.sync()
    s.put(7)
    s.sync()


SCENARIOS: dict[str, tuple[Scenario, str, int]] = {
    # name: (driver, fsync mode, segment_bytes_max); "+small-writes": a 1,500-byte
    # write buffer, so a batch reaches the file in several writes
    "append-sync": (sc_append_sync, "batch", 64 << 10),
    "append-sync+small-writes": (sc_append_sync, "batch", 64 << 10),
    "overlapped-fsync+small-writes": (sc_overlapped, "batch", 12 << 10),
    "always-rotation": (sc_rotation, "always", 12 << 10),
    "batch-rotation": (sc_rotation, "batch", 12 << 10),
    "snapshot-compact": (sc_snapshot_compact, "batch", 6 << 10),
    "compact-many-segments": (sc_compact_many, "batch", 2 << 10),
    "snapshot-overlap": (sc_snapshot_overlap, "batch", 3 << 10),
    "peer-install": (sc_install, "batch", 6 << 10),
    "restart": (sc_restart, "batch", 6 << 10),
    "never-process-crash": (sc_rotation, "never", 12 << 10),
}


def run_scenario(name: str, workdir: str, crash_at: int | None = None) -> list[tuple]:
    driver, mode, seg = SCENARIOS[name]
    root = os.path.join(workdir, "live")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    rec = Recorder(root, crash_at=crash_at)
    with recording(rec):
        s = Store(root, rec, mode, seg, 1500 if name.endswith("+small-writes") else walmod.WRITE_BUFFER_BYTES_MAX_DEFAULT)
        try:
            s.open()
            driver(s)
        except ProcessCrash:
            # The process died mid-operation; a new one starts on what it left and
            # does a little more work (acknowledged records on top of a recovery).
            if s.wal is not None:
                s.wal.abandon()
            s.open()
            s.put(5)
            s.sync()
        s.wal.abandon()
    return rec.ops


# --- the model ------------------------------------------------------------------------------


@dataclass
class FileModel:
    durable: bytes = b""
    pending: list[tuple] = field(default_factory=list)  # ("write", off, data) | ("truncate", size)


def _apply(content: bytearray, op: tuple) -> None:
    if op[0] == "write":
        _k, off, data = op
        if len(content) < off:
            content.extend(bytes(off - len(content)))
        content[off : off + len(data)] = data
    else:
        del content[op[1]:]
        if len(content) < op[1]:
            content.extend(bytes(op[1] - len(content)))


@dataclass
class Model:
    """Durable namespace + pending directory changes + per-inode data."""

    durable_ns: dict[str, object] = field(default_factory=lambda: {".": "dir"})  # path -> ino | "dir"
    current_ns: dict[str, object] = field(default_factory=lambda: {".": "dir"})
    pending_meta: list[tuple] = field(default_factory=list)  # (op index, parent dir, op)
    files: dict[int, FileModel] = field(default_factory=dict)
    last_sync_index: int = -1
    acked: int = 0
    handed: int = 0
    _next_ino: int = 0

    def step(self, index: int, op: tuple) -> None:
        kind = op[0]
        if kind == "ack":
            self.acked = max(self.acked, op[1])
        elif kind == "handed":
            self.handed = max(self.handed, op[1])
        elif kind == "mkdir":
            self.current_ns[op[1]] = "dir"
            self.pending_meta.append((index, os.path.dirname(op[1]) or ".", ("mkdir", op[1])))
        elif kind == "create":
            self._next_ino += 1
            ino = self._next_ino
            self.files[ino] = FileModel()
            self.current_ns[op[1]] = ino
            self.pending_meta.append((index, os.path.dirname(op[1]) or ".", ("link", op[1], ino)))
        elif kind in ("write", "truncate"):
            ino = self.current_ns[op[1]]
            self.files[ino].pending.append(("write", op[2], op[3]) if kind == "write" else ("truncate", op[2]))
        elif kind == "fsync":
            f = self.files[self.current_ns[op[1]]]
            content = bytearray(f.durable)
            for p in f.pending:
                _apply(content, p)
            f.durable, f.pending = bytes(content), []
            self.last_sync_index = index
        elif kind == "fsync_dir":
            d = op[1]
            keep = []
            for entry in self.pending_meta:
                if entry[1] == d:
                    _apply_meta(self.durable_ns, entry[2])
                else:
                    keep.append(entry)
            self.pending_meta = keep
            self.last_sync_index = index
        elif kind == "rename":
            ino = self.current_ns.pop(op[1])
            self.current_ns[op[2]] = ino
            self.pending_meta.append((index, os.path.dirname(op[1]) or ".", ("rename", op[1], op[2], ino)))
        elif kind == "unlink":
            ino = self.current_ns.pop(op[1])
            self.pending_meta.append((index, os.path.dirname(op[1]) or ".", ("unlink", op[1], ino)))
        else:
            raise AssertionError(f"unknown op {kind}")


def _apply_meta(ns: dict[str, object], m: tuple) -> None:
    if m[0] == "mkdir":
        ns[m[1]] = "dir"
    elif m[0] == "link":
        ns[m[1]] = m[2]
    elif m[0] == "rename":
        if ns.get(m[1]) == m[3]:
            del ns[m[1]]
        ns[m[2]] = m[3]
    elif m[0] == "unlink":
        if ns.get(m[1]) == m[2]:
            del ns[m[1]]


def _reachable(ns: dict[str, object]) -> dict[str, object]:
    """Entries whose every ancestor directory exists (a lost mkdir loses its subtree)."""
    out = {}
    for path, v in ns.items():
        parent = os.path.dirname(path) or "."
        ok = True
        while parent != ".":
            if ns.get(parent) != "dir":
                ok = False
                break
            parent = os.path.dirname(parent) or "."
        if ok:
            out[path] = v
    return out


def meta_subsets(n: int, full: bool) -> Iterator[tuple[int, ...]]:
    if n <= 5:
        for mask in range(1 << n):
            yield tuple(i for i in range(n) if mask >> i & 1)
        return
    seen = set()
    cands = [tuple(range(k)) for k in range(n + 1)]
    cands += [tuple(i for i in range(n) if i != j) for j in range(n)]
    cands += [(j,) for j in range(n)]
    if full:
        cands += [tuple(i for i in range(n) if i not in (a, b)) for a, b in itertools.combinations(range(n), 2)]
    for c in cands:
        if c not in seen:
            seen.add(c)
            yield c


def data_variants(f: FileModel, full: bool) -> list[tuple[bytes, bool]]:
    """(contents, ext4-feasible) for a file with pending writes."""
    states = [f.durable]
    cur = bytearray(f.durable)
    for p in f.pending:
        _apply(cur, p)
        states.append(bytes(cur))
    out: dict[bytes, bool] = {}
    for s in states:
        out[s] = True
    base = f.durable
    for j in (range(1, len(states)) if full else [len(states) - 1]):
        new = states[j]
        old = (base + bytes(max(0, len(new) - len(base))))[: len(new)]
        npages = (len(new) + PAGE - 1) // PAGE
        for p in range(npages):
            a, b = p * PAGE, min(len(new), (p + 1) * PAGE)
            if new[a:b] == old[a:b]:
                continue
            for v in (new[:a] + old[a:b] + new[b:],  # page dropped
                      new[: a + SECTOR_SPLIT] + old[a + SECTOR_SPLIT : b] + new[b:],  # page torn
                      new[:a] + old[a:]):  # zero-filled / old tail from this page on
                out.setdefault(v, False)
    return list(out.items())


@dataclass
class CrashState:
    files: dict[str, bytes]
    dirs: list[str]
    acked: int
    handed: int
    ext4: bool
    process: bool
    where: str

    def key(self) -> bytes:
        h = hashlib.sha256()
        for d in sorted(self.dirs):
            h.update(b"D" + d.encode() + b"\0")
        for p in sorted(self.files):
            h.update(b"F" + p.encode() + b"\0" + hashlib.sha256(self.files[p]).digest())
        h.update(struct.pack(">QQ", self.acked, self.handed))
        return h.digest()


def crash_states(ops: list[tuple], full: bool, power_loss: bool = True,
                 points: Callable[[int], bool] | None = None) -> Iterator[CrashState]:
    model = Model()
    for index, op in enumerate(ops):
        model.step(index, op)
        if op[0] == "handed":
            continue
        if index + 1 < len(ops) and ops[index + 1][0] == "ack":
            continue  # the same files, checked right after with the stronger ack count
        if points is not None and not points(index):
            continue
        yield from _states_at(model, index, full, power_loss, f"after op {index} {op[0]} {op[1]}")


def _states_at(model: Model, index: int, full: bool, power_loss: bool, where: str) -> Iterator[CrashState]:
    pend = model.pending_meta
    subsets = list(meta_subsets(len(pend), full)) if power_loss else [tuple(range(len(pend)))]
    for subset in subsets:
        ns = dict(model.durable_ns)
        for i in subset:
            _apply_meta(ns, pend[i][2])
        ns = _reachable(ns)
        chosen = set(subset)
        is_prefix = subset == tuple(range(len(subset)))
        covers_synced = all(i in chosen for i, e in enumerate(pend) if e[0] < model.last_sync_index)
        meta_ext4 = is_prefix and covers_synced
        process_meta = len(subset) == len(pend)
        dirs = [p for p, v in ns.items() if v == "dir" and p != "."]
        present = {p: v for p, v in ns.items() if v != "dir"}

        def latest(ino: int) -> bytes:
            c = bytearray(model.files[ino].durable)
            for p in model.files[ino].pending:
                _apply(c, p)
            return bytes(c)

        base = {p: latest(ino) for p, ino in present.items()}
        yield CrashState(dict(base), dirs, model.acked, model.handed, meta_ext4, process_meta, where)
        if not power_loss:
            continue
        varying = [p for p, ino in present.items() if model.files[ino].pending]
        if varying:  # everything unsynced lost at once
            lost = dict(base)
            for p in varying:
                lost[p] = model.files[present[p]].durable
            yield CrashState(lost, dirs, model.acked, model.handed, meta_ext4, False, where)
        for p in varying:
            for content, ext4 in data_variants(model.files[present[p]], full):
                files = dict(base)
                files[p] = content
                yield CrashState(files, dirs, model.acked, model.handed, meta_ext4 and ext4, False, where)


# --- checking ---------------------------------------------------------------------------------


def materialize(state: CrashState, root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    for d in sorted(state.dirs, key=len):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for p, content in state.files.items():
        with open(os.path.join(root, p), "wb") as f:
            f.write(content)


def check_state(state: CrashState, root: str, mode: str, seg: int) -> str | None:
    """None if the state recovers correctly, else what went wrong."""
    materialize(state, root)
    data = os.path.join(root, "data")
    try:
        wal, snap, payloads = open_store(data, mode, seg)
    except Exception as e:  # noqa: BLE001 - any refusal is a finding
        return f"refused to start: {e}"
    try:
        items: list[bytes] = []
        if snap is not None:
            items = [bytes.fromhex(h) for h in json.loads(snap.body)]
            if len(items) != snap.slot:
                return f"snapshot at slot {snap.slot} holds {len(items)} items"
        for k, payload in enumerate(payloads):
            i = struct.unpack_from(">I", payload)[0]
            value = payload[4:]
            if i <= len(items):
                if items[i - 1] != value:
                    return f"replayed record {k} restates item {i} with another value"
            elif i == len(items) + 1:
                items.append(value)
            else:
                return f"gap: replayed record {k} carries item {i} but only {len(items)} items precede it"
        n = len(items)
        if any(items[k] != item(k + 1) for k in range(n)):
            return "an item came back with a value never written"
        if n > state.handed:
            return f"{n} items came back, only {state.handed} were ever handed to storage"
        if n < state.acked:
            return f"lost acknowledged items: {n} came back, {state.acked} were acknowledged"
        # It must keep working: one more durable append survives a clean reopen.
        wal.append(record(n + 1))
        wal.sync()
        wal.close()
        wal, _snap, again = open_store(data, mode, seg)
        if record(n + 1) not in list(again):
            return "an append after recovery did not survive a reopen"
    except Exception as e:  # noqa: BLE001
        return f"recovery raised {type(e).__name__}: {e}"
    finally:
        wal.abandon()
    return None


@dataclass
class Figures:
    scenario: str
    runs: int = 0
    ops: int = 0
    enumerated: int = 0
    distinct: int = 0
    ext4: int = 0
    process: int = 0
    failures: list[str] = field(default_factory=list)


def explore(name: str, full: bool, workdir: str, budget: int | None = None, seed: int = 17,
            crash_ats: list[int] | None = None) -> Figures:
    _driver, mode, seg = SCENARIOS[name]
    fig = Figures(name)
    power_loss = mode != "never"
    runs: list[int | None] = [None] + list(crash_ats or [])
    seen: set[bytes] = set()
    rng = random.Random(seed)
    scratch = os.path.join(workdir, "state")
    for crash_at in runs:
        ops = run_scenario(name, workdir, crash_at)
        fig.runs += 1
        fig.ops += sum(1 for o in ops if o[0] not in ("ack", "handed"))
        candidates: list[CrashState] = []
        for st in crash_states(ops, full, power_loss):
            fig.enumerated += 1
            k = st.key()
            if k in seen:
                continue
            seen.add(k)
            fig.ext4 += st.ext4
            fig.process += st.process
            candidates.append(st)
        if budget is not None and len(candidates) > budget:
            # Keep every ext4 and process-crash state, sample the rest.
            must = [c for c in candidates if c.ext4 or c.process]
            rest = [c for c in candidates if not (c.ext4 or c.process)]
            candidates = must + rng.sample(rest, max(0, budget - len(must)))
        for st in candidates:
            fig.distinct += 1
            problem = check_state(st, scratch, mode, seg)
            if problem is not None:
                tags = ",".join(t for t, on in (("ext4", st.ext4), ("process", st.process)) if on) or "posix"
                fig.failures.append(f"{name} crash_at={crash_at} {st.where} [{tags}]: {problem}")
    return fig


def _workdir() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="cellar-crash-", dir=base)


def _all_crash_points(name: str, workdir: str) -> list[int]:
    return list(range(1, len(run_scenario(name, workdir))))


def short_run(workdir: str) -> list[Figures]:
    """The default suite's version: every scenario, every crash point, every page
    variant, and a process crash injected before every 16th operation (every
    operation in the full run; every 8th until 2026-11-27: 8,768 distinct states in
    25 s, now 5,248 in 13 s)."""
    return [explore(name, full=True, workdir=workdir, crash_ats=_all_crash_points(name, workdir)[::16])
            for name in SCENARIOS]


def full_run(workdir: str) -> list[Figures]:
    """Every scenario, every crash point, every page variant on every write prefix,
    pairs of lost directory changes, and a process crash injected before every
    operation of every scenario (the restarted process then recovers, appends and
    syncs, and its own crash states are enumerated too)."""
    return [explore(name, full=True, workdir=workdir, crash_ats=_all_crash_points(name, workdir))
            for name in SCENARIOS]


def report(figs: list[Figures], seconds: float) -> str:
    lines = [f"{'scenario':22} {'runs':>5} {'ops':>6} {'enumerated':>11} {'distinct':>9} {'ext4':>6} {'process':>8} {'failures':>9}"]
    for f in figs:
        lines.append(f"{f.scenario:22} {f.runs:5} {f.ops:6} {f.enumerated:11} {f.distinct:9} {f.ext4:6} {f.process:8} {len(f.failures):9}")
    tot = Figures("total")
    for f in figs:
        tot.runs += f.runs
        tot.ops += f.ops
        tot.enumerated += f.enumerated
        tot.distinct += f.distinct
        tot.ext4 += f.ext4
        tot.process += f.process
        tot.failures += f.failures
    lines.append(f"{'total':22} {tot.runs:5} {tot.ops:6} {tot.enumerated:11} {tot.distinct:9} {tot.ext4:6} {tot.process:8} {len(tot.failures):9}")
    lines.append(f"({seconds:.1f} s)")
    for fail in tot.failures[:20]:
        lines.append("FAIL " + fail)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="the full enumeration (minutes)")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), help="only this scenario")
    args = ap.parse_args(argv)
    import logging

    logging.getLogger("store").setLevel(logging.ERROR)  # torn-tail warnings are expected
    workdir = _workdir()
    t0 = time.monotonic()
    try:
        if args.scenario:
            crash_ats = _all_crash_points(args.scenario, workdir) if args.full else None
            figs = [explore(args.scenario, args.full, workdir, crash_ats=crash_ats)]
        else:
            figs = full_run(workdir) if args.full else short_run(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(figs, time.monotonic() - t0))
    return 1 if any(f.failures for f in figs) else 0


if __name__ == "__main__":
    sys.exit(main())
