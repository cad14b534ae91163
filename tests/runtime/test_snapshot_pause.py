"""Snapshots that do not pause the loop (issue 16, acceptance 1): the forked child
makes the live records too and stores them in the snapshot file, so the parent's
loop never rewrites its WAL; it only drops its old log (``compact(live=False)``),
deletes WAL segments and freezes the collector. Recovery replays the snapshot's live
records, then the WAL after its seq.

Crash safety of the new path: every replica of three is killed at the same new
step of its second snapshot (the child's image written, not yet placed; placed,
the old log not yet dropped; WAL segments deleted), so no peer holds more than its
own disk gives back; all restart from what they left and must bring back every
acknowledged write; then they are killed once more after new writes and must bring
those back too.
Power-loss states of the same steps are enumerated by tests/storage/crash_states.py
(scenario ``snapshot-overlap``)."""

from __future__ import annotations

import asyncio
import json
import os

import msgpack
import pytest

import consensus.runtime.node as node_mod
from consensus.runtime import clientwire
from consensus.runtime.node import Node, NodeConfig
from consensus.storage.snapshot import load_latest
from store.server import free_ports, make_node
from tests.runtime.test_snapshot_fork import WAIT_S, _put, _until
PAD = "." * 600  # 150 writes fill more than one 64 KiB WAL segment
UNANSWERED: dict[str, str] = {}  # key -> the value of a write whose answer never came


class _Crash(Exception):
    """Injected: the process dies here."""


def _configs(tmp_path) -> list[NodeConfig]:
    ports = free_ports(6)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    # Small segments, so that a snapshot's compaction deletes some.
    return [NodeConfig(node_id=i, peers=peers, client_address=("127.0.0.1", ports[3 + i]),
                       data_dir=str(tmp_path / f"n{i}"), snapshot_every=0, segment_bytes_max=64 << 10)
            for i in range(3)]


async def _start(cfgs: list[NodeConfig]) -> list[Node]:
    nodes = []
    for cfg in cfgs:
        node = make_node(cfg)
        node.open()
        nodes.append(node)
    for node in nodes:
        await node.start()
    return nodes


def _die_like_a_killed_process(node: Node) -> None:
    """From now on the node leaves its files as a killed process would: nothing
    buffered is written, nothing more is synced or sealed."""
    async def close_storage() -> None:
        node.wal.abandon()
        if node.committer._executor is not None:  # --fsync-worker thread: wait for its last fsync
            node.committer._executor.shutdown(wait=True)
        if node.committer._process is not None:  # the fsync process sees EOF, as when killed
            node.committer._process.close()

    node._close_storage = close_storage  # type: ignore[method-assign]


async def _snapshot(nodes: list[Node], taken_before: int) -> None:
    """Each node takes a snapshot now and stores it, or stops. Under load the child
    may find nothing to snapshot (a slot executed before its commit): asked again."""
    async with asyncio.timeout(WAIT_S):
        while not all(n.stats["snapshots_taken"] > taken_before or n.stopped.is_set() for n in nodes):
            for node in nodes:
                if node.stats["snapshots_taken"] == taken_before and node._snap_task is None and not node._down:
                    node._admin_snapshot(["snapshot_take"])
            await asyncio.sleep(0.01)


async def _writers(node: Node, acked: dict[str, str], clients: int = 6) -> None:
    """Closed-loop writers through ``node`` until it stops; ``acked`` gets each
    answered write. The write a client had in flight when the node stopped may
    have been chosen or not: its value goes to ``UNANSWERED`` (either is right)."""
    async def one(c: int) -> None:
        for j in range(1, 100_000):  # bounded; ends when the node stops
            key, value = f"c{c}-{j % 25}", f"{j}" + PAD
            UNANSWERED[key] = value
            try:
                status, _ = await asyncio.wait_for(node.submit(clientwire.CALL, f"w{c}", j, ["put", key, value]), WAIT_S)
            except (ConnectionError, asyncio.TimeoutError):
                return
            if status != clientwire.OK:
                return
            acked[key] = value
            del UNANSWERED[key]

    await asyncio.gather(*(one(c) for c in range(clients)))


async def _recovered(cfgs: list[NodeConfig], acked: dict[str, str], seq: int) -> tuple[list[Node], int]:
    """Restart every replica from its data dir; one more write through node 0 (so
    node 0 executed everything before it); every acknowledged key must hold its last
    acknowledged value there."""
    nodes = await _start(cfgs)
    seq += 1
    await _put(nodes[0], seq, "after-restart", str(seq))
    acked["after-restart"] = str(seq)
    data = nodes[0].machine.data
    missing = {k: v for k, v in acked.items() if data.get(k) not in (v, UNANSWERED.get(k))}
    assert not missing, f"lost acknowledged writes: {sorted(missing)[:5]} ({len(missing)} of {len(acked)})"
    return nodes, seq


async def _stop(nodes: list[Node]) -> None:
    for node in nodes:
        await node.stop()


@pytest.mark.parametrize("step", ["child-written", "placed", "wal-compacted"])
async def test_a_crash_at_each_new_snapshot_step_loses_no_acknowledged_write(tmp_path, monkeypatch, step):
    """Every replica is killed at the same step of its second snapshot, so no peer
    holds more than its own disk gave back."""
    cfgs = _configs(tmp_path)
    nodes = await _start(cfgs)
    acked: dict[str, str] = {}
    UNANSWERED.clear()
    seq = 0
    try:
        for i in range(150):
            seq += 1
            await _put(nodes[0], seq, f"k{i % 100}", f"v{seq}" + PAD)
            acked[f"k{i % 100}"] = f"v{seq}" + PAD
        await _snapshot(nodes, 0)  # the first: nothing to compact against yet
        assert all(n.stats["snapshots_taken"] == 1 and not n.stopped.is_set() for n in nodes)
        firsts = [load_latest(os.path.join(cfg.data_dir, "snapshots")) for cfg in cfgs]
        assert all(f is not None and f.live for f in firsts)  # the child's live records are in the file
        for i in range(150):
            seq += 1
            await _put(nodes[0], seq, f"k{i % 120}", f"w{seq}")
            acked[f"k{i % 120}"] = f"w{seq}"
        wal_firsts = [n.wal.first_seq for n in nodes]

        real_place = node_mod.place_snapshot
        for node in nodes:
            _die_like_a_killed_process(node)
            if step == "wal-compacted":
                def compact(upto, real=node.wal.compact):
                    real(upto)
                    raise _Crash(step)
                node.wal.compact = compact  # type: ignore[method-assign]
        if step == "child-written":
            def place(*a, **kw):
                raise _Crash(step)
            monkeypatch.setattr(node_mod, "place_snapshot", place)
        elif step == "placed":
            def place(*a, **kw):
                real_place(*a, **kw)
                raise _Crash(step)
            monkeypatch.setattr(node_mod, "place_snapshot", place)
        # Under load: instances accepted before a child's fork and executed after it
        # are in its live records only.
        load = asyncio.create_task(_writers(nodes[0], acked))
        await asyncio.sleep(0.3)
        await _snapshot(nodes, 1)
        for node in nodes:
            await asyncio.wait_for(node.stopped.wait(), WAIT_S)
            assert node.failure and step in node.failure
        await asyncio.wait_for(load, WAIT_S)
        monkeypatch.setattr(node_mod, "place_snapshot", real_place)
        latests = []
        for cfg, first, wal_first in zip(cfgs, firsts, wal_firsts):
            snapdir = os.path.join(cfg.data_dir, "snapshots")
            latest = load_latest(snapdir)
            latests.append(latest)
            if step == "child-written":
                assert latest.slot == first.slot
                assert [n for n in os.listdir(snapdir) if n.endswith(".tmp")]  # the child's image, never placed
            else:
                assert latest.slot > first.slot and latest.live
            if step == "wal-compacted":  # the segments only the first snapshot needed are gone
                assert min(int(n[4:-4]) for n in os.listdir(os.path.join(cfg.data_dir, "wal"))
                           if n.startswith("wal-")) > wal_first

        nodes, seq = await _recovered(cfgs, acked, seq)
        assert [n.status()["snapshot_slot"] for n in nodes] == [s.slot for s in latests]
        # Killed again after more writes (appended after the snapshot's seq): back too.
        for i in range(40):
            seq += 1
            await _put(nodes[0], seq, f"k{i}", f"x{seq}")
            acked[f"k{i}"] = f"x{seq}"
        for node in nodes:
            _die_like_a_killed_process(node)
        await _stop(nodes)
        nodes, seq = await _recovered(cfgs, acked, seq)
    finally:
        await _stop(nodes)


async def test_a_wal_that_lost_what_the_snapshot_restates_goes_on_after_it(tmp_path):
    """``fsync = "never"`` and a power loss can leave a WAL that ends below the seq of
    a snapshot with live records (the snapshot itself is always synced). The node
    goes on numbering after that seq, or the next recovery would skip the new
    records as restated by the snapshot."""
    cfgs = _configs(tmp_path)
    nodes = await _start(cfgs)
    acked: dict[str, str] = {}
    seq = 0
    try:
        for i in range(80):
            seq += 1
            await _put(nodes[0], seq, f"k{i}", f"v{seq}")
            acked[f"k{i}"] = f"v{seq}"
        await _snapshot(nodes, 0)
        snap_seqs = [load_latest(os.path.join(cfg.data_dir, "snapshots")).seq for cfg in cfgs]
        await _stop(nodes)
        for cfg in cfgs:
            wal_dir = os.path.join(cfg.data_dir, "wal")
            for name in os.listdir(wal_dir):  # the WAL's records all lost
                if name.startswith("wal-"):
                    os.unlink(os.path.join(wal_dir, name))
        nodes = await _start(cfgs)
        assert [n.wal.last_seq for n in nodes] == snap_seqs  # going on after each snapshot's seq
        for i in range(20):
            seq += 1
            await _put(nodes[0], seq, f"n{i}", f"v{seq}")
            acked[f"n{i}"] = f"v{seq}"
        await _stop(nodes)
        nodes, seq = await _recovered(cfgs, acked, seq)
    finally:
        await _stop(nodes)


async def test_the_loop_never_rewrites_the_log_for_a_forked_snapshot(tmp_path):
    """The parent appends nothing for a snapshot (the old path appended every live
    record, 10,000 records and 4.6 MB at 64,000 keys, on the loop), calls the core's
    ``compact`` without live records, frees what it dropped over later loop turns,
    and records each step's CPU time."""
    cfgs = _configs(tmp_path)
    nodes = await _start(cfgs)
    node = nodes[0]
    calls = []
    compact = node.replica.compact

    def spy(meta, live=True):
        calls.append(live)
        return compact(meta, live)

    node.replica.compact = spy
    try:
        seq = 0
        for taken in range(3):
            for i in range(60):
                seq += 1
                await _put(node, seq, f"k{i}", f"v{seq}")
            await _until(lambda: node.replica.exec_slot <= node.replica.o_committed and not node._outbox, "quiet")
            appends = node.wal.stats["appends"]
            await _snapshot([node], taken)
            assert node.stats["snapshots_taken"] == taken + 1
            assert node.wal.stats["appends"] == appends  # nothing for the snapshot
        assert calls == [False, False, False]  # in this process; the child made the live records
        # The old log is freed a slice per loop turn after compact, not in it.
        assert set(node.snapshot_loop_ms) == {"fork", "compact", "wal_compact", "release"}
        assert set(node.status()["snapshot_loop_ms"]) == set(node.snapshot_loop_ms)
        assert json.loads(json.dumps(node.status()["snapshot_loop_ms"])) == node.snapshot_loop_ms
        live = msgpack.unpackb(load_latest(os.path.join(cfgs[0].data_dir, "snapshots")).live, raw=False)
        assert live[0][0] == "V" and live[-1][0] == "OC"
    finally:
        await _stop(nodes)
