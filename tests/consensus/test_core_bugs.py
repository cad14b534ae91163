"""Regression schedules for the four SDPaxos safety bugs of issue 9.

Each test replays, in the seeded simulator, the schedule that broke a rule of the
core, and checks the rule's consequence directly. With the fix reverted each test
fails (the mutation list in ``tools/mutants.py`` re-plants every one of them).
"""

from consensus.sim import SimConfig, Simulation
from consensus.sim.simulator import Client

S = 0  # the first sequencer


def quiet(replicas=3, **kw):
    cfg = SimConfig(replicas=replicas, rtt="lan", clients_per_site=0, seconds=6.0, **kw)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)  # leases established by pings
    replies = []
    sim._on_reply = lambda cid, seq, result: replies.append((cid, seq, result))
    for node in range(replicas):
        sim.clients[100 + node] = Client(100 + node, node, active=False)
    return sim, replies


def step_until(sim, pred, start_ms, limit_ms, step_ms=1):
    """Advance in small steps until ``pred()`` holds; the time it did, or None."""
    t = start_ms
    while t < limit_ms:
        t += step_ms
        sim.run(until_ms=t)
        if pred():
            return t
    return None


def test_a_voter_keeps_its_lease_promise_in_every_view():
    """Bug 1. R1 joins candidate R2's view through R2's pings while its lease promise
    to the sequencer S still runs; R2's retried VRequest then comes in R1's own view.
    A vote there would elect R2 while S, cut off but with a valid lease, still serves
    reads locally: S would answer k=v1 after R2 acknowledged k=v2."""
    sim, replies = quiet()
    sim.nodes[1].propose(101, 1, ["put", "k", "v1"])
    sim._drain(1)
    sim.run(until_ms=1100)
    assert (101, 1, None) in replies or any(r[:2] == (101, 1) for r in replies)
    sim.net.cut(S, 2)
    sim.net.cut(2, S)  # R1 still renews S's lease; R2 hears no sequencer
    t = step_until(sim, lambda: sim.nodes[2].phase == "candidate", 1100, 3000)
    assert t is not None, "R2 stood for election"
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
    sim, replies = quiet(replicas=5)
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
    t = step_until(sim, lambda: sim.nodes[4].clog[3][0].ballot == mine.ballot and mine.acks >> 4 & 1, t, t + 2000)
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
    sim, replies = quiet()
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
