"""Review 9 of 19ce4a0: the planned sequencer handover (``transfer_sequencer`` →
``Handover`` → ``_on_handover``), N = 3 and N = 5. See
docs/reviews/core-fixes-review-9.md.

Hole 1 (liveness): a Handover is one broadcast, never resent, and the old sequencer S
gives up its lease at once for the rest of its view (``distrust_view``), while it
keeps serving (phase "normal", pinging). S refuses every pre-vote and every vote
(serving, and its own pings renew its self-promise ``lease_to = S``). A voter that
got the Handover distrusts S (it stops renewing the lease and pre-votes at every
election timeout); a replica that did not get it still hears S and refuses those
pre-votes. If the target never gets its Handover (one lost message, or the target
is down or cut off when the operator runs ``cellar sequencer transfer``), then with
N = 3 no replica can ever win a pre-vote again: S serves on in its view without a
lease, forever, also after the target is back. Every lease read becomes a write
through the log. With N = 5 two lost Handovers (the target's and one voter's) do
the same. Writes go on, so this is not an outage; the lease is gone for good
until some other fault forces a view change.

Hole 2 (found by the handover campaign, seed 101663, N = 3): a sequencer that handed
over still never votes (its pings renew its self-promise), so the target's view can
be formed by the target and a replica that executed O-slots on its own accept and
then lost that accept in a crash before its sync. The old sequencer, alive and the
only durable holder of those slots, is left out, and they become no-cl. No client
saw it here, but the judge counts it, and node.py snapshots without waiting for the
WAL's fsync (see the review).

The ordinary tests below are points that hold (lease reads stop at the old
sequencer the moment it hands over; a delayed Handover is ignored in a later view;
the lease comes back after a handover whose messages all arrive, N = 3 and N = 5;
a handover to a cut-off target with N = 5), and a small smoke run of the
handover campaign driver used for the review (swarm configs plus handovers).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from consensus.sim.search import swarm_config
from consensus.sim.simulator import Simulation

from .schedules import RuleBroken, quiet


def _lease_holders(sim) -> list[int]:
    return [r.id for r in sim.nodes if r is not None and r.lease_valid()]


def _write(sim, node: int, cid: int, seq: int, key: str, value: str) -> None:
    sim.nodes[node].propose(cid, seq, ["put", key, value])
    sim._drain(node)


def _no_lease_after_handover(replicas: int, target: int, lost_to: set, cut_target: bool) -> None:
    """R0 serves view 0 with a lease. The operator hands over to ``target``; the
    Handover to every replica in ``lost_to`` is lost (or the target is cut off
    from t = 1000 ms to 3000 ms). Then 20 s (40 leases, 40 election timeouts) of
    a healthy network, with writes and lease reads going on."""
    sim, replies = quiet(replicas=replicas, seconds=40.0)
    r0 = sim.nodes[0]
    assert r0.lease_valid() and r0.phase == "normal", "R0 holds the lease of view 0"
    lease_ms = sim.pcfg.lease_ticks * sim.pcfg.tick_ms
    sim.msg_filter = lambda src, dst, m: not (type(m).__name__ == "Handover" and dst in lost_to)
    if cut_target:
        sim.net.isolate(target)
    assert r0.transfer_sequencer(target), "the operator's transfer is accepted"
    sim._drain(0)
    sim.run(until_ms=3000)
    if cut_target:
        sim.net.heal()
    # Writes and reads go on at every replica for 20 s.
    seq = 1
    t = 3000
    while t < 23000:
        for node in range(replicas):
            _write(sim, node, 100 + node, seq, "k", f"v{seq}.{node}")
        seq += 1
        t += 500
        sim.run(until_ms=t)
    for node in range(replicas):
        sim.nodes[node].read(100 + node, seq, ["get", "k"], "k")
        sim._drain(node)
    sim.run(until_ms=t + 500)
    holders = _lease_holders(sim)
    views = sorted({r.view for r in sim.nodes})
    lease_reads = sum(r.stats["lease_reads"] for r in sim.nodes)
    log_reads = sum(r.stats["log_reads"] for r in sim.nodes)
    acked = sum(1 for cid, s, _ in replies if s < seq)
    if not holders:
        raise RuleBroken(
            f"N={replicas}: 20 s ({20000 // int(lease_ms)} leases) after a handover to R{target} "
            f"(Handover lost to {sorted(lost_to)}, target cut off: {cut_target}) no sequencer holds a lease: "
            f"views {views}, sequencer R{sim.nodes[1].sequencer} phase {sim.nodes[sim.nodes[1].sequencer].phase}, "
            f"distrust_view per replica {[r.distrust_view for r in sim.nodes]}; writes acknowledged meanwhile: {acked}; "
            f"the final reads: {lease_reads} via the lease, {log_reads} through the log"
        )


def test_n3_a_handover_lost_to_its_target_leaves_the_cluster_without_a_lease_forever():
    """N = 3, one lost message.

    1. R0 serves view 0 with a lease; the operator runs transfer_sequencer(2). R0
       drops its lease (lease_expiry = -1, distrust_view = 0) and broadcasts
       Handover(0, 2). The copy to R2 is lost.
    2. R1 distrusts R0: lease_until = 0, no more pongs, and its election deadline is
       no longer pushed back by R0's pings. It pre-votes at every election timeout.
    3. R0 refuses (it serves: ``_grants_prevote`` is ``phase != "normal"``; and its
       own pings renew ``lease_until`` to itself). R2 never got the Handover, hears
       R0's pings within an election timeout and refuses. R1 never has a majority.
    4. R0 keeps serving view 0, and its pongs no longer count (distrust_view). 20 s
       later nobody holds a lease; every read goes through the log.
    """
    _no_lease_after_handover(3, target=2, lost_to={2}, cut_target=False)


def test_n3_a_handover_to_a_cut_off_target_leaves_no_lease_after_it_is_back():
    """N = 3: the operator hands over to R2 while R2 is cut off (a network fault,
    or R2 down). Steps 2-4 as above; R2 rejoins at 3 s and hears R0's pings, so it
    refuses R1's pre-votes too. No lease, for good, with every link healthy."""
    _no_lease_after_handover(3, target=2, lost_to=set(), cut_target=True)


def test_n5_two_lost_handovers_leave_the_cluster_without_a_lease_forever():
    """N = 5, two lost messages (the Handover to the target R2 and to R3). R1 and R4
    distrust R0 and pre-vote; R0 (serving), R2 and R3 (hearing R0) refuse: two
    grants of five, never a majority."""
    _no_lease_after_handover(5, target=2, lost_to={2, 3}, cut_target=False)


# --- points that hold --------------------------------------------------------------


@pytest.mark.parametrize("replicas", [3, 5])
def test_the_old_sequencer_serves_no_lease_read_once_it_hands_over(replicas):
    """The transfer clears lease_expiry before the Handover leaves, and distrust_view
    keeps late pongs (sent before the Handover arrived) from renewing it: a read at
    R0, and R1's RRequest, both go through the log from then on."""
    sim, replies = quiet(replicas=replicas)
    r0 = sim.nodes[0]
    assert r0.lease_valid()
    # Hold every Handover: R0 has handed over but nobody knows yet, and pongs keep coming.
    sim.msg_filter = lambda src, dst, m: type(m).__name__ != "Handover"
    assert r0.transfer_sequencer(1)
    sim._drain(0)
    assert not r0.lease_valid()
    before = [r.stats["log_reads"] for r in sim.nodes]
    lease_before = [r.stats["lease_reads"] for r in sim.nodes]
    for t in range(1001, 1400, 7):
        sim.run(until_ms=t)
        assert not r0.lease_valid(), f"R0 renewed its lease at {t} ms after handing over"
    r0.read(100, 1, ["get", "k"], "k")
    sim._drain(0)
    sim.nodes[1].read(101, 1, ["get", "k"], "k")
    sim._drain(1)
    sim.run(until_ms=1500)
    assert [r.stats["lease_reads"] for r in sim.nodes] == lease_before, "no lease read anywhere"
    assert r0.stats["log_reads"] == before[0] + 1 and sim.nodes[1].stats["log_reads"] == before[1] + 1, (
        "R0's own read and R1's (R0 answered READ_VIA_LOG) both went through the log")
    assert {(c, s) for c, s, _ in replies} >= {(100, 1), (101, 1)}


@pytest.mark.parametrize("replicas", [3, 5])
def test_a_handover_whose_messages_arrive_brings_the_lease_back(replicas):
    sim, replies = quiet(replicas=replicas)
    assert sim.nodes[0].transfer_sequencer(2)
    sim._drain(0)
    sim.run(until_ms=3000)
    assert {r.sequencer for r in sim.nodes} == {2}
    assert _lease_holders(sim) == [2]


def test_a_delayed_handover_is_ignored_in_a_later_view():
    """A Handover of view 0 that arrives after R1 joined R2's view does not release
    R1's promise to R2 (``_on_handover`` checks the view), nor make R1 stand."""
    sim, replies = quiet(replicas=3)
    held = []

    def keep(src, dst, m):
        if type(m).__name__ == "Handover" and dst == 1:
            held.append((src, m))
            return False
        return True

    sim.msg_filter = keep
    assert sim.nodes[0].transfer_sequencer(2)
    sim._drain(0)
    sim.run(until_ms=3000)
    r1 = sim.nodes[1]
    assert r1.sequencer == 2 and r1.view > 0 and r1.now < r1.lease_until and r1.lease_to == 2
    view, until = r1.view, r1.lease_until
    r1.step(held[0][0], [held[0][1]])
    sim._drain(1)
    assert r1.lease_until == until and r1.view == view and r1.phase == "normal"


def test_n5_a_handover_to_a_cut_off_target_elects_another_sequencer():
    """With N = 5 the three replicas that got the Handover grant each other's pre-votes
    (distrust_view), so one of them takes over and the lease comes back."""
    sim, replies = quiet(replicas=5)
    sim.net.isolate(2)
    assert sim.nodes[0].transfer_sequencer(2)
    sim._drain(0)
    sim.run(until_ms=4000)
    holders = _lease_holders(sim)
    assert len(holders) == 1 and holders[0] not in (0, 2)


# --- the campaign driver (docs/reviews/core-fixes-review-9.md, "Randomized search") ---


class HandoverSim(Simulation):
    """A simulation whose fault list may hold ("handover", target): the serving
    sequencer of the highest view hands over to ``target`` (which may be cut off,
    crashed, lagging, or itself: then nothing happens)."""

    handovers = 0

    def _apply_fault(self, action):
        if action[0] != "handover":
            return super()._apply_fault(action)
        live = [r for r in self.nodes if r is not None and r.id == r.sequencer and r.phase == "normal"]
        if live:
            s = max(live, key=lambda r: r.view)
            if s.transfer_sequencer(action[1]):
                self.handovers += 1
                self._drain(s.id)


def handover_config(seed: int):
    """``search.swarm_config(seed)`` as SDPaxos, plus 1-6 handovers to random
    replicas during the fault phase."""
    cfg = swarm_config(seed)
    rng = random.Random(seed * 7 + 1)
    ms = cfg.seconds * 1000
    faults = list(cfg.faults)
    for _ in range(rng.randint(1, 6)):
        faults.append((round(rng.uniform(0.05, 0.72) * ms, 3), "handover", rng.randrange(cfg.replicas)))
    faults.sort(key=lambda e: e[0])
    return dataclasses.replace(cfg, protocol="sdpaxos", faults=faults)


def judge_handover(cfg) -> list[str]:
    sim = HandoverSim(cfg).run()
    result = sim.summary()
    failures = [name for name in ("consistent", "agreement") if not result[name]]
    failures += [f"{name}={result[name]}" for name in ("lost_acked", "duplicated", "wrong_results") if result[name]]
    if not sim.quiet():
        failures.append("not live")
    if sim.linearizable(timeout_s=30) is not True:
        failures.append("not linearizable")
    return failures


@pytest.mark.parametrize("seed", [100003, 100011, 100017, 200009])
def test_handover_campaign_smoke(seed):
    assert judge_handover(handover_config(seed)) == []


def test_handover_campaign_seed_101663_an_amnesiac_acceptor_and_a_non_voting_old_sequencer():
    """Found by the handover campaign (N = 3, geo, SimDisk with 20 ms syncs, lost
    unsynced records on a crash; only two of its four handovers matter).

    1. R0 serves view 32 and proposes O-slots 9-11 for R2's instances 3-5. R1 accepts
       them (``["O", 32, 9, [2, 2, 2]]``, not yet synced) and, N = 3, commits and
       *executes* them at once in memory (1869.4 ms). R0 hands over to R1.
    2. R1 crashes 5 ms later, before the sync: its accept of slots 9-11 is gone. R0
       alone still holds them.
    3. R0, still serving view 32 (distrusted), hands over to R2 (2000.8 ms). R2 stands
       without a pre-vote. R0 never votes: its own pings renew its self-promise.
       R1 restarted, and once its ``no_vote_until`` has passed it votes for R2.
    4. R2 takes view 66 on R1's vote alone. Slots 9-11 are holes there, and
       ``_take_office`` fills them with no-cl. Every replica executes NOCL at 9-11.
       R1's crashed incarnation executed R2's 3, 4 and 5 there.

    No client saw it: replies and messages wait for the sync, and the simulator takes
    snapshots only with everything synced. But the judge (``consistent``,
    ``agreement``) counts it, and ``node.py``'s ``_maybe_snapshot`` does not wait for
    the WAL's durability. There, a snapshot of that state can reach the disk before
    the O record does, and after a power loss R1 restarts from a state the cluster
    never chose."""
    cfg = handover_config(101663)
    keep = {1869.449, 2000.77}
    cfg = dataclasses.replace(cfg, faults=[f for f in cfg.faults if f[1] != "handover" or f[0] in keep])
    sim = HandoverSim(cfg).run()
    result = sim.check()
    if not (result["consistent"] and result["agreement"]):
        logs = {k: [label for label, _ in log][7:12] for k, log in enumerate(sim.exec_logs) if len(log) > 9}
        raise RuleBroken(f"executed slots 7-11 per incarnation: {logs}; {result}")


def test_n3_a_handover_with_one_replica_down_completes_on_the_old_sequencers_vote():
    """Review 9's second rule as a schedule of its own (the seed-101663 replay stopped
    showing it once 5f12fd7 made replicas execute only durable accepts): N = 3 with R2
    down, R0 hands over to R1. R1's view needs R0's vote, so R0 must not renew its
    lease promise to itself once it hands over. With the rule the lease is back at R1
    within a few round trips; without it R0 refuses to vote until its promise runs out
    after it stepped down, about an election timeout plus a lease later. R1's first
    vote request to R0 is lost, so R1 stands again after R0 pinged once more."""
    sim, _replies = quiet(replicas=3, seconds=10.0)
    sim.crash(2)
    sim.run(until_ms=1100)
    r0 = sim.nodes[0]
    assert r0.lease_valid() and r0.phase == "normal"
    dropped = []

    def lose_first_vote_request(src, dst, m):  # R1 stands again later: R0 has pinged by then
        if type(m).__name__ == "VRequest" and dst == 0 and not dropped:
            dropped.append(m)
            return False
        return True

    sim.msg_filter = lose_first_vote_request
    assert r0.transfer_sequencer(1)
    sim._drain(0)
    t0 = sim.now / 1000.0
    lease_ms = sim.pcfg.lease_ticks * sim.pcfg.tick_ms
    sim.run(until_ms=t0 + lease_ms)  # with the rule: 150 ms; without: 650 ms
    assert dropped, "R1 stood for election"
    r1 = sim.nodes[1]
    assert r1.sequencer == 1 and r1.phase == "normal" and r1.lease_valid(), (
        f"{lease_ms:.0f} ms after the handover R1 does not hold the lease: view {r1.view}, phase {r1.phase}, "
        f"R0 promises to R{r0.lease_to} until tick {r0.lease_until} (now {r0.now})")
