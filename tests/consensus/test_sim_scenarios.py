"""Rejoin, asymmetric and flapping fault scenarios (``cellar sim --scenario``), short runs.

Only safety is asserted: no acknowledged write lost, nothing applied twice, per-slot
agreement, a linearizable history of puts, lease reads and CAS, and every command
completed after the heal. ``view_changes`` and the stalls are reported, not judged:
whether a replica coming back disturbs the healthy majority is the pre-vote /
check-quorum work in the core.
"""

import json

import pytest
from click.testing import CliRunner

from consensus.sim import SimConfig, Simulation
from consensus.sim.cli import sim as sim_cli
from consensus.sim.scenarios import SCENARIOS, asymmetric_schedule, flapping_schedule, schedule

NEW = ("isolate-rejoin", "isolate-rejoin-sequencer", "pause-sequencer", "asymmetric", "flapping")


def run(name, replicas, protocol="sdpaxos", seconds=6.0, seed=1, sequencer=0):
    cfg = SimConfig(
        protocol=protocol, replicas=replicas, sequencer=sequencer, seconds=seconds, seed=seed, clients_per_site=2,
        read_fraction=0.3, cas_fraction=0.2, keys=3, faults=schedule(name, replicas, sequencer, seconds),
    )
    return Simulation(cfg).run()


def assert_safe(sim):
    result = sim.summary()
    hint = f"Simulation({sim.cfg!r}).run()"
    assert result["consistent"] and result["agreement"], hint
    assert result["lost_acked"] == 0 and result["duplicated"] == 0 and result["wrong_results"] == 0, hint
    assert sim.quiet(), f"commands still pending after the heal; {hint}"
    assert sim.linearizable() is True, hint
    return result


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("replicas", [3, 5])
@pytest.mark.parametrize("protocol", ["sdpaxos", "multipaxos"])
def test_scenario_is_safe(name, replicas, protocol):
    sim = run(name, replicas, protocol, sequencer=replicas - 1)
    result = assert_safe(sim)
    assert result["committed"] > 100
    assert "stall_ms" in result and result["view_changes"] >= 0


def test_isolate_rejoin_cuts_a_non_sequencer_for_five_seconds():
    faults = schedule("isolate-rejoin", 5, 2, 10.0)
    assert faults == [(1000.0, "isolate", 3), (6000.0, "heal")]
    assert schedule("isolate-rejoin-sequencer", 5, 2, 10.0) == [(1000.0, "isolate", 2), (6000.0, "heal")]
    assert schedule("pause-sequencer", 3, 0, 10.0) == [(1000.0, "pause", 0), (3000.0, "resume", 0)]


def test_a_paused_sequencer_is_replaced_and_comes_back_with_its_clock_caught_up():
    sim = run("pause-sequencer", 3, seconds=6.0)
    result = assert_safe(sim)
    assert result["view_changes"] >= 1, "paused longer than an election"
    old = sim.nodes[0]
    assert old.now * sim.cfg.tick_ms >= 0.9 * sim.now / 1000 - 10, "no tick lost in the pause"


def test_asymmetric_cuts_are_one_way():
    sched = asymmetric_schedule(3, 0, 10_000)
    assert sched[0] == (1000.0, "cut", 0, 1)
    assert (2500.0, "cut", 2, 0) in sched and (2500.0, "cut", 0, 2) not in sched
    assert sched[-1] == (7000.0, "heal")
    sim = Simulation(SimConfig(replicas=3, clients_per_site=0, seconds=1.0, faults=[(100, "cut", 0, 1)]))
    sim.run(until_ms=500)
    assert (0, 1) in sim.net.blocked and (1, 0) not in sim.net.blocked


def test_flapping_toggles_every_300_ms_for_several_seconds():
    sched = flapping_schedule(5, 0, 10_000)
    parts = [t for t, action, *_ in sched if action == "partition"]
    assert len(parts) >= 9 and all(b - a == 600 for a, b in zip(parts, parts[1:]))
    assert sched[1][0] - sched[0][0] == 300 and sched[-1] == (7000.0, "heal")
    assert sched[0][2] == ((2, 3, 4), (0, 1)), "the sequencer is on the small side"


def test_every_scenario_is_listed_for_the_cli():
    assert set(NEW) <= set(SCENARIOS)


@pytest.mark.parametrize("name", ["isolate-rejoin", "asymmetric", "flapping"])
def test_cli_reports_safety_view_changes_and_stall_as_json(name):
    out = CliRunner().invoke(
        sim_cli, ["--scenario", name, "--seconds", "5", "--replicas", "3", "--reads", "0.2", "--cas", "0.2", "--keys", "3", "--json"]
    )
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    assert result["scenario"] == name
    assert result["lost_acked"] == 0 and result["duplicated"] == 0 and result["linearizable"] is True
    assert result["agreement"] is True
    assert isinstance(result["view_changes"], int) and result["stall_ms"] >= 0
    assert set(result["stall_ms_by_site"]) == {"CA", "OR", "OH"}


def test_search_prints_one_json_object_and_progress_on_stderr():
    out = CliRunner().invoke(sim_cli, ["search", "--examples", "2", "--seed", "5", "--json"])
    assert out.exit_code == 0, out.output + out.stderr
    result = json.loads(out.stdout)
    assert result["first"] == 5 and result["examples"] == 2 and result["failures"] == []
    assert "SEED=5" in out.stderr
    out = CliRunner().invoke(sim_cli, ["search", "--replay", "5", "--json"])
    assert out.exit_code == 0, out.output
    replayed = json.loads(out.stdout)
    assert replayed["seed"] == 5 and replayed["linearizable"] is True
    assert replayed["replay"] == "cellar sim search --replay 5" and replayed["config"].startswith("SimConfig(")
