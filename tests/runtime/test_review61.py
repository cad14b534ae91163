"""Review 61: the snapshot child's own autogroup (43e2d8f) and the inline committer (78a38e0)."""

from __future__ import annotations

import asyncio
import ctypes
import os

import pytest

import consensus.runtime.node as node_mod
from consensus.storage.wal import WAL, GroupCommitter
from tests.runtime.test_crash_only import single_node

AUTOGROUPS = os.path.exists("/proc/self/autogroup")


def _autogroup_nice(pid: int | str) -> int:
    with open(f"/proc/{pid}/autogroup") as f:  # "/autogroup-123 nice 19"
        return int(f.read().split()[-1])


@pytest.mark.skipif(not AUTOGROUPS or os.geteuid() != 0, reason="needs autogroups, and root to drop to a plain user")
def test_the_snapshot_child_gets_nice_19_even_right_after_another_autogroup_change():
    """Without CAP_SYS_ADMIN the kernel takes one autogroup nice change per 100 ms
    system-wide (EAGAIN otherwise: proc_sched_autogroup_set_nice). A child that
    meets that window (another replica's child, a promotion, any user's write) was
    left in a session of its own at nice 0: a whole group's share beside its
    replica's, where the idle class no longer yields to the loop."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # an unprivileged replica's snapshot child
        code = 1
        try:
            os.close(r)
            other = os.fork()
            if other == 0:  # someone else changes its own (new, throwaway) autogroup now
                try:
                    os.setsid()
                    with open("/proc/self/autogroup", "w") as f:
                        f.write("19")
                finally:
                    os._exit(0)
            os.waitpid(other, 0)
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self ours again, as after an exec
            node_mod.snapshot_child_priority()
            os.write(w, str(_autogroup_nice("self")).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        out = os.read(r, 64)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert out == b"19"


async def test_a_promotion_that_meets_the_rate_limit_tries_again(tmp_path, monkeypatch):
    """``_promote_snapshot_child`` lifts the child's group to nice 10; an EAGAIN left it
    at 19 for good (the promotion runs once), the log growing under overload."""
    writes: list[tuple[str, int]] = []
    monkeypatch.setattr(node_mod, "AUTOGROUP_RETRY_S", 0.01)

    def set_nice(pid: str, nice: int) -> bool:
        writes.append((pid, nice))
        return len(writes) > 2  # EAGAIN twice, then done

    monkeypatch.setattr(node_mod, "_set_autogroup_nice", set_nice)
    monkeypatch.setattr(node_mod.os, "sched_setscheduler", lambda *a: None)
    monkeypatch.setattr(node_mod.os, "setpriority", lambda *a: None)
    node = single_node(tmp_path)
    node._snap_child = 4242
    node._promote_snapshot_child(4242)
    for _ in range(100):
        if len(writes) >= 3:
            break
        await asyncio.sleep(0.01)
    assert writes == [("4242", 10)] * 3
    assert node.stats["snapshot_child_promoted"] == 1
    node._snap_child = 0  # nothing to kill
    node.wal.close()


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
async def test_close_syncs_a_waiter_registered_by_a_released_callback(inline, tmp_path):
    """close() "syncs for remaining waiters": a callback released by its sync that
    appends and waits again is synced too, inline as with the thread (inline, close
    ran one sync and failed the second waiter with "committer closed")."""
    wal, _ = WAL.open(tmp_path)
    committer = GroupCommitter(wal, inline=inline)
    heard: list = []

    def first(exc):
        heard.append(("first", exc))
        if exc is None:
            committer.on_durable(wal.append(b"b"), lambda exc: heard.append(("second", exc)))

    committer.on_durable(wal.append(b"a"), first)
    await committer.close()
    assert heard == [("first", None), ("second", None)], heard
    wal.close()


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
async def test_a_waiter_made_durable_by_a_rotation_is_released(inline, tmp_path):
    """A rotation fsyncs the finished segment (durable_seq = last_seq). A waiter it
    covered before its turn's sync ran was never called: _start_sync saw nothing
    to sync and returned without releasing (pre-existing; both modes)."""
    wal, _ = WAL.open(tmp_path, segment_bytes_max=1024)
    committer = GroupCommitter(wal, inline=inline)
    heard: list = []
    committer.on_durable(wal.append(b"a" * 100), heard.append)
    segments = wal.stats["segments_created"]
    while wal.stats["segments_created"] == segments:  # same turn: a rotation
        wal.append(b"b" * 100)
    async with asyncio.timeout(5):
        while not heard:
            await asyncio.sleep(0.01)
    assert heard == [None]
    await committer.close()
    wal.close()


CHILD_OF_A_KILLED_REPLICA = r"""
import os, sys, time
import consensus.runtime.node as node_mod
parent = os.getpid()
pid = os.fork()
if pid == 0:  # the snapshot child, as _fork_snapshot starts it
    try:
        try:
            node_mod.snapshot_child_priority(parent)
        except TypeError:  # before review 61
            node_mod.snapshot_child_priority()
        time.sleep(5)  # encoding a large state
    finally:
        os._exit(0)
with open(sys.argv[1], "w") as f:
    f.write(str(pid))
os.kill(parent, 9)  # the replica is killed (kill -9, the OOM killer)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux")
def test_the_snapshot_child_does_not_outlive_a_killed_replica(tmp_path):
    """The child shares its replica's open files: the WAL's flock, the listening peer
    and client sockets. Orphaned, it kept them (a restarted replica: "WAL directory
    ... is locked", or its port in use) for as long as it ran, in its own session
    now (no hangup from the terminal) and at nice 19 in the idle class, never
    promoted: on a busy machine, indefinitely. It dies with its replica."""
    import subprocess
    import sys
    import time

    out = tmp_path / "child"
    subprocess.run([sys.executable, "-c", CHILD_OF_A_KILLED_REPLICA, str(out)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=30, env={**os.environ, "PYTHONPATH": os.getcwd()})
    child = int(out.read_text())
    deadline = time.monotonic() + 2
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)
