"""Review 5 of 0b91220 (N=5): the phantom cap lives only in the sequencer that ran
Fig. 7. See docs/reviews/core-fixes-review-5.md.

0b91220 caps a recovering sequencer's commit point at its first open phantom slot
(``_phantom_slot``), so nothing after a slot that may stand for an instance R_m never
proposed is acknowledged. But the phantom set is that sequencer's private state. If it
loses office before the phantom is decided, the next sequencer inherits the slot (the
voters report it, accepted in the previous view) without knowing it is a phantom: its
own Fig. 7 runs against the previous view's sequencer, names a different R_m (or none),
and so commits past the slot, serves, and acknowledges a command ordered after it.
R_m's next command then takes the phantom instance, and so the earlier slot.

Fixed: every N=5 take-office works out the open phantom instances of every leader
(slots past the instances any voter accepted from it), not only after its own fill.
"""


from .schedules import NEVER, RuleBroken, exec_order, hole_then_writes, quiet, step_until


def test_a_phantom_slot_is_forgotten_by_the_next_view():
    """N=5, LAN. R0 serves view 0; R4 = R_m of view 1; R1 stands for view 1; R4 wins
    view 2. At most two replicas cut off at once (R0 and R4, then R0 and R1); the
    other faults are lost messages.

    1. As in review 4 hole 1, but the command after the phantom is R2's: R0 writes H,
       its O-accepts from H's slot h on are lost. R4 writes W (C_4^0, slot h+1), R2
       writes Z on key a (slot h+2). Nothing is ready.
    2. R0 and R4 are cut off. R1 wins view 1 with R2, R3. Fig. 7 gives h to R4, so h+1
       is the phantom C_4^1. R1's CPrepares are lost. R2 and R3 take the whole
       recovered log (o_view = view 1); the cap keeps R1 from committing h+1, h+2.
    3. R1 is cut off and R4 comes back (R0 stays cut off). R4 wins the next view with
       R2 and R3 (any of R2, R3, R4 would do). Its Fig. 7: the last view reported is
       view 1, R1 did not vote, so R_m is R0, not R4, and there is no phantom. It
       re-proposes h: R4, h+1: R4, h+2: R2 (and a slot for R0's H), commits them,
       serves, and Z (C-committed long ago) is ready: R2 acknowledges it.
    4. R4 writes X on key a after Z's acknowledgement: X is C_4^1, slot h+1, before Z.
    """
    sim, replies = quiet(seconds=8.0)
    acked_at: dict = {}
    on_reply = sim._on_reply

    def record(cid, seq, result):
        acked_at.setdefault((cid, seq), sim.now)
        on_reply(cid, seq, result)

    sim._on_reply = record
    phase = {"p": "warm", "h": None}

    def keep(src, dst, m):
        name = type(m).__name__
        if phase["p"] == "hide" and src == 0 and name == "OAccept" and m.start <= phase["h"]:
            return False
        if phase["p"] == "office" and src == 1 and name == "CPrepare":
            return False
        return True

    sim.msg_filter = keep
    sim.run(until_ms=1100)
    r0, r1, r2, r3, r4 = sim.nodes
    assert r0.sequencer == 0 and r0.phase == "normal"
    h = hole_then_writes(sim, phase, z_node=2)
    assert [getattr(r0.oslots.get(h + k), "leader", None) for k in range(3)] == [0, 4, 2]
    assert all(h not in sim.nodes[r].oslots and sim.nodes[r].oslots[h + 2].leader == 2 for r in (1, 2, 3))
    assert not acked_at
    # View 1: R1, phantom C_4^1 at h+1, its recovery lost.
    sim.net.isolate(0)
    sim.net.isolate(4)
    for r in (2, 3, 4):
        sim.nodes[r].election_due = NEVER
    phase["p"] = "office"
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), 1140, 6000, step_ms=2)
    assert t is not None and r1.phase == "recovering", "R1 took office"
    assert r1._phantoms == [(4, 1)] and r1._phantom_slot == h + 1
    assert r1.oslots[h].leader == 4 and r1.oslots[h + 1].leader == 4
    t = step_until(sim, lambda: r2.o_view == r1.view and r3.o_view == r1.view, t, t + 1000, step_ms=2)
    assert t is not None, "R2 and R3 took view 1's whole recovered log"
    sim.run(until_ms=t + 50)
    assert r1.phase == "recovering" and r1.o_committed <= h + 1 and not acked_at, "the cap holds in view 1"
    view1 = r1.view
    # View 2: R1 cut off, R4 back. R4 (back in view 1 from R2's and R3's messages) stands
    # first; any sequencer other than R0 and R1 will do.
    sim.net.heal()
    sim.net.isolate(0)
    sim.net.isolate(1)
    phase["p"] = "view2"
    for r in (3, 4):
        sim.nodes[r].election_due = NEVER
    r2.election_due = r2._election_deadline()
    t = step_until(sim, lambda: r2.view > view1 and r2.sequencer in (2, 3, 4) and sim.nodes[r2.sequencer].phase == "normal", t + 50, t + 4000, step_ms=2)
    assert t is not None, "a view 2 without R0 and R1 serves"
    seq = sim.nodes[r2.sequencer]
    assert not seq._phantoms, "view 2's Fig. 7 names no phantom of R4"
    t = step_until(sim, lambda: (102, 1) in acked_at, t, t + 1000, step_ms=2)
    assert t is not None, "Z acknowledged in view 2"
    c41 = seq.clog[4].get(1)
    open_at_ack = not getattr(c41, "committed", False)
    sim.run(until_ms=t + 5)
    x_invoked = sim.now
    r4.propose(104, 2, ["put", "a", "X"])
    sim._drain(4)
    sim.msg_filter = None
    sim.net.heal()
    for r in (2, 3, 4):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.run()
    pos = exec_order(sim, {(102, 1), (104, 2)})
    assert (102, 1) in pos and (104, 2) in pos, "both writes executed"
    values = {sim.nodes[r].executor.sm.data.get("a") for r in range(5) if sim.nodes[r] is not None}
    if open_at_ack and acked_at[(102, 1)] < x_invoked and pos[(104, 2)] < pos[(102, 1)]:
        raise RuleBroken(
            f"R2 acknowledged put a=Z in view 2 (sequencer R{seq.id}) at {acked_at[(102, 1)]} us with C_4^1 (view 1's "
            f"phantom at slot {h + 1}) open; R4's put a=X, invoked at {x_invoked} us, became "
            f"C_4^1 and executes before Z (positions X {pos[(104, 2)]}, Z {pos[(102, 1)]}); "
            f"key a ends as {values}"
        )
