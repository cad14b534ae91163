"""Review 2 of 9d3922b (N=5: fast commit only on a serving view's O-accepts; every OAck
raises o_view first). See docs/reviews/core-fixes-review-2.md.

The argument under attack: "a view serves only on a majority of OAcks; every OAck
raises o_view first; so every later majority has a voter whose o_view names the last
serving view u; if last_view L > u, L's sequencer never served, holds its own recovered
log (which covers u's possibly fast-executed slots), and is either a voter (it reports
them) or the last_seq of Fig. 7 (which then fills for the one other non-voter)".

The gap: L's sequencer may *be* R_m, the command leader that fast-executed the slot in
u. Then the "one other non-voter" that Fig. 7 fills for is u's sequencer, not R_m, and
the voter whose o_view names L learned nothing of L's recovered log: it raised o_view
on an ``OCommit`` of the committed prefix alone (``_on_ocommit`` -> ``_ack_o_view``).
"""

import pytest

from .schedules import NEVER, RuleBroken, quiet, step_until


@pytest.mark.parametrize("restart_r2", [False, True], ids=["live", "r2-restarted"])
def test_fig7_misses_r_m_when_r_m_was_the_last_never_serving_sequencer(restart_r2):
    """N=5, LAN. R0 serves view 0; R4 = R_m. Never more than two replicas down or cut off.

    1. R0's O-commits to R2 are lost, so R2's committed O-prefix lags (it accepted the
       slots, N=5 non-sequencers commit only on O-commits).
    2. R4 writes X; R0 gives it slot j, whose O-accept (serving view 0) reaches R4 only:
       R4 fast-commits, answers the client and executes X at j.
    3. R0 is cut off. R4 stands and wins view L with the votes of R2 and R3 (+ R1). Its
       own report holds j -> R4, so L's recovered log is right. But L never serves: its
       O-accepts are lost; only its O-commit of the committed prefix reaches R2, whose
       prefix advances, so R2 acks and raises o_view to L (_ack_o_view).
    4. R4 crashes (R0 still cut off). R1, R2, R3 elect R1: last_view = L (R2's o_view),
       last_seq = R4 is no voter, "the one other non-voter" is R0, which Fig. 7 fills
       for (nothing: R0 proposed nothing). Nobody reports slot j.

    R4 executed X at j; the new view puts something else there (X acknowledged, lost).

    ``r2-restarted``: R2 restarts before the last election. Its o_view then comes from
    replaying the ``["O", L, ...]`` record ``_on_ocommit`` wrote for the slots it learned
    (``_replay`` raises o_view on every "O" record), so a fix that only stops
    ``_ack_o_view`` on a recovering view's O-commit still leaves this case broken.

    Fixed: a replica OAcks a view only after taking one of its O-accepts
    (``_may_ack``), and o_view is durable through "AV" records only.
    """
    sim, replies = quiet(seconds=8.0)
    phase = {"p": "warm"}

    def keep(src, dst, m):
        name = type(m).__name__
        p = phase["p"]
        if src == 0 and dst == 2 and name == "OCommit":
            return False  # R2's committed O-prefix lags behind
        if p == "fast" and src == 0 and name == "OAccept" and dst != 4:
            return False  # the O-accept of R4's slot reaches R4 only
        if p == "L" and src == 4 and name in ("OAccept",):
            return False  # L never serves: nobody takes its O-accepts
        if p == "L" and src == 4 and name == "OCommit" and dst != 2:
            return False  # ... but R2 takes its O-commit of the committed prefix
        return True

    sim.msg_filter = keep
    for k in range(3):
        for node in (1, 3):
            sim.nodes[node].propose(100 + node, k + 1, ["put", f"k{node}", f"a{k}"])
            sim._drain(node)
        sim.run(until_ms=1000 + 20 * (k + 1))
    sim.run(until_ms=1200)
    r2, r4 = sim.nodes[2], sim.nodes[4]
    assert r2.o_committed < r4.o_committed, (r2.o_committed, r4.o_committed)
    phase["p"] = "fast"
    inst = r4.next_inst
    sim.nodes[4].propose(104, 1, ["put", "x", "from-r4"])
    sim._drain(4)
    t = step_until(sim, lambda: any(r[:2] == (104, 1) for r in replies), 1200, 1400)
    assert t is not None, "R4 answered X (fast path)"
    step_until(sim, lambda: r4.exec_inst[4] > inst, t, t + 200)
    j = next(j for j, s in r4.oslots.items() if s.leader == 4 and s.fast)
    assert r4.exec_slot > j, "R4 executed X at slot j"
    assert all(j not in sim.nodes[r].oslots for r in (1, 2, 3)), "only R0 and R4 know slot j"
    sim.net.isolate(0)
    for r in (1, 2, 3):  # who stands is the schedule's choice: R4's timer fires first
        sim.nodes[r].election_due = NEVER
    phase["p"] = "L"
    t = step_until(sim, lambda: r4.sequencer == 4 and r4.phase in ("recovering", "normal"), t, t + 4000)
    assert t is not None and r4.phase == "recovering", "R4 took office in view L and cannot serve"
    view_l = r4.view
    assert r4.oslots[j].leader == 4, "L's recovered log keeps j -> R4"
    t = step_until(sim, lambda: any(s.view == view_l for s in sim.nodes[2].oslots.values()), t, t + 1000)
    assert t is not None, "R2 took L's O-commit of the committed prefix"
    sim.run(until_ms=t + 50)
    t += 50
    assert j not in sim.nodes[2].oslots, "R2 never learned slot j"
    if not restart_r2:
        assert sim.nodes[2].o_view < view_l, "an O-commit alone raises no o_view (and earns no OAck)"
    else:
        sim.crash(2)
        sim.restart(2)
        assert sim.nodes[2].o_view < view_l, "o_view is replayed from AV records only"
    sim.crash(4)
    for r in (1, 2, 3):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.nodes[2].election_due = sim.nodes[3].election_due = NEVER  # R1 stands
    t = step_until(sim, lambda: sim.nodes[1].sequencer == 1 and sim.nodes[1].phase == "normal" and sim.nodes[1].view > view_l, t, t + 8000, step_ms=5)
    assert t is not None, "R1, R2, R3 elected R1"
    seq = sim.nodes[1]
    got = getattr(seq.oslots.get(j), "leader", None)
    sim.msg_filter = None
    sim.net.heal()
    sim.restart(4)
    for r in (1, 2, 3):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.nodes[2].propose(102, 9, ["put", "x", "after"])
    sim._drain(2)
    sim.run()
    result = sim.summary()
    if got != 4 or not (result["consistent"] and result["agreement"]) or result["lost_acked"]:
        raise RuleBroken(
            f"R4 executed X at slot {j} in view 0; view {seq.view} (R1) put {got} there; "
            f"consistent={result['consistent']} agreement={result['agreement']} lost_acked={result['lost_acked']}"
        )


def test_fig7_misses_r_m_slots_below_the_base_of_its_own_view():
    """N=5, LAN, snapshots every 2 slots. R0 serves view 0; R4 = R_m.

    The same blind spot without the O-commit: a sequencer's recovered log starts at its
    ``vote_base`` (its committed O-prefix), and a replica that compacted raises its
    committed prefix to its floor (``_raise_floor``: "executed slots are decided"),
    fast-executed slots included. So L's recovered log need not cover u's fast slots
    even when its sequencer is R_m itself, and voters that took every O-accept of L
    (o_view = L, honestly) still know nothing of them.

    1. R4 writes X1..X4; R0 gives them slots j..j+3, whose O-accepts reach R4 only: R4
       fast-executes all four, snapshots and compacts past j (floor > j, so its
       committed prefix is past j too).
    2. R0 is cut off. R4 wins view L with R1, R2, R3; its VRequest and recovered log
       start above j. L's O-accepts reach everyone (o_view = L at R1, R2, R3); its
       Compacted notices are lost (a dropped message type), so nobody fetches R4's
       snapshot; L cannot serve (the others miss slot j).
    3. R4 crashes. R1, R2, R3 elect one of them: last_view = L, last_seq = R4 (no
       voter), Fig. 7 fills for R0 only; slots j..j+3 are holes: no-cl.

    Fixed: ``take_snapshot`` waits while an executed slot is not yet committed, so
    R4 keeps j..j+3 in its log (and in L's recovered log).
    """
    sim, replies = quiet(seconds=8.0, snapshot_every=2)
    phase = {"p": "warm"}

    def keep(src, dst, m):
        name = type(m).__name__
        p = phase["p"]
        if p == "fast" and src == 0 and name == "OAccept" and dst != 4:
            return False  # the O-accepts of R4's slots reach R4 only
        if p == "L" and src == 4 and name == "Compacted":
            return False  # nobody is pointed at R4's snapshot
        return True

    sim.msg_filter = keep
    for k in range(3):
        for node in (1, 3):
            sim.nodes[node].propose(100 + node, k + 1, ["put", f"k{node}", f"a{k}"])
            sim._drain(node)
        sim.run(until_ms=1000 + 20 * (k + 1))
    sim.run(until_ms=1200)
    r4 = sim.nodes[4]
    phase["p"] = "fast"
    t = 1200
    for k in range(4):
        sim.nodes[4].propose(104, k + 1, ["put", "x", f"X{k + 1}"])
        sim._drain(4)
        t = step_until(sim, lambda: any(r[:2] == (104, k + 1) for r in replies), t, t + 300)
        assert t is not None, f"R4 answered X{k + 1} (fast path)"
        if k == 0:
            j = min(s for s, o in r4.oslots.items() if o.leader == 4 and o.fast)
    sim.run(until_ms=t + 20)
    t += 20
    assert r4.exec_slot > j + 3
    if r4.floor_slot <= j:
        return  # the rule holds: no snapshot covers an executed slot not yet committed
    assert all(j not in sim.nodes[r].oslots and sim.nodes[r].floor_slot <= j for r in (1, 2, 3)), "only R0, R4 know slot j"
    sim.net.isolate(0)
    for r in (1, 2, 3):  # who stands is the schedule's choice: R4's timer fires first
        sim.nodes[r].election_due = NEVER
    phase["p"] = "L"
    t = step_until(sim, lambda: r4.sequencer == 4 and r4.phase in ("recovering", "normal"), t, t + 4000)
    assert t is not None and r4.phase == "recovering", "R4 took office in view L and cannot serve"
    view_l = r4.view
    t = step_until(sim, lambda: all(sim.nodes[r].o_view == view_l for r in (1, 2, 3)), t, t + 1000)
    assert t is not None, "R1, R2, R3 took L's O-accepts"
    assert all(j not in sim.nodes[r].oslots for r in (1, 2, 3)), "L's O-accepts start above j"
    sim.crash(4)
    for r in (1, 2, 3):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()

    def new_seq():
        return next((n for n in sim.nodes[1:4] if n.sequencer == n.id and n.phase == "normal" and n.view > view_l), None)

    t = step_until(sim, lambda: new_seq() is not None, t, t + 8000, step_ms=5)
    assert t is not None, "R1, R2, R3 elected one of them"
    seq = new_seq()
    got = getattr(seq.oslots.get(j), "leader", None)
    sim.msg_filter = None
    sim.net.heal()
    sim.restart(4)
    sim.nodes[2].propose(102, 9, ["put", "x", "after"])
    sim._drain(2)
    sim.run()
    result = sim.summary()
    if got != 4 or not (result["consistent"] and result["agreement"]) or result["lost_acked"]:
        raise RuleBroken(
            f"R4 executed X1 at slot {j} in view 0; view {seq.view} (R{seq.id}) put {got} there; "
            f"consistent={result['consistent']} agreement={result['agreement']} lost_acked={result['lost_acked']}"
        )
