"""Issue 10's remaining HiveD rules, each test written from HiveD's own documents and
sources (cited in its docstring): opportunistic pods spread away from guaranteed ones,
the read-only filter (what-if), partial release of a gang, the safe relaxed buddy split,
doomed bad cells and virtual-cell health."""

from __future__ import annotations

from typing import Any

from scheduler_state import SchedulerStateMachine, check, load_config

from tests.scheduler_state.helpers import allocate, apply_ok, nodes_of, spec

# Four 4-GPU nodes in two pools of two; vc1 and vc2 own one pool-sized share each
# (two K80-NODE cells), so buddy allocation decides which pool each VC gets.
FOUR_NODES = """
physicalCluster:
  cellTypes:
    K80-NODE: {childCellType: K80, childCellNumber: 4, isNodeLevel: true}
    K80-POOL: {childCellType: K80-NODE, childCellNumber: 2}
  physicalCells:
  - cellType: K80-POOL
    cellChildren: [{cellAddress: n0}, {cellAddress: n1}]
  - cellType: K80-POOL
    cellChildren: [{cellAddress: n2}, {cellAddress: n3}]
virtualClusters:
  vc1:
    virtualCells: [{cellType: K80-POOL.K80-NODE, cellNumber: 2}]
  vc2:
    virtualCells: [{cellType: K80-POOL.K80-NODE, cellNumber: 2}]
"""


def four_nodes(text: str = FOUR_NODES) -> SchedulerStateMachine:
    return SchedulerStateMachine(load_config(text))


# -- 3. opportunistic placement -------------------------------------------------------------


def test_opportunistic_pods_stay_away_from_nodes_with_guaranteed_pods() -> None:
    """HiveD ``topology_aware_scheduler.go`` (``crossPriorityPack``): the opportunistic
    scheduler packs inside each priority only, "opportunistic pod scheduling (stay away
    from guaranteed pods), because guaranteed pods can avoid preempting opportunistic
    pods only among buddy cells". Best fit alone would put the 1-GPU opportunistic pod
    next to the guaranteed one (the node with the fewest free GPUs that suffice)."""
    m = four_nodes()
    g = allocate(m, "g", "vc1", 0, 1, 1)
    assert g["ok"]
    busy = nodes_of(g)[0]
    o = allocate(m, "o", "vc2", -1, 1, 1)
    assert o["ok"] and nodes_of(o)[0] != busy
    # and next to other opportunistic pods, packed (same priority)
    o2 = allocate(m, "o2", "vc2", -1, 1, 1)
    assert nodes_of(o2) == nodes_of(o)


def test_opportunistic_pods_use_guaranteed_nodes_when_nothing_else_fits() -> None:
    """Staying away is a preference, not a rule: with every node holding a guaranteed
    pod, the opportunistic group still runs (the feature README's Opportunistic Job)."""
    m = four_nodes()
    for i in range(4):
        assert allocate(m, f"g{i}", "vc1" if i < 2 else "vc2", 0, 1, 4 if i % 2 else 1)["ok"]
    used = {n for i in range(4) for n in nodes_of(m.apply({"op": "group_status", "group": f"g{i}"}))}
    assert len(used) == 4
    o = allocate(m, "o", "vc2", -1, 1, 2)
    assert o["ok"]


def test_opportunistic_spread_is_deterministic() -> None:
    """Same commands, same answers and digest on every replica (a fresh machine)."""
    cmds = [{"op": "allocate", "group": spec(f"x{i}", "vc1" if i % 3 else "vc2", -1 if i % 2 else 0, 1, 1 + i % 2)}
            for i in range(10)]
    a, b = four_nodes(), four_nodes()
    assert [a.apply(c) for c in cmds] == [b.apply(c) for c in cmds]
    assert a.digest() == b.digest() and check(a) == []


# -- 4. filtering: the read-only what-if ----------------------------------------------------


def pod(uid: str, name: str) -> dict[str, str]:
    return {"uid": uid, "namespace": "default", "name": name}


def pod_spec(group: str, vc: str, prio: int, pods: int, leaves: int, **extra: Any) -> dict[str, Any]:
    return {**spec(group, vc, prio, pods, leaves, **extra), "leafCellNumber": leaves}


def test_what_if_answers_the_filter_without_changing_anything() -> None:
    """HiveD ``hived_algorithm.go`` ``Schedule``: in the filter phase a new group's
    placement is computed and victims are reported, but "we allow a new preemption only
    when in Preempting phase" -- nothing is reserved. ``what_if`` is that answer as a
    read: the digest is identical before and after, and ``pod_schedule`` then lands
    exactly where the dry run said."""
    m = four_nodes()
    before = m.digest()
    w = m.query({"op": "what_if", "pod": pod("u1", "p1"), "spec": pod_spec("j/g", "vc1", 1, 2, 2)})
    assert w["ok"] and w["placeable"] and w["changes_state"] and w["victims"] == []
    assert m.digest() == before
    r = apply_ok(m, {"op": "pod_schedule", "pod": pod("u1", "p1"), "spec": pod_spec("j/g", "vc1", 1, 2, 2)})
    assert (r["node"], r["leaf_cells"], r["slot"]) == (w["node"], w["leaf_cells"], w["slot"])
    assert [(x["node"], x["leaf_cells"]) for x in r["placement"]] == \
        [(x["node"], x["leaf_cells"]) for x in w["placement"]]
    # the second pod's what-if names the slot the group reserved for it
    w2 = m.query({"op": "what_if", "pod": pod("u2", "p2"), "spec": pod_spec("j/g", "vc1", 1, 2, 2)})
    assert w2["placeable"] and w2["slot"] == 1 and w2["node"] == r["placement"][1]["node"]


def test_what_if_reports_victims_and_lazy_demotions_and_undoes_them() -> None:
    """Feature README, Intra-VC Preemption (immediate and lazy): the what-if of a
    higher-priority group names the victims it would preempt (every pod of each victim
    group) or the groups it would only demote, and changes nothing -- not even the
    lazy demotion it tried on the way."""
    m = four_nodes()
    assert apply_ok(m, {"op": "pod_schedule", "pod": pod("v1", "low"), "spec": pod_spec("j/low", "vc1", 0, 1, 4)})["ok"]
    assert apply_ok(m, {"op": "pod_bind", "pod": pod("v1", "low"), "node": m.apply(
        {"op": "pod_status", "pod": {"uid": "v1"}})["node"]})["ok"]
    assert allocate(m, "lazy", "vc1", 0, 1, 4, lazyPreemptionEnable=True)["ok"]
    before = m.snapshot()
    w = m.query({"op": "what_if", "group": spec("high", "vc1", 5, 2, 4)})
    assert m.snapshot() == before
    assert not w["placeable"] and w["waiting"]
    # "lazy" is demoted first, then its physical node is the lowest free buddy cell
    # the mapping takes (HiveD's buddy alloc), so it is preempted for real too
    assert [v["group"] for v in w["victims"]] == ["j/low", "lazy"]
    assert w["victims"][0]["pods"][0]["uid"] == "v1" and w["victims"][1]["pods"] == []
    # the group-level allocate of the same spec does what the what-if said
    r = allocate(m, "high", "vc1", 5, 2, 4)
    assert r["preempted"] == ["j/low", "lazy"]
    assert [(x["node"], x["leaf_cells"]) for x in r["placement"]] == \
        [(x["node"], x["leaf_cells"]) for x in w["placement"]]


def test_what_if_of_a_lazy_demotion_only() -> None:
    """Feature README, Lazy Preemption: "The job will just downgrade the test job to be
    Opportunistic Job ... because all jobs can still fit into the whole physical
    cluster". The what-if lists it under ``lazy_preempted`` and leaves it guaranteed."""
    m = four_nodes()
    assert allocate(m, "test", "vc1", 0, 1, 4, lazyPreemptionEnable=True)["ok"]
    before = m.snapshot()
    w = m.query({"op": "what_if", "group": spec("prod", "vc1", 100, 2, 4)})
    assert m.snapshot() == before and not m.groups["test"].opportunistic
    assert w["placeable"] and w["victims"] == [] and w["lazy_preempted"] == ["test"]
    r = allocate(m, "prod", "vc1", 100, 2, 4)
    assert r["lazy_preempted"] == ["test"] and r["preempted"] == []


def test_what_if_is_a_read() -> None:
    """A query, not a command: ``query`` serves it, ``keys_of`` writes nothing; an
    already bound pod is refused as the filter refuses it."""
    m = four_nodes()
    assert SchedulerStateMachine.keys_of({"op": "what_if"}) == []
    assert m.query({"op": "what_if", "group": spec("x", "vc1", 0, 1, 1)})["placeable"]
    r = apply_ok(m, {"op": "pod_schedule", "pod": pod("u1", "p"), "spec": pod_spec("j/p", "vc2", 0, 1, 1)})
    apply_ok(m, {"op": "pod_bind", "pod": pod("u1", "p"), "node": r["node"]})
    before = m.digest()
    w = m.query({"op": "what_if", "pod": pod("u1", "p"), "spec": pod_spec("j/p", "vc2", 0, 1, 1)})
    assert not w["ok"] and "already been bound" in w["error"] and m.digest() == before


# -- 5. partial release ---------------------------------------------------------------------


def test_a_gang_keeps_its_cells_until_its_last_pod_is_gone() -> None:
    """HiveD ``hived_algorithm.go`` ``DeleteAllocatedPod``: deleting a pod only clears
    its slot; "if allPodsReleased(...) deleteAllocatedPodGroup" -- the group's cells are
    released when its last pod is gone (state-machine.md, AG event e3: "Condition: all
    pods of this AG are deleted"). Group-level ``release`` with ``pods`` does the same,
    with or without ``gangReleaseEnable`` (HiveD's algorithm never reads the flag when
    it frees cells). Nobody else gets the cells meanwhile; the last pod frees them and
    the waiting group is placed in the same command."""
    for gang in (False, True):
        m = four_nodes()
        assert allocate(m, "gang", "vc1", 0, 2, 4, gangReleaseEnable=gang)["ok"]
        assert allocate(m, "next", "vc1", 0, 1, 4)["waiting"]
        r = apply_ok(m, {"op": "release", "group": "gang", "pods": [0]})
        assert r == {"ok": True, "group": "gang", "released": False, "scheduled": []}
        st = m.apply({"op": "group_status", "group": "gang"})
        assert [p["released"] for p in st["placement"]] == [True, False]
        assert m.apply({"op": "vc_status", "vc": "vc1"})["guaranteed_leaf_cells_by_priority"] == {"0": 8}
        r = apply_ok(m, {"op": "release", "group": "gang", "pods": [1]})
        assert r["released"] and [s["group"] for s in r["scheduled"]] == ["next"]


def test_pod_by_pod_gang_keeps_its_cells_until_its_last_pod_is_deleted() -> None:
    """The same at pod level (``pod_delete``, HiveD's DeleteAllocatedPod): the deleted
    pod's slot is free again for a new pod of the group, on the same cells."""
    m = four_nodes()
    s = pod_spec("j/g", "vc1", 0, 2, 4)
    a = apply_ok(m, {"op": "pod_schedule", "pod": pod("a", "a"), "spec": s})
    b = apply_ok(m, {"op": "pod_schedule", "pod": pod("b", "b"), "spec": s})
    d = apply_ok(m, {"op": "pod_delete", "pod": pod("a", "a")})
    assert not d.get("released")
    assert allocate(m, "other", "vc1", 0, 1, 4, wait=False)["waiting"]
    a2 = apply_ok(m, {"op": "pod_schedule", "pod": pod("a2", "a2"), "spec": s})
    assert (a2["node"], a2["leaf_cells"]) == (a["node"], a["leaf_cells"])
    apply_ok(m, {"op": "pod_delete", "pod": pod("a2", "a2")})
    d = apply_ok(m, {"op": "pod_delete", "pod": pod("b", "b")})
    assert d["released"] and b["node"] != a["node"]
    assert allocate(m, "other", "vc1", 0, 2, 4, wait=False)["ok"]


# -- 2. safe relaxed buddy split --------------------------------------------------------------

RELAXED = """
physicalCluster:
  cellTypes:
    K80-NODE: {childCellType: K80, childCellNumber: 4, isNodeLevel: true}
    K80-POOL: {childCellType: K80-NODE, childCellNumber: 2}
  physicalCells:
  - cellType: K80-POOL
    cellChildren: [{cellAddress: n0}, {cellAddress: n1}]
  - cellType: K80-POOL
    cellChildren: [{cellAddress: n2}, {cellAddress: n3}]
virtualClusters:
%s
"""
SAFE = RELAXED % """  vc1:
    virtualCells: [{cellType: K80-POOL.K80-NODE, cellNumber: 2}]
  vc2:
    virtualCells: [{cellType: K80-POOL.K80-NODE, cellNumber: 1}]"""
UNSAFE = RELAXED % """  vc1:
    virtualCells: [{cellType: K80-POOL.K80-NODE, cellNumber: 1}]
  vc2:
    virtualCells: [{cellType: K80-POOL.K80-NODE, cellNumber: 1}]
  vc3:
    virtualCells: [{cellType: K80-POOL, cellNumber: 1}]"""


def _bad_lowest_level(text: str) -> SchedulerStateMachine:
    """vc2 binds a node (buddy alloc splits pool n0/n1: n0 for vc2, n1 left at the node
    level); then n1 goes bad: the lowest free level offers only a bad node."""
    m = four_nodes(text)
    r = allocate(m, "b", "vc2", 0, 1, 4)
    assert nodes_of(r) == ["n0"]
    apply_ok(m, {"op": "set_node_health", "node": "n1", "healthy": False})
    return m


def test_relaxed_split_when_safe() -> None:
    """HiveD ``cell_allocation.go``: "after buddyAlloc cannot find a healthy cell (or not
    in suggested nodes), try to split a higher level cell safely to get current level
    cells" (``safeRelaxedBuddyAlloc``: only as many higher cells as are "splittable",
    free cells beyond what the VCs' free cells need). Here splitting pool n2/n3 leaves
    n1 and the other half for vc1's second node: VC safety holds, so vc1's request is
    placed at once instead of waiting for n1."""
    m = _bad_lowest_level(SAFE)
    r = allocate(m, "a", "vc1", 0, 1, 4, wait=False)
    assert r["ok"] and nodes_of(r) == ["n2"]
    # vc1's second node is still guaranteed: n3 (n1 is bad, so it waits for n1 or n3)
    r2 = allocate(m, "a2", "vc1", 0, 1, 4, wait=False)
    assert r2["ok"] and nodes_of(r2) == ["n3"]


def test_no_relaxed_split_when_it_would_break_another_vcs_guarantee() -> None:
    """The same request when vc3 owns a whole pool: splitting pool n2/n3 would leave
    vc3's pool unobtainable (VC safety), so vc1's request waits (HiveD: "Cannot split
    higher level cells"), vc3 still gets its whole pool, and vc1 is placed once n1
    comes back (feature README, Bad Hardware Awareness: "The waiting job will start
    running, without any retries")."""
    m = _bad_lowest_level(UNSAFE)
    before = m.snapshot()
    r = allocate(m, "a", "vc1", 0, 1, 4, wait=False)
    assert r["waiting"] and "bad node n1" in r["reason"] and m.snapshot() == before
    assert allocate(m, "a", "vc1", 0, 1, 4)["queued"]
    assert nodes_of(allocate(m, "c", "vc3", 0, 2, 4)) == ["n2", "n3"]
    r = apply_ok(m, {"op": "set_node_health", "node": "n1", "healthy": True})
    assert [s["group"] for s in r["scheduled"]] == ["a"]
    assert nodes_of(m.apply({"op": "group_status", "group": "a"})) == ["n1"]


def test_relaxed_split_for_suggested_nodes() -> None:
    """The relaxed split also serves K8s suggested nodes (``ignoreK8sSuggestedNodes:
    false``): HiveD calls it when buddy alloc finds no cell "healthy (or ... in
    suggested nodes)"."""
    m = four_nodes(SAFE)
    assert nodes_of(allocate(m, "b", "vc2", 0, 1, 4)) == ["n0"]
    r = allocate(m, "a", "vc1", 0, 1, 4, wait=False, ignoreK8sSuggestedNodes=False,
                 suggestedNodes=["n2", "n3"])
    assert r["ok"] and nodes_of(r) == ["n2"]


# -- 1. doomed bad cells and virtual-cell health ------------------------------------------------


def health(m: SchedulerStateMachine, vc: str) -> list[tuple[str, str | None, str]]:
    s = m.apply({"op": "vc_status", "vc": vc})
    return [(c["address"], c["bound_to"], c["health"]) for c in s["cells"]]


def test_doomed_bad_cells_appear_as_nodes_go_bad_and_clear_as_they_come_back() -> None:
    """HiveD ``hived_algorithm.go`` (``vcDoomedBadCells``): "A preassigned cell in a VC is
    'doomed to be bad' when the healthy free cells in the physical cluster is fewer than
    the VC's free cells"; ``tryBindDoomedBadCell`` binds such a cell to a bad free cell
    (so "users can know if their VCs have bad nodes currently") and
    ``tryUnbindDoomedBadCell`` unbinds it once the VC's free cells are fewer than the
    healthy free cells. vc1 and vc2 own two nodes each of four. With n0 and n1 bad two
    healthy nodes remain for four free VC cells: nothing is doomed yet (2 <= 2 per VC).
    With n2 bad too, one healthy node is left and each VC gets one doomed cell."""
    m = four_nodes()
    for n in ("n0", "n1"):
        r = apply_ok(m, {"op": "set_node_health", "node": n, "healthy": False})
        assert r["doomed_bad_cells"] == {}
    r = apply_ok(m, {"op": "set_node_health", "node": "n2", "healthy": False})
    assert r["doomed_bad_cells"] == {"vc1": ["vc1/0"], "vc2": ["vc2/0"]}
    assert health(m, "vc1") == [("vc1/0", "0/n0", "doomed-bad"), ("vc1/1", None, "healthy")]
    assert health(m, "vc2") == [("vc2/0", "0/n1", "doomed-bad"), ("vc2/1", None, "healthy")]
    assert m.apply({"op": "vc_status", "vc": "vc1"})["cell_health"] == {"healthy": 1, "bad": 0, "doomed-bad": 1}
    # vc1 takes the last healthy node; vc2 is then doomed entirely and says so
    assert nodes_of(allocate(m, "a", "vc1", 0, 1, 4)) == ["n3"]
    assert health(m, "vc2") == [("vc2/0", "0/n1", "doomed-bad"), ("vc2/1", "1/n2", "doomed-bad")]
    r = allocate(m, "b", "vc2", 0, 1, 4)
    assert r["waiting"] and "doomed bad cells: vc2/0, vc2/1" in r["reason"]
    # nodes come back: the doomed bindings clear (a doomed cell on a healthy node at
    # once, the others as healthy free cells outnumber the VC's free cells), and the
    # waiting group runs without being resubmitted (feature README, Bad Hardware)
    r = apply_ok(m, {"op": "set_node_health", "node": "n0", "healthy": True})
    assert r["doomed_bad_cells"] == {"vc2": ["vc2/1"]}
    assert [s["group"] for s in r["scheduled"]] == ["b"]
    assert nodes_of(m.apply({"op": "group_status", "group": "b"})) == ["n0"]
    for n in ("n1", "n2"):
        r = apply_ok(m, {"op": "set_node_health", "node": n, "healthy": True})
    assert r["doomed_bad_cells"] == {} and m.cluster.hbound == {}
    assert all(h == "healthy" for vc in ("vc1", "vc2") for _, _, h in health(m, vc))


POOLS = """
physicalCluster:
  cellTypes:
    K80-NODE: {childCellType: K80, childCellNumber: 4, isNodeLevel: true}
    K80-POOL: {childCellType: K80-NODE, childCellNumber: 2}
  physicalCells:
  - cellType: K80-POOL
    cellChildren: [{cellAddress: n0}, {cellAddress: n1}]
  - cellType: K80-POOL
    cellChildren: [{cellAddress: n2}, {cellAddress: n3}]
  - cellType: K80-POOL
    cellChildren: [{cellAddress: n4}, {cellAddress: n5}]
virtualClusters:
  vc1:
    virtualCells: [{cellType: K80-POOL, cellNumber: 2}]
  vc2:
    virtualCells: [{cellType: K80-POOL, cellNumber: 1}]
"""


def test_placement_avoids_doomed_cells_while_healthy_ones_remain() -> None:
    """HiveD: "Marking doomed bad cells can help the intra-VC scheduler avoid finding
    placements that will be inevitably mapped to bad physical nodes"; a doomed cell's
    bad children are bound too (``allocateBadCell``: "so that the VC scheduler can see
    the bad cell"). With n0 and n2 bad only pool n4/n5 is healthy: vc1 (two pools) gets
    pool n0/n1 doomed, its bad node n0 bound below it. vc1's pods go to the healthy
    pool first; then to the doomed pool's healthy node n1; never to n0."""
    m = four_nodes(POOLS)
    for n in ("n0", "n2"):
        apply_ok(m, {"op": "set_node_health", "node": n, "healthy": False})
    assert health(m, "vc1") == [("vc1/0", "0", "doomed-bad"), ("vc1/1", None, "healthy")]
    assert m.apply({"op": "vc_status", "vc": "vc1"})["cells"][0]["bad_cells"] == ["vc1/0/0"]
    assert health(m, "vc2") == [("vc2/0", None, "healthy")]
    placed = [nodes_of(allocate(m, f"a{i}", "vc1", 0, 1, 4))[0] for i in range(3)]
    assert placed == ["n4", "n5", "n1"]
    assert allocate(m, "a3", "vc1", 0, 1, 4)["waiting"]
    # vc1's healthy pool is in use now: vc2's one pool is doomed to n2/n3, and its
    # request runs on the healthy half
    assert health(m, "vc2") == [("vc2/0", "1", "doomed-bad")]
    assert nodes_of(allocate(m, "b", "vc2", 0, 1, 4)) == ["n3"]
    assert health(m, "vc2") == [("vc2/0", "1", "bad")]  # in use, still on a bad pool
    # n0 back: the waiting vc1 pod runs there
    r = apply_ok(m, {"op": "set_node_health", "node": "n0", "healthy": True})
    assert [s["group"] for s in r["scheduled"]] == ["a3"]
    assert nodes_of(m.apply({"op": "group_status", "group": "a3"})) == ["n0"]


def test_doomed_state_snapshots_and_replays_exactly() -> None:
    """Determinism: the same command stream gives the same digest on every replica, and
    a snapshot taken with doomed bindings restores to the same bytes and decides the
    same way afterwards."""
    cmds: list[dict[str, Any]] = [{"op": "set_node_health", "node": n, "healthy": False} for n in ("n0", "n2")]
    cmds += [{"op": "allocate", "group": spec(f"a{i}", "vc1", 0, 1, 4)} for i in range(2)]
    tail: list[dict[str, Any]] = [{"op": "allocate", "group": spec("b", "vc2", 0, 1, 4)},
                                  {"op": "set_node_health", "node": "n2", "healthy": True},
                                  {"op": "allocate", "group": spec("c", "vc1", 0, 2, 4)},
                                  {"op": "set_node_health", "node": "n0", "healthy": True}]
    a, b = four_nodes(POOLS), four_nodes(POOLS)
    assert [a.apply(c) for c in cmds] == [b.apply(c) for c in cmds]
    assert a.cluster.hbound and a.digest() == b.digest()
    snap = a.snapshot()
    c = four_nodes(POOLS)
    c.restore(snap)
    assert c.snapshot() == snap and check(c) == []
    assert [a.apply(x) for x in tail] == [c.apply(x) for x in tail]
    assert a.digest() == c.digest() and check(a) == []


def test_a_running_pod_re_added_on_a_doomed_cell_keeps_its_cells() -> None:
    """AddAllocatedPod (recovery from pod bind info) of a pod running on a node that
    another VC's doomed bad cell sits on: the running pod wins -- HiveD's
    ``allocateLeafCell`` binds it over "the binding ... created before (when the cell is
    bad)" -- and the doomed cell moves to another bad node; the group is not lazily
    preempted."""
    a = four_nodes()
    assert nodes_of(allocate(a, "x", "vc2", 0, 1, 4)) == ["n0"]
    s = pod_spec("j/run", "vc1", 0, 1, 4)
    r = apply_ok(a, {"op": "pod_schedule", "pod": pod("u", "run"), "spec": s})
    assert r["node"] == "n1"
    info = apply_ok(a, {"op": "pod_bind", "pod": pod("u", "run"), "node": "n1"})["bind_info"]
    b = four_nodes()
    for n in ("n0", "n1", "n2"):
        apply_ok(b, {"op": "set_node_health", "node": n, "healthy": False})
    assert health(b, "vc2")[0] == ("vc2/0", "0/n1", "doomed-bad")
    r = apply_ok(b, {"op": "add_allocated_pod", "pod": pod("u", "run"), "spec": s, "bind_info": info})
    assert r["ok"] and r["lazy_preempted"] == [] and r["node"] == "n1"
    assert ("vc1/1", "0/n1", "bad") in health(b, "vc1")
    assert [h for _, _, h in health(b, "vc2")].count("doomed-bad") == 1
