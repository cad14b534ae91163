"""A hostile peer snapshot through the node's receive-and-install path (issue 17,
acceptance 3).

Replica 2 of three runs alone (in process) on a data dir holding two snapshots of
its own. A "peer" answers its pull with a snapshot whose checksums are all valid
(the file CRC and every chunk CRC) but whose metadata is bad, whose state does not
decode, or whose slot is wrong. Each one is fed to ``Node._on_snapshot_chunk``, the
handler of the peer connection's SNAP_CHUNK frames, so it takes the real path:
reassembly, decoding, the node's checks, the core's ``install_snapshot``, storage.

The node must never store it: its own snapshot files are the same files with the
same bytes afterwards, and a new process restarts from the data dir at its own
snapshot. It rejects the snapshot and keeps running, except where the core itself
raises ``SafetyViolation`` (a snapshot that would un-execute commands we executed):
that stops the node with one line (crash-only), before anything is touched.
"""

from __future__ import annotations

import asyncio
import os
import random

import msgpack
import pytest

from consensus.core.config import ProtocolConfig
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import _SNAPSHOT_FORMAT, KVStateMachine
from consensus.runtime.node import SNAPSHOT_BYTES_MAX, SNAPSHOT_CHUNK_BYTES, Node
from consensus.storage.snapshot import Snapshot, SnapshotReceiver, encode_snapshot, iter_chunks, write_snapshot

from .test_crash_only import WAIT_S, single_node, stopped

PEER = 0
ME = 2


def _pump(replicas: list, done) -> None:
    for _ in range(2000):  # bounded; a few rounds suffice
        if done():
            return
        moved = False
        for r in replicas:
            for dst, msgs in r.ready().messages:
                replicas[dst].step(r.id, msgs)
                moved = True
        if not moved:
            for r in replicas:
                r.tick()
    raise AssertionError("the in-memory cluster did not get there")


def histories() -> dict:
    """Snapshots of an in-memory three-replica cluster: ours (replica 2) after 3 and
    6 writes, and the peer's (replica 0) after 2 and 9 writes."""
    cfg = ProtocolConfig(n=3)
    replicas = [SDPaxosReplica(i, cfg, KVStateMachine(), records=[], rng=random.Random(i)) for i in range(3)]
    out = {}
    written = 0
    for upto, who, name in ((2, PEER, "peer_old"), (3, ME, "mine_a"), (6, ME, "mine_b"), (9, PEER, "peer_new")):
        for i in range(written, upto):
            replicas[0].propose("w", i + 1, ["put", f"k{i}", i])
        written = upto

        def there() -> bool:
            if any(len(r.executor.sm.data) != upto for r in replicas):
                return False
            return replicas[who].take_snapshot() is not None

        _pump(replicas, there)
        out[name] = replicas[who].take_snapshot()
    return out


def own_snapshots(data_dir: str, snaps: dict) -> dict[str, bytes]:
    """Replica 2's data dir with two snapshots of its own; their files and bytes."""
    directory = os.path.join(data_dir, "snapshots")
    for name in ("mine_a", "mine_b"):
        meta, state = snaps[name]
        write_snapshot(directory, Snapshot(0, msgpack.packb(meta, use_bin_type=True), state, slot=meta["slot"]), keep=2)
    return files(directory)


def files(directory: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


def hostile(case: str, snaps: dict) -> Snapshot:
    """The snapshot the peer sends (every checksum valid)."""
    meta, state = snaps["peer_new"]
    meta = dict(meta)
    header_slot = meta["slot"]
    raw_meta = None
    if case == "legit":
        pass
    elif case == "meta-not-msgpack":
        raw_meta = b"\xc1\xc1 not msgpack"
    elif case == "meta-not-a-map":
        raw_meta = msgpack.packb([meta["slot"], meta["exec_inst"]])
    elif case == "meta-slot-not-an-int":
        meta["slot"] = str(meta["slot"])
    elif case == "meta-other-protocol":
        meta["protocol"] = "multipaxos"
    elif case == "meta-other-cluster-size":
        meta["n"] = 5
        meta["exec_inst"] = meta["exec_inst"] + [0, 0]
    elif case == "meta-exec-inst-past-slot":
        meta["exec_inst"] = [meta["slot"] + 1] + meta["exec_inst"][1:]
    elif case == "state-not-msgpack":
        state = b"\xc1" * 64
    elif case == "state-not-an-executor-image":
        state = msgpack.packb({"not": "a triple"})
    elif case == "state-machine-image-truncated":  # a kv image missing most of its fields
        state = msgpack.packb([msgpack.packb({"format": _SNAPSHOT_FORMAT, "revision": 7}), [], 9])
    elif case == "state-machine-image-garbage":
        state = msgpack.packb([b"\xc1\xc1\xc1", [], 9])
    elif case == "slot-behind-ours":  # the peer's older snapshot, at a slot we passed
        meta, state = snaps["peer_old"]
        header_slot = meta["slot"]
    elif case == "slot-equal-to-ours":
        meta, state = snaps["mine_b"]
        header_slot = meta["slot"]
    elif case == "slot-header-disagrees-with-meta":
        header_slot = meta["slot"] + 1000
    elif case == "slot-ahead-but-behind-our-execution":
        meta["slot"] += 1000
        meta["exec_inst"] = [0] * len(meta["exec_inst"])
        header_slot = meta["slot"]
    else:
        raise AssertionError(case)
    if raw_meta is None:
        raw_meta = msgpack.packb(meta, use_bin_type=True)
    return Snapshot(0, raw_meta, state, slot=header_slot)


REJECTED = [
    "meta-not-msgpack", "meta-not-a-map", "meta-slot-not-an-int", "meta-other-protocol",
    "meta-other-cluster-size", "meta-exec-inst-past-slot",
    "state-not-msgpack", "state-not-an-executor-image", "state-machine-image-truncated",
    "state-machine-image-garbage",
    "slot-behind-ours", "slot-equal-to-ours", "slot-header-disagrees-with-meta",
]
STOPS = ["slot-ahead-but-behind-our-execution"]  # the core raises SafetyViolation


@pytest.fixture(scope="module")
def snaps() -> dict:
    return histories()


async def feed(node: Node, snap: Snapshot) -> None:
    """The peer's answer to our pull, chunk by chunk, as the peer connection delivers it."""
    node._pull = (PEER, SnapshotReceiver(SNAPSHOT_BYTES_MAX), asyncio.get_running_loop().time())
    data = encode_snapshot(snap)
    for chunk in iter_chunks(data, max(1, min(SNAPSHOT_CHUNK_BYTES, len(data) // 3))):
        node._on_snapshot_chunk(PEER, chunk.to_wire())
    assert node._pull is None, "the whole snapshot was received"
    for _ in range(20):  # loop turns: a fetched snapshot is installed at the end of one
        node._kick()
        await asyncio.sleep(0.01)
    task = node._snap_task
    if task is not None:
        async with asyncio.timeout(WAIT_S):
            await asyncio.shield(task)


def restarts_at_own_snapshot(tmp_path, snaps: dict) -> None:
    again = single_node(tmp_path, n=3, node_id=ME)  # Node.open on the same data dir
    try:
        meta, _ = snaps["mine_b"]
        assert again.replica.exec_slot == meta["slot"]
        assert again.replica.executor.sm.data == {f"k{i}": i for i in range(6)}
    finally:
        again.wal.close()


@pytest.mark.parametrize("case", REJECTED + STOPS)
async def test_a_hostile_peer_snapshot_is_never_stored(tmp_path, snaps, case):
    before = own_snapshots(str(tmp_path / f"n{ME}"), snaps)
    assert len(before) == 2
    node = single_node(tmp_path, n=3, node_id=ME)
    own_slot = snaps["mine_b"][0]["slot"]
    assert node.replica.exec_slot == own_slot
    await node.start()
    try:
        await feed(node, hostile(case, snaps))
        if case in STOPS:
            failure = await stopped(node)
            assert failure.startswith("core raised SafetyViolation: ") and "(in install_snapshot)" in failure, failure
            assert len(failure.splitlines()) == 1
        else:
            assert node.failure is None, node.failure
            assert node.stats["snapshots_installed"] == 0 and not node._installing and node._fetched is None
            assert node.replica.exec_slot == own_slot
            assert node.replica.executor.sm.data == {f"k{i}": i for i in range(6)}
    finally:
        await node.stop()
    assert files(str(tmp_path / f"n{ME}" / "snapshots")) == before
    restarts_at_own_snapshot(tmp_path, snaps)


async def test_the_same_path_installs_and_stores_an_honest_snapshot(tmp_path, snaps):
    """The control: the legit snapshot the hostile ones were made from is installed
    and replaces ours (so the test above would see a stored one)."""
    own_snapshots(str(tmp_path / f"n{ME}"), snaps)
    node = single_node(tmp_path, n=3, node_id=ME)
    await node.start()
    try:
        await feed(node, hostile("legit", snaps))
        assert node.failure is None, node.failure
        meta, _ = snaps["peer_new"]
        assert node.stats["snapshots_installed"] == 1 and node.replica.exec_slot == meta["slot"]
    finally:
        await node.stop()
    assert list(files(str(tmp_path / f"n{ME}" / "snapshots"))) == [f"snap-slot-{meta['slot']:020d}.snap"]
    again = single_node(tmp_path, n=3, node_id=ME)
    try:
        assert again.replica.exec_slot == meta["slot"]
        assert again.replica.executor.sm.data == {f"k{i}": i for i in range(9)}
    finally:
        again.wal.close()
