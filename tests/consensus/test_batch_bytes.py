"""Batches and multi-slot messages are bounded by bytes as well as by count, so no
message the core sends with legal commands (each at most 1 MiB) exceeds a peer frame
(issue 12: four 3 MiB puts once made one 9.4 MB envelope, dropped on every resend)."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.core.config import ProtocolConfig
from consensus.core.messages import encode_message
from consensus.core.multipaxos import MultiPaxosReplica
from consensus.core.replica import op_bytes, take_batch
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine
from consensus.transport.framing import MAX_FRAME_BYTES

MIB = 1 << 20
BIG = "v" * (MIB - 64)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 3 * MIB), max_size=40), st.integers(1, 300), st.integers(1, 4 * MIB))
def test_take_batch_bounds_count_and_bytes(sizes, count_max, bytes_max):
    queue = [[1, i, ["put", "k", "x" * n]] for i, n in enumerate(sizes)]
    before = list(queue)
    batch = take_batch(queue, count_max, bytes_max)
    assert batch + queue == before  # a prefix, in order, nothing lost
    if before:
        assert 1 <= len(batch) <= count_max
        assert sum(op_bytes(c[2]) for c in batch[:-1]) < bytes_max  # only the last may cross it


def sent_sizes(r) -> list[int]:
    ready = r.ready()
    return [len(msgpack.packb([0, [encode_message(m)]], use_bin_type=True)) for _, msgs in ready.messages for m in msgs]


def test_sdpaxos_c_accepts_of_big_commands_fit_a_frame():
    r = SDPaxosReplica(1, ProtocolConfig(n=3, initial_sequencer=0), KVStateMachine())
    for i in range(12):
        r.propose(7, i + 1, ["put", f"k{i}", BIG], needs_result=False)
    sizes = sent_sizes(r)
    assert sizes and max(sizes) < MAX_FRAME_BYTES
    assert sum(sizes) > MAX_FRAME_BYTES  # together they would not fit one frame


def test_multipaxos_accepts_and_forwards_of_big_commands_fit_a_frame():
    leader = MultiPaxosReplica(0, ProtocolConfig(n=3, initial_sequencer=0), KVStateMachine())
    follower = MultiPaxosReplica(1, ProtocolConfig(n=3, initial_sequencer=0), KVStateMachine())
    for r in (leader, follower):
        for i in range(12):
            r.propose(7 + r.id, i + 1, ["put", f"k{i}", BIG], needs_result=False)
    for r in (leader, follower):
        sizes = sent_sizes(r)
        assert sizes and max(sizes) < MAX_FRAME_BYTES, (r.id, max(sizes))
