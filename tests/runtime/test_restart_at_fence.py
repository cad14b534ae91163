"""Review 16b: ``WAL.restart_at`` (the recovery of a replica whose WAL lost records its
version-3 snapshot restates: ``fsync = "never"`` and a power loss) against the format
fence and ``Node._check_wal_reaches``. Each test failed before the fix:

1. ``restart_at`` deleted every segment, the version-3 one included, before it
   created the new one. A crash in between left version-3 snapshots and no WAL
   segment (or only a torn creation, which every build deletes at open): nothing
   fenced the data dir off from d59f900, which started on an empty state. Now the
   new segment (version 3, flagged ``FLAG_RESTART``) is made first and recovery
   finishes an interrupted restart.
2. After ``restart_at`` the WAL is one empty segment at ``snap.seq + 1``, and
   ``_check_wal_reaches`` skipped an empty WAL: with the newest snapshot later
   damaged, the older one loaded without the records between the two. Now an
   empty WAL is checked like any other (its first seq is where the next record goes).
3. The same with a version-2 fallback (a restored or upgraded data dir): the
   snapshots older than the one ``restart_at`` relies on are deleted first (they
   need the records it drops), so later damage is "no intact snapshot": refused.
"""

from __future__ import annotations

import dataclasses
import os
import struct

import pytest

import consensus.storage.wal as walmod
from consensus.runtime.node import NodeError
from consensus.storage.snapshot import load_latest
from consensus.storage.wal import WAL, SEGMENT_HEADER_BYTES
from store.server import make_node
from tests.runtime.test_snapshot_fork import _put
from tests.runtime.test_format_fence import _data_dirs, _recovered, _segments, open_with_the_build_before
from tests.runtime.test_snapshot_pause import PAD, _configs, _snapshot, _start, _stop



async def _never_dirs(tmp_path, snapshots: int = 3, puts: int = 120):
    """``_data_dirs`` with ``fsync = "never"`` (the mode restart_at exists for)."""
    return await _data_dirs(tmp_path, snapshots, puts, fsync="never")


def _damage_newest(snap_dir: str) -> None:
    """One byte of the newest snapshot file flipped (the case two are kept for)."""
    names = sorted(n for n in os.listdir(snap_dir) if n.endswith(".snap"))
    path = os.path.join(snap_dir, names[-1])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0xFF]))


def _power_loss(cfg) -> int:
    """A power loss under ``fsync = "never"``: the last segment keeps its (fsynced)
    header and loses every record (only ever handed to the page cache). Returns the
    newest snapshot's seq, which must be above what the WAL keeps."""
    snap = load_latest(os.path.join(cfg.data_dir, "snapshots"))
    assert snap is not None and snap.live
    last = _segments(cfg)[-1]
    assert int(os.path.basename(last)[4:-4]) <= snap.seq, "the last segment must hold records the snapshot restates"
    os.truncate(last, SEGMENT_HEADER_BYTES)
    return snap.seq


class _Crash(Exception):
    """Injected: the process dies here."""


def _crash_when_unfenced(monkeypatch, cfg) -> None:
    """Inside restart_at, at each durable step (a directory fsync of the WAL dir):
    if no intact version-3 segment is left, the process dies there."""
    wal_dir = os.path.join(cfg.data_dir, "wal")
    inside = [False]
    real_fsync_dir, real_restart_at = walmod.fsync_dir, WAL.restart_at

    def fsync_dir(directory):
        real_fsync_dir(directory)
        if inside[0] and os.path.abspath(directory) == os.path.abspath(wal_dir):
            if 3 not in [v for _p, v in _segment_versions(cfg)]:
                raise _Crash("the process dies with no version-3 segment in the WAL")

    def restart_at(self, first_seq):
        inside[0] = True
        try:
            return real_restart_at(self, first_seq)
        finally:
            inside[0] = False

    monkeypatch.setattr(walmod, "fsync_dir", fsync_dir)
    monkeypatch.setattr(WAL, "restart_at", restart_at)


def _segment_versions(cfg) -> list:
    out = []
    for path in _segments(cfg):
        with open(path, "rb") as f:
            head = f.read(SEGMENT_HEADER_BYTES)
        if len(head) == SEGMENT_HEADER_BYTES and head[:8] == walmod.SEGMENT_MAGIC:
            out.append((path, struct.unpack_from(">H", head, 8)[0]))
    return out


def _open_crashing_inside_restart_at(monkeypatch, cfg) -> None:
    _crash_when_unfenced(monkeypatch, cfg)
    node = make_node(cfg)
    try:
        node.open()
    except (_Crash, NodeError):
        node.wal._release_lock()
    else:
        node.wal.close()
    monkeypatch.undo()


async def test_a_crash_inside_restart_at_leaves_a_v3_data_dir_without_a_v3_segment(tmp_path, monkeypatch):
    cfgs, acked = await _never_dirs(tmp_path)
    cfg = cfgs[0]
    _power_loss(cfg)

    _open_crashing_inside_restart_at(monkeypatch, cfg)  # dies where the WAL holds no v3 segment, if ever

    snap = load_latest(os.path.join(cfg.data_dir, "snapshots"))
    assert snap is not None and snap.live  # version-3 snapshots are still there
    versions = []
    for path in _segments(cfg):
        with open(path, "rb") as f:
            versions.append(struct.unpack_from(">H", f.read(10), 8)[0])
    # The fence the change relies on ("a data dir that holds a version-3 snapshot
    # always holds a version-3 segment") no longer holds:
    assert any(v >= 3 for v in versions), f"version-3 snapshots, WAL segment versions {versions}: no fence"


async def test_a_reader_of_versions_1_and_2_starts_empty_after_a_crash_inside_restart_at(tmp_path, monkeypatch):
    """The same state, opened by a reader of versions 1 and 2 (this build's reader
    narrowed, as in test_format_fence): the WAL opens; with -m slow, d59f900 itself."""
    cfgs, acked = await _never_dirs(tmp_path)
    cfg = cfgs[0]
    _power_loss(cfg)
    _open_crashing_inside_restart_at(monkeypatch, cfg)
    current = walmod.SEGMENT_VERSION
    monkeypatch.setattr(walmod, "SEGMENTS_SAME_LAYOUT", (2,))
    monkeypatch.setattr(walmod, "SEGMENT_VERSION", 2)
    # A reader of 1 and 2 must refuse this data dir (its snapshots are version 3).
    with pytest.raises(walmod.WALCorruption, match=f"unsupported segment version {current}"):
        wal, _ = WAL.open(os.path.join(cfg.data_dir, "wal"))
        wal.close()


@pytest.mark.slow
async def test_d59f900_refuses_the_data_dir_after_a_crash_inside_restart_at(tmp_path, monkeypatch):
    cfgs, acked = await _never_dirs(tmp_path / "new")
    cfg = cfgs[0]
    _power_loss(cfg)
    _open_crashing_inside_restart_at(monkeypatch, cfg)
    res = open_with_the_build_before(tmp_path, cfg)
    assert res["refused"], f"d59f900 started on this data dir with {res['keys']} of {len(acked)} acknowledged keys"


async def test_an_older_snapshot_after_restart_at_is_refused_like_a_non_empty_wal(tmp_path):
    cfgs, acked = await _never_dirs(tmp_path)
    cfg = cfgs[0]
    newest = _power_loss(cfg)
    node = make_node(cfg)
    node.open()  # restart_at(newest + 1): the WAL is one empty segment
    assert (node.wal.first_seq, node.wal.last_seq) == (newest + 1, newest)
    node.wal.close()
    assert {k: v for k, v in _recovered(cfg).items() if k in acked} == acked  # all there, from the snapshot
    # The newest snapshot is damaged later (the case two are kept for).
    snap_dir = os.path.join(cfg.data_dir, "snapshots")
    _damage_newest(snap_dir)
    older = load_latest(snap_dir)
    assert older is None or older.seq < newest
    # Records older.seq+1 .. newest are only in the damaged file: refuse, as for a
    # non-empty WAL that starts at newest + 1.
    node = make_node(cfg)
    try:
        node.open()
    except NodeError as e:
        assert "missing" in str(e)
        return
    data = dict(node.replica.executor.sm.data)
    node.wal.close()
    lost = sorted(k for k, v in acked.items() if data.get(k) != v)
    pytest.fail(f"started on the older snapshot (seq {older and older.seq}) with an empty WAL at seq {newest + 1}: "
                f"{len(lost)} of {len(acked)} acknowledged writes lost, e.g. {lost[:3]}")


async def test_a_restored_v2_snapshot_after_restart_at_is_refused_too(tmp_path):
    """The same hole with a version-2 snapshot as the fallback (``cellar snapshot
    restore`` writes one; an upgraded data dir has them): ``_check_wal_reaches``
    checks nothing after a snapshot without live records, and restart_at deleted
    the log it needs, so the replica starts on the restored state, every write made
    since the restore gone."""
    from consensus.storage.snapshot import Snapshot, write_snapshot

    src, _ = await _never_dirs(tmp_path / "a", snapshots=1, puts=20)
    seed = load_latest(os.path.join(src[0].data_dir, "snapshots"))
    cfgs = [dataclasses.replace(c, fsync="never") for c in _configs(tmp_path / "b")]
    for cfg in cfgs:  # what `cellar snapshot restore` writes
        write_snapshot(os.path.join(cfg.data_dir, "snapshots"), Snapshot(0, seed.meta, seed.body, slot=seed.slot),
                       keep=1)
    nodes = await _start(cfgs)
    acked: dict[str, str] = {}
    try:
        for i in range(120):
            await _put(nodes[0], i + 1, f"r{i}", f"v{i}" + PAD)
            acked[f"r{i}"] = f"v{i}" + PAD
        await _snapshot(nodes, 0)
    finally:
        await _stop(nodes)
    cfg = cfgs[0]
    newest = _power_loss(cfg)
    node = make_node(cfg)
    node.open()  # restart_at(newest + 1)
    node.wal.close()
    snap_dir = os.path.join(cfg.data_dir, "snapshots")
    _damage_newest(snap_dir)
    fallback = load_latest(snap_dir)
    assert fallback is None or not fallback.live  # the restored one, unless a fix pruned it
    node = make_node(cfg)
    try:
        node.open()
    except NodeError:
        return
    data = dict(node.replica.executor.sm.data)
    node.wal.close()
    lost = sorted(k for k, v in acked.items() if data.get(k) != v)
    pytest.fail(f"started on the restored snapshot with an empty WAL at seq {newest + 1}: "
                f"{len(lost)} of {len(acked)} acknowledged writes lost")
