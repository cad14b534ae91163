"""The replicated-machine seam (consensus.core.statemachine.ReplicatedMachine) and the
simulator running the scheduler machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus.core.executor import Executor
from consensus.core.statemachine import ReplicatedMachine
from store.kv_machine import KVStateMachine
from store.machines import make_machine
from consensus.sim import SimConfig, Simulation
from scheduler_state import SchedulerStateMachine, check, load_config
from scheduler_state.machine import SCHEDULER_KEY
from scheduler_state.replicated import ReplicatedScheduler, config_hash, init_command

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = EXAMPLES / "hived-small.yaml"
SPEC = {"virtualCluster": "vc-a", "priority": 1, "leafCellNumber": 2, "name": "g1"}


def test_every_machine_implements_the_protocol():
    cfg = load_config(SMALL)
    for m in (KVStateMachine(), SchedulerStateMachine(cfg), ReplicatedScheduler(), ReplicatedScheduler(cfg),
              make_machine("kv"), make_machine("scheduler", SMALL)):
        assert isinstance(m, ReplicatedMachine), type(m)
    with pytest.raises(ValueError):
        make_machine("nope")


def test_kv_read_key_and_keys_of():
    kv = KVStateMachine()
    assert kv.read_key(["get", "a"]) == "a"
    assert kv.read_key(["put", "a", 1]) is None
    assert kv.keys_of(["put", "a", 1]) == ["a"] and kv.keys_of(["get", "a"]) == []


def test_scheduler_query_is_read_only_and_keys_are_conservative():
    m = SchedulerStateMachine(load_config(SMALL))
    before = m.snapshot()
    refused = m.query({"op": "allocate", "group": SPEC})
    assert refused["ok"] is False and "not a read-only query" in refused["error"]
    assert m.snapshot() == before
    assert m.query({"op": "cluster_status"})["ok"]
    assert m.ask("vc_status", vc="vc-a")["vc"] == "vc-a"
    assert m.read_key({"op": "list_groups"}) == SCHEDULER_KEY
    assert m.read_key({"op": "allocate"}) is None
    assert m.keys_of({"op": "allocate", "group": SPEC}) == [SCHEDULER_KEY]
    assert m.keys_of({"op": "inspect", "view": "clusterstatus"}) == []
    assert m.keys_of("garbage") == [SCHEDULER_KEY]


def test_inspect_views_have_hiveds_shapes():
    m = SchedulerStateMachine(load_config(SMALL))
    assert m.apply({"op": "allocate", "group": SPEC})["ok"]
    g = m.query({"op": "inspect", "view": "affinitygroup", "name": "g1"})["result"]
    assert g["metadata"] == {"name": "g1"}
    st = g["status"]
    assert st["state"] == "Allocated" and st["vc"] == "vc-a" and st["priority"] == 1
    (node, leaves), = st["physicalPlacement"].items()
    assert len(leaves) == 2 and node.startswith("node-")
    assert sum(len(v) for v in st["virtualPlacement"].values()) == 2
    assert m.query({"op": "inspect", "view": "affinitygroups"})["result"]["items"][0] == g
    cs = m.query({"op": "inspect", "view": "clusterstatus"})["result"]
    assert set(cs) == {"physicalCluster", "virtualClusters"} and sorted(cs["virtualClusters"]) == ["vc-a", "vc-b"]
    used = [c for c in cs["physicalCluster"] if c["cellState"] == "Used"]
    assert len(used) == 1 and used[0]["cellPriority"] == 1 and used[0]["cellHealthiness"] == "Healthy"
    missing = m.query({"op": "inspect", "view": "affinitygroup", "name": "nope"})
    assert missing["ok"] is False and missing["not_found"] is True


def test_replicated_scheduler_genesis():
    cfg = load_config(SMALL)
    other = load_config(EXAMPLES / "hived-small-vc-c.yaml")
    m = ReplicatedScheduler()
    assert m.apply({"op": "allocate", "group": SPEC})["uninitialized"] is True
    first = m.apply(init_command(cfg))
    assert first == {"ok": True, "initialized": True, "config_hash": config_hash(cfg)}
    second = m.apply(init_command(other))  # the first init committed wins; the rest only learn it
    assert second == {"ok": True, "initialized": False, "config_hash": config_hash(cfg)}
    assert config_hash(other) != config_hash(cfg)
    assert m.apply({"op": "allocate", "group": SPEC})["ok"]
    copy = ReplicatedScheduler()
    copy.restore(m.snapshot())
    assert copy.digest() == m.digest() and copy.snapshot() == m.snapshot()
    empty = ReplicatedScheduler()
    empty.restore(ReplicatedScheduler().snapshot())
    assert empty.inner is None
    # the executor's snapshot (sessions included) round-trips too
    ex = Executor(ReplicatedScheduler())
    out: list = []
    ex.run([["c", 1, init_command(cfg)], ["c", 2, {"op": "allocate", "group": SPEC}]], out)
    ex2 = Executor(ReplicatedScheduler())
    ex2.restore(ex.snapshot())
    assert ex2.snapshot() == ex.snapshot()


@pytest.mark.parametrize("protocol", ["sdpaxos", pytest.param("multipaxos", marks=pytest.mark.slow)])
def test_simulator_runs_the_scheduler(protocol):
    cfg = SimConfig(protocol=protocol, machine="scheduler", machine_config=SMALL, rtt="lan", seconds=0.7,
                    clients_per_site=2, read_fraction=0.3, seed=3,
                    snapshot_every=20 if protocol == "sdpaxos" else 0,
                    faults=[(300, "crash", 1), (600, "restart", 1)])
    sim = Simulation(cfg).run()
    s = sim.summary()
    assert s["committed"] > 100
    assert s["consistent"] and s["agreement"]
    assert s["lost_acked"] == s["duplicated"] == s["wrong_results"] == 0
    live = [r for r in sim.nodes if r is not None]
    assert len({r.executor.sm.digest() for r in live}) == 1
    for r in live:
        assert check(r.executor.sm.inner) == []
    if protocol == "sdpaxos":
        assert sum(r.stats.get("lease_reads", 0) for r in sim.all_replicas) > 0
    assert Simulation(cfg).run().trace_hash == sim.trace_hash  # one seed, one run


def test_simulator_default_machine_is_kv():
    assert SimConfig().machine == "kv"
    sim = Simulation(SimConfig(seconds=0.3, rtt="lan"))
    assert isinstance(sim.nodes[0].executor.sm, KVStateMachine)
