"""A Multi-Paxos leader sends a suspected peer nothing but pings (found by `cellar bench
failover`, issue 15): every commit used to carry the slots that peer had not acked (up to
SLOTS_PER_MSG_MAX, re-encoded on each commit), and every resend period the same again as
accepts, so after a failover under load the new leader spent its CPU on a dead replica
and throughput fell to 5-13 % for good. Once the peer is heard again, it catches up."""

from __future__ import annotations

from consensus.core.config import ProtocolConfig
from consensus.core.messages import MAccept, MAck, MCommit, Ping
from consensus.core.multipaxos import MultiPaxosReplica
from store.kv_machine import KVStateMachine


def _sent(rd, dst: int) -> list:
    return [m for d, msgs in rd.messages for m in msgs if d == dst]


def test_a_suspected_peer_gets_no_commits_or_accepts_and_catches_up_once_heard():
    cfg = ProtocolConfig(n=3, heartbeat_ticks=2, election_ticks=10, resend_ticks=4)
    leader = MultiPaxosReplica(0, cfg, KVStateMachine())
    view = leader.view
    seq = 0
    for _ in range(40):  # R2 says nothing for 40 ticks: suspected; R1 acks everything
        seq += 1
        leader.propose("c", seq, ["put", f"k{seq}", "v"])
        leader.tick()
        leader.step(1, [MAck(view, leader.next_slot)])
        rd = leader.ready(sync=True)
        if leader.suspected(2):
            carried = [m for m in _sent(rd, 2) if isinstance(m, (MCommit, MAccept))]
            assert carried == [], (leader.now, carried)
    assert leader.suspected(2) and leader.committed >= 30
    # R2 speaks again (its liveness ping): it is sent what it lacks, from its acked prefix.
    leader.step(2, [Ping(view, -2)])
    got = []
    for _ in range(2 * cfg.resend_ticks):
        leader.tick()
        got += _sent(leader.ready(sync=True), 2)
    assert any(isinstance(m, (MCommit, MAccept)) and m.start == 0 and m.batches for m in got), got
