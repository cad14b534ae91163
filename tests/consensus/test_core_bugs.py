"""Regression schedules for the four SDPaxos safety bugs of issue 9.

Each test replays, in the seeded simulator, the schedule that broke a rule of the
core, and checks the rule's consequence directly. With the fix reverted each test
fails (the mutation list in ``tools/mutants.py`` re-plants every one of them).
"""

from .schedules import quiet, step_until

S = 0  # the first sequencer


def test_a_voter_keeps_its_lease_promise_in_every_view():
    """Bug 1. R1 joins candidate R2's view through R2's pings while its lease promise
    to the sequencer S still runs; R2's retried VRequest then comes in R1's own view.
    A vote there would elect R2 while S, cut off but with a valid lease, still serves
    reads locally: S would answer k=v1 after R2 acknowledged k=v2."""
    sim, replies = quiet(3)
    sim.nodes[1].propose(101, 1, ["put", "k", "v1"])
    sim._drain(1)
    sim.run(until_ms=1100)
    assert (101, 1, None) in replies or any(r[:2] == (101, 1) for r in replies)
    sim.net.cut(S, 2)
    sim.net.cut(2, S)  # R1 still renews S's lease; R2 hears no sequencer
    # R2 stands for election. (Its pre-vote fails while R1 hears from S; R2 gets here
    # when R1 granted a pre-vote during a silence of S and heard from S again after.)
    sim.run(until_ms=1700)
    sim.nodes[2]._start_election()
    sim._drain(2)
    t = 1700
    assert sim.nodes[2].phase == "candidate"
    sim.net.isolate(S)  # S never learns of the new view; its lease runs on
    t = step_until(sim, lambda: sim.nodes[1].view == sim.nodes[2].view, t, t + 1000)
    assert t is not None, "R1 joined R2's view from its pings"
    assert sim.nodes[1].now < sim.nodes[1].lease_until, "...while its promise to S still ran"
    t = step_until(sim, lambda: sim.nodes[2].phase == "normal" and sim.nodes[2].sequencer == 2, t, t + 3000)
    assert t is not None, "R2 took office eventually"
    # The rule: R2 cannot be serving while S still counts on its lease.
    assert not sim.nodes[S].lease_valid(), "a new sequencer serves while the old one's lease holds"
    sim.nodes[2].propose(102, 1, ["put", "k", "v2"])
    sim._drain(2)
    t = step_until(sim, lambda: any(r[:2] == (102, 1) for r in replies), t, t + 1000)
    assert t is not None, "R2 acknowledged k=v2"
    sim.nodes[S].read(100, 1, ["get", "k"], "k")
    sim._drain(S)
    sim.run(until_ms=t + 50)
    assert not [r for r in replies if r[:2] == (100, 1)], "S answered a read of k after k=v2 was acknowledged"


def test_a_command_leader_counts_acks_of_one_ballot_only():
    """Bug 3 (N=5, CL=R3, recoverer R4). X at ballot b reaches only R0. R4 prepares
    with R1, R2 (which never saw X) and proposes a no-op at a higher ballot b'; its
    C-accept reaches only R3, which accepts it for its own in-flight instance. R3's
    resend of (b', no-op) reaches only R4, which acks. Counting R0's old ack for b
    with R3 and R4 for b' would make R3 choose the no-op with no quorum at any one
    ballot; R0 then recovers X: two values for one instance."""
    sim, replies = quiet(5)
    phase = {"now": "x"}

    def keep(src, dst, m):
        name = type(m).__name__
        if phase["now"] == "x":  # X at ballot b reaches R0 only
            return not (src == 3 and name in ("CAccept", "CCommit") and dst != 0)
        if phase["now"] == "recover":  # R4's phase 1 with R1, R2; its phase 2 to R3 only
            if src == 4 and name == "CPrepare":
                return dst in (1, 2)
            if src == 4 and name == "CAccept":
                return dst == 3
            return not (src == 3 and name in ("CAccept", "CCommit", "CPromise"))
        # R3's resends of (b', no-op) reach R4 only; nothing of R3's commit gets out.
        if src == 3 and name in ("CAccept", "CCommit"):
            return dst == 4 and name == "CAccept"
        return not (src == 4 and name in ("CAccept", "CPrepare", "CCommit"))

    sim.msg_filter = keep
    sim.nodes[3].propose(103, 1, ["put", "k", "X"])
    sim._drain(3)
    sim.run(until_ms=1010)
    mine = sim.nodes[3].clog[3][0]
    b = mine.ballot
    assert not mine.committed and sim.nodes[0].clog[3][0].cmds is not None
    phase["now"] = "recover"
    sim.nodes[4]._start_crecovery(3, 0, 0)
    sim._drain(4)
    t = step_until(sim, lambda: mine.ballot > b, 1010, 1200)
    assert t is not None and mine.cmds is None, "R3 accepted R4's no-op at b' for its own instance"
    phase["now"] = "resend"
    t = step_until(sim, lambda: sim.nodes[4].clog[3][0].ballot == mine.ballot and sim.nodes[3].unready[0].acks >> 4 & 1, t, t + 2000)
    assert t is not None, "R4 acked R3's resend of (b', no-op)"
    assert not mine.committed, "R3 chose the no-op with acks of two ballots"
    # End to end: R3 and R4 fail; the survivors recover X, and nobody executed a no-op.
    sim.crash(3)
    sim.crash(4)
    sim.msg_filter = None
    sim.run()
    result = sim.summary()
    assert result["consistent"], result


def test_a_re_prepared_instance_is_ordered_with_its_keys():
    """Bug 4 (N=3, sequencer R0). R1 re-prepares its own instance holding k=v2; the
    sequencer first learns of it from the C-request R1 sends after the re-prepare.
    Without the instance's keys the sequencer's history table keeps k at the slot of
    k=v1, so a lease read of k at R0 returns v1 after k=v2 was acknowledged (R0 has
    not executed v2's slot: it never received that C-instance)."""
    sim, replies = quiet(3)
    sim.nodes[2].propose(102, 1, ["put", "k", "v1"])
    sim._drain(2)
    sim.run(until_ms=1100)
    assert any(r[:2] == (102, 1) for r in replies)
    # R0 sees nothing of R1's instance but the C-request that follows the re-prepare.
    sim.msg_filter = lambda src, dst, m: not (
        dst == 0 and type(m).__name__ in ("CAccept", "CCommit") or (src == 1 and dst == 0 and type(m).__name__ == "CRequest" and not allow["req"])
    )
    allow = {"req": False}
    sim.nodes[1].propose(101, 1, ["put", "k", "v2"])
    sim._drain(1)
    sim.run(until_ms=1105)
    allow["req"] = True
    sim.nodes[1]._start_crecovery(1, 0, 0)  # R1 re-prepares its own instances
    sim._drain(1)
    t = step_until(sim, lambda: any(r[:2] == (101, 1) for r in replies), 1105, 1400)
    assert t is not None, "k=v2 was acknowledged"
    assert sim.nodes[0].stats["recoveries"] == 0 and sim.nodes[1].stats["recoveries"] >= 1
    sim.nodes[0].read(100, 1, ["get", "k"], "k")
    sim._drain(0)
    sim.run(until_ms=t + 5)
    assert [r[2] for r in replies if r[:2] == (100, 1)] in ([], ["v2"]), "a lease read at the sequencer returned k=v1"


def test_fig7_finds_the_last_sequencer_through_its_voters():
    """Bug 2 (N=5, never more than two replicas down). R0 (the sequencer) crashes and
    R2 is isolated; R1 wins with the votes of R3 and R4; nothing of R1's reaches R3.
    R0 restarts; R4's write is acknowledged on the N=5 fast path, its O-slot seen by
    R1 and R4 only. R1 and R4 crash; R2 takes office with voters {R0, R3, R2}. It
    must see that R1 served (R1 could not serve before a majority took its
    O-accepts: R0 did, and says so in its vote) and give R4's slot back to R4
    (Fig. 7), or its next command takes R4's executed slot."""
    sim, replies = quiet(5)
    for node in (1, 2, 3):
        sim.nodes[node].propose(100 + node, 1, ["put", f"k{node}", "a"])
        sim._drain(node)
    sim.run(until_ms=1100)
    only = {"candidate": 1, "cut": ()}

    def keep(src, dst, m):
        if type(m).__name__ == "VRequest" and src != only["candidate"]:
            return False
        return (src, dst) not in only["cut"] or type(m).__name__ == "VRequest"

    sim.msg_filter = keep
    sim.crash(0)
    sim.net.isolate(2)
    # Who stands, and when, is this schedule's choice: only the named candidate does.
    never = 10**9
    for r in (1, 3, 4):
        sim.nodes[r].election_due = never
    sim.run(until_ms=1700)  # every lease promise to R0 has run out
    sim.nodes[1]._start_election()
    sim._drain(1)
    t = 1700
    only["cut"] = ((1, 3),)  # nothing of R1's but its VRequest reaches R3
    t = step_until(sim, lambda: sim.nodes[1].phase in ("recovering", "normal"), t, t + 3000)
    assert t is not None, "R1 took office with R3's and R4's votes"
    sim.restart(0)
    sim.nodes[0].gate.no_vote_until = never  # R0 restarts as the stale owner of view 0: keep it out
    t = step_until(sim, lambda: sim.nodes[1].phase == "normal", t, t + 3000)
    assert t is not None, "R1 serves once a majority (R0, R4) took its O-accepts"
    only["cut"] = ((1, 3), (1, 0))  # from now on R1's O-accepts reach R4 only
    inst = sim.nodes[4].next_inst
    sim.nodes[4].propose(104, 1, ["put", "x", "from-r4"])
    sim._drain(4)
    t = step_until(sim, lambda: any(r[:2] == (104, 1) for r in replies), t, t + 1000)
    assert t is not None, "R4's write was acknowledged"
    slot = next(j for j, s in sorted(sim.nodes[4].oslots.items()) if s.leader == 4 and sum(
        1 for i, o in sim.nodes[4].oslots.items() if o.leader == 4 and i <= j) == inst + 1)
    t = step_until(sim, lambda: sim.nodes[4].exec_slot > slot, t, t + 1000)
    assert t is not None, "R4 executed its write (fast path: its slot is committed there)"
    assert all(slot not in sim.nodes[r].oslots for r in (0, 2, 3)), "no survivor saw R4's slot"
    sim.crash(1)
    sim.crash(4)
    sim.net.heal()
    only["cut"] = ()
    only["candidate"] = 2
    sim.nodes[0].gate.no_vote_until = 0
    for r in (0, 3):
        sim.nodes[r].election_due = never
    sim.run(until_ms=t + 600)  # R0's lease promise to R1 runs out
    sim.nodes[2]._start_election()
    sim._drain(2)
    t += 600
    t = step_until(sim, lambda: sim.nodes[2].phase == "normal" and sim.nodes[2].sequencer == 2, t, t + 6000)
    assert t is not None, "R2 took office with R0's and R3's votes"
    assert getattr(sim.nodes[2].oslots.get(slot), "leader", None) == 4, "Fig. 7 gave R4's executed slot back to R4"
    sim.msg_filter = None
    sim.nodes[3].propose(103, 2, ["put", "y", "after"])
    sim._drain(3)
    sim.run()
    result = sim.summary()
    assert result["consistent"] and result["lost_acked"] == 0, result
