"""Every section of HiveD's feature README (../shared/hived/feature/README.md), replayed
through the command interface on the named hived-config-*.yaml (issue 5, acceptance 1).

Opt-in (marker ``shared``: ``python3 -m pytest -m shared``): it needs HiveD's files in
../shared/hived. The default suite replays the same sections on our own configs
(test_example_features.py).

The README's jobs (itc-*.yaml) are not in the shared folder; each test states the job
shape it assumes, taken from the README's description. Node names are the configs'.
"""

from __future__ import annotations

import pytest

from scheduler_state import SchedulerStateMachine
from tests.scheduler_state.helpers import allocate, apply_ok, feature_config, nodes_of, status
from tests.scheduler_state.helpers import hived_machine as machine

pytestmark = pytest.mark.shared

K80_NODES = ["10.151.41.18", "10.151.41.19", "10.151.41.23", "10.151.41.24"]
M60_NODE = "10.151.41.26"


def reconfigure(m: SchedulerStateMachine, n: int | str) -> dict:
    result = apply_ok(m, {"op": "reconfigure", "config": feature_config(n).read_text()})
    assert result["ok"], result
    return result


# -- VC Safety -------------------------------------------------------------------------


def test_vc_safety_jobs_of_one_vc_share_one_node_and_never_fragment_others() -> None:
    """config-1: two jobs of vc1 (one K80 node of quota) always run within one node, and
    whatever vc1 does, vc2 and default can still get whole nodes."""
    m = machine(1)
    a = allocate(m, "itc-safety-1", "vc1", 0, 2, 1, "K80")
    b = allocate(m, "itc-safety-2", "vc1", 0, 2, 1, "K80")
    assert a["ok"] and b["ok"]
    assert len(set(nodes_of(a) + nodes_of(b))) == 1
    # vc1's 4 single-GPU jobs cannot fragment vc2's node or default's two nodes.
    assert allocate(m, "vc2-node", "vc2", 0, 1, 4, "K80")["ok"]
    full = allocate(m, "default-2-nodes", "default", 0, 2, 4, "K80")
    assert full["ok"] and len(set(nodes_of(full))) == 2
    used = set(nodes_of(a)) | set(nodes_of(status(m, "vc2-node"))) | set(nodes_of(full))
    assert len(used) == 4  # four distinct nodes: every VC got whole nodes
    # vc1 is full now: a fifth GPU waits instead of spilling into another VC's node.
    r = allocate(m, "itc-safety-3", "vc1", 0, 1, 1, "K80")
    assert r["ok"] is False and r["waiting"]


# -- Pinned Cells ------------------------------------------------------------------------


def test_pinned_cells_only_for_requests_naming_them() -> None:
    """config-8: vc1's pinned node 10.151.41.25 takes the vc1pinned tasks; tasks without
    pinnedCellId never land there, whatever their VC or priority."""
    m = machine(8)
    pinned = allocate(m, "itc-pin/vc1pinned", "vc1", 0, 4, 1, pinnedCellId="VC1-K80")
    assert pinned["ok"] and set(nodes_of(pinned)) == {"10.151.41.25"}
    nopin = allocate(m, "itc-pin/vc1nopinned", "vc1", 0, 4, 1, "K80")
    assert nopin["ok"] and "10.151.41.25" not in nodes_of(nopin)
    allocate(m, "vc2", "vc2", 0, 1, 4, "K80")
    opp = allocate(m, "opp", "vc2", -1, 1, 4, "K80")
    assert opp["ok"] and "10.151.41.25" not in nodes_of(opp)
    # vc1's non-pinned quota is used up; the free pinned node is still not reachable.
    r = allocate(m, "more", "vc1", 0, 1, 1, "K80")
    assert r["ok"] is False and r["waiting"]
    # Other VCs cannot name vc1's pinned cell, and opportunistic groups cannot use one.
    assert "does not have pinned cell" in allocate(m, "x", "vc2", 0, 1, 1, pinnedCellId="VC1-K80")["error"]
    assert "cannot use pinned cell" in allocate(m, "y", "vc1", -1, 1, 1, pinnedCellId="VC1-K80")["error"]


# -- SKU Type ----------------------------------------------------------------------------


def test_sku_type_specified_only_that_type_partially_running() -> None:
    """config-2: itc-k80-type, six 1-GPU tasks (each its own group) of K80 in vc1: four
    run on K80 (all of vc1's K80 quota), two wait although vc1's M60 node is free."""
    m = machine(2)
    results = [allocate(m, f"itc-k80-type/{i}", "vc1", 0, 1, 1, "K80") for i in range(6)]
    running = [r for r in results if r["ok"]]
    assert len(running) == 4
    assert all(r["chain"] == "K80-NODE-POOL" for r in running)
    assert all(n in K80_NODES for r in running for n in nodes_of(r))
    assert [r.get("waiting") for r in results[4:]] == [True, True]


def test_sku_type_not_specified_uses_any_type() -> None:
    """config-2: itc-no-type, eight 1-GPU tasks without leafCellType in vc1: all run,
    some on K80 (10.151.41.18) and the others on M60 (10.151.41.26)."""
    m = machine(2)
    results = [allocate(m, f"itc-no-type/{i}", "vc1", 0, 1, 1) for i in range(8)]
    assert all(r["ok"] for r in results)
    nodes = [n for r in results for n in nodes_of(r)]
    assert set(nodes) == {"10.151.41.18", M60_NODE}
    assert nodes.count(M60_NODE) == 4


# -- Gang Scheduling ----------------------------------------------------------------------


def test_gang_scheduling_all_or_nothing_without_head_of_line_blocking() -> None:
    """config-2: itc-gang (6 x 1 K80 GPU, one group) waits, since vc1 has 4 K80 GPUs;
    itc-gang4 (4 x 1) then runs, and itc-gang is still waiting with nothing placed."""
    m = machine(2)
    gang = allocate(m, "itc-gang", "vc1", 0, 6, 1, "K80")
    assert gang["ok"] is False and gang["waiting"] and gang["queued"]
    gang4 = allocate(m, "itc-gang4", "vc1", 0, 4, 1, "K80")
    assert gang4["ok"] and len(gang4["placement"]) == 4
    assert status(m, "itc-gang")["state"] == "pending"
    cluster = m.apply({"op": "cluster_status"})
    assert cluster["chains"]["K80-NODE-POOL"]["used_leaf_cells"] == 4  # only itc-gang4's


def test_gang_scheduling_tensorflow_distributed_training() -> None:
    """config-2: itc-dtf in the default VC, one gang of a parameter server (1 GPU) and
    two workers (2 GPUs each): all pods start together."""
    m = machine(2)
    group = {"virtualCluster": "default", "priority": 0, "leafCellType": "K80",
             "affinityGroup": {"name": "itc-dtf/default", "members": [
                 {"podNumber": 1, "leafCellNumber": 1}, {"podNumber": 2, "leafCellNumber": 2}]}}
    r = apply_ok(m, {"op": "allocate", "group": group})
    assert r["ok"]
    assert [p["leaf_cell_number"] for p in r["placement"]] == [1, 2, 2]
    ps, w1, w2 = nodes_of(r)
    # 5 GPUs need both of default's 4-GPU nodes; the workers are packed onto one of them.
    assert w1 == w2 != ps and {ps, w1} <= set(K80_NODES)
    assert m.apply({"op": "vc_status", "vc": "default"})["guaranteed_leaf_cells_by_priority"] == {"0": 5}


# -- Incremental Scheduling and Guaranteed Job -----------------------------------------------


def test_incremental_scheduling_partially_runs_beyond_quota() -> None:
    """config-1: itc-elastic, each task its own affinity group, six 1-GPU tasks in vc1
    (quota: one 4-GPU node): four run at once, the rest wait and run when cells free."""
    m = machine(1)
    results = [allocate(m, f"itc-elastic/{i}", "vc1", 0, 1, 1, "K80") for i in range(6)]
    assert [r["ok"] for r in results] == [True] * 4 + [False] * 2
    released = apply_ok(m, {"op": "release", "group": "itc-elastic/0"})
    assert [s["group"] for s in released["scheduled"]] == ["itc-elastic/4"]
    assert status(m, "itc-elastic/4")["state"] == "allocated"
    assert status(m, "itc-elastic/5")["state"] == "pending"


def test_guaranteed_job_stays_within_its_vc_quota() -> None:
    """config-1: itc-elastic's guaranteed tasks never use more than vc1's one node, even
    though other nodes are idle; and no other VC's job can preempt them."""
    m = machine(1)
    results = [allocate(m, f"itc-elastic/{i}", "vc1", 0, 1, 1, "K80") for i in range(6)]
    nodes = {n for r in results if r["ok"] for n in nodes_of(r)}
    assert len(nodes) == 1
    for vc in ("vc2", "default"):
        r = allocate(m, f"{vc}-prod", vc, 1000, 1, 4, "K80")
        assert r["ok"] and r["preempted"] == []
    assert all(status(m, f"itc-elastic/{i}")["state"] == "allocated" for i in range(4))


# -- Opportunistic Job -------------------------------------------------------------------------


def test_opportunistic_job_uses_other_vcs_quota() -> None:
    """config-1: itc-oppo (priority -1, 2 x 4 K80 GPUs) in vc1 runs on two nodes although
    vc1's quota is one node."""
    m = machine(1)
    r = allocate(m, "itc-oppo", "vc1", -1, 2, 4, "K80")
    assert r["ok"] and r["opportunistic"]
    assert len(set(nodes_of(r))) == 2
    vc = m.apply({"op": "vc_status", "vc": "vc1"})
    assert vc["opportunistic_leaf_cells"] == 8 and vc["guaranteed_leaf_cells_by_priority"] == {}


# -- Intra-VC Preemption -------------------------------------------------------------------------


def test_intra_vc_immediate_preemption() -> None:
    """config-3: test (4 M60, priority 0) runs; prod (4 M60, priority 100, same VC)
    preempts it at once; the test job, retried, waits for resources."""
    m = machine(3)
    test = allocate(m, "itc-intra-imd-preempt-test", "vc1", 0, 1, 4, "M60")
    assert test["ok"] and nodes_of(test) == [M60_NODE]
    prod = allocate(m, "itc-intra-imd-preempt-prod", "vc1", 100, 1, 4, "M60")
    assert prod["ok"] and prod["preempted"] == ["itc-intra-imd-preempt-test"]
    assert nodes_of(prod) == [M60_NODE]
    retry = allocate(m, "itc-intra-imd-preempt-test", "vc1", 0, 1, 4, "M60")
    assert retry["ok"] is False and retry["waiting"]


def test_intra_vc_lazy_preemption() -> None:
    """config-3: test (4 K80, priority 0, lazyPreemptionEnable) runs; prod (4 K80,
    priority 100, vc1) only downgrades it to opportunistic, since everything still fits
    the physical cluster; prod2 (3 x 4 K80, default VC) then preempts it for real."""
    m = machine(3)
    test = allocate(m, "itc-intra-lazy-preempt-test", "vc1", 0, 1, 4, "K80", lazyPreemptionEnable=True)
    assert test["ok"]
    prod = allocate(m, "itc-intra-lazy-preempt-prod", "vc1", 100, 1, 4, "K80")
    assert prod["ok"] and prod["preempted"] == []
    assert prod["lazy_preempted"] == ["itc-intra-lazy-preempt-test"]
    s = status(m, "itc-intra-lazy-preempt-test")
    assert s["state"] == "allocated" and s["opportunistic"]
    assert s["lazy_preempted_by"] == "itc-intra-lazy-preempt-prod"
    assert nodes_of(s) == nodes_of(test)  # still running where it was
    assert nodes_of(prod) != nodes_of(test)
    prod2 = allocate(m, "itc-intra-lazy-preempt-prod2", "default", 100, 3, 4, "K80")
    assert prod2["ok"] and prod2["preempted"] == ["itc-intra-lazy-preempt-test"]


# -- Inter-VC Preemption -------------------------------------------------------------------------


def test_inter_vc_preemption_of_opportunistic_jobs() -> None:
    """config-3: itc-inter-preempt-oppo (2 x 4 K80, priority -1, vc1) runs on two
    nodes; itc-inter-preempt-prod (3 x 4 K80, priority 100, default) preempts it."""
    m = machine(3)
    oppo = allocate(m, "itc-inter-preempt-oppo", "vc1", -1, 2, 4, "K80")
    assert oppo["ok"] and len(set(nodes_of(oppo))) == 2
    prod = allocate(m, "itc-inter-preempt-prod", "default", 100, 3, 4, "K80")
    assert prod["ok"] and prod["preempted"] == ["itc-inter-preempt-oppo"]
    assert len(set(nodes_of(prod))) == 3
    assert m.apply({"op": "group_status", "group": "itc-inter-preempt-oppo"})["ok"] is False


# -- Topology-Aware Intra-VC Scheduling --------------------------------------------------------------


def test_topology_aware_buddy_placement() -> None:
    """config-2: itc-buddy, two 1-GPU tasks in one affinity group, get two buddy GPUs
    (the two leaves of one K80-2GPU cell), even when the node is already fragmented."""
    m = machine(2)
    first = allocate(m, "itc-buddy", "vc1", 0, 2, 1, "K80")
    assert first["ok"] and len(set(nodes_of(first))) == 1
    assert sorted(p["leaf_cells"][0] for p in first["placement"]) == [0, 1]
    apply_ok(m, {"op": "release", "group": "itc-buddy"})
    # Fragment vc1's node: leaf 0 taken by another job; the pair must not straddle.
    single = allocate(m, "single", "vc1", 0, 1, 1, "K80")
    pair = allocate(m, "itc-buddy-2", "vc1", 0, 2, 1, "K80")
    assert nodes_of(single)[0] == nodes_of(pair)[0]
    taken = single["placement"][0]["leaf_cells"][0]
    leaves = sorted(p["leaf_cells"][0] for p in pair["placement"])
    assert leaves[0] // 2 == leaves[1] // 2 != taken // 2  # one K80-2GPU cell, a free one
    third = allocate(m, "third", "vc1", 0, 1, 1, "K80")
    assert third["placement"][0]["leaf_cells"][0] // 2 == taken // 2  # packs next to "single"


# -- Work-Preserving Reconfiguration -----------------------------------------------------------------


def test_reconfig_delete_physical_cell() -> None:
    """config-2 -> config-33: the M60 job keeps running; its M60 cells are ignored."""
    m = machine(2)
    r1 = allocate(m, "itc-reconfig-1", "vc1", 0, 1, 4, "M60")
    assert r1["ok"] and nodes_of(r1) == [M60_NODE]
    report = reconfigure(m, 33)
    assert report["ignored_leaf_cells"] == {"itc-reconfig-1": 4} and report["lazy_preempted"] == []
    s = status(m, "itc-reconfig-1")
    assert s["state"] == "allocated" and s["placement"][0]["ignored_leaf_cells"] == 4
    assert "M60-NODE-POOL" not in m.apply({"op": "cluster_status"})["chains"]
    assert apply_ok(m, {"op": "release", "group": "itc-reconfig-1"})["ok"]


def test_reconfig_add_physical_cell() -> None:
    """config-33 -> config-2: the K80 job keeps running and is still accounted."""
    m = machine(33)
    k80 = allocate(m, "itc-k80-type", "vc1", 0, 4, 1, "K80")
    assert k80["ok"]
    reconfigure(m, 2)
    s = status(m, "itc-k80-type")
    assert s["state"] == "allocated" and not s["opportunistic"]
    assert [p["node"] for p in s["placement"]] == nodes_of(k80)
    vc = m.apply({"op": "vc_status", "vc": "vc1"})
    assert vc["guaranteed_leaf_cells_by_priority"] == {"0": 4}
    # vc1's K80 quota is still fully used by it, so a new K80 job waits.
    assert allocate(m, "more", "vc1", 0, 1, 1, "K80")["waiting"]
    assert allocate(m, "m60", "vc1", 0, 1, 4, "M60")["ok"]  # the added cells are usable


def test_reconfig_update_physical_cell_add_node() -> None:
    """config-2 -> config-4 (a second M60 node): itc-reconfig-1 keeps running and is
    accounted; itc-reconfig-2, all M60 nodes at the same priority, waits instead of
    (lazily) preempting it."""
    m = machine(2)
    assert allocate(m, "itc-reconfig-1", "vc1", 0, 1, 4, "M60")["ok"]
    reconfigure(m, 4)
    s = status(m, "itc-reconfig-1")
    assert s["state"] == "allocated" and not s["opportunistic"] and "lazy_preempted_by" not in s
    r2 = allocate(m, "itc-reconfig-2", "vc1", 0, 2, 4, "M60")
    assert r2["ok"] is False and r2["waiting"]
    assert not status(m, "itc-reconfig-1")["opportunistic"]


def test_reconfig_update_physical_cell_delete_node() -> None:
    """config-2 -> config-7 (node 10.151.41.18 removed): itc-reconfig-3 keeps running;
    its usage of the deleted node is ignored, the rest still accounted."""
    m = machine(2)
    r3 = allocate(m, "itc-reconfig-3", "default", 0, 2, 4, "K80")
    assert r3["ok"] and "10.151.41.18" in nodes_of(r3)
    report = reconfigure(m, 7)
    assert report["ignored_leaf_cells"] == {"itc-reconfig-3": 4}
    s = status(m, "itc-reconfig-3")
    assert s["state"] == "allocated" and not s["opportunistic"]
    ignored = {p["node"]: p["ignored_leaf_cells"] for p in s["placement"]}
    assert ignored["10.151.41.18"] == 4 and sum(ignored.values()) == 4
    assert m.apply({"op": "vc_status", "vc": "default"})["guaranteed_leaf_cells_by_priority"] == {"0": 4}


def test_reconfig_delete_virtual_cluster() -> None:
    """config-2 -> config-5 (default VC deleted, its quota moved to vc1): itc-reconfig-3
    keeps running but is lazily preempted; itc-reconfig-4 (vc1, all K80 nodes)
    preempts it at once."""
    m = machine(2)
    assert allocate(m, "itc-reconfig-3", "default", 0, 2, 4, "K80")["ok"]
    report = reconfigure(m, 5)
    assert report["lazy_preempted"] == ["itc-reconfig-3"]
    s = status(m, "itc-reconfig-3")
    assert s["state"] == "allocated" and s["opportunistic"] and "default" in s["lazy_preempted_by"]
    r4 = allocate(m, "itc-reconfig-4", "vc1", 0, 4, 4, "K80")
    assert r4["ok"] and r4["preempted"] == ["itc-reconfig-3"]


def test_reconfig_update_virtual_cluster() -> None:
    """config-2 -> config-6 (one K80 node moved from default to vc1): itc-reconfig-3
    (two nodes in default) keeps running, lazily preempted; itc-reconfig-5 (vc1, all
    its K80 nodes) preempts it at once."""
    m = machine(2)
    assert allocate(m, "itc-reconfig-3", "default", 0, 2, 4, "K80")["ok"]
    report = reconfigure(m, 6)
    assert report["lazy_preempted"] == ["itc-reconfig-3"]
    assert status(m, "itc-reconfig-3")["opportunistic"]
    r5 = allocate(m, "itc-reconfig-5", "vc1", 0, 3, 4, "K80")
    assert r5["ok"] and r5["preempted"] == ["itc-reconfig-3"]


def test_reconfig_to_the_same_config_changes_nothing() -> None:
    m = machine(2)
    allocate(m, "a", "vc1", 0, 1, 4, "K80")
    allocate(m, "b", "default", 5, 2, 2, "K80")
    allocate(m, "c", "vc1", -1, 1, 2, "M60")
    before = m.snapshot()
    reconfigure(m, 2)
    assert m.snapshot() == before


# -- Bad Hardware Awareness --------------------------------------------------------------------------


def test_bad_hardware_waits_then_runs_when_node_is_back() -> None:
    """config-2: the only M60 node goes bad; itc-badnode50 (M60) waits; when the node
    is healthy again the waiting job starts, without being resubmitted."""
    m = machine(2)
    assert apply_ok(m, {"op": "set_node_health", "node": M60_NODE, "healthy": False})["changed"]
    r = allocate(m, "itc-badnode50", "vc1", 0, 1, 4, "M60")
    assert r["ok"] is False and r["waiting"] and r["queued"] and M60_NODE in r["reason"]
    opp = allocate(m, "opp-m60", "default", -1, 1, 1, "M60", wait=False)
    assert opp["ok"] is False and opp["queued"] is False  # bad cells are never allocated
    back = apply_ok(m, {"op": "set_node_health", "node": M60_NODE, "healthy": True})
    assert [s["group"] for s in back["scheduled"]] == ["itc-badnode50"]
    s = status(m, "itc-badnode50")
    assert s["state"] == "allocated" and nodes_of(s) == [M60_NODE]
