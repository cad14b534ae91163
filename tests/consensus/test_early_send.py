"""Early send (``ProtocolConfig.early_send``, docs/early-send.md): a command leader's
C-accepts leave before its own record of the instance is durable.

Each rule of the argument has a schedule here that breaks when the rule is taken out
(planted as the mutants ``early-self-count-before-durable``,
``early-restart-ignores-reservation`` and ``early-beyond-reservation``, tools/mutants.py):

1. The leader's own vote counts only once its record is durable: a peer's ack that
   arrives first does not commit the instance.
2. Only instances below a durable reservation ("CR" record) are sent early.
3. A restart re-prepares every reserved instance its log lacks before it proposes: a
   peer may hold the value sent early, at the leader's round-0 ballot, and a new value
   there at that same ballot would make two values acceptable in one ballot.

And end to end: simulated crashes of command leaders right after their early sends,
with unsynced records lost, stay safe (agreement, nothing acknowledged lost,
linearizable), and the restarted leaders re-prepare.
"""

from __future__ import annotations

import pytest

from consensus.core.config import ProtocolConfig
from consensus.core.messages import CAccept, CAck, CPrepare, CPromise
from consensus.core.sdpaxos import EARLY_RESERVE, SDPaxosReplica
from consensus.sim import SimConfig, Simulation
from store.kv_machine import KVStateMachine

ME, SEQ, PEER = 1, 0, 2


def replica(records: list | None = None, early: bool = True) -> SDPaxosReplica:
    return SDPaxosReplica(ME, ProtocolConfig(n=3, initial_sequencer=SEQ, early_send=early), KVStateMachine(),
                          records=records)


def accepts(envelopes: list) -> list[tuple[int, CAccept]]:
    return [(dst, m) for dst, msgs in envelopes for m in msgs if type(m) is CAccept]


def reserved(r: SDPaxosReplica, durable: list) -> None:
    """Propose one command and make everything durable: the reservation is in place."""
    r.propose("c", 0, ["put", "a", "0"])
    rd = r.ready()
    assert any(rec[0] == "CR" for rec in rd.persist)
    assert not accepts(rd.urgent), "sent early before any reservation was durable"
    durable.extend(rd.persist)
    r.persisted(rd.token)
    assert r.c_reserved == EARLY_RESERVE + 1


def test_the_first_instance_waits_for_its_record_and_the_reservation_then_later_ones_leave_early():
    r, durable = replica(), []
    reserved(r, durable)
    r.propose("c", 1, ["put", "a", "1"])
    rd = r.ready()
    ((dst, m),) = accepts(rd.urgent)
    assert m.inst == 1 and not accepts(rd.messages)
    assert any(rec[0] == "C" and rec[2] == 1 for rec in rd.persist)


def test_without_early_send_every_accept_waits():
    r = replica(early=False)
    for seq in range(3):
        r.propose("c", seq, ["put", "a", str(seq)])
        rd = r.ready()
        assert not rd.urgent and accepts(rd.messages)
        assert not any(rec[0] == "CR" for rec in rd.persist)
        r.persisted(rd.token)


def test_a_peer_ack_before_our_own_record_is_durable_does_not_commit():
    r, durable = replica(), []
    reserved(r, durable)
    r.propose("c", 1, ["put", "a", "1"])
    rd = r.ready()
    ((dst, m),) = accepts(rd.urgent)
    r.step(dst, [CAck(r.view, ME, m.inst, m.ballot, True)])
    r.ready()
    assert not r.clog[ME][m.inst].committed, "committed on one durable accept of three"
    r.persisted(rd.token)
    assert r.clog[ME][m.inst].committed


def test_a_restarted_leader_re_prepares_what_it_sent_early_before_proposing():
    r, durable = replica(), []
    reserved(r, durable)
    r.propose("c", 1, ["put", "a", "X"])
    rd = r.ready()
    ((dst, sent),) = accepts(rd.urgent)
    # The peer accepted X at instance 1, round-0 ballot; we crash before our sync.
    r2 = replica(records=list(durable))
    assert r2.next_inst == 1
    r2.propose("d", 0, ["put", "a", "Y"])
    rd = r2.ready()
    out = rd.messages + rd.urgent
    assert not [m for _, m in accepts(out) if m.inst == sent.inst and m.ballot == sent.ballot], \
        "a new value at the instance we sent early, at the same ballot"
    prepares = [m for _, msgs in out for m in msgs if type(m) is CPrepare]
    assert prepares and prepares[0].from_inst <= sent.inst <= prepares[0].upto_inst
    assert prepares[0].upto_inst >= EARLY_RESERVE  # every reserved instance
    r2.persisted(rd.token)
    b = prepares[0].ballot
    r2.step(dst, [CPromise(r2.view, ME, b, True, [[sent.inst, sent.ballot, sent.cmds, False]])])
    rd = r2.ready()
    again = {m.inst: m for _, m in accepts(rd.messages + rd.urgent)}
    assert again[sent.inst].cmds == sent.cmds and again[sent.inst].ballot == b, "X not re-proposed"
    assert all(again[i].cmds is None for i in range(sent.inst + 1, EARLY_RESERVE + 1)), "reserved, never sent: no-ops"
    # Y waits for an instance after the reserved range (behind the re-prepared ones:
    # inflight_max).
    assert r2.next_inst == EARLY_RESERVE + 1 and [c[2] for c in r2._pending] == [["put", "a", "Y"]]


def _leader_crashes(seed: int, n: int) -> SimConfig:
    """A non-sequencer command leader crashes and restarts repeatedly under load, with
    20 ms syncs (a wide window between its early sends and its records' sync) and its
    unsynced records lost."""
    faults = []
    t = 300.0
    while t < 2200.0:
        faults += [(t, "crash", 1), (t + 150.0, "restart", 1)]
        t += 400.0
    return SimConfig(replicas=n, rtt="lan", seconds=3.0, seed=seed, sequencer=0, clients_per_site=2,
                     disk_sync_ms=20.0, lose_unsynced_on_crash=True, early_send=True, faults=faults)


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("seed", [1, 2])
def test_leaders_crashing_right_after_early_sends_lose_nothing(seed, n):
    sim = Simulation(_leader_crashes(seed, n)).run()
    result = sim.summary()
    hint = f"Simulation({sim.cfg!r}).run()"
    assert result["consistent"] and result["agreement"], hint
    assert result["lost_acked"] == 0 and result["duplicated"] == 0 and result["wrong_results"] == 0, hint
    assert sim.linearizable() is True, hint
    assert sim.sim_disks[1].lost > 0, "no crash lost an unsynced record"
    assert sim.nodes[1].stats["recoveries"] > 0, "the restarted leader never re-prepared"
    assert all(site["commits"] > 0 for site in result["sites"].values()), hint
