"""A recovering sequencer that installs a peer's snapshot at or past its ``recover_end``
still starts serving (liveness; mutant ``serve-only-when-majority-moves``).

A new SDPaxos sequencer serves once the *acked* majority prefix reaches ``recover_end``
(``_recompute_majority``). ``_raise_floor`` (``install_snapshot``) also raises
``majority_prefix`` to the snapshot's floor, without a single OAck of the view. A check
that runs only when ``majority_prefix`` moves would then never run again: no slot is
proposed while recovering, so the acks never pass ``majority_prefix``, and the sequencer
stays "recovering" for good while it keeps pinging (nobody stands). Swarm seed 704296
(test_review2_liveness) used to reach this state; after later core changes it no longer
does. This schedule reaches it by hand.

N=5, LAN, batch 1, ``snapshot_every`` 5. Messages to R1 are filtered by phase:
1. R0 (view 0) commits 15 writes everywhere; R1 gets the O-side only (every C* message
   and Compacted to R1 is lost), so R1 has O-slots committed to 15 and executes nothing.
2. R1 is cut off; R0 commits 5 more writes. R2..R4 execute 20 and snapshot there
   (floor 15: compaction keeps one interval).
3. R0 crashes; R1 stands (the others wait) and wins with vote_base 15 (no voter has
   compacted past it): the recovered log is slots 15..19, ``recover_end`` = 20. C* and
   OAcks to R1 are still lost.
4. Compacted notices reach R1 again (OAcks still lost): R1, blocked executing slot 0,
   fetches, is told the peer compacted to 15, and installs the peer's snapshot at 20 =
   ``recover_end`` while still recovering (asserted: floor_slot >= recover_end,
   majority_prefix >= recover_end, no peer's ack counted yet).
5. Nothing is lost any more: the peers' acks (20) arrive on the resends; R1 must serve
   and new writes at R1, R2 and R3 must be acknowledged within 3 s.
"""

from consensus.sim import SimConfig, Simulation

from .schedules import NEVER, RuleBroken, attach_clients, step_until

# What is lost on the way to R1 in each phase of the schedule.
DROP_TO_R1 = {
    "o-only": lambda name: name.startswith("C"),  # CAccept, CCommit, CPromise, ..., Compacted
    "cut": lambda name: True,
    "elect": lambda name: name.startswith("C") or name == "OAck",
    "install": lambda name: name == "OAck",
    "open": lambda name: False,
}


def test_a_recovering_sequencer_serves_after_installing_a_snapshot_past_recover_end():
    cfg = SimConfig(replicas=5, rtt="lan", clients_per_site=0, seconds=60.0, batch=1, snapshot_every=5)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)
    replies = attach_clients(sim, 5)
    phase = {"p": "o-only"}
    sim.msg_filter = lambda src, dst, m: dst != 1 or not DROP_TO_R1[phase["p"]](type(m).__name__)
    r0, r1 = sim.nodes[0], sim.nodes[1]
    peers = [sim.nodes[r] for r in (2, 3, 4)]
    assert r0.sequencer == 0 and r0.phase == "normal"

    # 1. 15 writes; R1 learns the O-slots only.
    for s in range(15):
        r0.propose(100, s + 1, ["put", f"k{s % 3}", s])
    sim._drain(0)
    t = step_until(sim, lambda: r1.o_committed >= 15 and all(p.exec_slot >= 15 for p in peers), 1000, 10_000, 5)
    assert t is not None, "15 slots committed everywhere"
    assert r1.o_committed == 15 and r1.exec_slot == 0, "R1 holds the O-slots, not the values"

    # 2. R1 cut off; 5 more writes; R2..R4 snapshot at 20 and compact to 15.
    phase["p"] = "cut"
    for s in range(15, 20):
        r0.propose(100, s + 1, ["put", f"k{s % 3}", s])
    sim._drain(0)
    t = step_until(sim, lambda: all(p.exec_slot >= 20 and p.floor_slot >= 15 for p in peers), t, t + 10_000, 5)
    assert t is not None, "R2..R4 executed 20 and compacted"
    assert all(sim.snaps[r][0]["slot"] == 20 and sim.nodes[r].floor_slot == 15 for r in (2, 3, 4))
    assert r1.o_committed == 15 and r1.exec_slot == 0

    # 3. R0 crashes; R1 wins view and recovers slots 15..19.
    sim.crash(0)
    for p in peers:
        p.election_due = NEVER  # R1 stands
    phase["p"] = "elect"
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), t, t + 10_000, 1)
    assert t is not None, "R1 took office"
    assert r1.phase == "recovering" and r1.vote_base == 15 and r1.recover_end == 20, (
        f"{r1.phase}, vote_base {r1.vote_base}, recover_end {r1.recover_end}"
    )
    assert r1.floor_slot < r1.recover_end and r1.majority_prefix < r1.recover_end
    for p in peers:
        p.election_due = p._election_deadline()

    # 4. Compacted notices get through: R1 installs a peer's snapshot while recovering.
    phase["p"] = "install"
    installed = r1.stats["snapshots_installed"]
    t = step_until(
        sim, lambda: r1.stats["snapshots_installed"] > installed or r1.phase != "recovering", t, t + 10_000, 1
    )
    assert t is not None, "R1 installed a snapshot"
    # The state under test: recovering, the floor (and so majority_prefix) at or past
    # recover_end, and not one peer's OAck of this view counted.
    assert r1.stats["snapshots_installed"] == installed + 1
    assert r1.phase == "recovering", r1.phase
    assert r1.sequencer == 1 and r1.floor_slot >= r1.recover_end == 20, (r1.floor_slot, r1.recover_end)
    assert r1.majority_prefix >= r1.recover_end
    assert all(r1.acked[r] < r1.recover_end for r in (0, 2, 3, 4)), r1.acked

    # 5. Nothing lost any more: R1 serves and new writes are acknowledged.
    phase["p"] = "open"
    for node in (1, 2, 3):
        sim.nodes[node].propose(100 + node, 1, ["put", f"n{node}", node])
        sim._drain(node)
    done = step_until(sim, lambda: {c for c, _s, _r in replies} >= {101, 102, 103}, t, t + 3000, 10)
    if done is None or r1.phase != "normal":
        raise RuleBroken(
            f"3 s after installing a snapshot at {r1.floor_slot} >= recover_end {r1.recover_end}, R1 is "
            f"{r1.phase} in view {r1.view} (sequencer {r1.sequencer}): acked {r1.acked}, majority_prefix "
            f"{r1.majority_prefix}; answered {sorted({c for c, _s, _r in replies})} of [101, 102, 103]"
        )
    assert r1.view == sim.nodes[2].view and r1.sequencer == 1, "served by R1, not by a later view"
