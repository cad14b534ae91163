"""Disk faults for the nemesis (issue 14): what a crash, bit rot and a full disk do to a
replica's write-ahead log, applied to real data directories (``jepsen_like.db``).

The WAL's promises (``consensus.storage.wal``, docs/storage.md "Recovery rules"): a torn
tail of the last segment (bytes after its last intact commit marker) is truncated at
open, with one warning naming the file and offset; damage that a crash cannot explain
(anywhere in a sealed segment, or before a point a later intact commit marker vouches
was durable) is refused (``WALCorruption``: the node exits with one line, status 2,
nothing modified); a failed write or fsync (ENOSPC) stops the node (crash-only, status
1, one line) and a restart recovers from what is durable.

- ``tear_tail``: on a stopped node, a torn write after the end of the log: part of a
  batch that never completed (a record header and some of its payload, no commit
  marker), appended to the last segment. This is the un-fsynced tail of a crash: the
  bytes of a write that reached the disk only in part. Recovery must drop it.
  (Truncating *into* the last batch is not done: from outside one cannot tell whether
  that batch had been fsynced and acknowledged, and dropping an acknowledged batch is
  outside the crash model; docs/storage.md: bit rot confined to the last batch is
  indistinguishable from a torn write and is truncated.)
- ``flip_byte``: on a stopped node, one byte of a *durable* record inverted: a byte of a
  sealed segment, or of the last segment before the point its last intact commit
  marker vouches for. Recovery must refuse to start; ``unflip`` puts the byte back
  (the disk replaced from a mirror), so the replica comes back with exactly what it
  had acknowledged. Wiping such a replica instead is what docs/operations.md forbids
  (a replica back with an empty data dir under its old id forgot its promises).
- ``Tmpfs`` and ``fill``: a node's data dir on a small tmpfs of its own, filled by a
  filler file while the node runs (ENOSPC), emptied afterwards (as
  tests/runtime/test_disk_full.py does).
"""

from __future__ import annotations

import errno
import os
import random
import struct
import subprocess
import time
from typing import Any

from consensus.storage import wal as W

__all__ = ["Tmpfs", "fill", "flip_byte", "last_segment", "segments", "tear_tail", "unflip", "vouched_end"]


def segments(data_dir: str) -> list[str]:
    d = os.path.join(data_dir, "wal")
    try:
        names = sorted(n for n in os.listdir(d) if W._SEGMENT_NAME.match(n))
    except FileNotFoundError:
        return []
    return [os.path.join(d, n) for n in names]


def last_segment(data_dir: str) -> str | None:
    segs = segments(data_dir)
    return segs[-1] if segs else None


def vouched_end(path: str) -> int:
    """How far the segment's intact commit markers vouch it was durable (the largest
    ``durable_end`` of a valid marker; the header size if none), walking records and
    markers from the header. Versions 2 and 3 only, one layout (0 for anything else)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < W.SEGMENT_HEADER_BYTES:
        return 0
    magic, version, _flags, _first, salt, _crc = W._SEGMENT_HEADER.unpack_from(data, 0)
    if magic != W.SEGMENT_MAGIC or version not in W.SEGMENTS_SAME_LAYOUT:
        return 0
    pos = claimed = W.SEGMENT_HEADER_BYTES
    size = len(data)
    while pos + W.RECORD_HEADER_BYTES <= size:  # advances by >= 16 bytes a pass
        length, _crc, _seq = W._RECORD_HEADER.unpack_from(data, pos)
        if length == W.COMMIT_TAG:
            if pos + W.COMMIT_MARKER_BYTES > size:
                break
            _t, mcrc, _last, _bb, _bc, durable_end = W._COMMIT.unpack_from(data, pos)
            if W._marker_crc(salt, memoryview(data)[pos + 8: pos + W.COMMIT_MARKER_BYTES]) != mcrc:
                break
            claimed = max(claimed, durable_end)
            pos += W.COMMIT_MARKER_BYTES
            continue
        if length == 0 and data[pos: pos + W.RECORD_HEADER_BYTES] == bytes(W.RECORD_HEADER_BYTES):
            break
        pos += W.RECORD_HEADER_BYTES + length
    return claimed


def flip_byte(data_dir: str, rng: random.Random) -> dict[str, Any] | None:
    """Invert one byte of a durable record (see the module docstring); what was done,
    or None if nothing is durable yet beyond the headers."""
    segs = segments(data_dir)
    choices: list[tuple[str, int, int]] = []  # (path, first offset, end offset)
    for i, path in enumerate(segs):
        size = os.path.getsize(path)
        end = size if i < len(segs) - 1 else min(size, vouched_end(path))
        if end > W.SEGMENT_HEADER_BYTES:
            choices.append((path, W.SEGMENT_HEADER_BYTES, end))
    if not choices:
        return None
    path, lo, hi = choices[-1] if rng.random() < 0.7 else rng.choice(choices)  # mostly the last segment
    offset = rng.randrange(lo, hi)
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)[0]
        new = old ^ (1 << rng.randrange(8))
        f.seek(offset)
        f.write(bytes([new]))
        f.flush()
        os.fsync(f.fileno())
    return {"path": path, "offset": offset, "old": old, "new": new, "vouched_to": hi}


def unflip(info: dict[str, Any]) -> None:
    with open(info["path"], "r+b") as f:
        f.seek(info["offset"])
        f.write(bytes([info["old"]]))
        f.flush()
        os.fsync(f.fileno())


def tear_tail(data_dir: str, rng: random.Random) -> dict[str, Any] | None:
    """Append a torn write (a record header and part of its payload, no marker) to the
    last segment; what was done, or None if there is no segment."""
    path = last_segment(data_dir)
    if path is None:
        return None
    length = rng.randrange(64, 4096)
    seq = rng.randrange(1, 1 << 40)
    header = struct.pack(">IIQ", length, rng.getrandbits(32), seq)
    torn = header + rng.randbytes(rng.randrange(0, length))
    torn = torn[: rng.randrange(1, len(torn) + 1)]  # the write stopped anywhere in it
    offset = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(torn)
        f.flush()
        os.fsync(f.fileno())
    return {"path": path, "offset": offset, "bytes": len(torn)}


class Tmpfs:
    """A tmpfs of ``size`` mounted at ``path`` (root only); ``umount`` is bounded."""

    def __init__(self, path: str, size: str = "64m") -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", path],
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise OSError(f"cannot mount a tmpfs on {path}: {out.stderr.strip() or out.returncode}")
        self.mounted = True

    def umount(self) -> None:
        if not self.mounted:
            return
        for _ in range(50):  # bounded: a process that just exited may still hold a file
            if subprocess.run(["umount", self.path], capture_output=True, timeout=30).returncode == 0 \
                    or not os.path.ismount(self.path):
                self.mounted = False
                return
            time.sleep(0.1)
        subprocess.run(["umount", "-l", self.path], capture_output=True, timeout=30)
        self.mounted = False


def can_mount() -> str | None:
    """None if a tmpfs can be mounted here, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    import tempfile

    d = tempfile.mkdtemp(prefix="cellar-tmpfs-probe-")
    try:
        t = Tmpfs(d, "1m")
        t.umount()
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    finally:
        try:
            os.rmdir(d)
        except OSError:
            pass


def fill(path: str) -> int:
    """Write ``path`` until its file system has no page left; the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    total = 0
    try:
        for chunk in (1 << 20, 4096):
            block = b"\0" * chunk
            for _ in range(1 << 16):  # bounded: the file system is a few MiB
                try:
                    total += os.write(fd, block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return total
