"""Review 10 of 5f12fd7 (docs/reviews/core-fixes-review-10.md): node.py tells the core
which Readys are durable (``_tokens`` → ``_report_persisted`` → ``persisted``).

Points that hold, on an in-process N = 3 node (R1; R0 sequences view 0, its peers are
not started): with the fsync held back, R1 takes R0's O-accept of a chosen instance
and neither executes it nor sends the OAck; once the fsync completes, the OAck leaves
(after the record it vouches for is durable) and the core executes the slot; no token
is left behind, in every fsync mode.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from consensus.core.messages import CAccept, CCommit, OAccept, OAck, decode_message, encode_message
from consensus.runtime.node import ENVELOPE

from .test_crash_only import WAIT_S, single_node

PUT = [[7, 1, ["put", "k", "v"]]]


async def _until(pred, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not pred():
            await asyncio.sleep(0.005)


def _feed(node, src: int, msgs: list) -> None:
    node._on_peer_frames(src, [[ENVELOPE, [encode_message(m) for m in msgs]]])


@pytest.mark.parametrize("fsync", ["batch", "batch-loop", "always", "never"])
async def test_a_replica_executes_on_its_own_accept_once_the_wal_says_it_is_durable(tmp_path, fsync):
    # "batch": the fsync in the committer's thread, where the test can hold it;
    # "batch-loop" syncs on the loop, which a held fsync would block. (The default,
    # a child process's fsync: test_fsync_process.py.)
    node = single_node(tmp_path, n=3, node_id=1, fsync=fsync.removesuffix("-loop"),
                       fsync_worker="thread" if fsync == "batch" else "loop")
    await node.start()
    wal, r = node.wal, node.replica
    gate = threading.Event()
    gate.set()
    real_sync = wal.perform_sync

    def held_sync(ticket):
        gate.wait(WAIT_S)
        real_sync(ticket)

    wal.perform_sync = held_sync
    sent: list = []  # (message type, O record's seq, durable seq when it left)
    o_seq = [None]
    real_send = node.transport.send

    def record_send(dst, frame):
        if frame[0] == ENVELOPE:
            for m in frame[1]:
                sent.append((type(decode_message(m)).__name__, o_seq[0], wal.durable_seq))
        return real_send(dst, frame)

    node.transport.send = record_send
    try:
        v = r.view
        _feed(node, 2, [CAccept(v, 2, 0, r.promised[2], PUT), CCommit(v, 2, 0, r.promised[2], True, PUT)])
        await _until(lambda: r.token > 0 and r.durable_token == r.token, "the C records are durable")
        if fsync == "batch":
            gate.clear()
        _feed(node, 0, [OAccept(v, 0, [2], True, 0)])
        await _until(lambda: 0 in r.oslots, "the O-accept is taken")
        for _ in range(20):
            await asyncio.sleep(0)
        o_seq[0] = wal.last_seq
        if fsync == "batch":
            assert wal.durable_seq < o_seq[0], "the fsync is held"
            assert r.exec_slot == 0 and r.token > r.durable_token, "executed before its accept is durable"
            assert not any(name == "OAck" for name, _, _ in sent), "the OAck left before the record it vouches for"
            gate.set()
        await _until(lambda: r.exec_slot == 1, "executed once durable")
        await _until(lambda: any(name == "OAck" for name, _, _ in sent), "the OAck left")
        for name, rec_seq, durable in sent:
            if name == "OAck" and rec_seq is not None:
                assert durable >= rec_seq, f"OAck sent with durable seq {durable} < the O record's {rec_seq}"
        assert not node._tokens and r._sync_wait == [] and r.durable_token == r.token
    finally:
        gate.set()
        await node.stop()
