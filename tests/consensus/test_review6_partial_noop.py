"""Review 6 of b8a3235 (N=5): ``known`` (the highest C-instance of a leader any voter
accepted) counts an instance that a recoverer's no-op reached at one voter only. See
docs/reviews/core-fixes-review-6.md.

b8a3235 treats a slot of leader l past ``max(voters' c_max[l]) + 1`` as a phantom. But
``c_max`` is raised by any C-accept, including the no-op of a C-recovery that did not
finish. If the phantom recovery of view 1 reaches one voter and its sequencer then
loses office, view 2 sees ``c_max[l]`` past the phantom, does not treat the slot as one,
commits past it and acknowledges Z. The no-op was never chosen, so l's next command
(re-prepared by a quorum without that voter) still takes the instance, and the slot
before Z.

Fixed: the phantom bound is what l is known to have taken (votes carry ``c_own``:
instances accepted at l's own ballot, or chosen), which a recoverer's no-op does not
raise. View 2 decides C_4^1 before it serves; X, displaced by the chosen no-op, is
retried by its client and executes after Z.
"""

import pytest

from .schedules import NEVER, RuleBroken, exec_order, hole_then_writes, quiet, step_until


def test_a_partial_phantom_noop_hides_the_phantom_from_the_next_view():
    """N=5, LAN. As review 5's schedule, but view 1's phantom recovery gets as far as
    one C-accept of the no-op for C_4^1, at R2. At most two replicas cut off at once
    (R0 and R4, then R0 and R1, then R1); the other faults are lost messages.

    1. R0 writes H, its O-accepts from H's slot h on are lost. R4 writes W (C_4^0,
       slot h+1), R2 writes Z on key a (slot h+2). Nothing is ready.
    2. R0 and R4 are cut off. R1 wins view 1 with R2, R3: phantom C_4^1 at h+1. Its
       CPrepare gets R2's and R3's promises; its no-op C-accept reaches R2 only.
    3. R1 is cut off, R4 comes back. View 2 (R2, R3, R4): R2 reports c_max[4] = 1, so
       known = 1 and there is no phantom. It commits, serves, and R2 acknowledges Z.
    4. R0 comes back. R4 writes X on key a after Z's acknowledgement: C_4^1 at its old
       ballot, refused by R2/R3 (R1's promise), so R4 re-prepares. R2's promise is
       lost, R0 and R3 report nothing for C_4^1, and X is chosen: slot h+1, before Z.
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
        if phase["p"] == "office" and src == 1 and name == "CAccept" and m.leader == 4 and dst != 2:
            return False
        if phase["p"] == "x" and getattr(m, "leader", None) == 4 and name in ("CPrepare", "CPromise"):
            if {src, dst} == {2, 4} or src not in (0, 3, 4):
                return False
            if name == "CPrepare" and src != 4:
                return False
        return True

    sim.msg_filter = keep
    sim.run(until_ms=1100)
    r0, r1, r2, r3, r4 = sim.nodes
    assert r0.sequencer == 0 and r0.phase == "normal"
    h = hole_then_writes(sim, phase, z_node=2)
    assert [getattr(r0.oslots.get(h + k), "leader", None) for k in range(3)] == [0, 4, 2]
    assert not acked_at
    # View 1: R1, phantom C_4^1 at h+1; its no-op reaches R2 only.
    sim.net.isolate(0)
    sim.net.isolate(4)
    for r in (2, 3, 4):
        sim.nodes[r].election_due = NEVER
    phase["p"] = "office"
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), 1140, 6000, step_ms=2)
    assert t is not None and r1.phase == "recovering", "R1 took office"
    assert r1._phantoms == [(4, 1)] and r1._phantom_slot == h + 1
    t = step_until(
        sim,
        lambda: r2.o_view == r1.view and r3.o_view == r1.view and r2.clog[4].get(1) is not None,
        t, t + 1000, step_ms=2,
    )
    assert t is not None, "R2 and R3 took view 1's log, R2 the no-op for C_4^1"
    c = r2.clog[4][1]
    assert c.cmds is None and not c.committed and r2.c_max[4] == 1
    assert r3.clog[4].get(1) is None and not acked_at
    view1 = r1.view
    # View 2: R1 cut off, R4 back.
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
    t = step_until(sim, lambda: (102, 1) in acked_at, t, t + 1000, step_ms=2)
    assert t is not None, "Z acknowledged in view 2"
    open_at_ack = not getattr(seq.clog[4].get(1), "committed", False)
    # The fix: R1's no-op at R2 is not R4's ballot, so view 2 still counts C_4^1 as a
    # phantom and decides it before serving.
    assert not open_at_ack, "C_4^1 decided before view 2 acknowledged Z"
    # R0 back (R1 stays cut off); R4 writes X.
    sim.net.heal()
    sim.net.isolate(1)
    r0.election_due = NEVER
    phase["p"] = "x"
    sim.run(until_ms=t + 5)
    x_invoked = sim.now
    r4.propose(104, 2, ["put", "a", "X"])
    sim._drain(4)
    t = step_until(sim, lambda: getattr(r4.clog[4].get(1), "committed", False), sim.now, sim.now + 2000, step_ms=2)
    assert t is not None, "C_4^1 decided"
    sim.msg_filter = None
    sim.net.heal()
    for r in range(5):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.run()
    pos = exec_order(sim, {(102, 1), (104, 2)})
    if (104, 2) not in pos:
        # C_4^1 was chosen as a no-op: X lost its instance and R4 dropped it unanswered;
        # its client retries (same client id and seq) and X takes a later instance.
        assert all(sim.nodes[r].clog[4][1].cmds is None for r in (0, 2, 3, 4))
        assert (104, 2) not in acked_at, "never acknowledge what was not applied"
        r4.propose(104, 2, ["put", "a", "X"])
        sim._drain(4)
        sim.run(until_ms=sim.now + 2000)
        pos = exec_order(sim, {(102, 1), (104, 2)})
    assert (102, 1) in pos and (104, 2) in pos, "both writes executed"
    values = {sim.nodes[r].executor.sm.data.get("a") for r in range(5) if sim.nodes[r] is not None}
    if open_at_ack and acked_at[(102, 1)] < x_invoked and pos[(104, 2)] < pos[(102, 1)]:
        raise RuleBroken(
            f"R2 acknowledged put a=Z in view 2 (sequencer R{seq.id}) at {acked_at[(102, 1)]} us with C_4^1 "
            f"(view 1's phantom at slot {h + 1}) open, hidden by R1's unchosen no-op at R2 (c_max[4] = 1); "
            f"R4's put a=X, invoked at {x_invoked} us, became C_4^1 and executes before Z "
            f"(positions X {pos[(104, 2)]}, Z {pos[(102, 1)]}); key a ends as {values}"
        )
