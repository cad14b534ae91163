"""Every section of HiveD's feature README, replayed through the command interface on our
own configs under examples/hived-features/ (issue 5, acceptance 1).

test_features.py replays the same sections on HiveD's own hived-config-*.yaml (opt-in,
``-m shared``). Here, HiveD's configs are replaced by ours:

- pinned.yaml (for hived-config-1 and -8): rows of 3 and 2 nodes of 8 A100; nlp and cv
  one node each of row A, cv also the pinned node a100-1 (CV-PIN), ops the whole row B;
- mixed.yaml (for hived-config-2): a V100 rack of 4 nodes of 8 and one T4 node of 4;
  vision one V100 node and the T4 node, speech two V100 nodes, one V100 node idle;
- mixed-full-quota.yaml (hived-config-3): speech 3 V100 nodes, none idle;
- mixed-no-t4.yaml (33), mixed-two-t4.yaml (4), mixed-without-v0.yaml (7),
  mixed-no-speech.yaml (5), mixed-moved-quota.yaml (6): the reconfigurations.

Each test states the job shape it assumes (the README's jobs, scaled to our node sizes).
"""

from __future__ import annotations

from scheduler_state import SchedulerStateMachine
from tests.scheduler_state.helpers import allocate, apply_ok, example, machine, nodes_of, status

V100_NODES = ["gpu-v0", "gpu-v1", "gpu-v2", "gpu-v3"]
T4_NODE = "gpu-t0"
PINNED_NODE = "a100-1"


def reconfigure(m: SchedulerStateMachine, name: str) -> dict:
    result = apply_ok(m, {"op": "reconfigure", "config": example(name).read_text()})
    assert result["ok"], result
    return result


# -- VC Safety -------------------------------------------------------------------------


def test_vc_safety_jobs_of_one_vc_share_one_node_and_never_fragment_others() -> None:
    """pinned: two jobs of nlp (one 8-GPU node of quota) always run within one node, and
    whatever nlp does, cv and ops can still get whole nodes."""
    m = machine("pinned")
    a = allocate(m, "safety-1", "nlp", 0, 4, 1, "A100")
    b = allocate(m, "safety-2", "nlp", 0, 4, 1, "A100")
    assert a["ok"] and b["ok"]
    assert len(set(nodes_of(a) + nodes_of(b))) == 1
    # nlp's 8 single-GPU jobs cannot fragment cv's node or ops's two nodes.
    assert allocate(m, "cv-node", "cv", 0, 1, 8, "A100")["ok"]
    full = allocate(m, "ops-2-nodes", "ops", 0, 2, 8, "A100")
    assert full["ok"] and len(set(nodes_of(full))) == 2
    used = set(nodes_of(a)) | set(nodes_of(status(m, "cv-node"))) | set(nodes_of(full))
    assert len(used) == 4  # four distinct nodes: every VC got whole nodes
    assert PINNED_NODE not in used
    # nlp is full now: a ninth GPU waits instead of spilling into another VC's node.
    r = allocate(m, "safety-3", "nlp", 0, 1, 1, "A100")
    assert r["ok"] is False and r["waiting"]


# -- Pinned Cells ------------------------------------------------------------------------


def test_pinned_cells_only_for_requests_naming_them() -> None:
    """pinned: cv's pinned node a100-1 takes the tasks naming CV-PIN; tasks without
    pinnedCellId never land there, whatever their VC or priority."""
    m = machine("pinned")
    pinned = allocate(m, "pin/cvpinned", "cv", 0, 8, 1, pinnedCellId="CV-PIN")
    assert pinned["ok"] and set(nodes_of(pinned)) == {PINNED_NODE}
    nopin = allocate(m, "pin/cvnopinned", "cv", 0, 8, 1, "A100")
    assert nopin["ok"] and PINNED_NODE not in nodes_of(nopin)
    allocate(m, "nlp", "nlp", 0, 1, 8, "A100")
    opp = allocate(m, "opp", "nlp", -1, 1, 8, "A100")
    assert opp["ok"] and PINNED_NODE not in nodes_of(opp)
    # cv's non-pinned quota is used up; the pinned node is full too, and never lent.
    r = allocate(m, "more", "cv", 0, 1, 1, "A100")
    assert r["ok"] is False and r["waiting"]
    apply_ok(m, {"op": "release", "group": "pin/cvpinned"})
    r = allocate(m, "more-2", "cv", 0, 1, 1, "A100")
    assert r["ok"] is False and r["waiting"]  # the free pinned node is still not reachable
    # Other VCs cannot name cv's pinned cell, and opportunistic groups cannot use one.
    assert "does not have pinned cell" in allocate(m, "x", "nlp", 0, 1, 1, pinnedCellId="CV-PIN")["error"]
    assert "cannot use pinned cell" in allocate(m, "y", "cv", -1, 1, 1, pinnedCellId="CV-PIN")["error"]


# -- SKU Type ----------------------------------------------------------------------------


def test_sku_type_specified_only_that_type_partially_running() -> None:
    """mixed: ten 1-GPU tasks (each its own group) of V100 in vision: eight run (all of
    vision's V100 quota), two wait although vision's T4 node is free."""
    m = machine("mixed")
    results = [allocate(m, f"v100-type/{i}", "vision", 0, 1, 1, "V100") for i in range(10)]
    running = [r for r in results if r["ok"]]
    assert len(running) == 8
    assert all(r["chain"] == "V100-RACK" for r in running)
    assert all(n in V100_NODES for r in running for n in nodes_of(r))
    assert [r.get("waiting") for r in results[8:]] == [True, True]


def test_sku_type_not_specified_uses_any_type() -> None:
    """mixed: twelve 1-GPU tasks without leafCellType in vision: all run, eight on one
    V100 node and the other four on the T4 node."""
    m = machine("mixed")
    results = [allocate(m, f"no-type/{i}", "vision", 0, 1, 1) for i in range(12)]
    assert all(r["ok"] for r in results)
    nodes = [n for r in results for n in nodes_of(r)]
    assert len(set(nodes)) == 2 and T4_NODE in nodes
    assert nodes.count(T4_NODE) == 4


# -- Gang Scheduling ----------------------------------------------------------------------


def test_gang_scheduling_all_or_nothing_without_head_of_line_blocking() -> None:
    """mixed: gang (10 x 1 V100, one group) waits, since vision has 8 V100 GPUs; gang8
    (8 x 1) then runs, and gang is still waiting with nothing placed."""
    m = machine("mixed")
    gang = allocate(m, "gang", "vision", 0, 10, 1, "V100")
    assert gang["ok"] is False and gang["waiting"] and gang["queued"]
    gang8 = allocate(m, "gang8", "vision", 0, 8, 1, "V100")
    assert gang8["ok"] and len(gang8["placement"]) == 8
    assert status(m, "gang")["state"] == "pending"
    cluster = m.apply({"op": "cluster_status"})
    assert cluster["chains"]["V100-RACK"]["used_leaf_cells"] == 8  # only gang8's


def test_gang_scheduling_tensorflow_distributed_training() -> None:
    """mixed: in speech, one gang of a parameter server (2 GPUs) and two workers (4 GPUs
    each): all pods start together."""
    m = machine("mixed")
    group = {"virtualCluster": "speech", "priority": 0, "leafCellType": "V100",
             "affinityGroup": {"name": "dtf/speech", "members": [
                 {"podNumber": 1, "leafCellNumber": 2}, {"podNumber": 2, "leafCellNumber": 4}]}}
    r = apply_ok(m, {"op": "allocate", "group": group})
    assert r["ok"]
    assert [p["leaf_cell_number"] for p in r["placement"]] == [2, 4, 4]
    ps, w1, w2 = nodes_of(r)
    # 10 GPUs need both of speech's 8-GPU nodes; the workers are packed onto one of them.
    assert w1 == w2 != ps and {ps, w1} <= set(V100_NODES)
    assert m.apply({"op": "vc_status", "vc": "speech"})["guaranteed_leaf_cells_by_priority"] == {"0": 10}


# -- Incremental Scheduling and Guaranteed Job -----------------------------------------------


def test_incremental_scheduling_partially_runs_beyond_quota() -> None:
    """pinned: elastic, each task its own affinity group, ten 1-GPU tasks in nlp (quota:
    one 8-GPU node): eight run at once, the rest wait and run when cells free."""
    m = machine("pinned")
    results = [allocate(m, f"elastic/{i}", "nlp", 0, 1, 1, "A100") for i in range(10)]
    assert [r["ok"] for r in results] == [True] * 8 + [False] * 2
    released = apply_ok(m, {"op": "release", "group": "elastic/0"})
    assert [s["group"] for s in released["scheduled"]] == ["elastic/8"]
    assert status(m, "elastic/8")["state"] == "allocated"
    assert status(m, "elastic/9")["state"] == "pending"


def test_guaranteed_job_stays_within_its_vc_quota() -> None:
    """pinned: elastic's guaranteed tasks never use more than nlp's one node, even though
    other nodes are idle; and no other VC's job can preempt them."""
    m = machine("pinned")
    results = [allocate(m, f"elastic/{i}", "nlp", 0, 1, 1, "A100") for i in range(10)]
    nodes = {n for r in results if r["ok"] for n in nodes_of(r)}
    assert len(nodes) == 1
    for vc in ("cv", "ops"):
        r = allocate(m, f"{vc}-prod", vc, 1000, 1, 8, "A100")
        assert r["ok"] and r["preempted"] == []
    assert all(status(m, f"elastic/{i}")["state"] == "allocated" for i in range(8))


# -- Opportunistic Job -------------------------------------------------------------------------


def test_opportunistic_job_uses_other_vcs_quota() -> None:
    """pinned: oppo (priority -1, 2 x 8 A100) in nlp runs on two nodes although nlp's
    quota is one node."""
    m = machine("pinned")
    r = allocate(m, "oppo", "nlp", -1, 2, 8, "A100")
    assert r["ok"] and r["opportunistic"]
    assert len(set(nodes_of(r))) == 2 and PINNED_NODE not in nodes_of(r)
    vc = m.apply({"op": "vc_status", "vc": "nlp"})
    assert vc["opportunistic_leaf_cells"] == 16 and vc["guaranteed_leaf_cells_by_priority"] == {}


# -- Intra-VC Preemption -------------------------------------------------------------------------


def test_intra_vc_immediate_preemption() -> None:
    """mixed-full-quota: test (4 T4, priority 0) runs; prod (4 T4, priority 100, same
    VC) preempts it at once; the test job, retried, waits for resources."""
    m = machine("mixed-full-quota")
    test = allocate(m, "intra-imd-preempt-test", "vision", 0, 1, 4, "T4")
    assert test["ok"] and nodes_of(test) == [T4_NODE]
    prod = allocate(m, "intra-imd-preempt-prod", "vision", 100, 1, 4, "T4")
    assert prod["ok"] and prod["preempted"] == ["intra-imd-preempt-test"]
    assert nodes_of(prod) == [T4_NODE]
    retry = allocate(m, "intra-imd-preempt-test", "vision", 0, 1, 4, "T4")
    assert retry["ok"] is False and retry["waiting"]


def test_intra_vc_lazy_preemption() -> None:
    """mixed-full-quota: test (8 V100, priority 0, lazyPreemptionEnable) runs; prod (8
    V100, priority 100, vision) only downgrades it to opportunistic, since everything
    still fits the physical cluster; prod2 (3 x 8 V100, speech) then preempts it."""
    m = machine("mixed-full-quota")
    test = allocate(m, "intra-lazy-preempt-test", "vision", 0, 1, 8, "V100", lazyPreemptionEnable=True)
    assert test["ok"]
    prod = allocate(m, "intra-lazy-preempt-prod", "vision", 100, 1, 8, "V100")
    assert prod["ok"] and prod["preempted"] == []
    assert prod["lazy_preempted"] == ["intra-lazy-preempt-test"]
    s = status(m, "intra-lazy-preempt-test")
    assert s["state"] == "allocated" and s["opportunistic"]
    assert s["lazy_preempted_by"] == "intra-lazy-preempt-prod"
    assert nodes_of(s) == nodes_of(test)  # still running where it was
    assert nodes_of(prod) != nodes_of(test)
    prod2 = allocate(m, "intra-lazy-preempt-prod2", "speech", 100, 3, 8, "V100")
    assert prod2["ok"] and prod2["preempted"] == ["intra-lazy-preempt-test"]


# -- Inter-VC Preemption -------------------------------------------------------------------------


def test_inter_vc_preemption_of_opportunistic_jobs() -> None:
    """mixed-full-quota: inter-preempt-oppo (2 x 8 V100, priority -1, vision) runs on
    two nodes; inter-preempt-prod (3 x 8 V100, priority 100, speech) preempts it."""
    m = machine("mixed-full-quota")
    oppo = allocate(m, "inter-preempt-oppo", "vision", -1, 2, 8, "V100")
    assert oppo["ok"] and len(set(nodes_of(oppo))) == 2
    prod = allocate(m, "inter-preempt-prod", "speech", 100, 3, 8, "V100")
    assert prod["ok"] and prod["preempted"] == ["inter-preempt-oppo"]
    assert len(set(nodes_of(prod))) == 3
    assert m.apply({"op": "group_status", "group": "inter-preempt-oppo"})["ok"] is False


# -- Topology-Aware Intra-VC Scheduling --------------------------------------------------------------


def test_topology_aware_buddy_placement() -> None:
    """mixed: buddy, two 1-GPU tasks in one affinity group, get two buddy GPUs (the two
    leaves of one V100-PAIR cell), even when the node is already fragmented; four get
    one V100-QUAD."""
    m = machine("mixed")
    first = allocate(m, "buddy", "vision", 0, 2, 1, "V100")
    assert first["ok"] and len(set(nodes_of(first))) == 1
    assert sorted(p["leaf_cells"][0] for p in first["placement"]) == [0, 1]
    apply_ok(m, {"op": "release", "group": "buddy"})
    # Fragment vision's node: leaf 0 taken by another job; the pair must not straddle.
    single = allocate(m, "single", "vision", 0, 1, 1, "V100")
    pair = allocate(m, "buddy-2", "vision", 0, 2, 1, "V100")
    assert nodes_of(single)[0] == nodes_of(pair)[0]
    taken = single["placement"][0]["leaf_cells"][0]
    leaves = sorted(p["leaf_cells"][0] for p in pair["placement"])
    assert leaves[0] // 2 == leaves[1] // 2 != taken // 2  # one V100-PAIR, a free one
    third = allocate(m, "third", "vision", 0, 1, 1, "V100")
    assert third["placement"][0]["leaf_cells"][0] // 2 == taken // 2  # packs next to "single"
    # The first quad is full now; four more 1-GPU tasks take the other quad whole.
    quad = allocate(m, "quad", "vision", 0, 4, 1, "V100")
    assert sorted(p["leaf_cells"][0] for p in quad["placement"]) == [4, 5, 6, 7]


# -- Work-Preserving Reconfiguration -----------------------------------------------------------------


def test_reconfig_delete_physical_cell() -> None:
    """mixed -> mixed-no-t4: the T4 job keeps running; its T4 cells are ignored."""
    m = machine("mixed")
    r1 = allocate(m, "reconfig-1", "vision", 0, 1, 4, "T4")
    assert r1["ok"] and nodes_of(r1) == [T4_NODE]
    report = reconfigure(m, "mixed-no-t4")
    assert report["ignored_leaf_cells"] == {"reconfig-1": 4} and report["lazy_preempted"] == []
    s = status(m, "reconfig-1")
    assert s["state"] == "allocated" and s["placement"][0]["ignored_leaf_cells"] == 4
    assert "T4-RACK" not in m.apply({"op": "cluster_status"})["chains"]
    assert apply_ok(m, {"op": "release", "group": "reconfig-1"})["ok"]


def test_reconfig_add_physical_cell() -> None:
    """mixed-no-t4 -> mixed: the V100 job keeps running and is still accounted."""
    m = machine("mixed-no-t4")
    v100 = allocate(m, "v100-type", "vision", 0, 8, 1, "V100")
    assert v100["ok"]
    reconfigure(m, "mixed")
    s = status(m, "v100-type")
    assert s["state"] == "allocated" and not s["opportunistic"]
    assert [p["node"] for p in s["placement"]] == nodes_of(v100)
    vc = m.apply({"op": "vc_status", "vc": "vision"})
    assert vc["guaranteed_leaf_cells_by_priority"] == {"0": 8}
    # vision's V100 quota is still fully used by it, so a new V100 job waits.
    assert allocate(m, "more", "vision", 0, 1, 1, "V100")["waiting"]
    assert allocate(m, "t4", "vision", 0, 1, 4, "T4")["ok"]  # the added cells are usable


def test_reconfig_update_physical_cell_add_node() -> None:
    """mixed -> mixed-two-t4 (a second T4 node): reconfig-1 keeps running and is
    accounted; reconfig-2, all T4 nodes at the same priority, waits instead of (lazily)
    preempting it."""
    m = machine("mixed")
    assert allocate(m, "reconfig-1", "vision", 0, 1, 4, "T4")["ok"]
    reconfigure(m, "mixed-two-t4")
    s = status(m, "reconfig-1")
    assert s["state"] == "allocated" and not s["opportunistic"] and "lazy_preempted_by" not in s
    r2 = allocate(m, "reconfig-2", "vision", 0, 2, 4, "T4")
    assert r2["ok"] is False and r2["waiting"]
    assert not status(m, "reconfig-1")["opportunistic"]
    # The new node is vision's: one more T4 node's worth runs beside reconfig-1.
    r3 = allocate(m, "reconfig-3", "vision", 0, 1, 4, "T4")
    assert r3["ok"] and nodes_of(r3) == ["gpu-t1"]


def test_reconfig_update_physical_cell_delete_node() -> None:
    """mixed -> mixed-without-v0 (node gpu-v0 removed): reconfig-3 keeps running; its
    usage of the deleted node is ignored, the rest still accounted."""
    m = machine("mixed")
    r3 = allocate(m, "reconfig-3", "speech", 0, 2, 8, "V100")
    assert r3["ok"] and "gpu-v0" in nodes_of(r3)
    report = reconfigure(m, "mixed-without-v0")
    assert report["ignored_leaf_cells"] == {"reconfig-3": 8}
    s = status(m, "reconfig-3")
    assert s["state"] == "allocated" and not s["opportunistic"]
    ignored = {p["node"]: p["ignored_leaf_cells"] for p in s["placement"]}
    assert ignored["gpu-v0"] == 8 and sum(ignored.values()) == 8
    assert m.apply({"op": "vc_status", "vc": "speech"})["guaranteed_leaf_cells_by_priority"] == {"0": 8}


def test_reconfig_delete_virtual_cluster() -> None:
    """mixed -> mixed-no-speech (speech deleted, its quota moved to vision): reconfig-3
    keeps running but is lazily preempted; reconfig-4 (vision, all V100 nodes)
    preempts it at once."""
    m = machine("mixed")
    assert allocate(m, "reconfig-3", "speech", 0, 2, 8, "V100")["ok"]
    report = reconfigure(m, "mixed-no-speech")
    assert report["lazy_preempted"] == ["reconfig-3"]
    s = status(m, "reconfig-3")
    assert s["state"] == "allocated" and s["opportunistic"] and "speech" in s["lazy_preempted_by"]
    r4 = allocate(m, "reconfig-4", "vision", 0, 4, 8, "V100")
    assert r4["ok"] and r4["preempted"] == ["reconfig-3"]


def test_reconfig_update_virtual_cluster() -> None:
    """mixed -> mixed-moved-quota (one V100 node moved from speech to vision):
    reconfig-3 (two nodes in speech) keeps running, lazily preempted; reconfig-5
    (vision, all its V100 nodes) preempts it at once."""
    m = machine("mixed")
    assert allocate(m, "reconfig-3", "speech", 0, 2, 8, "V100")["ok"]
    report = reconfigure(m, "mixed-moved-quota")
    assert report["lazy_preempted"] == ["reconfig-3"]
    assert status(m, "reconfig-3")["opportunistic"]
    r5 = allocate(m, "reconfig-5", "vision", 0, 3, 8, "V100")
    assert r5["ok"] and r5["preempted"] == ["reconfig-3"]


def test_reconfig_to_the_same_config_changes_nothing() -> None:
    m = machine("mixed")
    allocate(m, "a", "vision", 0, 1, 8, "V100")
    allocate(m, "b", "speech", 5, 2, 4, "V100")
    allocate(m, "c", "vision", -1, 1, 2, "T4")
    before = m.snapshot()
    reconfigure(m, "mixed")
    assert m.snapshot() == before


# -- Bad Hardware Awareness --------------------------------------------------------------------------


def test_bad_hardware_waits_then_runs_when_node_is_back() -> None:
    """mixed: the only T4 node goes bad; badnode (T4) waits; when the node is healthy
    again the waiting job starts, without being resubmitted."""
    m = machine("mixed")
    assert apply_ok(m, {"op": "set_node_health", "node": T4_NODE, "healthy": False})["changed"]
    r = allocate(m, "badnode", "vision", 0, 1, 4, "T4")
    assert r["ok"] is False and r["waiting"] and r["queued"] and T4_NODE in r["reason"]
    opp = allocate(m, "opp-t4", "speech", -1, 1, 1, "T4", wait=False)
    assert opp["ok"] is False and opp["queued"] is False  # bad cells are never allocated
    back = apply_ok(m, {"op": "set_node_health", "node": T4_NODE, "healthy": True})
    assert [s["group"] for s in back["scheduled"]] == ["badnode"]
    s = status(m, "badnode")
    assert s["state"] == "allocated" and nodes_of(s) == [T4_NODE]
