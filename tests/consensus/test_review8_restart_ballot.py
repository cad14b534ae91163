"""Review 8 of ca96456 (N=5): a restarted command leader proposes at a ballot it
never prepared.

``_after_replay`` raises l's ballot to ``make_ballot(ballot_round(max(top,
promised[l])), l)`` when someone prepared l's instances. That ballot is *higher* than
the recoverer's whenever l's id is higher than the recoverer's (ballots order by
round, then owner), so ``promised[l] > ballot`` no longer holds and the check that
ca96456 added to ``_flush_proposals`` does not re-prepare. l then proposes its next
command at a fresh instance at a ballot nobody promised, with no phase 1, over a
no-op a phantom recovery chose there at the lower ballot (l promised that recovery
but lost its C-accept). Acceptors that hold the chosen no-op ack the higher ballot
without storing it ("already chosen"), so l commits and acknowledges a command that
no other replica will ever execute. See docs/reviews/core-fixes-review-8.md, hole 1.

Fixed: after a restart l proposes only at a ballot that reached phase 2 (records at
it), never one made up from a promise; a promise above it makes ``_flush_proposals``
re-prepare first, and X takes C_4^2.
"""

from .schedules import NEVER, RuleBroken, hole_then_writes, quiet, step_until


def test_a_restarted_leader_proposes_above_a_promise_without_phase_1():
    """Schedule A (the steps are in ``_schedule``): R4's id is above R1's, so the
    restarted ballot (1, R4) = 36 is above R1's 33 = (1, R1)."""
    _schedule(mid_reprepare=False)


def test_a_leader_restarted_mid_re_prepare_proposes_at_the_unprepared_ballot():
    """Schedule B. As schedule A, but R4 is live when it writes X first: ca96456's check sees
    promised[4] = 33 > ballot 4 and re-prepares at 68 = (round 2, R4), a durable P
    record; every CPrepare of that re-prepare is lost, and R4 crashes before any
    promise (X was never proposed, never answered). After the restart
    ``_after_replay`` sets ballot := make_ballot(round(68), 4) = 68 = promised[4]:
    the unfinished re-prepare's ballot counts as prepared, whatever R4's id. R4's
    client retries X: C_4^1 at 68, no phase 1, over the chosen no-op."""
    _schedule(mid_reprepare=True)


def _schedule(mid_reprepare: bool) -> None:
    """N=5, LAN. At most one replica cut off (R0), one crash and restart (R4); the
    other faults are lost messages.

    1. As review 5: R0 writes H, its O-accepts from slot h on are lost; R4 writes W
       (C_4^0), R2 writes Z.
    2. R0 is cut off. R1 stands; R4's vote is lost. R1 wins view 1 with R2 and R3:
       Fig. 7 (R_m = R4) gives h to R4, so C_4^1 (h+1) is a phantom. R1 C-recovers
       it at ballot 33 = (round 1, R1): R4 promises 33 (a durable P record), but
       R1's C-accept and C-commit of leader 4 to R4 are lost (and R4's fetches of
       C_4^1). R1, R2, R3 choose the no-op for C_4^1. View 1 serves; Z acknowledged.
    3. R4 crashes and restarts. ``_after_replay``: promised[4] = 33 > ballot 4, so
       ballot := make_ballot(1, 4) = 36 > 33. ``next_inst`` = 1 (R4's log holds
       C_4^0 only). No re-prepare: 33 is not above 36, and C_4^1 is not in R4's log.
    4. R4 writes x=X: C_4^1 at ballot 36, no phase 1. R1, R2, R3 hold C_4^1 chosen
       and ack any ballot not below their promise (33): R4 commits X and, once view
       1's O-slot h+1 is committed, acknowledges it. Every other replica executes the
       no-op at h+1: X, acknowledged, is lost there for good.
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
        if phase["p"] == "reprep":
            if name == "CPrepare" and src == 4:
                return False  # R4's own re-prepare is lost
            phase_p = "vote1"
        else:
            phase_p = phase["p"]
        if phase["p"] == "hide" and src == 0 and name == "OAccept" and m.start <= phase["h"]:
            return False
        if phase["p"] == "vote1" and src == 4 and name == "Vote":
            return False
        if phase_p in ("vote1", "x") and getattr(m, "leader", None) == 4:
            if dst == 4 and name in ("CAccept", "CCommit"):
                return False  # R4 promises R1's ballot but never learns the no-op
            if src == 4 and name == "Fetch":
                return False
            if name == "CPrepare" and src not in (1, 4):
                return False  # blocked executors do not recover C_4^1 themselves
        return True

    sim.msg_filter = keep
    sim.run(until_ms=1100)
    r0, r1, r2, r3, r4 = sim.nodes
    assert r0.sequencer == 0 and r0.phase == "normal"
    h = hole_then_writes(sim, phase, z_node=2)
    assert [getattr(r0.oslots.get(h + k), "leader", None) for k in range(3)] == [0, 4, 2]
    sim.net.isolate(0)
    for r in (2, 3, 4):
        sim.nodes[r].election_due = NEVER
    phase["p"] = "vote1"
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), 1140, 6000, step_ms=2)
    assert t is not None, "R1 took office"
    assert r1.oslots[h].leader == 4 and r1.oslots[h + 1].leader == 4, "Fig. 7 gave h to R4"
    t = step_until(sim, lambda: r1.phase == "normal" and (102, 1) in acked_at, t, t + 2000, step_ms=2)
    assert t is not None, "view 1 serves and Z is acknowledged"
    noop_ballot = r1.clog[4][1].ballot
    assert r1.clog[4][1].committed and r1.clog[4][1].cmds is None
    assert r4.clog[4].get(1) is None and r4.promised[4] == noop_ballot, "R4 promised R1's ballot, lost its accept"
    # R4 crashes and restarts.
    sim.run(until_ms=t + 50)
    if mid_reprepare:
        phase["p"] = "reprep"
        r4.propose(104, 2, ["put", "x", "X"])
        sim._drain(4)
        sim.run(until_ms=t + 80)
        assert 4 in r4.crec and r4.promised[4] > noop_ballot and r4.clog[4].get(1) is None, ("R4 re-prepares", r4.crec, r4.promised, r4.ballot, r4.next_inst, r4._pending, r4.unready, r4._crec_after, r4.now)
        assert (104, 2) not in acked_at
        phase["p"] = "vote1"
    sim.crash(4)
    sim.run(until_ms=t + 100)
    sim.restart(4)
    r4 = sim.nodes[4]
    r4.election_due = NEVER
    restarted_ballot, promised = r4.ballot, r4.promised[4]
    assert r4.next_inst == 1
    phase["p"] = "x"
    sim.run(until_ms=t + 400)
    x_invoked = sim.now
    r4.propose(104, 2, ["put", "x", "X"])
    sim._drain(4)
    t = step_until(sim, lambda: (104, 2) in acked_at or getattr(r4.clog[4].get(1), "committed", False),
                   sim.now, sim.now + 3000, step_ms=2)
    sim.run(until_ms=sim.now + 1000)
    values = {r: (sim.nodes[r].clog[4][1].cmds, sim.nodes[r].clog[4][1].committed)
              for r in range(5) if sim.nodes[r].clog[4].get(1) is not None}
    chosen = {repr(cmds) for cmds, committed in values.values() if committed}
    xs = {r: sim.nodes[r].executor.sm.data.get("x") for r in range(5)}
    if len(chosen) > 1:
        raise RuleBroken(
            f"two values chosen for C_4^1 (slot {h + 1}): R1's no-op at ballot {noop_ballot} (R1, R2, R3) and R4's X "
            f"at ballot {restarted_ballot} (promised {promised}), never prepared; per replica {values}; "
            f"X acknowledged: {(104, 2) in acked_at} (invoked {x_invoked}); x per replica {xs}"
        )
    assert chosen == {"None"}, values
