"""Fetch is for loss (issue 16: "no Fetch traffic without loss"). A replica whose
execution waits for a C-instance it has not got fetches it after resend_ticks/2; once
a fetch has been answered and execution moves on to the next missing instance, that
one is fetched at once (a pipeline: catching up by thousands of slots costs round
trips, not timeouts). A block that clears because the C-commit came on its own, as it
does without loss, starts no pipeline: before, every such block after a step of
progress sent a Fetch, and the leader answered with a full CCommit it had already
sent (a fifth of the peer traffic under load on real processes).

Mutants (tools/mutants.py): ``fetch-after-every-progress`` (the old rule) is killed by
the lossless runs; ``fetch-pipeline-off`` by the catch-up."""

from __future__ import annotations

import pytest

from consensus.sim import SimConfig, Simulation

from .test_snapshot import assert_safe


@pytest.mark.parametrize("seed", [1])
def test_without_loss_nobody_fetches(seed):
    sim = Simulation(SimConfig(replicas=3, rtt="lan", seconds=0.3, seed=seed))
    sim.message_counts = {}
    sim.run()
    assert_safe(sim)
    assert sim.message_counts.get("CCommit", 0) > 1000  # the load ran
    assert sim.message_counts.get("Fetch", 0) == 0, sim.message_counts


@pytest.mark.parametrize("seed", [1])
def test_a_replica_thousands_of_slots_behind_catches_up_by_pipelined_fetches(seed):
    """Replica 2 is cut off for 600 ms under load (the C-commits to it are lost; the others wait out C-instance recovery of its instances, then go on), then
    heals: it catches up on about 2,000 slots in well under a second (each a fetch
    answered in a LAN round trip; one resend_ticks/2 wait per slot would take 500 s)."""
    sim = Simulation(SimConfig(replicas=3, rtt="lan", seconds=1.0, seed=seed, inflight=8,
                               faults=[(100, "isolate", 2), (700, "heal")]))
    sim.message_counts = {}
    sim.run(until_ms=700)
    target = max(sim.nodes[0].exec_slot, sim.nodes[1].exec_slot)
    assert target - sim.nodes[2].exec_slot > 1000, "replica 2 did not fall behind"
    t = 700
    while sim.nodes[2].exec_slot < target and t < 1700:  # bounded: 1 s of simulated time
        t += 10
        sim.run(until_ms=t)
    assert sim.nodes[2].exec_slot >= target, f"replica 2 at {sim.nodes[2].exec_slot} of {target} after 1 s"
    assert sim.message_counts.get("Fetch", 0) > 1000
    assert_safe(sim)  # so far: nothing decided twice, nothing acknowledged lost
