"""Snapshots of the state machine plus the protocol metadata needed to resume, and a
pure chunked-transfer codec for shipping one to a peer.

A ``Snapshot(seq, meta, body, slot=None)`` says: every WAL record ``<= seq`` is
reflected in ``body`` (the state machine, opaque bytes) and ``meta`` (protocol
metadata such as the view and executed/committed positions, opaque bytes). ``slot``
(optional) is the protocol position the snapshot was taken at; a snapshot that has
one is named and ordered by it (``snap-slot-<slot:020d>.snap``), because the WAL seq
can go *down* after a torn-tail truncation and a slot never does. ``docs/storage.md``
describes the file format.

Files::

    path = write_snapshot(directory, snapshot, keep=2)   # atomic; prunes to `keep`
    snap = load_latest(directory)                        # newest intact one, or None
    upto = compactable_seq(directory, keep=2)            # safe argument for WAL.compact

``write_snapshot`` writes ``<name>.tmp``, fsyncs it, renames it into place and
fsyncs the directory (and the directory's parent, so a new ``snapshots/`` folder is
durable too), so a crash leaves either the old set or the new one.
``load_latest`` skips (with a warning) a newer file that is torn or fails its
checksum and falls back to the previous one; that fallback is why two are kept, and
why the WAL may only be compacted up to the *oldest* retained snapshot
(``compactable_seq``): the records after the older snapshot must still exist.

Transfer (no I/O)::

    for chunk in iter_chunks(data, chunk_bytes): send(chunk.to_wire())
    chunk = chunk_at(data, offset, chunk_bytes)  # serving: the whole-file CRC is cached
    receiver = SnapshotReceiver(total_bytes_max)
    data = receiver.feed(Chunk.from_wire(raw))   # None until complete; raises ChunkError

A ``Chunk`` carries ``(offset, total, total_crc, crc, data)``. The receiver rejects
(``ChunkError.reason``) a chunk whose CRC is wrong (``"bad-chunk"``), one that is not
at ``next_offset`` (``"out-of-order"``, duplicates included), one whose ``total`` or
``total_crc`` disagrees with the first chunk or exceeds the bound (``"wrong-total"``),
a wire value of the wrong shape (``"malformed"``), a transfer whose first bytes are
not a snapshot header that promises exactly ``total`` bytes (``"bad-header"``,
checked as soon as the header has arrived, so a bogus multi-GiB claim is refused
early), and a reassembled whole whose CRC is wrong or that does not decode
(``"checksum"``). A rejected chunk leaves the receiver unchanged (resume from
``next_offset``), except ``"bad-header"`` and ``"checksum"``, after which it starts
over. CRC32C detects accidents, not malice: peers are trusted members of the
cluster (docs/storage.md).
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import crc32c

from consensus.storage.wal import fsync_dir, makedirs_durable

log = logging.getLogger(__name__)

SNAPSHOT_MAGIC = b"CELLSNAP"
SNAPSHOT_VERSION = 1  # written for a snapshot without a slot
SNAPSHOT_VERSION_SLOT = 2  # written for a snapshot with a slot
SNAPSHOT_VERSION_LIVE = 3  # written for a snapshot with a slot and live records
# magic, version, flags, seq, meta_len, body_len, crc32c of (header before crc + meta + body)
_HEADER = struct.Struct(">8sHHQIQI")
SNAPSHOT_HEADER_BYTES = _HEADER.size  # 36
# version 2: magic, version, flags, seq, slot, meta_len, body_len, crc32c
_HEADER_V2 = struct.Struct(">8sHHQQIQI")
SNAPSHOT_HEADER_BYTES_V2 = _HEADER_V2.size  # 44
# version 3: magic, version, flags, seq, slot, meta_len, body_len, live_len, crc32c
_HEADER_V3 = struct.Struct(">8sHHQQIQQI")
SNAPSHOT_HEADER_BYTES_V3 = _HEADER_V3.size  # 52
_NAME = re.compile(r"^snap-(\d{20})\.snap$")
_NAME_SLOT = re.compile(r"^snap-slot-(\d{20})\.snap$")
META_BYTES_MAX = (1 << 32) - 1
# A received snapshot's metadata is protocol state (views, positions): small.
META_RECEIVE_BYTES_MAX = 64 << 20


class SnapshotCorrupt(Exception):
    """A snapshot file or buffer is torn or fails its checksum."""


class SnapshotUnsupported(SnapshotCorrupt):
    """A snapshot of a format version this build does not know: written by a newer
    build. Never skipped as damage: the WAL beside it may have been compacted
    against it (``load_latest`` raises it)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    seq: int  # covered WAL seq: every record <= seq is reflected below
    meta: bytes  # protocol metadata needed to resume (opaque)
    body: bytes  # the state machine (opaque)
    slot: int | None = None  # protocol position; names and orders the file when set
    # The owner's live records at ``seq`` (opaque; empty: none). A snapshot that has
    # them replaces every WAL record <= seq at recovery (docs/storage.md).
    live: bytes = b""


def snapshot_name(seq: int, slot: int | None = None) -> str:
    if slot is not None:
        return f"snap-slot-{slot:020d}.snap"
    return f"snap-{seq:020d}.snap"


def _order_key(slot: int | None, seq: int) -> tuple[int, int]:
    # Slot-named snapshots (written by this version) are newer than seq-named ones.
    return (1, slot) if slot is not None else (0, seq)


def encode_snapshot(snap: Snapshot) -> bytes:
    if snap.seq < 0 or len(snap.meta) > META_BYTES_MAX or (snap.slot is not None and snap.slot < 0):
        raise ValueError("snapshot seq and slot must be >= 0 and meta under 4 GiB")
    if snap.live:
        if snap.slot is None:
            raise ValueError("a snapshot with live records needs a slot")
        head = _HEADER_V3.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION_LIVE, 0, snap.seq, snap.slot, len(snap.meta),
                               len(snap.body), len(snap.live), 0)[:-4]
        crc = crc32c.crc32c(snap.live, crc32c.crc32c(snap.body, crc32c.crc32c(snap.meta, crc32c.crc32c(head))))
        return b"".join((head, struct.pack(">I", crc), snap.meta, snap.body, snap.live))
    if snap.slot is None:
        head = _HEADER.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 0, snap.seq, len(snap.meta), len(snap.body), 0)[:-4]
    else:
        head = _HEADER_V2.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION_SLOT, 0, snap.seq, snap.slot, len(snap.meta),
                               len(snap.body), 0)[:-4]
    crc = crc32c.crc32c(snap.body, crc32c.crc32c(snap.meta, crc32c.crc32c(head)))
    return b"".join((head, struct.pack(">I", crc), snap.meta, snap.body))


def _header_bytes(data: bytes | bytearray | memoryview) -> int:
    """How long the header of the image starting with ``data`` is (by its version)."""
    version = struct.unpack_from(">H", data, 8)[0] if len(data) >= 10 else 0
    return {SNAPSHOT_VERSION_SLOT: SNAPSHOT_HEADER_BYTES_V2,
            SNAPSHOT_VERSION_LIVE: SNAPSHOT_HEADER_BYTES_V3}.get(version, SNAPSHOT_HEADER_BYTES)


def _parse_header(data: bytes | bytearray | memoryview, source: str
                  ) -> tuple[int, int | None, int, int, int, int, int]:
    """(header bytes, slot, seq, meta_len, body_len, crc, live_len) of a snapshot
    image's header; raises ``SnapshotCorrupt``. ``data`` may be only the first bytes."""
    if len(data) < SNAPSHOT_HEADER_BYTES:
        raise SnapshotCorrupt(f"{source}: torn snapshot header ({len(data)} bytes)")
    magic, version = bytes(data[:8]), struct.unpack_from(">H", data, 8)[0]
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotCorrupt(f"{source}: bad magic {magic!r}")
    if version == SNAPSHOT_VERSION:
        _m, _v, _f, seq, meta_len, body_len, crc = _HEADER.unpack_from(data, 0)
        return SNAPSHOT_HEADER_BYTES, None, seq, meta_len, body_len, crc, 0
    if version in (SNAPSHOT_VERSION_SLOT, SNAPSHOT_VERSION_LIVE):
        if len(data) < _header_bytes(data):
            raise SnapshotCorrupt(f"{source}: torn snapshot header ({len(data)} bytes)")
        if version == SNAPSHOT_VERSION_SLOT:
            _m, _v, _f, seq, slot, meta_len, body_len, crc = _HEADER_V2.unpack_from(data, 0)
            return SNAPSHOT_HEADER_BYTES_V2, slot, seq, meta_len, body_len, crc, 0
        _m, _v, _f, seq, slot, meta_len, body_len, live_len, crc = _HEADER_V3.unpack_from(data, 0)
        return SNAPSHOT_HEADER_BYTES_V3, slot, seq, meta_len, body_len, crc, live_len
    raise SnapshotUnsupported(f"{source}: unsupported snapshot version {version} (this build reads 1 to 3)")


def decode_snapshot(data: bytes, source: str = "<buffer>") -> Snapshot:
    """Verify and decode; raises ``SnapshotCorrupt`` naming ``source``."""
    hdr, slot, seq, meta_len, body_len, crc, live_len = _parse_header(data, source)
    if hdr + meta_len + body_len + live_len != len(data):
        raise SnapshotCorrupt(f"{source}: header promises {hdr + meta_len + body_len + live_len} bytes, "
                              f"file has {len(data)}")
    view = memoryview(data)
    if crc32c.crc32c(view[hdr:], crc32c.crc32c(view[: hdr - 4])) != crc:
        raise SnapshotCorrupt(f"{source}: checksum mismatch")
    meta_end = hdr + meta_len
    body_end = meta_end + body_len
    return Snapshot(seq, bytes(view[hdr:meta_end]), bytes(view[meta_end:body_end]), slot, bytes(view[body_end:]))


def _list(directory: str) -> list[tuple[tuple[int, int], str]]:
    """(order key, path) of every snapshot file, newest first."""
    out = []
    for name in os.listdir(directory):
        m = _NAME_SLOT.match(name)
        if m:
            out.append((_order_key(int(m.group(1)), 0), os.path.join(directory, name)))
            continue
        m = _NAME.match(name)
        if m:
            out.append((_order_key(None, int(m.group(1))), os.path.join(directory, name)))
    out.sort(reverse=True)
    return out


def _name_matches(key: tuple[int, int], snap: Snapshot) -> bool:
    return key == _order_key(snap.slot, snap.seq)


def write_snapshot(directory: str | os.PathLike[str], snap: Snapshot, *, keep: int = 2,
                   image: bytes | None = None) -> str:
    """Atomically write ``snap``, then delete all but the ``keep`` newest snapshots
    (and any leftover temporary files). Returns the path written. ``image``: the
    caller's ``encode_snapshot(snap)``, so it is not encoded twice."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    directory = os.fspath(directory)
    # The folder (new or made by a process that crashed before syncing it) must be
    # durable in its parent before the WAL is compacted against what it holds.
    makedirs_durable(directory)
    data = encode_snapshot(snap) if image is None else image
    # Pair assertion: what goes to disk decodes to the same header values.
    _h, slot, seq, meta_len, body_len, _c, live_len = _parse_header(data, "encoded")
    assert (seq, slot, meta_len, body_len, live_len) == (snap.seq, snap.slot, len(snap.meta), len(snap.body),
                                                         len(snap.live))
    path = os.path.join(directory, snapshot_name(snap.seq, snap.slot))
    tmp = path + ".tmp"
    write_file_synced(tmp, data)
    return place_snapshot(directory, tmp, snap, keep=keep)


def write_file_synced(path: str, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` to a new ``path`` and fsync it (not its directory)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:  # each write makes progress or raises
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def place_snapshot(directory: str, tmp: str, snap: Snapshot, *, keep: int = 2) -> str:
    """Rename the synced image ``tmp`` of ``snap`` into place (``directory`` already
    durable in its parent), then delete all but the ``keep`` newest snapshots and any
    leftover temporary files. Returns the path."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    path = os.path.join(directory, snapshot_name(snap.seq, snap.slot))
    os.replace(tmp, path)
    fsync_dir(directory)

    # Any subset of these deletions leaves the `keep` newest in place.
    for _key, old in _list(directory)[keep:]:
        os.unlink(old)
    for name in os.listdir(directory):
        if name.startswith("snap-") and name.endswith(".snap.tmp"):
            os.unlink(os.path.join(directory, name))
    fsync_dir(directory)
    return path


def load_latest(directory: str | os.PathLike[str]) -> Snapshot | None:
    """The newest snapshot that is intact, or None. Damaged newer files are skipped
    with a warning (and left in place for inspection); a file of a version this
    build does not know raises ``SnapshotUnsupported`` (a newer build wrote it, and
    may have compacted the WAL against it: skipping it could resume from an older
    state and lose acknowledged writes). The directory is fsynced
    first (recovery's half of "a rename is durable only after its directory's
    fsync")."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return None
    # What we are about to resume from may be a rename that a crashed process never
    # made durable: make it durable before the WAL is appended to on top of it.
    fsync_dir(directory)
    for key, path in _list(directory):
        with open(path, "rb") as f:
            data = f.read()
        try:
            snap = decode_snapshot(data, path)
            if not _name_matches(key, snap):
                raise SnapshotCorrupt(f"{path}: header (seq {snap.seq}, slot {snap.slot}) does not match the file name")
        except SnapshotUnsupported:
            raise
        except SnapshotCorrupt as e:
            log.warning("snapshot: skipping damaged %s (%s); trying an older one", path, e)
            continue
        return snap
    return None


def keep_only(directory: str | os.PathLike[str], snap: Snapshot) -> None:
    """Delete every snapshot file in ``directory`` but ``snap``'s, durably (before
    ``WAL.restart_at``: the older ones need WAL records the restart drops, and a
    later fall-back to one of them would start without those records)."""
    directory = os.fspath(directory)
    keep = snapshot_name(snap.seq, snap.slot)
    for _key, path in _list(directory):
        if os.path.basename(path) != keep:
            os.unlink(path)
    fsync_dir(directory)


def compactable_seq(directory: str | os.PathLike[str], *, keep: int = 2) -> int:
    """The highest seq the WAL may be compacted up to: the oldest of the ``keep``
    retained snapshots, once there are that many (else 0: keep the whole log, since
    a damaged only-snapshot would need it)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return 0
    snaps = _list(directory)[:keep]
    if len(snaps) < keep:
        return 0
    key, path = snaps[-1]
    if key[0] == 0:
        return key[1]
    with open(path, "rb") as f:
        head = f.read(SNAPSHOT_HEADER_BYTES_V3)
    try:
        return _parse_header(head, path)[2]
    except SnapshotCorrupt:
        return 0  # unreadable: keep the whole log


# --- chunked transfer (pure) ---------------------------------------------------------


class ChunkError(Exception):
    """A snapshot chunk was rejected; ``reason`` is a short code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


@dataclass(frozen=True, slots=True)
class Chunk:
    offset: int
    total: int
    total_crc: int  # crc32c of the whole transfer
    crc: int  # crc32c of data
    data: bytes

    def to_wire(self) -> list[Any]:
        return [self.offset, self.total, self.total_crc, self.crc, self.data]

    @staticmethod
    def from_wire(raw: Any) -> Chunk:
        if not (isinstance(raw, (list, tuple)) and len(raw) == 5):
            raise ChunkError("malformed", "a chunk is a list of 5 fields")
        offset, total, total_crc, crc, data = raw
        if not all(type(x) is int and x >= 0 for x in (offset, total, total_crc, crc)) or type(data) is not bytes:
            raise ChunkError("malformed", "chunk fields have the wrong types")
        return Chunk(offset, total, total_crc, crc, data)


def iter_chunks(data: bytes, chunk_bytes: int) -> Iterator[Chunk]:
    """Split ``data`` into chunks of at most ``chunk_bytes`` (one empty chunk if
    ``data`` is empty, so every transfer has a last chunk)."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be >= 1")
    total = len(data)
    total_crc = crc32c.crc32c(data)
    view = memoryview(data)
    offset = 0
    while True:  # bounded: offset grows by chunk_bytes until it reaches total
        piece = bytes(view[offset : offset + chunk_bytes])
        yield Chunk(offset, total, total_crc, crc32c.crc32c(piece), piece)
        offset += len(piece)
        if offset >= total:
            return


_TOTAL_CRC_CACHE: list = [None, 0]  # [the last image served, its crc32c]


def chunk_at(data: bytes, offset: int, chunk_bytes: int) -> Chunk:
    """The chunk of ``data`` at ``offset`` (serving a pull). The whole-image CRC is
    computed once per image (the last one served is remembered), not per chunk."""
    if _TOTAL_CRC_CACHE[0] is not data:
        _TOTAL_CRC_CACHE[0], _TOTAL_CRC_CACHE[1] = data, crc32c.crc32c(data)
    piece = bytes(memoryview(data)[offset : offset + chunk_bytes])
    return Chunk(offset, len(data), _TOTAL_CRC_CACHE[1], crc32c.crc32c(piece), piece)


class SnapshotReceiver:
    """Reassembles one transfer from in-order chunks and verifies it."""

    def __init__(self, total_bytes_max: int, *, image: bool = True) -> None:
        """``image``: the transfer is a snapshot file image (the node's case): its
        header is checked as soon as it arrives and the whole is decoded before it
        is returned. ``image=False`` ships arbitrary bytes (CRCs only)."""
        self.total_bytes_max = total_bytes_max
        self.image = image
        self._reset()

    def _reset(self) -> None:
        self._buf = bytearray()
        self._total: int | None = None
        self._total_crc = 0
        self._running_crc = 0
        self.done = False

    @property
    def next_offset(self) -> int:
        return len(self._buf)

    def feed(self, chunk: Chunk) -> bytes | None:
        """Accept one chunk; returns the whole transfer after the last one."""
        if self.done:
            raise ChunkError("out-of-order", "transfer already complete")
        if crc32c.crc32c(chunk.data) != chunk.crc:
            raise ChunkError("bad-chunk", f"checksum mismatch at offset {chunk.offset}")
        if chunk.total > self.total_bytes_max:
            raise ChunkError("wrong-total", f"total {chunk.total} exceeds {self.total_bytes_max}")
        if self._total is not None and (chunk.total, chunk.total_crc) != (self._total, self._total_crc):
            raise ChunkError("wrong-total", f"chunk says total {chunk.total}, transfer is {self._total}")
        if chunk.offset != len(self._buf):
            raise ChunkError("out-of-order", f"got offset {chunk.offset}, expected {len(self._buf)}")
        if chunk.offset + len(chunk.data) > chunk.total:
            raise ChunkError("wrong-total", f"chunk ends at {chunk.offset + len(chunk.data)}, past total {chunk.total}")
        if not chunk.data and chunk.total != 0:
            raise ChunkError("bad-chunk", "empty chunk in a non-empty transfer")
        had = len(self._buf)
        self._total, self._total_crc = chunk.total, chunk.total_crc
        self._buf += chunk.data
        self._running_crc = crc32c.crc32c(chunk.data, self._running_crc)
        if self.image and had < SNAPSHOT_HEADER_BYTES_V3:
            problem = self._header_problem()
            if problem is not None:
                self._reset()
                raise ChunkError("bad-header", problem)
        if len(self._buf) < chunk.total:
            return None
        if self._running_crc != self._total_crc:
            self._reset()
            raise ChunkError("checksum", "reassembled snapshot fails its checksum; restart the transfer")
        data = bytes(self._buf)
        if self.image:
            try:  # the whole-file check, before anyone installs it
                decode_snapshot(data, "received snapshot")
            except SnapshotCorrupt as e:
                self._reset()
                raise ChunkError("checksum", str(e)) from None
        self.done = True
        return data

    def _header_problem(self) -> str | None:
        """Once the header has arrived: does it describe exactly ``total`` bytes?"""
        buf, total = self._buf, self._total
        assert total is not None
        if len(buf) < _header_bytes(buf) and len(buf) < total:
            return None  # not all there yet
        try:
            hdr, _slot, _seq, meta_len, body_len, _crc, live_len = _parse_header(buf, "received snapshot")
        except SnapshotCorrupt as e:
            return str(e)
        if meta_len > META_RECEIVE_BYTES_MAX:
            return f"metadata of {meta_len} bytes exceeds {META_RECEIVE_BYTES_MAX}"
        if hdr + meta_len + body_len + live_len != total:
            return f"header promises {hdr + meta_len + body_len + live_len} bytes, transfer claims {total}"
        return None
