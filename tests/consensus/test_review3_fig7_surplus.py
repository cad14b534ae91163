"""Review 3 of 2611cb3 (N=5): after the Fig. 7 fill, an R_m slot past its C[m]+1-th is
made no-cl unless a voter reports it *committed*. See docs/reviews/core-fixes-review-3.md.

The argument of 2611cb3: "such a slot cannot be ready or executed anywhere (its instance
would be committed, so a voter would cover it in C[m])". True of *execution at that
moment*, but the rule changes a value that a voter *reported*, and a reported O-slot may
be chosen: a majority accepted it in the last serving view, and that view's sequencer
committed it (N=5: the sequencer commits on a majority of OAcks, the others learn it
only from an OCommit). "Reported committed" is not "chosen": a non-sequencer voter
reports committed only what an OCommit told it. The old sequencer keeps its committed
slot for good (``_on_oaccept`` and ``_on_ocommit`` skip committed slots), so once the
C-instance behind it is decided, it executes R_m's command at j while every other
replica executes no-cl at j and the same command at a later slot.

The paper (Fig. 7, lines 32-37) never replaces a reported value: it only fills empty
O-instances. Its corner case (R_m committed O_j but no voter saw C_m^i) lets *R_m*
accept a no-cl over a slot it marked committed, and only when no voter saw O_j.
"""


from consensus.core.config import NOCL
from .schedules import NEVER, RuleBroken, quiet, step_until


def test_fig7_surplus_rule_replaces_a_slot_the_old_sequencer_committed():
    """N=5, LAN. R0 serves view 0; R4 = R_m; R1, R2, R3 vote. At most two replicas
    cut off (R0, R4); the only other faults are lost messages.

    1. Warm-up: R1, R3 and R4 each write once (R4's C-instance 0 is seen by voters).
    2. R4 writes X (C-instance 1). Its C-accepts reach nobody but R0, so no voter has
       C_4^1 (C[4] = 0). R0 gives X slot j; R1, R2, R3 accept it (view 0), R0 commits j
       on their OAcks. R0's O-commits are lost: no voter knows j is committed.
    3. R0 and R4 are cut off. R1 wins view 1 with R2, R3. Every voter reports j -> R4
       at view 0 (no hole before it). Fig. 7: needed = C[4] + 1 = 1, j is R4's second
       slot, not "reported committed": j becomes no-cl. A chosen value changed.
    4. Heal. R4's X is C-committed with the voters' acks and gets a fresh slot j2 > j.
       R0 keeps j -> R4 committed, executes X at j: the logs disagree at j.
    """
    sim, replies = quiet(seconds=8.0)
    phase = {"p": "warm"}

    def keep(src, dst, m):
        name = type(m).__name__
        if phase["p"] == "hide":
            if src == 4 and name in ("CAccept", "CCommit") and dst != 0:
                return False  # C_4^1 reaches R0 only
            if src == 0 and name == "OCommit":
                return False  # nobody learns that j is committed
        return True

    sim.msg_filter = keep
    for k, node in enumerate((1, 3, 4)):
        sim.nodes[node].propose(100 + node, 1, ["put", f"k{node}", "a"])
        sim._drain(node)
        sim.run(until_ms=1000 + 30 * (k + 1))
    sim.run(until_ms=1200)
    r0, r4 = sim.nodes[0], sim.nodes[4]
    assert r0.sequencer == 0 and r0.phase == "normal"
    assert r4.exec_inst[4] == 1 and all(sim.nodes[r].c_max[4] >= 0 for r in (1, 2, 3))
    phase["p"] = "hide"
    inst = r4.next_inst
    r4.propose(104, 1, ["put", "x", "X"])
    sim._drain(4)

    def j_of():
        seen = 0
        for s in sorted(r0.oslots):
            if r0.oslots[s].leader == 4:
                if seen == inst:
                    return s
                seen += 1
        return None

    t = step_until(sim, lambda: j_of() is not None and r0.o_committed > j_of(), 1200, 1600)
    assert t is not None, "R0 committed R4's slot j (a majority accepted it)"
    j = j_of()
    assert r0.oslots[j].committed
    assert all(sim.nodes[r].c_max[4] < inst for r in (1, 2, 3)), "no voter saw C_4^1"
    assert all(sim.nodes[r].oslots.get(j) is not None and sim.nodes[r].oslots[j].leader == 4 for r in (1, 2, 3))
    assert all(not sim.nodes[r].oslots[j].committed for r in (1, 2, 3)), "no voter knows j committed"
    sim.net.isolate(0)
    sim.net.isolate(4)
    for r in (2, 3):
        sim.nodes[r].election_due = NEVER
    t = step_until(sim, lambda: sim.nodes[1].sequencer == 1 and sim.nodes[1].phase == "normal", t, t + 5000, step_ms=5)
    assert t is not None, "R1, R2, R3 elected R1"
    got = sim.nodes[1].oslots[j].leader
    phase["p"] = "heal"
    sim.msg_filter = None
    sim.net.heal()
    for r in (2, 3):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.run()
    result = sim.summary()
    r0_j = r0.oslots[j].leader if j in r0.oslots else "compacted"
    if got != 4 or not (result["consistent"] and result["agreement"]):
        raise RuleBroken(
            f"slot {j} was chosen as R4 in view 0 (R0 committed it; R1-R3 accepted it); "
            f"view {sim.nodes[1].view} put {'no-cl' if got == NOCL else got} there; R0 holds {r0_j}; "
            f"consistent={result['consistent']} agreement={result['agreement']}"
        )
