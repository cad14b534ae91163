"""Crash-only runtime (consensus.runtime.node): anything the node cannot reason about
stops it, and the driver carries out each Ready as persist → send → reply → install.

In-process nodes run alone on 127.0.0.1 (the core runs for real, its peers are not
started); the last tests run ``cellar serve`` processes with the test-only fault hook.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import subprocess
import sys
import threading

import msgpack
import pytest

import consensus.runtime.node as node_mod
from consensus.core.config import ProtocolConfig
from consensus.core.ready import Ready, Reply
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine
from consensus.runtime.node import Node, NodeConfig
from store.server import make_node
from consensus.storage.snapshot import load_latest
from store.client import CellarClient
from store.server import TEST_CORE_FAULT_ENV, free_ports

from .conftest import committing

WAIT_S = 10.0


def single_node(tmp_path, n: int = 3, node_id: int = 0, **kw) -> Node:
    # These tests replace the WAL's sync methods in this process: the fsync on the loop
    # (or, asked for, in a thread), not in the default's child process.
    kw.setdefault("fsync_worker", "loop")
    *peers, client = free_ports(n + 1)
    cfg = NodeConfig(node_id=node_id, peers={i: ("127.0.0.1", p) for i, p in enumerate(peers)},
                     client_address=("127.0.0.1", client), data_dir=str(tmp_path / f"n{node_id}"), **kw)
    node = make_node(cfg)
    node.open()
    return node


async def stopped(node: Node) -> str:
    async with asyncio.timeout(WAIT_S):
        await node.stopped.wait()
    assert node.failure is not None
    return node.failure


class FakeConn:
    """Stands in for a client connection: records what the node answers."""

    def __init__(self) -> None:
        self.replies: list = []
        self.got = asyncio.Event()

    def reply(self, item: list) -> None:
        self.replies.append(item)
        self.got.set()

    def flush(self) -> None:
        pass


# --- the core raises ---------------------------------------------------------------


async def test_tick_raising_stops_the_node(tmp_path):
    node = single_node(tmp_path)
    calls = []

    def bad_tick():
        calls.append(1)
        raise ZeroDivisionError("tick bug")

    node.replica.tick = bad_tick
    await node.start()
    try:
        failure = await stopped(node)
        assert failure.startswith("core raised ZeroDivisionError: tick bug (in tick)"), failure
        assert len(calls) == 1  # the timer was not re-armed into a second failure
        with open(os.path.join(node.cfg.data_dir, "crash.log")) as f:
            assert "ZeroDivisionError: tick bug" in f.read()
        with pytest.raises(OSError):  # nobody serves clients any more
            await asyncio.open_connection(*node.cfg.client_address)
    finally:
        await node.stop()


async def test_propose_raising_stops_the_node_and_answers_nobody(tmp_path):
    node = single_node(tmp_path)
    await node.start()
    try:
        def bad_propose(*args, **kwargs):
            raise KeyError("propose bug")

        node.replica.propose = bad_propose
        async with CellarClient([node.cfg.client_address], timeout_s=1.0, deadline_s=WAIT_S) as cellar:
            write = asyncio.ensure_future(cellar.session().put("k", "v"))
            failure = await stopped(node)
            assert "core raised KeyError" in failure and "(in propose)" in failure, failure
            assert not write.done() or write.exception() is not None  # never acknowledged
            write.cancel()
    finally:
        await node.stop()


# --- persist before you promise ----------------------------------------------------


async def test_output_waits_for_every_earlier_record_not_only_its_own(tmp_path):
    """A Ready without records (a lazy ack, a reply) still waits for the fsync of
    records an earlier Ready appended: they may be what it vouches for. (The fsync in
    the committer's thread, where the test can hold it while later Readys run.)"""
    node = single_node(tmp_path, fsync="batch", fsync_worker="thread")
    await node.start()
    gate = threading.Event()
    wal = node.wal
    real_sync = wal.perform_sync

    def slow_sync(ticket):
        gate.wait(WAIT_S)
        real_sync(ticket)

    wal.perform_sync = slow_sync
    conn = FakeConn()
    node._waiters[("c", 1)] = conn
    script = [Ready(persist=[["test-record"]]), Ready(replies=[Reply("c", 1, "result")])]
    real_ready = node.replica.ready
    node.replica.ready = lambda: script.pop(0) if script else real_ready()
    try:
        for _ in range(20):  # loop turns: both Readys are carried out
            node._kick()
            await asyncio.sleep(0)
        assert not script, "both scripted Readys were taken"
        record_seq = wal.last_seq
        assert wal.durable_seq < record_seq and conn.replies == []
        gate.set()
        async with asyncio.timeout(WAIT_S):
            await conn.got.wait()
        assert wal.durable_seq >= record_seq
        assert conn.replies == [["c", 1, 0, "result"]]
    finally:
        gate.set()
        await node.stop()


@pytest.mark.parametrize("where", ["append", "fsync"])
async def test_a_failed_wal_write_stops_the_node_before_anything_is_sent(tmp_path, where):
    node = single_node(tmp_path, fsync="batch")
    await node.start()
    wal = node.wal
    if where == "append":
        def broken(payloads):
            raise OSError(errno.ENOSPC, "No space left on device")
        wal.append_many = broken
    else:
        def broken(ticket):
            raise OSError(errno.EIO, "Input/output error")
        wal.perform_sync = broken
    conn = FakeConn()
    node._waiters[("c", 1)] = conn
    script = [Ready(persist=[["test-record"]], replies=[Reply("c", 1, "result")])]
    real_ready = node.replica.ready
    node.replica.ready = lambda: script.pop(0) if script else real_ready()
    try:
        node._kick()
        failure = await stopped(node)
        expected = "write-ahead log append failed: OSError" if where == "append" else "write-ahead log fsync failed"
        assert failure.startswith(expected), failure
        assert conn.replies == []
    finally:
        await node.stop()


def test_a_failed_segment_rotation_fails_the_wal(tmp_path):
    """The WAL refuses every later write once it could not create its next segment
    (instead of failing later on a closed descriptor)."""
    from consensus.storage.wal import WAL, WALFailed

    wal, _ = WAL.open(str(tmp_path / "wal"), fsync="never", segment_bytes_max=4096)
    try:
        def no_space(first_seq):
            raise OSError(errno.ENOSPC, "No space left on device")

        wal._create_segment = no_space
        with pytest.raises(OSError):
            for _ in range(100):  # bounded: 100 KiB overflows a 4 KiB segment
                wal.append(b"x" * 1000)
        with pytest.raises(WALFailed):
            wal.append(b"after")
    finally:
        wal.abandon()


def peer_snapshot(commands: int) -> tuple[int, dict, bytes]:
    """Replica 0's snapshot after a three-replica cluster (in memory, messages passed
    by hand) executed ``commands`` writes."""
    cfg = ProtocolConfig(n=3)
    replicas = [SDPaxosReplica(i, cfg, KVStateMachine(), records=[], rng=random.Random(i)) for i in range(3)]
    for i in range(commands):
        replicas[0].propose("w", i + 1, ["put", f"k{i}", i])
    for _ in range(1000):  # bounded; a few rounds suffice
        if len(replicas[0].executor.sm.data) == commands:
            break
        moved = False
        for r in replicas:
            for dst, msgs in r.ready().messages:
                replicas[dst].step(r.id, msgs)
                moved = True
        if not moved:
            for r in replicas:
                r.tick()
    meta, state = replicas[0].take_snapshot()
    assert meta["slot"] > 0 and len(replicas[0].executor.sm.data) == commands
    return 0, meta, state


def lagging_node(tmp_path) -> Node:
    """Replica 2 of three, alone, at slot 0: a peer snapshot is ahead of it."""
    return single_node(tmp_path, n=3, node_id=2)


async def test_a_fetched_snapshot_is_installed_compacted_then_stored_with_the_core_frozen(tmp_path, monkeypatch):
    node = lagging_node(tmp_path)
    await node.start()
    replica = node.replica
    events: list[str] = []
    resumed = asyncio.Event()  # the core got a tick after the install finished
    stored = threading.Event()
    release_store = threading.Event()
    real_write = node_mod.write_snapshot

    def write_snapshot(directory, snap, keep, image=None):
        events.append("store")
        stored.set()
        release_store.wait(WAIT_S)  # the loop keeps running meanwhile
        return real_write(directory, snap, keep=keep, image=image)

    monkeypatch.setattr(node_mod, "write_snapshot", write_snapshot)
    for name in ("install_snapshot", "compact", "ready", "tick", "step", "propose"):
        real = getattr(replica, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            events.append(_name)
            if _name == "tick" and "compact" in events:
                resumed.set()
            return _real(*args, **kwargs)

        setattr(replica, name, wrapped)
    try:
        peer, meta, state = peer_snapshot(5)
        from consensus.storage.snapshot import Snapshot

        node._fetched = (peer, Snapshot(0, msgpack.packb(meta, use_bin_type=True), state), meta)
        node._kick()
        async with asyncio.timeout(WAIT_S):
            await asyncio.get_running_loop().run_in_executor(None, stored.wait, WAIT_S)
        # Frozen: ticks fall due, clients and peers knock; nothing reaches the core.
        conn = FakeConn()
        node._on_client_frame(conn, [[0, "c", 1, ["put", "x", 1]]])
        assert conn.replies == [["c", 1, 1, "busy: retry later"]]
        await asyncio.sleep(3 * node.cfg.tick_ms / 1000)  # let ticks fall due (time is the input here)
        # compact right after the install: the live records it returns go in the
        # snapshot file (they restate our log as of the install, nothing moved since).
        frozen = events[events.index("install_snapshot"):]
        assert frozen == ["install_snapshot", "compact", "store"], frozen
        task = node._snap_task
        assert task is not None
        release_store.set()
        async with asyncio.timeout(WAIT_S):
            await asyncio.shield(task)  # compacted, stored with the live records
        assert node.failure is None
        after = events[events.index("install_snapshot"):]
        assert after[:3] == ["install_snapshot", "compact", "store"], after  # nothing else in between
        assert load_latest(os.path.join(node.cfg.data_dir, "snapshots")).live
        assert replica.exec_slot == meta["slot"] and node.stats["snapshots_installed"] == 1
        assert replica.executor.sm.data == {f"k{i}": i for i in range(5)}
        # The core runs again, and gets the ticks that fell due meanwhile.
        async with asyncio.timeout(WAIT_S):
            await resumed.wait()
    finally:
        release_store.set()
        await node.stop()


async def test_a_failed_store_after_install_stops_the_node(tmp_path, monkeypatch):
    node = lagging_node(tmp_path)
    await node.start()

    def write_snapshot(directory, snap, keep, image=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(node_mod, "write_snapshot", write_snapshot)
    try:
        peer, meta, state = peer_snapshot(3)
        from consensus.storage.snapshot import Snapshot

        node._fetched = (peer, Snapshot(0, msgpack.packb(meta, use_bin_type=True), state), meta)
        node._kick()
        failure = await stopped(node)
        assert failure.startswith("storing the snapshot installed from node 0 failed: OSError"), failure
    finally:
        await node.stop()


# --- real processes ------------------------------------------------------------------


async def test_a_core_exception_stops_cellar_serve_with_one_line_on_stderr(make_cluster):
    """Replica 1's core raises SafetyViolation on its 21st step (test hook): the
    process exits with status 1 and one line on stderr; the others keep serving."""
    cluster = make_cluster(3)
    cluster.start(0)
    cluster.start(2)
    env = dict(os.environ, **{TEST_CORE_FAULT_ENV: "step:20"})
    proc = subprocess.Popen(cluster.command(1), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        # Peers' heartbeats alone make it step; bounded wait for the exit.
        _, err = await asyncio.get_running_loop().run_in_executor(None, lambda: proc.communicate(timeout=20))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 1, (proc.returncode, err)
    lines = err.strip().splitlines()
    if lines and lines[0].startswith("cellar serve: replica 1 of 3 ("):
        lines = lines[1:]  # the startup line, printed before the fault
    assert len(lines) == 1, err
    assert lines[0].startswith("cellar serve: replica 1 stopped: core raised SafetyViolation: test fault"), lines[0]
    assert "(in step)" in lines[0] and "crash.log" in lines[0]
    with open(os.path.join(cluster.data_dir(1), "crash.log")) as f:
        assert "Traceback" in f.read()
    await cluster.await_ready(0)
    await cluster.await_ready(2)
    async with CellarClient(cluster.client_addresses[::2], timeout_s=1.0, deadline_s=20.0) as cellar:
        await committing(cellar, "without replica 1")


def test_a_malformed_fault_hook_is_a_configuration_error(tmp_path):
    p0, p1, p2, client = free_ports(4)
    env = dict(os.environ, **{TEST_CORE_FAULT_ENV: "fly:3"})
    proc = subprocess.run(
        [*_serve(), "--id", "0", "--peers", f"0=127.0.0.1:{p0},1=127.0.0.1:{p1},2=127.0.0.1:{p2}", "--client", f"127.0.0.1:{client}",
         "--data-dir", str(tmp_path / "d")],
        env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert TEST_CORE_FAULT_ENV in proc.stderr


def _serve() -> list[str]:
    return [sys.executable, "-m", "store.cli", "serve"]


# --- a machine's client-side checks raise ------------------------------------------


@pytest.mark.parametrize("where", ["stamp", "validate", "read_key"])
async def test_a_check_raising_on_a_clients_value_refuses_that_request_only(tmp_path, where):
    """The machine's stamper, validator and read_key see a client's raw value before
    anything reaches the core. One of them raising (a malformed op, a bug) is that
    request's error; the replica serves on (it used to stop, and a client retrying on
    each replica in turn stopped them all: tests/store/test_malformed_ops.py)."""
    from consensus.runtime import clientwire

    node = single_node(tmp_path)
    await node.start()
    try:
        def boom(*_args):
            raise TypeError("unhashable type: 'list'")

        setattr(node, "_" + where, boom)
        if where == "read_key":  # past the validator, which would refuse it first
            node._validate = lambda op: None
        conn = FakeConn()
        kind = clientwire.READ if where == "read_key" else clientwire.CALL
        node._on_client_frame(conn, [[kind, "c", 1, {"op": ["x"]}]])
        assert conn.replies == [["c", 1, clientwire.ERROR,
                                 "InvalidRequest: malformed operation (TypeError: unhashable type: 'list')"]]
        assert node.failure is None and not node._down
        assert node.stats["refused_invalid"] == 1
    finally:
        await node.stop()
