"""Review 7 of 5f23e18 (N=5): a phantom recovery decides a no-op at an instance the
*live* leader l has not proposed yet, with l in the recovery's quorum. l accepts that
no-op (and learns it is chosen), but ``next_inst`` does not move past it:
``_propose_instance`` writes l's next command over the no-op in l's own log, at l's
old ballot (below the promise l gave the recoverer), self-acks it, and two acceptors
that never saw the recovery complete a second quorum. Two values are chosen for one
C-instance. See docs/reviews/core-fixes-review-7.md, hole 2.

The change under review makes such recoveries more frequent (every slot of l past what
l is known to have *taken* is a phantom, not only those past what a voter accepted),
but the overwrite is in the proposer path and needs only some recoverer deciding an
instance at or past l's ``next_inst`` with l in its accept quorum.
"""

import pytest

from .schedules import NEVER, RuleBroken, exec_order, hole_then_writes, quiet, step_until


def test_a_live_leader_writes_over_a_chosen_phantom_noop():
    """N=5, LAN. At most one replica cut off (R0); the other faults are lost messages.

    1. As review 5: R0 writes H, its O-accepts from slot h on are lost; R4 writes W
       (C_4^0, slot h+1), R2 writes Z (slot h+2).
    2. R0 is cut off. R1 stands; R4's vote is lost (R4 stays connected). R1 wins view 1
       with R2 and R3: Fig. 7 (R_m = R4) gives h to R4, so C_4^1 (h+1) is a phantom.
       R1's CPrepare, no-op C-accept and C-commit for leader 4 to R3 are lost. R1, R2
       and R4 choose the no-op for C_4^1 at R1's ballot; R4 gets the short C-commit.
       View 1 serves.
    3. R0 comes back, but of its incoming messages only R4's C-accepts and C-commits
       arrive. R4 writes a=X. R4's next_inst is still 1: X is written over the
       chosen no-op in R4's log, at R4's round-0 ballot, below its promise to R1. The
       C-accepts to R1 and R2 are lost (and R4's fetches of C_4^1 from them, or
       their answers); R0 and R3 (who never saw R1's recovery of
       leader 4) accept it: X is chosen for C_4^1 too, and R4 acknowledges it.
    """
    sim, replies = quiet(seconds=8.0)
    acked_at: dict = {}
    on_reply = sim._on_reply

    def record(cid, seq, result):
        acked_at.setdefault((cid, seq), sim.now)
        on_reply(cid, seq, result)

    sim._on_reply = record
    phase = {"p": "warm", "h": None}
    c_msgs = ("CPrepare", "CPromise", "CAccept", "CAck", "CCommit")

    def keep(src, dst, m):
        name = type(m).__name__
        if phase["p"] == "hide" and src == 0 and name == "OAccept" and m.start <= phase["h"]:
            return False
        if phase["p"] == "vote1" and src == 4 and name == "Vote":
            return False
        if phase["p"] in ("vote1", "x") and name in c_msgs and getattr(m, "leader", None) == 4 and 3 in (src, dst) and 1 in (src, dst):
            return False  # R1's recovery of leader 4 never reaches R3
        if phase["p"] in ("vote1", "x") and name == "CPrepare" and m.leader == 4 and src not in (1, 4):
            return False  # blocked executors do not recover C_4^1 themselves
        if phase["p"] == "x" and name in ("CAccept", "CAck", "CCommit", "Fetch") and m.leader == 4 and {src, dst} & {1, 2} and 4 in (src, dst):
            return False
        if phase["p"] == "x" and dst == 0 and not (src == 4 and name in ("CAccept", "CCommit")):
            return False  # R0 hears only R4's C-accepts (it learns no O-slot, so it never blocks on C_4^1)
        return True

    sim.msg_filter = keep
    sim.run(until_ms=1100)
    r0, r1, r2, r3, r4 = sim.nodes
    assert r0.sequencer == 0 and r0.phase == "normal"
    h = hole_then_writes(sim, phase, z_node=2)
    assert [getattr(r0.oslots.get(h + k), "leader", None) for k in range(3)] == [0, 4, 2]
    # View 1: R0 cut off, R4's vote lost.
    sim.net.isolate(0)
    for r in (2, 3, 4):
        sim.nodes[r].election_due = NEVER
    phase["p"] = "vote1"
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), 1140, 6000, step_ms=2)
    assert t is not None, "R1 took office"
    assert r1.oslots[h].leader == 4 and r1.oslots[h + 1].leader == 4, "Fig. 7 gave h to R4"
    t = step_until(sim, lambda: r1.phase == "normal" and getattr(r4.clog[4].get(1), "committed", False), t, t + 2000, step_ms=2)
    assert t is not None, "view 1 serves; C_4^1 chosen as a no-op and R4 knows it"
    assert r1.clog[4][1].committed and r1.clog[4][1].cmds is None and r4.clog[4][1].cmds is None
    assert r4.promised[4] > r4.ballot, "R4 promised R1's ballot for its own instances"
    assert r4.next_inst == 1, "R4's next_inst did not move past the chosen no-op"
    assert r3.clog[4].get(1) is None and r3.promised[4] <= r4.ballot
    view1 = r1.view
    # R0 back; R4 writes X.
    sim.net.heal()
    r0.election_due = NEVER
    phase["p"] = "x"
    sim.run(until_ms=t + 5)
    r4.propose(104, 2, ["put", "a", "X"])
    sim._drain(4)
    t = step_until(sim, lambda: getattr(r4.clog[4].get(1), "committed", False) and r4.clog[4][1].cmds is not None
                   or (104, 2) in acked_at, t + 5, t + 1500, step_ms=2)
    assert r1.view == view1
    values = {r: (sim.nodes[r].clog[4][1].cmds, sim.nodes[r].clog[4][1].committed)
              for r in range(5) if sim.nodes[r].clog[4].get(1) is not None}
    chosen = {repr(cmds) for cmds, committed in values.values() if committed}
    if len(chosen) > 1:
        raise RuleBroken(
            f"two values chosen for C_4^1 (slot {h + 1}): R1's no-op (quorum R1, R2, R4 at R1's ballot) and "
            f"R4's X (quorum R4, R0, R3 at R4's round-0 ballot); per replica {values}; "
            f"X acknowledged: {(104, 2) in acked_at}"
        )
    # The fix: R4 re-prepares before proposing (its promise to R1 is above its ballot,
    # and C_4^1 holds R1's value); it learns the chosen no-op and X takes C_4^2.
    assert chosen == {"None"}, values
    sim.msg_filter = None
    sim.net.heal()
    for r in range(5):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.run()
    pos = exec_order(sim, {(104, 2)})
    assert (104, 2) in pos and (104, 2) in acked_at, "X executed and acknowledged"
    assert {sim.nodes[r].executor.sm.data.get("a") for r in range(5)} == {"X"}
