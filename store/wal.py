"""A durable write-ahead log with group commit.

The WAL stores opaque ``bytes`` payloads (the caller msgpack-encodes its acceptor
records: promises, accepted C- and O-instances, views, commit markers) under
consecutive sequence numbers starting at 1. ``docs/storage.md`` describes the
on-disk format, the fsync modes and the recovery rules in full; this docstring is
the interface.

Opening and recovery::

    wal, records = WAL.open(directory, fsync="batch", segment_bytes_max=64 << 20,
                            replay_from_seq=1)
    for seq, payload in records: ...        # every recovered record >= replay_from_seq

``WAL.open`` reads every segment, verifies every record (length, CRC32C, sequence
number), truncates a torn tail of the *last* segment (logging one warning naming the
file and offset) and raises ``WALCorruption`` (whose message names the file and the
byte offset) on damage anywhere else. It holds an exclusive ``flock`` on
``<directory>/LOCK`` until ``close()``.

Writing (all on one thread, the event loop's)::

    seq = wal.append(payload)               # buffered; not durable yet
    last = wal.append_many([p1, p2, p3])    # returns the last seq assigned
    durable = wal.sync()                    # group commit: one fsync covers all
    wal.durable_seq, wal.last_seq, wal.first_seq, wal.stats["fsyncs"]
    wal.compact(upto_seq)                   # drop whole segments <= upto_seq
    wal.close()                             # sync (per mode) and release
    wal.abandon()                           # crash simulation: release without syncing

Fsync modes (``fsync=``):

- ``"batch"`` (default): ``append`` only buffers; ``sync()`` writes the buffer and
  issues *one* ``fdatasync`` that covers every record appended since the previous
  one. The runtime calls it (or ``GroupCommitter``) once per event-loop turn and
  releases a reply only once its record's seq is ``<= durable_seq``. Replies never
  leave before the covering fsync completes; the cost of an fsync is shared by every
  record of the turn.
- ``"always"``: every ``append``/``append_many`` call writes and fsyncs before it
  returns (one fsync per call). Simplest and slowest; it blocks the caller.
- ``"never"``: no per-record fsync; ``sync()`` only hands the buffer to the OS and
  reports it as "durable". That survives a *process* crash (the page cache keeps
  it) but not power loss or a kernel crash. For tests and benchmarks only.

In every mode, creating a segment (at open and at rotation) fsyncs the previous
segment, the new segment's header and the directory, so only the last segment can
ever hold unsynced bytes (recovery relies on that).

Group commit from asyncio (``GroupCommitter``)::

    committer = GroupCommitter(wal)                 # owns one fsync thread
    seq = wal.append(payload)
    committer.on_durable(seq, callback)             # callback(None) or callback(exc)
    await committer.durable(seq)                    # or await it
    committer.request_sync()                        # sync without a waiter
    await committer.close()

One fsync runs at a time, in a single worker thread, so the loop keeps accepting
work; records appended while it is in flight are covered by the next one. An fsync
error is fatal (retrying after a failed fsync is unsafe: the kernel may have dropped
the dirty pages): every waiter gets the error and the WAL refuses further writes.

Threading: the WAL is not thread-safe. ``prepare_sync``/``complete_sync`` run on the
owner's thread and only ``perform_sync`` (a bare ``fdatasync``) runs on the
committer's thread; that split is the whole concurrency story.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
import heapq
import itertools
import logging
import os
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import crc32c

log = logging.getLogger(__name__)

SEGMENT_MAGIC = b"CELLRWAL"
SEGMENT_VERSION = 1
# magic, version, flags, first_seq, crc32c of the 20 bytes before it.
_SEGMENT_HEADER = struct.Struct(">8sHHQI")
SEGMENT_HEADER_BYTES = _SEGMENT_HEADER.size  # 24
# length of payload, crc32c, seq. The crc covers (length, seq, payload) so a damaged
# length or a record at the wrong position cannot pass.
_RECORD_HEADER = struct.Struct(">IIQ")
RECORD_HEADER_BYTES = _RECORD_HEADER.size  # 16
_CRC_PREFIX = struct.Struct(">IQ")
_ZERO_RECORD_HEADER = bytes(RECORD_HEADER_BYTES)

SEGMENT_BYTES_MAX_DEFAULT = 64 << 20
WRITE_BUFFER_BYTES_MAX_DEFAULT = 1 << 20
_SEGMENT_NAME = re.compile(r"^wal-(\d{20})\.log$")
FSYNC_MODES = ("always", "batch", "never")

_fdatasync = getattr(os, "fdatasync", os.fsync)


class WALError(Exception):
    """Base class of WAL errors."""


class WALCorruption(WALError):
    """Durable log data is damaged; the replica must not start on it."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"WAL corruption in {path} at byte offset {offset}: {reason}; refusing to start "
            f"(restore this replica from a snapshot/peers, or inspect the file)"
        )


class WALFailed(WALError):
    """An earlier fsync or write failed; the WAL accepts no more work."""


class CommitQueueFull(WALError):
    """Too many durability waiters are pending; the caller must shed load."""


def segment_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


def _record_crc(length: int, seq: int, payload: bytes | memoryview) -> int:
    return crc32c.crc32c(payload, crc32c.crc32c(_CRC_PREFIX.pack(length, seq)))


def encode_record(seq: int, payload: bytes) -> bytes:
    """One record as it sits on disk: header + payload."""
    length = len(payload)
    return _RECORD_HEADER.pack(length, _record_crc(length, seq, payload), seq) + payload


def _encode_segment_header(first_seq: int) -> bytes:
    head = struct.pack(">8sHHQ", SEGMENT_MAGIC, SEGMENT_VERSION, 0, first_seq)
    return head + struct.pack(">I", crc32c.crc32c(head))


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    # Each os.write makes progress or raises, so this loop is bounded by len(data).
    while view:
        n = os.write(fd, view)
        view = view[n:]


@dataclass(frozen=True, slots=True)
class SyncTicket:
    """One pending group commit: fsync ``fd`` and everything ``<= seq`` is durable."""

    fd: int
    seq: int


@dataclass(slots=True)
class _Segment:
    first_seq: int
    path: str


# --- recovery -----------------------------------------------------------------


def _parse_record(data: bytes, pos: int, size: int) -> tuple[str | None, int, int, int]:
    """Try the record at ``pos``: (problem or None, length, crc, seq)."""
    if size - pos < RECORD_HEADER_BYTES:
        return "partial record header", 0, 0, 0
    length, crc, seq = _RECORD_HEADER.unpack_from(data, pos)
    if data[pos : pos + RECORD_HEADER_BYTES] == _ZERO_RECORD_HEADER:
        return "zero-filled record header", length, crc, seq
    end = pos + RECORD_HEADER_BYTES + length
    if end > size:
        return f"record length {length} runs past end of file ({size} bytes)", length, crc, seq
    body = memoryview(data)[pos + RECORD_HEADER_BYTES : end]
    if _record_crc(length, seq, body) != crc:
        return "record checksum mismatch", length, crc, seq
    return None, length, crc, seq


def _find_valid_record_after(data: bytes, pos: int, size: int, seq_bad: int) -> tuple[int, int] | None:
    """The first intact record that starts after ``pos`` with a seq above ``seq_bad``.

    Finding one means the damage at ``pos`` is followed by real log data: corruption,
    not a torn tail. Bounded by the segment size, and fast in the common cases: an
    intact record has a nonzero seq, so a zero-filled tail is skipped (``rstrip``);
    and its seq lies in a narrow range whose big-endian encodings share their high
    bytes, so candidates are located with ``bytes.find`` on that prefix (C speed)
    and only they pay for a header unpack and a CRC.
    """
    seq_lo = seq_bad + 1
    seq_hi = seq_bad + (size - pos) // RECORD_HEADER_BYTES  # can't fit more records than that
    lo, hi = seq_lo.to_bytes(8, "big"), seq_hi.to_bytes(8, "big")
    k = 0
    while k < 8 and lo[k] == hi[k]:
        k += 1
    prefix = lo[:k]
    last_start = min(len(data.rstrip(b"\x00")) - 1, size - RECORD_HEADER_BYTES)
    seq_at = 8  # offset of the seq field inside a record header
    unpack = _RECORD_HEADER.unpack_from
    hit = data.find(prefix, pos + 1 + seq_at, last_start + seq_at + k)
    while hit != -1:  # each pass moves hit forward by >= 1 byte
        start = hit - seq_at
        length, crc, seq = unpack(data, start)
        end = start + RECORD_HEADER_BYTES + length
        if seq_lo <= seq <= seq_hi and end <= size:
            if _record_crc(length, seq, memoryview(data)[start + RECORD_HEADER_BYTES : end]) == crc:
                return start, seq
        hit = data.find(prefix, hit + 1, last_start + seq_at + k)
    return None


@dataclass(slots=True)
class _SegmentScan:
    records: list[tuple[int, bytes]]
    next_seq: int
    valid_end: int  # offset just past the last intact record
    torn_reason: str | None


def _scan_segment(path: str, first_seq: int, is_last: bool, replay_from_seq: int) -> _SegmentScan:
    with open(path, "rb") as f:
        data = f.read()
    size = len(data)
    if size < SEGMENT_HEADER_BYTES or data[:SEGMENT_HEADER_BYTES] == bytes(SEGMENT_HEADER_BYTES):
        if is_last:
            # A crash while the segment was being created: its header is fsynced
            # before any record goes in, so nothing acknowledged can live here.
            return _SegmentScan([], first_seq, 0, "segment header missing or torn")
        raise WALCorruption(path, 0, "segment header missing")
    magic, version, _flags, header_seq, header_crc = _SEGMENT_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise WALCorruption(path, 0, f"bad segment magic {magic!r}")
    if crc32c.crc32c(data[: SEGMENT_HEADER_BYTES - 4]) != header_crc:
        raise WALCorruption(path, 0, "segment header checksum mismatch")
    if version != SEGMENT_VERSION:
        raise WALCorruption(path, 0, f"unsupported segment version {version}")
    if header_seq != first_seq:
        raise WALCorruption(path, 0, f"segment header says first seq {header_seq}, file name says {first_seq}")

    records: list[tuple[int, bytes]] = []
    seq_expected = first_seq
    pos = SEGMENT_HEADER_BYTES
    while pos < size:  # each iteration advances pos by >= RECORD_HEADER_BYTES or exits
        problem, length, _crc, seq = _parse_record(data, pos, size)
        if problem is None and seq != seq_expected:
            # An intact record in the wrong place is never a torn write.
            raise WALCorruption(path, pos, f"record has seq {seq}, expected {seq_expected}")
        if problem is not None:
            if not is_last:
                raise WALCorruption(path, pos, problem + " in a non-last (fully synced) segment")
            found = _find_valid_record_after(data, pos, size, seq_expected)
            if found is not None:
                raise WALCorruption(
                    path, pos,
                    f"{problem} (seq {seq_expected}), but an intact record (seq {found[1]}) "
                    f"follows at offset {found[0]}",
                )
            return _SegmentScan(records, seq_expected, pos, f"{problem} (seq {seq_expected})")
        body_start = pos + RECORD_HEADER_BYTES
        if seq >= replay_from_seq:
            records.append((seq, data[body_start : body_start + length]))
        seq_expected += 1
        pos = body_start + length
    return _SegmentScan(records, seq_expected, pos, None)


# --- the log --------------------------------------------------------------------


class WAL:
    """A segmented write-ahead log. Build it with ``WAL.open``; see the module docstring."""

    def __init__(self, directory: str, mode: str, segment_bytes_max: int, write_buffer_bytes_max: int,
                 lock_fd: int) -> None:
        self.directory = directory
        self.mode = mode
        self.segment_bytes_max = segment_bytes_max
        self.write_buffer_bytes_max = write_buffer_bytes_max
        self.stats: dict[str, int] = {"appends": 0, "bytes_appended": 0, "fsyncs": 0, "segments_created": 0}
        self._lock_fd = lock_fd
        self._segments: list[_Segment] = []
        self._fd = -1  # current (last) segment, opened for writing
        self._seg_end = 0  # logical end of the current segment, including _buf
        self._seg_records = 0
        self._buf = bytearray()
        self._last_seq = 0
        self._durable_seq = 0
        self._retired_fds: list[int] = []  # old segments kept open while a sync may use them
        self._ticket: SyncTicket | None = None
        self._failed: BaseException | None = None
        self._closed = False

    # -- open / recover --

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        fsync: str = "batch",
        segment_bytes_max: int = SEGMENT_BYTES_MAX_DEFAULT,
        write_buffer_bytes_max: int = WRITE_BUFFER_BYTES_MAX_DEFAULT,
        replay_from_seq: int = 1,
    ) -> tuple[WAL, list[tuple[int, bytes]]]:
        """Recover the log in ``directory`` (created if missing) and open it for appends.

        Returns the WAL and the recovered ``(seq, payload)`` records with
        ``seq >= replay_from_seq``, in order (records below are still verified).
        Raises ``WALCorruption`` on damage that is not a torn tail.
        """
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {FSYNC_MODES}, not {fsync!r}")
        if segment_bytes_max < SEGMENT_HEADER_BYTES + RECORD_HEADER_BYTES + 1:
            raise ValueError(f"segment_bytes_max {segment_bytes_max} is too small")
        directory = os.fspath(directory)
        if not os.path.isdir(directory):
            os.makedirs(directory)
            _fsync_dir(os.path.dirname(os.path.abspath(directory)))
        lock_fd = os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(lock_fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise WALError(f"WAL directory {directory} is locked by another open WAL") from e
            raise
        wal = cls(directory, fsync, segment_bytes_max, write_buffer_bytes_max, lock_fd)
        try:
            records = wal._recover(replay_from_seq)
        except BaseException:
            wal._release_lock()
            raise
        return wal, records

    def _recover(self, replay_from_seq: int) -> list[tuple[int, bytes]]:
        found: list[_Segment] = []
        for name in os.listdir(self.directory):
            m = _SEGMENT_NAME.match(name)
            if m:
                found.append(_Segment(int(m.group(1)), os.path.join(self.directory, name)))
        found.sort(key=lambda s: s.first_seq)

        records: list[tuple[int, bytes]] = []
        next_seq = found[0].first_seq if found else 1
        reopen_last = bool(found)
        for i, seg in enumerate(found):
            is_last = i == len(found) - 1
            if seg.first_seq != next_seq:
                # A missing segment (or an overlapping one) loses acknowledged records.
                raise WALCorruption(seg.path, 0, f"segment starts at seq {seg.first_seq}, expected {next_seq}")
            scan = _scan_segment(seg.path, seg.first_seq, is_last, replay_from_seq)
            records.extend(scan.records)
            next_seq = scan.next_seq
            if scan.torn_reason is not None:
                log.warning("WAL: torn tail in %s at byte offset %d (%s); truncating",
                            seg.path, scan.valid_end, scan.torn_reason)
                if scan.valid_end == 0:
                    os.unlink(seg.path)
                    _fsync_dir(self.directory)
                    reopen_last = False
                    continue
                fd = os.open(seg.path, os.O_WRONLY)
                try:
                    os.ftruncate(fd, scan.valid_end)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self._segments.append(seg)
            if is_last:
                self._seg_end = scan.valid_end
                self._seg_records = scan.next_seq - seg.first_seq

        self._last_seq = next_seq - 1
        if reopen_last:
            seg = self._segments[-1]
            self._fd = os.open(seg.path, os.O_WRONLY)
            os.lseek(self._fd, self._seg_end, os.SEEK_SET)
            # What we read may have been only in the page cache (a process crash
            # before its fsync); make it durable before anyone acts on it.
            self._fsync(self._fd)
        else:
            self._create_segment(next_seq)
        self._durable_seq = self._last_seq
        # Pair assertion: what we hand back is exactly the contiguous tail of the log.
        assert all(b[0] == a[0] + 1 for a, b in zip(records, records[1:]))
        assert not records or records[-1][0] == self._last_seq
        return records

    # -- properties --

    @property
    def last_seq(self) -> int:
        """Highest seq appended (durable or not); 0 for an empty log."""
        return self._last_seq

    @property
    def durable_seq(self) -> int:
        """Highest seq covered by a completed fsync (``never``: handed to the OS)."""
        return self._durable_seq

    @property
    def first_seq(self) -> int:
        """Lowest seq still stored (after compaction); ``last_seq + 1`` if none."""
        return self._segments[0].first_seq if self._segments else self._last_seq + 1

    @property
    def segment_paths(self) -> list[str]:
        return [s.path for s in self._segments]

    # -- appends --

    def _check_usable(self) -> None:
        if self._closed:
            raise WALError("WAL is closed")
        if self._failed is not None:
            raise WALFailed(f"WAL failed earlier: {self._failed!r}") from self._failed

    def append(self, payload: bytes) -> int:
        """Buffer one record; returns its seq. Durable only after a covering sync
        (immediately in ``always`` mode)."""
        seq = self._append_one(payload)
        if self.mode == "always":
            self.sync()
        return seq

    def append_many(self, payloads: Iterable[bytes]) -> int:
        """Buffer several records; returns the last seq (``last_seq`` if empty).
        ``always`` mode fsyncs once for the whole call."""
        for payload in payloads:
            self._append_one(payload)
        if self.mode == "always":
            self.sync()
        return self._last_seq

    def _append_one(self, payload: bytes) -> int:
        self._check_usable()
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"WAL payloads are bytes, not {type(payload).__name__}")
        record_bytes = RECORD_HEADER_BYTES + len(payload)
        if SEGMENT_HEADER_BYTES + record_bytes > self.segment_bytes_max:
            raise ValueError(f"record of {len(payload)} bytes exceeds segment_bytes_max {self.segment_bytes_max}")
        if self._seg_records > 0 and self._seg_end + record_bytes > self.segment_bytes_max:
            self._rotate()
        seq = self._last_seq + 1
        record = encode_record(seq, bytes(payload))
        assert len(record) == record_bytes
        self._buf += record
        self._seg_end += record_bytes
        self._seg_records += 1
        self._last_seq = seq
        self.stats["appends"] += 1
        self.stats["bytes_appended"] += record_bytes
        if len(self._buf) >= self.write_buffer_bytes_max:
            self._flush()
        return seq

    def _flush(self) -> None:
        """Hand the buffer to the OS (no fsync)."""
        if self._buf:
            try:
                _write_all(self._fd, self._buf)
            except OSError as e:
                # After a failed write we no longer know what is in the file.
                self._failed = e
                raise
            self._buf.clear()

    def _rotate(self) -> None:
        # Make the finished segment durable before the next one receives any record,
        # so a torn write can only ever sit in the last segment.
        self._flush()
        self._fsync(self._fd)
        self._durable_seq = self._last_seq
        if self._ticket is not None and self._ticket.fd == self._fd:
            self._retired_fds.append(self._fd)  # closed by complete_sync
        else:
            os.close(self._fd)
        self._fd = -1
        try:
            self._create_segment(self._last_seq + 1)
        except BaseException as e:
            # No segment to write to: every later append would fail differently. Fail now.
            self._failed = e
            raise

    def _create_segment(self, first_seq: int) -> None:
        path = os.path.join(self.directory, segment_name(first_seq))
        header = _encode_segment_header(first_seq)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, header)
            self._fsync(fd)
            # Pair assertion: the header we will trust at recovery reads back intact.
            assert os.pread(fd, SEGMENT_HEADER_BYTES, 0) == header
            _fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        self._segments.append(_Segment(first_seq, path))
        self._fd = fd
        self._seg_end = SEGMENT_HEADER_BYTES
        self._seg_records = 0
        self.stats["segments_created"] += 1

    def _fsync(self, fd: int) -> None:
        # Structural fsyncs (segment creation, rotation, recovery) happen in every
        # mode, ``never`` included: they are rare and keep the recovery rules true.
        try:
            _fdatasync(fd)
        except OSError as e:
            self._failed = e
            raise
        self.stats["fsyncs"] += 1

    # -- group commit --

    def sync(self) -> int:
        """Group commit: make every appended record durable with (at most) one fsync.
        Returns ``durable_seq``. Not to be mixed with an in-flight ``GroupCommitter`` sync."""
        ticket = self.prepare_sync()
        if ticket is None:
            return self._durable_seq
        try:
            self.perform_sync(ticket)
        except OSError as e:
            return self.complete_sync(ticket, e)
        return self.complete_sync(ticket)

    def prepare_sync(self) -> SyncTicket | None:
        """Owner thread: write out the buffer and describe the fsync that would cover
        it; None if everything appended is already durable."""
        self._check_usable()
        if self._ticket is not None:
            raise WALError("a sync is already in flight")
        self._flush()
        if self._durable_seq >= self._last_seq:
            return None
        self._ticket = SyncTicket(self._fd, self._last_seq)
        return self._ticket

    def perform_sync(self, ticket: SyncTicket) -> None:
        """Any thread: the fsync itself. Touches nothing but the file descriptor."""
        if self.mode != "never":
            _fdatasync(ticket.fd)

    def complete_sync(self, ticket: SyncTicket, error: BaseException | None = None) -> int:
        """Owner thread: record the outcome of ``perform_sync``; returns ``durable_seq``."""
        assert self._ticket is ticket, "complete_sync for a ticket that is not in flight"
        self._ticket = None
        for fd in self._retired_fds:
            os.close(fd)
        self._retired_fds.clear()
        if error is not None:
            self._failed = error
            raise WALFailed(f"fsync failed: {error!r}") from error
        if self.mode != "never":
            self.stats["fsyncs"] += 1
        self._durable_seq = max(self._durable_seq, ticket.seq)
        assert self._durable_seq <= self._last_seq
        return self._durable_seq

    # -- compaction / close --

    def compact(self, upto_seq: int) -> int:
        """Delete whole segments whose records are all ``<= upto_seq`` (covered by a
        snapshot). The last segment is never deleted. Returns how many were removed."""
        self._check_usable()
        if upto_seq > self._durable_seq:
            raise ValueError(f"cannot compact past durable seq {self._durable_seq} (asked {upto_seq})")
        removed = 0
        # Bounded by the number of segments; segment i ends where segment i+1 starts.
        while len(self._segments) > 1 and self._segments[1].first_seq - 1 <= upto_seq:
            os.unlink(self._segments[0].path)
            del self._segments[0]
            removed += 1
        if removed:
            _fsync_dir(self.directory)
        return removed

    def close(self) -> None:
        """Write out the buffer and sync it (per the mode), then release the files."""
        if self._closed:
            return
        if self._ticket is not None:
            raise WALError("close() while a sync is in flight; await the committer first")
        try:
            if self._failed is None:
                self.sync()
        finally:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            for fd in self._retired_fds:
                os.close(fd)
            self._retired_fds.clear()
            self._release_lock()

    def abandon(self, *, write_buffer: bool = False) -> None:
        """Drop the files without syncing: what a crashed process leaves behind.
        Buffered appends are lost unless ``write_buffer`` (the process died just after
        its ``write`` call). For tests and fault injection."""
        if self._closed:
            return
        if write_buffer and self._failed is None:
            self._flush()
        self._closed = True
        for fd in [self._fd, *self._retired_fds]:
            if fd >= 0:
                os.close(fd)
        self._fd = -1
        self._retired_fds.clear()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> WAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- asyncio group committer ------------------------------------------------------

DurableCallback = Callable[[BaseException | None], None]


class GroupCommitter:
    """Runs a WAL's fsyncs in one background thread and tells waiters when their
    record is durable. See the module docstring.

    ``waiters_max`` bounds pending waiters; beyond it ``on_durable``/``durable``
    raise ``CommitQueueFull``. Callbacks run on the event loop, in seq order, and
    must not raise (an exception is logged and swallowed so others still run).
    """

    def __init__(self, wal: WAL, *, waiters_max: int = 65536) -> None:
        self._wal = wal
        self._loop = asyncio.get_running_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-fsync")
        self._waiters: list[tuple[int, int, DurableCallback]] = []  # heap by seq
        self._tiebreak = itertools.count()
        self._waiters_max = waiters_max
        self._in_flight: asyncio.Future[None] | None = None
        self._kick_scheduled = False
        self._sync_requested_seq = 0
        self._failed: BaseException | None = None
        self._closed = False

    @property
    def pending_waiters(self) -> int:
        return len(self._waiters)

    def on_durable(self, seq: int, callback: DurableCallback) -> None:
        """Call ``callback(None)`` once ``seq`` is durable (``callback(exc)`` if the
        WAL fails first). Immediate if it already is."""
        if self._failed is not None:
            raise WALFailed(f"WAL failed earlier: {self._failed!r}") from self._failed
        if self._closed:
            raise WALError("committer is closed")
        if seq > self._wal.last_seq:
            raise ValueError(f"seq {seq} has not been appended (last seq {self._wal.last_seq})")
        if seq <= self._wal.durable_seq:
            callback(None)
            return
        if len(self._waiters) >= self._waiters_max:
            raise CommitQueueFull(f"{len(self._waiters)} durability waiters pending")
        heapq.heappush(self._waiters, (seq, next(self._tiebreak), callback))
        self._kick()

    async def durable(self, seq: int) -> int:
        """Wait until ``seq`` is durable; returns the durable seq at that moment."""
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(exc: BaseException | None) -> None:
            if fut.done():  # the waiter was cancelled
                return
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

        self.on_durable(seq, done)
        await fut
        return self._wal.durable_seq

    def request_sync(self) -> None:
        """Sync everything appended so far even though nobody waits on it."""
        if self._failed is None and not self._closed:
            self._sync_requested_seq = self._wal.last_seq
            self._kick()

    def _kick(self) -> None:
        # Deferred to the end of this loop turn so appends made later in the same
        # turn ride on the same fsync.
        if not self._kick_scheduled and self._in_flight is None:
            self._kick_scheduled = True
            self._loop.call_soon(self._start_sync)

    def _wanted_seq(self) -> int:
        return max(self._sync_requested_seq, self._waiters[0][0] if self._waiters else 0)

    def _start_sync(self) -> None:
        self._kick_scheduled = False
        if self._in_flight is not None or self._failed is not None:
            return
        if self._wanted_seq() <= self._wal.durable_seq:
            return
        try:
            if self._wal.mode != "batch":
                # always: already durable; never: only a write to the page cache.
                self._wal.sync()
                self._release(None)
                return
            ticket = self._wal.prepare_sync()
        except BaseException as e:
            self._fail(e)
            return
        if ticket is None:
            self._release(None)
            return
        self._in_flight = self._loop.run_in_executor(self._executor, self._wal.perform_sync, ticket)
        self._in_flight.add_done_callback(lambda fut: self._sync_done(ticket, fut))

    def _sync_done(self, ticket: SyncTicket, fut: asyncio.Future[None]) -> None:
        self._in_flight = None
        error = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        try:
            self._wal.complete_sync(ticket, error)
        except BaseException as e:
            self._fail(e)
            return
        self._release(None)
        # Everything appended while that fsync ran goes in the next one, right away.
        if self._wanted_seq() > self._wal.durable_seq:
            self._start_sync()

    def _release(self, error: BaseException | None) -> None:
        durable = self._wal.durable_seq
        # Bounded by the number of waiters.
        while self._waiters and (error is not None or self._waiters[0][0] <= durable):
            _seq, _n, callback = heapq.heappop(self._waiters)
            try:
                callback(error)
            except Exception:
                log.exception("WAL durability callback raised")

    def _fail(self, error: BaseException) -> None:
        log.error("WAL sync failed, the WAL accepts no more work: %r", error)
        self._failed = error
        self._release(error)

    async def close(self, timeout_s: float = 30.0) -> None:
        """Finish the in-flight fsync, sync for remaining waiters, stop the thread.
        Does not close the WAL."""
        if self._closed:
            return
        async with asyncio.timeout(timeout_s):
            if self._in_flight is not None:
                await asyncio.wait([self._in_flight])
            # Bounded: each pass either completes a sync or fails the committer.
            while self._waiters and self._failed is None:
                self._start_sync()
                if self._in_flight is None:
                    break
                await asyncio.wait([self._in_flight])
        self._closed = True
        self._release(WALError("committer closed"))
        self._executor.shutdown(wait=True)
