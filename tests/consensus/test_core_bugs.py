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
