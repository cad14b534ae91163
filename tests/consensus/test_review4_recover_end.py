"""Review 4 of 0ec73b0 (N=5): a replica raises o_view, and so may OAck, only once its
O-prefix reaches the view's ``recover_end``; but the sequencer resends O-accepts from the
peer's *acked* prefix, which is 0 in a new view until the peer acks. See
docs/reviews/core-fixes-review-4.md.

A peer that missed the recovered log's O-accept gets resends that start at 0 (or at the
sequencer's floor, with a Compacted notice) and carry at most ``OSLOTS_PER_MSG_MAX``
slots. Once more than that many slots lie below ``recover_end`` (8192 committed slots
without a snapshot, or a floor that far behind), every resend holds only slots the peer
already has committed: its O-prefix never moves, it never raises o_view, never acks,
and the sequencer never resends from further on. OCommits start at the acked prefix too
(``start = min(acked[dst], upto)``) and are cut at the same bound, so they never reach
the peer's committed prefix either. Before 0ec73b0 the peer acked its O-prefix on the
first resend and the next resend started there.

- A peer cut off during the view change never catches up after it comes back (no
  message lost): it executes nothing new and its own commands are never acknowledged.
- Two lost O-accepts (the first of the recovered log, to two peers) with one replica
  down: the view never serves, and the live peers keep hearing pings, so nobody elects.

The ``small`` cases patch ``OSLOTS_PER_MSG_MAX`` to 8 (20 committed slots); the
``real_bound`` case commits 8200 slots (batch 1, LAN; about 5 s).

Fixed: an OAck whose prefix is below the view's recovered-log end (learned from its
O-accepts) is allowed before the replica holds the whole log: it cannot count towards
serving, and it tells the sequencer where to resend from (_may_ack).
"""


import pytest
import consensus.core.sdpaxos as sdpaxos
from consensus.sim import SimConfig, Simulation

from .schedules import NEVER, RuleBroken, attach_clients, step_until


def _committed_cluster(writes: int):
    cfg = SimConfig(replicas=5, rtt="lan", clients_per_site=0, seconds=60.0, batch=1)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)
    replies = attach_clients(sim, 5)
    r0 = sim.nodes[0]
    for s in range(writes):
        r0.propose(100, s + 1, ["put", f"k{s % 7}", s])
    sim._drain(0)
    t = step_until(sim, lambda: all(n.o_committed >= writes for n in sim.nodes), 1000, 60_000, step_ms=20)
    assert t is not None, "every replica committed the writes"
    assert all(n.floor_slot == 0 for n in sim.nodes), "no snapshots"
    return sim, replies, t


def _rejoined_peer(writes: int) -> None:
    """N=5, LAN, batch 1, no snapshots. R0 serves view 0 and commits ``writes`` slots
    everywhere. R0 crashes and R4 is cut off; R1 wins view 1 with R2, R3 and serves.
    R4 comes back (no message is lost) and writes Z; R2 writes Y."""
    sim, replies, t = _committed_cluster(writes)
    r1, r4 = sim.nodes[1], sim.nodes[4]
    sim.crash(0)
    sim.net.isolate(4)
    for r in (2, 3):
        sim.nodes[r].election_due = NEVER  # R1 stands
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase == "normal", t, t + 5000, step_ms=5)
    assert t is not None, "R1, R2, R3 elected R1 and it serves"
    for r in (2, 3):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.net.heal()
    t = step_until(sim, lambda: r4.view == r1.view, t, t + 3000, step_ms=5)
    assert t is not None, "R4 joined view 1"
    r4.propose(104, 1, ["put", "z", "Z"])
    sim._drain(4)
    sim.nodes[2].propose(102, 1, ["put", "y", "Y"])
    sim._drain(2)
    step_until(sim, lambda: any(c == 104 for c, _s, _r in replies), t, t + 30_000, step_ms=50)
    assert any(c == 102 for c, _s, _r in replies), "the view serves R2's write"
    if not any(c == 104 for c, _s, _r in replies):
        raise RuleBroken(
            f"R4, back after the view change, is stuck 30 s later: o_prefix {r4.o_prefix} < recover_end "
            f"{r1.recover_end}, o_view {r4.o_view} < view {r4.view}; R1 holds acked[4] = {r1.acked[4]} and "
            f"resends from it; R4's write never acknowledged"
        )


def test_a_peer_back_after_the_view_change_never_catches_up_small(monkeypatch):
    monkeypatch.setattr(sdpaxos, "OSLOTS_PER_MSG_MAX", 8)
    _rejoined_peer(writes=20)


@pytest.mark.slow  # the _small variant (the mutant's killer) runs by default
def test_a_peer_back_after_the_view_change_never_catches_up_real_bound():
    _rejoined_peer(writes=sdpaxos.OSLOTS_PER_MSG_MAX + 8)


def test_two_lost_recovery_o_accepts_keep_the_view_from_serving_small(monkeypatch):
    """N=5, LAN, batch 1, no snapshots, OSLOTS_PER_MSG_MAX = 8. R0 commits 20 slots
    everywhere, then crashes. R1 wins view 1 with R2, R3 (R4 votes or not). The first
    O-accept of R1's recovered log (one no-cl slot at 20) is lost to R3 and to R4;
    every later message arrives. R1 never serves."""
    monkeypatch.setattr(sdpaxos, "OSLOTS_PER_MSG_MAX", 8)
    sim, replies, t = _committed_cluster(20)
    r1 = sim.nodes[1]
    lost: set = set()

    def keep(src, dst, m):
        if src == 1 and type(m).__name__ == "OAccept" and dst in (3, 4) and dst not in lost:
            lost.add(dst)
            return False
        return True

    sim.msg_filter = keep
    sim.crash(0)
    for r in (2, 3, 4):
        sim.nodes[r].election_due = NEVER  # R1 stands
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), t, t + 5000, step_ms=5)
    assert t is not None, "R1 took office"
    assert lost == {3, 4}
    for r in (2, 3, 4):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.nodes[2].propose(102, 1, ["put", "y", "Y"])
    sim._drain(2)
    served = step_until(sim, lambda: r1.phase == "normal" or r1.view != sim.nodes[2].view, t, t + 30_000, step_ms=50)
    if served is None:
        raise RuleBroken(
            f"30 s after two lost O-accepts R1 is still {r1.phase} in view {r1.view}: acked {r1.acked}, "
            f"recover_end {r1.recover_end}; o_view of R3, R4: {sim.nodes[3].o_view}, {sim.nodes[4].o_view}"
        )
