"""Snapshots of the state machine plus the protocol metadata needed to resume, and a
pure chunked-transfer codec for shipping one to a peer.

A ``Snapshot(seq, meta, body)`` says: every WAL record ``<= seq`` is reflected in
``body`` (the state machine, opaque bytes) and ``meta`` (protocol metadata such as
the view and executed/committed positions, opaque bytes). ``docs/storage.md``
describes the file format.

Files::

    path = write_snapshot(directory, snapshot, keep=2)   # atomic; prunes to `keep`
    snap = load_latest(directory)                        # newest intact one, or None
    upto = compactable_seq(directory, keep=2)            # safe argument for WAL.compact

``write_snapshot`` writes ``snap-<seq:020d>.snap.tmp``, fsyncs it, renames it into
place and fsyncs the directory, so a crash leaves either the old set or the new one.
``load_latest`` skips (with a warning) a newer file that is torn or fails its
checksum and falls back to the previous one; that fallback is why two are kept, and
why the WAL may only be compacted up to the *oldest* retained snapshot
(``compactable_seq``): the records after the older snapshot must still exist.

Transfer (no I/O)::

    for chunk in iter_chunks(data, chunk_bytes): send(chunk.to_wire())
    receiver = SnapshotReceiver(total_bytes_max)
    data = receiver.feed(Chunk.from_wire(raw))   # None until complete; raises ChunkError

A ``Chunk`` carries ``(offset, total, total_crc, crc, data)``. The receiver rejects
(``ChunkError.reason``) a chunk whose CRC is wrong (``"bad-chunk"``), one that is not
at ``next_offset`` (``"out-of-order"``, duplicates included), one whose ``total`` or
``total_crc`` disagrees with the first chunk or exceeds the bound (``"wrong-total"``),
a wire value of the wrong shape (``"malformed"``), and a reassembled whole whose CRC
is wrong (``"checksum"``). A rejected chunk leaves the receiver unchanged (resume
from ``next_offset``), except ``"checksum"``, after which it starts over.
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

log = logging.getLogger(__name__)

SNAPSHOT_MAGIC = b"CELLSNAP"
SNAPSHOT_VERSION = 1
# magic, version, flags, seq, meta_len, body_len, crc32c of (header before crc + meta + body)
_HEADER = struct.Struct(">8sHHQIQI")
SNAPSHOT_HEADER_BYTES = _HEADER.size  # 36
_NAME = re.compile(r"^snap-(\d{20})\.snap$")
META_BYTES_MAX = (1 << 32) - 1


class SnapshotCorrupt(Exception):
    """A snapshot file or buffer is torn or fails its checksum."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    seq: int  # covered WAL seq: every record <= seq is reflected below
    meta: bytes  # protocol metadata needed to resume (opaque)
    body: bytes  # the state machine (opaque)


def snapshot_name(seq: int) -> str:
    return f"snap-{seq:020d}.snap"


def encode_snapshot(snap: Snapshot) -> bytes:
    if snap.seq < 0 or len(snap.meta) > META_BYTES_MAX:
        raise ValueError("snapshot seq must be >= 0 and meta under 4 GiB")
    head = _HEADER.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 0, snap.seq, len(snap.meta), len(snap.body), 0)[:-4]
    crc = crc32c.crc32c(snap.body, crc32c.crc32c(snap.meta, crc32c.crc32c(head)))
    return b"".join((head, struct.pack(">I", crc), snap.meta, snap.body))


def decode_snapshot(data: bytes, source: str = "<buffer>") -> Snapshot:
    """Verify and decode; raises ``SnapshotCorrupt`` naming ``source``."""
    if len(data) < SNAPSHOT_HEADER_BYTES:
        raise SnapshotCorrupt(f"{source}: torn snapshot header ({len(data)} bytes)")
    magic, version, _flags, seq, meta_len, body_len, crc = _HEADER.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotCorrupt(f"{source}: bad magic {magic!r}")
    if version != SNAPSHOT_VERSION:
        raise SnapshotCorrupt(f"{source}: unsupported version {version}")
    if SNAPSHOT_HEADER_BYTES + meta_len + body_len != len(data):
        raise SnapshotCorrupt(
            f"{source}: header promises {SNAPSHOT_HEADER_BYTES + meta_len + body_len} bytes, file has {len(data)}"
        )
    view = memoryview(data)
    if crc32c.crc32c(view[SNAPSHOT_HEADER_BYTES:], crc32c.crc32c(view[: SNAPSHOT_HEADER_BYTES - 4])) != crc:
        raise SnapshotCorrupt(f"{source}: checksum mismatch")
    meta_end = SNAPSHOT_HEADER_BYTES + meta_len
    return Snapshot(seq, bytes(view[SNAPSHOT_HEADER_BYTES:meta_end]), bytes(view[meta_end:]))


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _list(directory: str) -> list[tuple[int, str]]:
    """(seq, path) of every snapshot file, newest first."""
    out = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        if m:
            out.append((int(m.group(1)), os.path.join(directory, name)))
    out.sort(reverse=True)
    return out


def write_snapshot(directory: str | os.PathLike[str], snap: Snapshot, *, keep: int = 2) -> str:
    """Atomically write ``snap``, then delete all but the ``keep`` newest snapshots
    (and any leftover temporary files). Returns the path written."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    data = encode_snapshot(snap)
    # Pair assertion: what goes to disk decodes to the same header values.
    _m, _v, _f, seq, meta_len, body_len, _c = _HEADER.unpack_from(data, 0)
    assert (seq, meta_len, body_len) == (snap.seq, len(snap.meta), len(snap.body))
    path = os.path.join(directory, snapshot_name(snap.seq))
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:  # each write makes progress or raises
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(directory)

    for _seq, old in _list(directory)[keep:]:
        os.unlink(old)
    for name in os.listdir(directory):
        if name.startswith("snap-") and name.endswith(".snap.tmp"):
            os.unlink(os.path.join(directory, name))
    _fsync_dir(directory)
    return path


def load_latest(directory: str | os.PathLike[str]) -> Snapshot | None:
    """The newest snapshot that is intact, or None. Damaged newer files are skipped
    with a warning (and left in place for inspection)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return None
    for seq, path in _list(directory):
        with open(path, "rb") as f:
            data = f.read()
        try:
            snap = decode_snapshot(data, path)
            if snap.seq != seq:
                raise SnapshotCorrupt(f"{path}: header seq {snap.seq} does not match the file name")
        except SnapshotCorrupt as e:
            log.warning("snapshot: skipping damaged %s (%s); trying an older one", path, e)
            continue
        return snap
    return None


def compactable_seq(directory: str | os.PathLike[str], *, keep: int = 2) -> int:
    """The highest seq the WAL may be compacted up to: the oldest of the ``keep``
    retained snapshots, once there are that many (else 0: keep the whole log, since
    a damaged only-snapshot would need it)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return 0
    snaps = _list(directory)[:keep]
    return snaps[-1][0] if len(snaps) >= keep else 0


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


class SnapshotReceiver:
    """Reassembles one transfer from in-order chunks and verifies it."""

    def __init__(self, total_bytes_max: int) -> None:
        self.total_bytes_max = total_bytes_max
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
        self._total, self._total_crc = chunk.total, chunk.total_crc
        self._buf += chunk.data
        self._running_crc = crc32c.crc32c(chunk.data, self._running_crc)
        if len(self._buf) < chunk.total:
            return None
        if self._running_crc != self._total_crc:
            self._reset()
            raise ChunkError("checksum", "reassembled snapshot fails its checksum; restart the transfer")
        data = bytes(self._buf)
        self.done = True
        return data
