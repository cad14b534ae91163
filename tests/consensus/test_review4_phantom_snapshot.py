"""Review 4 of a850b8f (N=5): a phantom instance decided by an installed snapshot leaves
the new sequencer recovering for good. See docs/reviews/core-fixes-review-4.md.

The recovering sequencer serves once its acked prefix reaches ``recover_end`` and no
phantom is pending (``_recompute_majority``). That check runs on an OAck that raises a
peer's acked prefix, on new slots, and on a C-commit (``_serve_if_decided`` after
``_commit_c`` / ``_on_ccommit``). A phantom can also be decided by a snapshot: a peer
executed the phantom's slot, compacted past it and answers the sequencer's Fetch with a
Compacted notice; ``install_snapshot`` raises ``floor_inst`` past the phantom. Nothing
calls ``_recompute_majority`` then, and the next ``_sequencer_tick`` empties
``_phantoms`` (``_phantoms_pending`` filters it), so ``_serve_if_decided`` never fires
either. If every live peer already acked the whole recovered log, no OAck ever raises
an acked prefix again: the view never serves, every C-request stays deferred, and the
live peers keep hearing pings, so nobody elects.

Fixed: a recovering sequencer re-checks serving on every tick; and since nothing
after an open phantom slot commits, the snapshot path no longer arises here. The test
now requires that R1 serves after the heal whichever way the phantom is decided.
"""


from .schedules import NEVER, RuleBroken, hole_then_writes, quiet, step_until


def test_a_phantom_decided_by_a_snapshot_never_lets_the_view_serve():
    """N=5, LAN, snapshot every slot. R0 serves view 0; R4 = R_m; R1 stands, R2 and R3
    vote. R0 is cut off (and stays so: one replica down); R4 is cut off for the view
    change only; the other faults are lost messages, all healed before the check.

    1. As in test_review4_phantom_ack: a hole at h (R0's slot, its O-accepts lost), R4's
       W at h+1, R1's Z at h+2; R1's C-commit of Z does not reach R2.
    2. R0 and R4 cut off; R1 wins view 1 with R2, R3. Fig. 7 gives h to R4: h+1 is the
       phantom C_4^1. R1's CPrepares are lost; R2, R3 ack the whole recovered log.
    3. R4 comes back (R0 stays cut off) and writes X = C_4^1. C-commits to R1 are lost.
       R1 commits the recovered log (acked by a majority) and sends OCommits: R2
       executes h, h+1, fetches Z, executes h+2, and snapshots twice, so its floor
       passes C_4^1. R1, blocked on C_4^1, fetches it from R2, gets a Compacted notice
       and installs R2's snapshot: the phantom is decided.
    4. R1's next tick finds no phantom pending (and forgets the list); then every loss
       is healed (R0 still cut off). R4 writes five more commands. R1 stays
       recovering: they are deferred and never acknowledged.
    """
    sim, replies = quiet(seconds=60.0, snapshot_every=1)
    phase = {"p": "warm", "h": None}

    def keep(src, dst, m):
        name = type(m).__name__
        p = phase["p"]
        if p == "hide" and src == 0 and name == "OAccept" and m.start <= phase["h"]:
            return False  # the hole at h
        if p in ("hide", "office") and src == 1 and dst == 2 and name == "CCommit":
            return False  # R2 learns Z's commit only by fetching it (two snapshots)
        if p in ("office", "x") and src == 1 and name == "CPrepare":
            return False  # the phantom's recovery does not get through
        if p == "x" and dst == 1 and name == "CCommit":
            return False  # R1 does not learn C_4^1 from a commit
        return True

    sim.msg_filter = keep
    sim.run(until_ms=1100)
    r0, r1, r2, r4 = sim.nodes[0], sim.nodes[1], sim.nodes[2], sim.nodes[4]
    assert r0.sequencer == 0 and r0.phase == "normal"
    h = hole_then_writes(sim, phase, z_node=1)
    assert all(h not in sim.nodes[r].oslots for r in (1, 2, 3))
    sim.net.isolate(0)
    sim.net.isolate(4)
    for r in (2, 3):
        sim.nodes[r].election_due = NEVER
    phase["p"] = "office"
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), 1140, 6000, step_ms=2)
    assert t is not None and r1.phase == "recovering" and r1._phantoms == [(4, 1)], "R1 took office with a phantom"
    t = step_until(sim, lambda: all(r1.acked[r] >= r1.recover_end for r in (2, 3)), t, t + 400, step_ms=2)
    assert t is not None, "R2, R3 acked the recovered log"
    phase["p"] = "x"
    sim.net.heal()
    sim.net.isolate(0)
    t = step_until(sim, lambda: r4.view == r1.view, t, t + 2000, step_ms=2)
    assert t is not None, "R4 joined view 1"
    r4.propose(104, 2, ["put", "a", "X"])
    sim._drain(4)
    # (Since the fix, R2 cannot compact past the phantom: nothing after it commits
    # while it is open. R1 then neither serves nor installs before the heal.)
    t = step_until(sim, lambda: r1.stats["snapshots_installed"] > 0 or r1.phase == "normal", t, t + 5000, step_ms=5) or t + 5000
    installed = r1.stats["snapshots_installed"] > 0 and r1.floor_inst[4] > 1
    # The C-commits to R1 stay lost until its next tick has looked at the phantoms.
    t = step_until(sim, lambda: not r1._phantoms, t, t + 100) or t + 100
    phase["p"] = "heal"
    sim.msg_filter = None
    sim.net.heal()
    sim.net.isolate(0)  # R0 stays down: one replica
    for k in range(3, 8):
        r4.propose(104, k, ["put", "b", f"B{k}"])
        sim._drain(4)
    t0 = t
    served = step_until(sim, lambda: r1.phase == "normal", t, t + 30_000, step_ms=50)
    sim.run(until_ms=t0 + 30_000)
    acked = sorted(seq for cid, seq, _ in replies if cid == 104 and seq >= 3)
    if served is None or len(acked) < 5:
        raise RuleBroken(
            f"R1 installed a snapshot past phantom C_4^1 at {t0} ms with R2, R3, R4 acked at "
            f"recover_end; 30 s later R1 is {r1.phase} in view {r1.view} (views {[n.view for n in sim.nodes if n]}), "
            f"R4's writes 3..7 acknowledged: {acked}"
        )
