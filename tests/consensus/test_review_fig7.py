"""Review of 6c5fb5b (N=5 Fig. 7 through the voters' o_view): a schedule that breaks it.

The argument of the commit: a view serves only once a majority took its O-accepts, so
the highest o_view among a majority of voters names the last sequencer that served; a
higher reported view whose sequencer never served "re-proposed every slot that may
have been executed, to the voter that reports it".

The gap: a *recovering* sequencer's O-accepts already make their command leader commit
(and execute) on the N=5 fast path (``OSlot.fast`` is set for any O-accept naming the
receiver; ``_execute`` runs an own fast slot of the current view). When such O-accepts
reach only that command leader, no voter reports the view, so the next candidate's
``max(o_view)`` names an older sequencer, which is a voter, and Fig. 7 is skipped.
"""


from consensus.sim import SimConfig, Simulation
from consensus.sim.simulator import Client
from .schedules import NEVER, RuleBroken, quiet, step_until


def test_fig7_misses_a_view_that_never_served_but_made_r_m_execute():
    """N=5, LAN. R0 serves view 0. Never more than two replicas down or cut off.

    1. R0 is cut off (isolate). R4 proposes X; its C-instance is accepted by R1-R3
       (committed) but R0, the sequencer, never saw it, so X has no O-slot yet.
    2. R1 times out and wins view 33 with the votes of R2, R3 (R1's VRequest to R4 is
       lost). Fig. 7 there: max o_view = 0, R0 is no voter, so R_m = R4 and C[4] makes R1
       give R4 one slot (j = 3). R1 is *recovering*; its O-accepts reach only R4.
    3. R4 adopts view 33, takes slot 3 as fast (it names R4), answers X's client and
       executes X at slot 3 (every earlier slot is committed).
    4. R1 and R4 crash; R0 is healed. R0, R2, R3 elect a sequencer; their o_views are all
       0 (none took an O-accept of view 33), so last_seq = R0, a voter: Fig. 7 is
       skipped; nobody reports slot 3, and the new sequencer proposes no-cl there.

    R4 executed X at slot 3, the others execute no-cl at slot 3: two commands executed
    in one slot (and X, acknowledged, is lost while R4 is down).
    """
    sim, replies = quiet()
    for node in (1, 2, 3):
        sim.nodes[node].propose(100 + node, 1, ["put", f"k{node}", "a"])
        sim._drain(node)
    sim.run(until_ms=1100)
    drops = {"oaccept_from_1": False}

    def keep(src, dst, m):
        name = type(m).__name__
        if drops["oaccept_from_1"] and src == 1 and name == "OAccept" and dst != 4:
            return False  # R1's O-accepts (its recovery proposals) reach R4 only
        if src == 1 and dst == 4 and name == "VRequest":
            return False  # R4 does not vote for R1
        return True

    sim.msg_filter = keep
    sim.net.isolate(0)
    for r in (2, 3, 4):  # who stands is the schedule's choice: R1's timer fires first
        sim.nodes[r].election_due = NEVER
    inst = sim.nodes[4].next_inst
    sim.nodes[4].propose(104, 1, ["put", "x", "from-r4"])
    sim._drain(4)
    t = step_until(sim, lambda: sim.nodes[4].clog[4][inst].committed, 1100, 2500)
    assert t is not None, "R4's C-instance was accepted by R1-R3"
    drops["oaccept_from_1"] = True
    t = step_until(sim, lambda: sim.nodes[1].sequencer == 1 and sim.nodes[1].phase in ("recovering", "normal"), t, t + 3000)
    assert t is not None and sim.nodes[1].phase == "recovering", "R1 took office; it cannot serve (only R4 acks)"
    fill = [j for j, s in sim.nodes[1].oslots.items() if s.leader == 4 and s.view == sim.nodes[1].view]
    assert fill, "R1's Fig. 7 gave R4 a slot for X"
    slot = fill[-1]
    # R4 answers X's client and executes X at ``slot`` (fast path: the slot names R4).
    step_until(sim, lambda: sim.nodes[4].exec_slot > slot, t, t + 1000)
    t += 1000
    executed_by_r4 = sim.nodes[4].exec_slot > slot
    view33 = sim.nodes[1].view
    assert all(sim.nodes[r].o_view < view33 for r in (0, 2, 3)), "no survivor took a view-33 O-accept"
    sim.crash(1)
    sim.crash(4)
    sim.net.heal()
    sim.msg_filter = None
    t = step_until(
        sim,
        lambda: any(n is not None and n.sequencer == n.id and n.phase == "normal" and n.view > view33 for n in sim.nodes),
        t, t + 6000, step_ms=5,
    )
    assert t is not None, "R0, R2, R3 elected a new sequencer"
    seq = next(n for n in sim.nodes if n is not None and n.sequencer == n.id and n.phase == "normal")
    sim.nodes[2].propose(102, 2, ["put", "x", "after"])
    sim._drain(2)
    sim.run()
    result = sim.summary()
    lost_slot = executed_by_r4 and getattr(seq.oslots.get(slot), "leader", None) != 4
    if lost_slot or not (result["consistent"] and result["agreement"]) or result["lost_acked"]:
        raise RuleBroken(
            f"slot {slot}: R4 executed X there in view 33, new sequencer R{seq.id} (view {seq.view}) put "
            f"{getattr(seq.oslots.get(slot), 'leader', None)} there; consistent={result['consistent']} "
            f"agreement={result['agreement']} lost_acked={result['lost_acked']}"
        )


def test_a_view_serves_only_once_a_majority_took_its_o_accepts():
    """N=5, LAN, snapshots every 5 slots. R0 serves view 0.

    1. Traffic from R2, R3; every replica snapshots (R1's floor is 6). R0's O-commits to
       R1 are lost for a while, so R1's committed prefix lags (16 vs 20).
    2. R0 is cut off. R1 wins view 33 (base 16, recovered suffix 16..19, committed
       everywhere else). R1's O-accepts reach R4 only (lost to R0, R2, R3).
    3. In a new view ``acked`` restarts at 0, below R1's floor, so ``_sequencer_tick``
       sends R2 and R3 a Compacted notice instead of resending the O-accepts;
       ``_on_compacted`` answers it with an OAck of their prefix (20, all committed).
       R1 counts them and serves: a majority "acked" view 33, but only R1 and R4 took
       one of its O-accepts (o_view 33); R0, R2, R3 still report 0.
    4. R4 writes X; R1 gives it slot 20; the O-accept reaches R4 only, which answers
       and executes X at slot 20 (the fast path, view 33 is serving).
    5. R1 and R4 crash, R0 is healed. Voters R0, R2, R3 report o_view 0: last_seq = R0,
       a voter, Fig. 7 is skipped, nobody reports slot 20: the new sequencer puts no-cl
       there.
    """
    cfg = SimConfig(replicas=5, rtt="lan", clients_per_site=0, seconds=6.0, snapshot_every=5)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)
    replies = []
    sim._on_reply = lambda cid, seq, result: replies.append((cid, seq, result))
    for node in range(5):
        sim.clients[100 + node] = Client(100 + node, node, active=False)
    for k in range(8):
        for node in (2, 3):
            sim.nodes[node].propose(100 + node, k + 1, ["put", f"k{node}", f"a{k}"])
            sim._drain(node)
        sim.run(until_ms=1000 + 10 * (k + 1))
    sim.run(until_ms=1200)
    lost = {"ocommit_0_1": True, "oaccept_1": False}

    def keep(src, dst, m):
        name = type(m).__name__
        if lost["ocommit_0_1"] and src == 0 and dst == 1 and name == "OCommit":
            return False
        if lost["oaccept_1"] and src == 1 and name == "OAccept" and dst != 4:
            return False
        return True

    sim.msg_filter = keep
    for k in range(4):
        sim.nodes[2].propose(102, 20 + k, ["put", "k2", f"b{k}"])
        sim._drain(2)
        sim.run(until_ms=1200 + 10 * (k + 1))
    sim.run(until_ms=1300)
    assert sim.nodes[1].o_committed < sim.nodes[2].o_committed and sim.nodes[1].floor_slot > 0
    lost["oaccept_1"] = True
    sim.net.isolate(0)
    for r in (2, 3, 4):  # who stands is the schedule's choice: R1's timer fires first
        sim.nodes[r].election_due = NEVER
    t = step_until(sim, lambda: sim.nodes[1].sequencer == 1 and sim.nodes[1].phase in ("recovering", "normal"), 1300, 4000)
    assert t is not None, "R1 took office"
    view33 = sim.nodes[1].view
    # R1 serves (or not: the rule under review says it must not, with one O-accept taker).
    step_until(sim, lambda: sim.nodes[1].phase == "normal", t, t + 1000)
    t += 1000
    sim.nodes[4].propose(104, 1, ["put", "x", "from-r4"])
    sim._drain(4)
    step_until(sim, lambda: any(r[:2] == (104, 1) for r in replies), t, t + 1000)
    t += 1000
    mine = [j for j, s in sim.nodes[4].oslots.items() if s.leader == 4 and s.view == view33 and j < sim.nodes[4].exec_slot]
    takers = [r for r in range(5) if sim.nodes[r].o_view >= view33]
    sim.crash(1)
    sim.crash(4)
    sim.net.heal()
    sim.msg_filter = None
    t = step_until(sim, lambda: any(n is not None and n.sequencer == n.id and n.phase == "normal" and n.view > view33 for n in sim.nodes), t, t + 6000, step_ms=5)
    assert t is not None, "R0, R2, R3 elected a new sequencer"
    seq = next(n for n in sim.nodes if n is not None and n.sequencer == n.id and n.phase == "normal")
    lost_slots = [j for j in mine if getattr(seq.oslots.get(j), "leader", None) != 4]
    sim.nodes[2].propose(102, 99, ["put", "x", "after"])
    sim._drain(2)
    sim.run()
    result = sim.summary()
    if lost_slots or not (result["consistent"] and result["agreement"]) or result["lost_acked"]:
        raise RuleBroken(
            f"view {view33} served with O-accept takers {takers} only; R4 executed X at {mine}, new sequencer "
            f"R{seq.id} put {[getattr(seq.oslots.get(j), 'leader', None) for j in mine]} there; "
            f"consistent={result['consistent']} agreement={result['agreement']} lost_acked={result['lost_acked']}"
        )
