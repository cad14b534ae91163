"""Hypothesis searches fault schedules (issue 3, acceptance 2 and 3).

Each example draws a protocol, a cluster size, network misbehaviour (jitter, so
reordering; loss; duplication) and a seeded random fault schedule (crashes and
restarts of any minority including the sequencer, partitions, one-way cuts, slow
nodes, loss bursts), runs it, then heals everything and requires:

- every replica executed a prefix of one sequence; no command applied twice;
- no acknowledged write lost; the client history (writes and reads, lease reads
  included) linearizable under the key-value model;
- liveness after the heal: every submitted command completed.

The default suite runs a few hundred schedules (about a minute);
``CELLAR_FAULT_EXAMPLES=5000 pytest tests/consensus/test_fault_search.py`` runs a
long campaign. A failure prints the configuration, which replays exactly.
"""

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consensus.sim import SimConfig, Simulation
from consensus.sim.scenarios import random_schedule

EXAMPLES = int(os.environ.get("CELLAR_FAULT_EXAMPLES", "600"))


@st.composite
def fault_runs(
    draw,
    protocols=("sdpaxos", "sdpaxos", "multipaxos"),
    rtts=("geo",),
    snapshot_every=(0,),
    read_fractions=(0.0, 0.3, 0.6),
):
    """A random run under a random fault schedule (also used by test_snapshot)."""
    replicas = draw(st.sampled_from([3, 5]))
    rtt = draw(st.sampled_from(rtts))
    seconds = 3.0 if rtt == "geo" else 0.6
    return SimConfig(
        protocol=draw(st.sampled_from(protocols)),
        replicas=replicas,
        rtt=rtt,
        sequencer=draw(st.integers(0, replicas - 1)),
        clients_per_site=draw(st.integers(1, 2)),
        seconds=seconds,
        seed=draw(st.integers(0, 2**32)),
        batch=draw(st.sampled_from([1, 8, 256])),
        inflight=draw(st.sampled_from([2, 32])),
        jitter=draw(st.sampled_from([0.0, 0.5, 1.5])),
        loss=draw(st.sampled_from([0.0, 0.02, 0.1])),
        dup=draw(st.sampled_from([0.0, 0.05])),
        read_fraction=draw(st.sampled_from(read_fractions)),
        keys=draw(st.integers(1, 3)),
        client_timeout_ms=1000.0,
        snapshot_every=draw(st.sampled_from(snapshot_every)),
        faults=random_schedule(replicas, seconds, draw(st.integers(0, 2**32))),
    )


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fault_runs())
def test_fault_schedules_are_safe_and_live(cfg):
    sim = Simulation(cfg).run()
    result = sim.summary()
    hint = f"replay: Simulation({cfg!r}).run()"
    assert result["consistent"], hint
    assert result["duplicated"] == 0, hint
    assert result["lost_acked"] == 0, hint
    assert result["wrong_results"] == 0, hint
    assert sim.quiet(), f"not every command completed after the heal; {hint}"
    assert sim.linearizable(timeout_s=60) is True, hint


def test_gap_in_o_accepts_is_filled_while_new_slots_keep_coming():
    """Regression (found by the search): a peer lost one O-accept while the sequencer
    kept proposing new slots; each new O-accept used to restart the resend timer, so
    the gap was never resent and nothing committed again."""
    cfg = SimConfig(
        protocol="sdpaxos", replicas=3, rtt="geo", sequencer=2, clients_per_site=1, seconds=3.0, seed=372,
        batch=1, inflight=32, jitter=0.5, loss=0.1, dup=0.05, read_fraction=0.0, keys=1, client_timeout_ms=1000.0,
        faults=[(436.81, "crash", 0), (625.003, "partition", ((1, 2), (0,))), (1459.219, "partition", ((1, 2), (0,))),
                (1854.099, "cut", 2, 1), (2100.0, "heal"), (2100.0, "loss", 0.0), (2100.0, "slow", 0, 1.0),
                (2100.0, "slow", 1, 1.0), (2100.0, "slow", 2, 1.0), (2100.0, "restart", 0)],
    )
    sim = Simulation(cfg).run()
    result = sim.summary()
    assert result["consistent"] and result["lost_acked"] == 0 and result["duplicated"] == 0
    assert sim.quiet(), "every command completes after the heal"
