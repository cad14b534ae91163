"""The crash-state harness (tests/storage/crash_states.py, issue 17): the short version
runs here; the full enumeration is ``python3 -m tests.storage.crash_states --full`` or
``python3 -m pytest -m slow tests/storage/test_crash_states.py``. The harness is also
shown to catch each storage bug issue 17 describes, re-introduced one at a time."""

from __future__ import annotations

import logging
import os
import shutil
import sys

import pytest

import consensus.storage.snapshot as snapmod
import consensus.storage.wal as walmod
from tests.storage import crash_states as cs


@pytest.fixture
def workdir():
    d = cs._workdir()
    logging.getLogger("store").setLevel(logging.ERROR)
    yield d
    logging.getLogger("store").setLevel(logging.NOTSET)
    shutil.rmtree(d, ignore_errors=True)


def test_short_enumeration_loses_nothing_acknowledged_and_always_starts(workdir):
    figs = cs.short_run(workdir)
    print(cs.report(figs, 0))
    failures = [f for fig in figs for f in fig.failures]
    assert failures == []
    assert sum(f.distinct for f in figs) >= 5000
    assert sum(f.ext4 for f in figs) >= 2000
    assert {f.scenario for f in figs} == set(cs.SCENARIOS)


@pytest.mark.slow
def test_full_enumeration(workdir):
    figs = cs.full_run(workdir)
    print(cs.report(figs, 0))
    assert [f for fig in figs for f in fig.failures] == []
    assert sum(f.distinct for f in figs) >= 40_000


def test_the_model_loses_only_what_was_not_synced(workdir):
    ops = [("mkdir", "d"), ("fsync_dir", "."), ("create", "d/f"), ("write", "d/f", 0, b"a" * 5000),
           ("fsync", "d/f"), ("write", "d/f", 5000, b"b" * 5000)]
    states = list(cs.crash_states(ops, full=True))
    last = [s for s in states if s.where.startswith("after op 5")]
    contents = {s.files.get("d/f") for s in last}
    assert None in contents  # the create was never made durable by a directory fsync
    kept = {c for c in contents if c is not None}
    assert b"a" * 5000 in kept and b"a" * 5000 + b"b" * 5000 in kept
    assert any(c[4096:5000] == b"a" * 904 and c[5000:8192] == bytes(3192) and c[8192:] == b"b" * 1808
               for c in kept if len(c) == 10000)  # a page lost, a later one kept
    assert all(c[:5000] == b"a" * 5000 for c in kept)  # synced bytes never change


# --- the harness catches the bugs ----------------------------------------------------


def _failures(workdir, scenarios, crash_ats=None) -> list[str]:
    out = []
    for name in scenarios:
        out += cs.explore(name, full=False, workdir=workdir, crash_ats=crash_ats).failures
    return out


def test_it_catches_compaction_with_one_directory_fsync_at_the_end(workdir, monkeypatch):
    def compact(self, upto):
        removed = 0
        while len(self._segments) > 1 and self._segments[1].first_seq - 1 <= upto:
            walmod.os.unlink(self._segments.pop(0).path)
            removed += 1
        if removed:
            walmod.fsync_dir(self.directory)
        return removed

    monkeypatch.setattr(walmod.WAL, "compact", compact)
    assert any("refused to start" in f for f in _failures(workdir, ["compact-many-segments"]))


def test_it_catches_a_snapshots_folder_never_synced_into_its_parent(workdir, monkeypatch):
    plain = lambda d: walmod.os.makedirs(d, exist_ok=True)  # noqa: E731
    monkeypatch.setattr(snapmod, "makedirs_durable", plain)
    real = cs.makedirs_durable
    monkeypatch.setattr(cs, "makedirs_durable", lambda d: plain(d) if d.endswith("snapshots") else real(d))
    assert any("gap" in f or "lost" in f for f in _failures(workdir, ["snapshot-compact"]))


def test_it_catches_a_recovery_that_does_not_sync_the_directory(workdir, monkeypatch):
    real = walmod.fsync_dir

    def fsync_dir(d):
        if sys._getframe(1).f_code.co_name != "_recover":
            real(d)

    monkeypatch.setattr(walmod, "fsync_dir", fsync_dir)
    # A process crash just before a rotation's directory fsync, then a restart.
    ops = cs.run_scenario("restart", workdir)
    rotation_fsync = next(i for i, o in enumerate(ops) if o[0] == "fsync_dir" and o[1].endswith("wal")
                          and i > 20)
    failures = _failures(workdir, ["restart"], crash_ats=[rotation_fsync])
    assert any("lost acknowledged" in f for f in failures)


def test_it_catches_a_zero_hole_treated_as_corruption(workdir, monkeypatch):
    """The rule before format 2: damage followed by any later log data refuses to start."""
    monkeypatch.setattr(walmod, "_claim_after",
                        lambda data, salt, start, first: (start, start + 1)
                        if data.find(walmod._COMMIT_TAG_BYTES, start + 1) != -1 else None)
    assert any("refused to start" in f for f in _failures(workdir, ["append-sync"]))


def test_it_catches_an_ack_before_the_fsync(workdir, monkeypatch):
    def sync(self):
        ticket = self.prepare_sync()
        if ticket is not None:
            self._ticket = None
            self._durable_seq = ticket.seq
        return self._durable_seq

    monkeypatch.setattr(walmod.WAL, "sync", sync)
    failures = _failures(workdir, ["append-sync"])
    assert any("lost acknowledged" in f and "[ext4" in f for f in failures)


def test_it_catches_a_snapshot_loaded_without_syncing_its_folder(workdir, monkeypatch):
    # Before WAL.restart_at, recovery deletes the older snapshots (snapshot.keep_only),
    # which syncs the folder too: the planted bug skips both syncs.
    real = walmod.fsync_dir

    def fsync_dir(d):
        if sys._getframe(1).f_code.co_name not in ("load_latest", "keep_only"):
            real(d)

    monkeypatch.setattr(snapmod, "fsync_dir", fsync_dir)
    ops = cs.run_scenario("snapshot-compact", workdir)
    # The process dies right after renaming its first snapshot into place.
    after_rename = next(i for i, o in enumerate(ops) if o[0] == "rename") + 1
    failures = _failures(workdir, ["snapshot-compact"], crash_ats=[after_rename])
    assert any("gap" in f or "lost" in f for f in failures)
    assert os.path.isdir(workdir)


def test_it_catches_new_records_numbered_below_the_snapshots_seq(workdir, monkeypatch):
    """A snapshot with live records replaces the WAL records up to its seq; after a
    power loss took WAL records it covers, the log must go on after that seq
    (WAL.restart_at), or the next recovery skips what was appended since."""
    monkeypatch.setattr(walmod.WAL, "restart_at", lambda self, first_seq: None)
    failures = _failures(workdir, ["snapshot-compact"])
    assert any("did not survive a reopen" in f and "[ext4" in f for f in failures)
