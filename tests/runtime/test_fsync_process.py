"""The fsync in a child process (``fsync_worker = "process"``;
``consensus.storage.wal.FsyncProcess``): nothing is reported durable before the
child's ``fdatasync`` answered; its error, or its death, fails the WAL for good (a
retried fsync may not see an error the first one consumed); and a replica killed with
SIGKILL leaves no fsync process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from consensus.storage.wal import WAL, FsyncProcess, GroupCommitter, WALError, WALFailed
from store.server import LocalCluster

WAIT_S = 10.0


async def test_records_are_durable_only_after_the_child_answered(tmp_path):
    wal, _ = WAL.open(str(tmp_path / "wal"), fsync="batch")
    committer = GroupCommitter(wal, process=True)
    try:
        assert committer._process is not None and committer._executor is None
        child = committer._process._proc
        os.kill(child.pid, signal.SIGSTOP)  # hold its fsync
        seq = wal.append(b"a")
        waiter = asyncio.ensure_future(committer.durable(seq))
        for _ in range(20):  # the loop keeps turning; the record stays not durable
            await asyncio.sleep(0)
        assert not waiter.done() and wal.durable_seq < seq
        more = wal.append(b"b")  # appended while the first sync is in flight: the next one covers it
        os.kill(child.pid, signal.SIGCONT)
        async with asyncio.timeout(WAIT_S):
            assert await waiter >= seq
            assert await committer.durable(more) >= more
        assert wal.stats["fsyncs"] >= 2
    finally:
        await committer.close()
        wal.close()
    assert committer._process._proc.returncode is not None, "close() ends the child"


async def test_an_fsync_error_in_the_child_fails_the_wal_for_good(tmp_path):
    wal, _ = WAL.open(str(tmp_path / "wal"), fsync="batch")
    committer = GroupCommitter(wal, process=True)
    read_end, write_end = os.pipe()  # fdatasync on a pipe fails (EINVAL)
    real_submit = committer._process.submit
    committer._process.submit = lambda fd: real_submit(write_end)
    try:
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(WALFailed, match="fsync failed"):
                await committer.durable(wal.append(b"a"))
            with pytest.raises(WALFailed):
                await committer.durable(wal.append(b"b"))
        assert wal.durable_seq == 0
    finally:
        await committer.close()
        os.close(read_end)
        os.close(write_end)


async def test_the_childs_death_fails_the_wal_rather_than_retrying(tmp_path):
    wal, _ = WAL.open(str(tmp_path / "wal"), fsync="batch")
    committer = GroupCommitter(wal, process=True)
    try:
        child = committer._process._proc
        child.kill()
        child.wait(timeout=WAIT_S)
        async with asyncio.timeout(WAIT_S):
            with pytest.raises((WALFailed, WALError)):
                await committer.durable(wal.append(b"a"))
        assert wal.durable_seq == 0
    finally:
        await committer.close()


async def test_the_child_gets_each_request_answered_in_turn(tmp_path):
    """FsyncProcess alone: a request per descriptor, each answered by id."""
    proc = FsyncProcess(asyncio.get_running_loop())
    try:
        fds = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644) for i in range(3)]
        for fd in fds:
            os.write(fd, b"x")
        async with asyncio.timeout(WAIT_S):
            await asyncio.gather(*(proc.submit(fd) for fd in fds))
        for fd in fds:
            os.close(fd)
    finally:
        proc.close()
    assert proc._proc.returncode == 0


def _children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_replica_leaves_no_fsync_process(tmp_path):
    cluster = LocalCluster(str(tmp_path), 3, extra_args=["--fsync-worker", "process"])
    try:
        cluster.start_all()
        cluster.wait_ready()
        pid = cluster.procs[0].pid
        kids = _children(pid)
        assert len(kids) == 1, kids
        with open(f"/proc/{kids[0]}/cmdline", "rb") as f:
            assert b"-I\0-S\0-c\0" in f.read()
        os.kill(pid, signal.SIGKILL)
        cluster.procs[0].wait(timeout=WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while _alive(kids[0]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _alive(kids[0]), "the fsync process outlived its replica"
    finally:
        cluster.stop_all()


async def test_close_with_a_sync_that_never_answers_fails_its_waiter_and_returns(tmp_path):
    """Review 69: the close timeout left the waiter pending forever and the loop blocked
    in an unbounded wait for the child."""
    wal, _ = WAL.open(str(tmp_path / "wal"), fsync="batch")
    committer = GroupCommitter(wal, process=True)
    child = committer._process._proc
    os.kill(child.pid, signal.SIGSTOP)  # its fdatasync never answers
    waiter = asyncio.ensure_future(committer.durable(wal.append(b"a")))
    for _ in range(10):
        await asyncio.sleep(0)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await committer.close(timeout_s=0.2)
    assert time.monotonic() - started < 3
    async with asyncio.timeout(WAIT_S):
        with pytest.raises((WALError, WALFailed)):
            await waiter
    assert wal.durable_seq == 0
    child.wait(timeout=WAIT_S)  # killed (a stopped process dies of SIGKILL)
