"""Review 7 of 5f23e18 (N=5): ``_taken`` counts a *committed* instance of leader l as
taken by l, and takes the maximum. A recoverer's no-op that is chosen at instance k
says nothing about the instances below k: if k-1 was never proposed by l and is still
open, the next view's bound jumps past it, the slot of k-1 is no phantom, the view
serves and acknowledges commands after it, and l's next command takes k-1 (and with it
the earlier slot). See docs/reviews/core-fixes-review-7.md, hole 1.

Two phantoms of one leader come from one Fig. 7 fill: R0 (view 0's sequencer) has two
hidden slots h, h+1 before R4's two slots h+2, h+3, so view 1's Fig. 7 gives h and h+1
to R4, and R4's instances 2 and 3 (slots h+2, h+3) are phantoms. View 1's recovery
gets the no-op for C_4^3 chosen but not the one for C_4^2.
"""

import pytest

from .schedules import NEVER, RuleBroken, exec_order, quiet, step_until


def _writes(sim, phase):
    """R0 writes H1, H2 (slots h, h+1; their O-accepts are lost), R4 writes W1, W2
    (C_4^0, C_4^1 at h+2, h+3), R2 writes a=Z (C_2^0 at h+4). Returns h."""
    r0 = sim.nodes[0]
    h = phase["h"] = r0.next_slot
    phase["p"] = "hide"
    t = sim.now // 1000  # ms
    for node, cid, seq, op in ((0, 100, 1, ["put", "h1", "H1"]), (0, 100, 2, ["put", "h2", "H2"]),
                               (4, 104, 1, ["put", "w1", "W1"]), (4, 104, 2, ["put", "w2", "W2"]),
                               (2, 102, 1, ["put", "a", "Z"])):
        sim.nodes[node].propose(cid, seq, op)
        sim._drain(node)
        t += 10
        sim.run(until_ms=t)
    sim.run(until_ms=t + 30)
    return h


def test_a_chosen_noop_above_an_open_phantom_hides_it_from_the_next_view():
    """N=5, LAN. At most two replicas cut off at once (R0 and R4, then R0 and R1);
    the other faults are lost messages.

    1. R0 writes H1, H2; its O-accepts from slot h on are lost. R4 writes W1, W2
       (C_4^0, C_4^1: slots h+2, h+3), R2 writes a=Z (C_2^0: slot h+4). Nothing is
       ready (the holes h, h+1 stop every ready rule).
    2. R0 and R4 are cut off. R1 wins view 1 with R2, R3. Fig. 7 (R_m = R4, C[4] = 1)
       fills h and h+1 with R4, so R4 owns h..h+3 and C_4^2 (h+2) and C_4^3 (h+3)
       are phantoms. R1's CPrepare gets R2's and R3's promises. Its no-op C-accept for
       C_4^3 reaches R2 and R3 and is chosen (R1 sends the short C-commits); every
       C-accept for C_4^2 is lost. The cap keeps view 1 from serving.
    3. R1 is cut off and R4 comes back. A view 2 of R2, R3, R4 (R4 stands first, as
       in review 5; any of them would do). R2 and R3
       report c_own[4] = 3 (C_4^3 committed), so known = 3 and view 2 has no phantom
       of R4. It commits h..h+4 and serves; R2 acknowledges Z while C_4^2 is open.
    4. R4 writes a=X after that. X is C_4^2 (R4's next_inst is 2): refused by R2, R3
       (R1's promise), R4 re-prepares; R2, R3 report nothing for C_4^2 (and the chosen
       no-op for C_4^3), so X is chosen as C_4^2, slot h+2, before Z at h+4.
       (Other replicas' CPrepares for leader 4 are lost meanwhile, so the blocked
       executors' own recoveries do not decide C_4^2 first.)
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
        if phase["p"] == "hide" and src == 0 and name == "OAccept" and m.start <= phase["h"] + 1:
            return False
        if phase["p"] == "office" and src == 1 and name == "CAccept" and m.leader == 4:
            return m.inst == 3 and dst in (2, 3)
        if phase["p"] in ("view2", "x") and name == "CPrepare" and m.leader == 4 and src != 4:
            return False
        return True

    sim.msg_filter = keep
    sim.run(until_ms=1100)
    r0, r1, r2, r3, r4 = sim.nodes
    assert r0.sequencer == 0 and r0.phase == "normal"
    h = _writes(sim, phase)
    assert [getattr(r0.oslots.get(h + k), "leader", None) for k in range(5)] == [0, 0, 4, 4, 2]
    assert all(sim.nodes[r].c_max[4] >= 0 for r in (0,)) and max(sim.nodes[r].c_max[4] for r in (1, 2, 3)) == 1
    assert not acked_at
    # View 1: R1; phantoms C_4^2 (h+2) and C_4^3 (h+3); only C_4^3's no-op is chosen.
    sim.net.isolate(0)
    sim.net.isolate(4)
    for r in (2, 3, 4):
        sim.nodes[r].election_due = NEVER
    phase["p"] = "office"
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), sim.now // 1000, 6000, step_ms=2)
    assert t is not None and r1.phase == "recovering", "R1 took office"
    # (C_4^3 may be chosen already: _phantoms_pending prunes it.)
    assert [r1.oslots[h + k].leader for k in range(5)] == [4, 4, 4, 4, 2]
    assert r1._phantoms[:1] == [(4, 2)] and r1._phantom_slot == h + 2
    t = step_until(
        sim,
        lambda: r2.o_view == r1.view and r3.o_view == r1.view
        and getattr(r2.clog[4].get(3), "committed", False) and getattr(r3.clog[4].get(3), "committed", False),
        t, t + 1000, step_ms=2,
    )
    assert t is not None, "R2 and R3 took view 1's log and the chosen no-op for C_4^3"
    assert r2.clog[4][3].cmds is None and r2.clog[4].get(2) is None and r3.clog[4].get(2) is None
    assert r1.phase == "recovering" and not acked_at, "the cap holds in view 1"
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
    open_at_ack = not getattr(seq.clog[4].get(2), "committed", False)
    # The fix: a chosen no-op does not count as taken by R4, so view 2 still sees
    # C_4^2 as a phantom and decides it before serving.
    assert not open_at_ack, "C_4^2 decided before view 2 acknowledged Z"
    # R4 writes X (R0 and R1 stay cut off).
    phase["p"] = "x"
    sim.run(until_ms=t + 5)
    x_invoked = sim.now
    r4.propose(104, 3, ["put", "a", "X"])
    sim._drain(4)
    t = step_until(sim, lambda: getattr(r4.clog[4].get(2), "committed", False), t + 5, t + 2000, step_ms=2)
    assert t is not None, "C_4^2 decided"
    sim.msg_filter = None
    sim.net.heal()
    for r in range(5):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.run()
    pos = exec_order(sim, {(102, 1), (104, 3)})
    if (104, 3) not in pos:
        # X lost its instance to a chosen no-op and R4 dropped it unanswered: its
        # client retries (same client id and seq).
        assert (104, 3) not in acked_at, "never acknowledge what was not applied"
        r4.propose(104, 3, ["put", "a", "X"])
        sim._drain(4)
        sim.run(until_ms=sim.now + 2000)
        pos = exec_order(sim, {(102, 1), (104, 3)})
    assert (102, 1) in pos and (104, 3) in pos, f"both writes executed {pos}"
    values = {sim.nodes[r].executor.sm.data.get("a") for r in range(5) if sim.nodes[r] is not None}
    if open_at_ack and acked_at[(102, 1)] < x_invoked and pos[(104, 3)] < pos[(102, 1)]:
        raise RuleBroken(
            f"R2 acknowledged put a=Z in view 2 (sequencer R{seq.id}) at {acked_at[(102, 1)]} us with C_4^2 "
            f"(view 1's phantom at slot {h + 2}) open, hidden by the chosen no-op at C_4^3 (c_own[4] = 3); "
            f"R4's put a=X, invoked at {x_invoked} us, became C_4^2 and executes before Z "
            f"(positions X {pos[(104, 3)]}, Z {pos[(102, 1)]}); key a ends as {values}"
        )
