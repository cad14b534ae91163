"""Issue 10, "Preemption over time": the cells of a Preempting group's plan are
reserved for it. Written from HiveD's ``state-machine.md``:

- AG e1 / cell e5: when an AG goes Pending -> Preempting, "For free cells: Free ->
  Reserved (by this AG)", besides its victims' cells Used -> Reserving (cell e2);
  ``createPreemptingAffinityGroup`` (hived_algorithm.go): "Its resources are
  immediately allocated to the group ... so that other groups will not be scheduled to
  the same placement (unless they have higher priorities)";
- AG e0 / e1 and cell e3 / e6 / e8 (i): only an AG of higher priority gets a Reserving or
  Reserved cell; it cancels the first preemption (AG e5): "All the other Reserving cells
  (by this AG) -> Used (by the Being preempted AG)", "All the other Reserved cells (by this
  AG) -> Free";
- AG e7 / cell e7: a Preempting AG whose pods are all deleted: "All the Reserved cells
  (by this AG) -> Free";
- cell life cycle ``Free -> Used -> Reserving -> Reserved -> Used``: a victim's cells
  become Reserved when it is deleted, and AG e2 ("all the cells ... are Reserved")
  places the preemptor on them.

The configs: ``hived-small.yaml`` (vc-b owns one 4-GPU node of two buddy pairs) and a
two-node pool with one node of quota, for a preemptor whose victim is opportunistic."""

from __future__ import annotations

from typing import Any

import yaml

from scheduler_state import SchedulerStateMachine, check, load_config

from tests.scheduler_state.test_hived_fidelity import FOUR_NODES
from tests.scheduler_state.test_pods import fresh, pod, pspec, run, schedule

def pair_config() -> dict[str, Any]:
    """test_hived_fidelity's four nodes cut to one pool of two, with one node of quota."""
    cfg = yaml.safe_load(FOUR_NODES)
    del cfg["physicalCluster"]["physicalCells"][1]
    cfg["virtualClusters"] = {"vc1": {"virtualCells": [{"cellType": "K80-POOL.K80-NODE", "cellNumber": 1}]}}
    return cfg


def bound(m: SchedulerStateMachine, uid: str, spec: dict[str, Any]) -> dict[str, Any]:
    r = schedule(m, uid, spec)
    assert r["ok"] and r["state"] == "Binding", r
    assert run(m, {"op": "pod_bind", "pod": {"uid": uid}, "node": r["node"]})["ok"]
    return r


def reserved(m: SchedulerStateMachine, group: str) -> list[tuple[str, int]]:
    """The physical leaf cells reserved for a Preempting group (group_status)."""
    st = m.apply({"op": "group_status", "group": group})
    assert st["state"] == "preempting", st
    return [(row["node"], i) for row in st["reserved_placement"] for i in row["leaf_cells"]]


def cells_of(r: dict[str, Any]) -> list[tuple[str, int]]:
    return [(p["node"], i) for p in r["placement"] for i in p["leaf_cells"]]


def preempting_on_half_free_node() -> tuple[SchedulerStateMachine, str]:
    """vc-b's node: a victim ``low`` (priority 1, live pod) on its second buddy pair,
    the first pair free; ``high`` (priority 5, one 4-GPU pod) preempts ``low``: the
    free pair is Reserved for it, ``low``'s pair Reserving. Returns (machine, node)."""
    m = fresh()
    filler = bound(m, "f0", pspec("filler", "vc-b", 1, 1, 2))
    low = bound(m, "l0", pspec("low", "vc-b", 1, 1, 2))
    assert filler["node"] == low["node"] and filler["leaf_cells"] == [0, 1] and low["leaf_cells"] == [2, 3]
    assert run(m, {"op": "pod_delete", "pod": {"uid": "f0"}})["released"]
    r = schedule(m, "h0", pspec("high", "vc-b", 5, 1, 4), op="pod_preempt")
    assert r["ok"] and r["preempting"] and [v["group"] for v in r["victims"]] == ["low"], r
    assert r["reserved_leaf_cells"] == 2
    node = low["node"]
    assert reserved(m, "high") == [(node, 0), (node, 1)]
    return m, node


def test_free_cells_of_the_plan_are_reserved_at_preemption() -> None:
    """AG e1 / cell e5: Free -> Reserved; cell e2: the victim's cells Reserving. The
    inspect views show HiveD's cell states; vc_status counts the reserved leaves."""
    m, node = preempting_on_half_free_node()
    states = {}
    for top in m.apply({"op": "inspect", "view": "physicalcluster"})["result"]:
        for n in top["cellChildren"]:
            for pair in n["cellChildren"]:
                for leaf in pair["cellChildren"]:
                    states[leaf["cellAddress"]] = leaf["cellState"]
    prefix = next(a for a in states if f"{node}/" in a).rsplit("/", 2)[0]
    assert [states[f"{prefix}/{p}/{i}"] for p, i in ((0, 0), (0, 1), (1, 2), (1, 3))] == \
        ["Reserved", "Reserved", "Reserving", "Reserving"]
    vc = m.apply({"op": "vc_status", "vc": "vc-b"})
    assert vc["reserved_leaf_cells"] == 2 and vc["cells"][0]["free_leaf_cells"] == 0


def test_an_equal_or_lower_priority_group_cannot_take_the_reserved_cells() -> None:
    """createPreemptingAffinityGroup: "other groups will not be scheduled to the same
    placement (unless they have higher priorities)". Before issue 10 closed this, the
    2-GPU groups below were placed on the free pair at once."""
    m, node = preempting_on_half_free_node()
    for prio in (5, 3, 0):
        spec = pspec(f"p{prio}", "vc-b", prio, 1, 2)
        before = m.snapshot()
        w = m.query({"op": "what_if", "group": spec})
        assert w["ok"] and not w["placeable"] and w["victims"] == [], w
        for op in ("pod_schedule", "pod_preempt"):
            r = schedule(m, f"x{prio}", spec, op=op)
            assert not r["ok"] and r["waiting"], r
        assert m.snapshot() == before
        r = run(m, {"op": "allocate", "group": {**spec, "affinityGroup": {"name": f"g{prio}", "members": [
            {"podNumber": 1, "leafCellNumber": 2}]}}, "wait": False})
        assert not r["ok"] and "2 leaf cells are reserved for Preempting affinity group high (priority 5)" in \
            r["reason"], r
    # the pending-queue retry pass does not hand them out either
    q = run(m, {"op": "allocate", "group": pspec("queued", "vc-b", 4, 1, 2)})
    assert q["queued"]
    assert run(m, {"op": "release", "group": "nobody-x"})["ok"] is False
    assert reserved(m, "high") == [(node, 0), (node, 1)] and "queued" in m.pending_by_name


def test_opportunistic_groups_go_elsewhere_or_wait() -> None:
    """The reserved cells are allocated at the preemptor's priority (cell e5), so the
    opportunistic scheduler does not see them as free: it goes elsewhere, and waits once
    they are the only free cells left."""
    m, node = preempting_on_half_free_node()
    o = run(m, {"op": "allocate", "group": pspec("o1", "vc-a", -1, 1, 2)})
    assert o["ok"] and (node, 0) not in cells_of(o) and (node, 1) not in cells_of(o)
    # fill every other free cell
    i = 0
    while True:
        i += 1
        r = run(m, {"op": "allocate", "group": pspec(f"fill{i}", "vc-a", -1, 1, 1), "wait": False})
        if not r["ok"]:
            break
        assert cells_of(r)[0][0] != node or cells_of(r)[0][1] in (2, 3)
    assert reserved(m, "high") == [(node, 0), (node, 1)]


def test_a_higher_priority_group_overwrites_the_reservation_and_cancels_the_preemption() -> None:
    """AG e0 with cell e8 (i) (allocate, the filter) and AG e1 with cell e6 (pod_preempt):
    a group of higher priority takes Reserved cells; the first preemption is cancelled
    (AG e5): its other Reserved cells -> Free, its Reserving cells -> Used by the victim
    (Allocated again)."""
    for how in ("allocate", "pod_schedule", "pod_preempt"):
        m, node = preempting_on_half_free_node()
        top = pspec("top", "vc-b", 9, 1, 2)
        w = m.query({"op": "what_if", "group": top})
        assert w["placeable"] and w["victims"] == [] and w["placement"][0]["leaf_cells"] == [0, 1], w
        if how == "allocate":
            r = run(m, {"op": "allocate", "group": top})
            assert r["ok"] and r["preempted"] == [] and cells_of(r) == [(node, 0), (node, 1)]
        else:
            r = schedule(m, "t0", top, op=how)
            if how == "pod_preempt":  # no victims: nothing to preempt; the next filter places it
                assert r["ok"] and not r["preempting"] and "high" in m.preemptors, r
                r = schedule(m, "t0", top)
            assert r["ok"] and r["node"] == node and r["leaf_cells"] == [0, 1], r
        assert {"group": "high", "preemption_cancelled": "further preempted by a higher-priority affinity group "
                                                         "top"} in r["scheduled"]
        assert not m.preemptors and m.group("low").preempted_by is None
        assert m.apply({"op": "inspect", "view": "affinitygroup", "name": "low"})["result"]["status"]["state"] == \
            "Allocated"
        assert m.apply({"op": "vc_status", "vc": "vc-b"})["reserved_leaf_cells"] == 0
        # high's pod may preempt again: now only low (priority 1) is in its way, not top
        again = schedule(m, "h0", pspec("high", "vc-b", 5, 1, 4), op="pod_preempt")
        assert not again["ok"] and again["waiting"], again


def test_cancelling_the_preemption_frees_the_reservation() -> None:
    """AG e7 / cell e7: the Preempting AG's pods all deleted: Reserved -> Free; its
    Reserving cells stay with the victim (cell e4). So does a group-level release. The
    pending queue is retried in the same command (cells were freed): the waiting group
    gets the formerly reserved cells."""
    for how in ("pod_delete", "release"):
        m, node = preempting_on_half_free_node()
        waiting = run(m, {"op": "allocate", "group": pspec("w", "vc-b", 0, 1, 2)})
        assert waiting["queued"]
        if how == "pod_delete":
            r = run(m, {"op": "pod_delete", "pod": {"uid": "h0"}})
            assert r["preemption_cancelled"]
        else:
            r = run(m, {"op": "release", "group": "high"})
            assert r["ok"] and r["cancelled"]
        assert r["scheduled"] == [{"group": "w", "preempted": [], "lazy_preempted": []}]
        assert m.apply({"op": "group_status", "group": "w"})["placement"][0]["leaf_cells"] == [0, 1]
        assert m.apply({"op": "group_status", "group": "w"})["placement"][0]["node"] == node
        assert not m.preemptors and m.group("low").preempted_by is None
        assert check(m) == []


def test_the_preemptor_lands_exactly_on_its_plan_when_its_victims_go() -> None:
    """Cell life cycle Free -> Used -> Reserving -> Reserved -> Used: the victim's cells
    become Reserved when it is deleted, and AG e2 ("all the cells ... are Reserved")
    allocates the plan; a waiting group of lower priority gets none of it."""
    m, node = preempting_on_half_free_node()
    plan = m.apply({"op": "group_status", "group": "high"})["planned_placement"]
    queued = run(m, {"op": "allocate", "group": pspec("queued", "vc-b", 3, 1, 2)})
    assert queued["queued"]
    r = run(m, {"op": "pod_delete", "pod": {"uid": "l0"}})
    assert r["released"] and r["scheduled"][0] == {"group": "high", "preempted": [], "lazy_preempted": [],
                                                    "preemption_completed": True}
    view = m.apply({"op": "group_status", "group": "high"})
    assert [{"node": p["node"], "leaf_cells": p["leaf_cells"]} for p in view["placement"]] == plan
    assert plan == [{"node": node, "leaf_cells": [0, 1, 2, 3]}]
    assert "queued" in m.pending_by_name
    b = schedule(m, "h0", pspec("high", "vc-b", 5, 1, 4))
    assert b["ok"] and (b["node"], b["leaf_cells"]) == (node, [0, 1, 2, 3])


def test_reservation_of_a_cell_an_opportunistic_victim_runs_on() -> None:
    """A guaranteed preemptor whose plan maps onto an opportunistic group's cells:
    those cells are Reserving (their virtual cells bound to the preemptor, HiveD's
    ``allocateLeafCell`` in createPreemptingAffinityGroup), the free ones Reserved. No
    other opportunistic group gets them; when the victim goes the preemptor gets the
    whole node."""
    m = SchedulerStateMachine(load_config(pair_config()))
    run(m, {"op": "allocate", "group": pspec("o-full", "vc1", -1, 1, 4)})
    o = bound(m, "o0", pspec("o-half", "vc1", -1, 1, 2))
    node = o["node"]
    r = schedule(m, "g0", pspec("g", "vc1", 0, 1, 4), op="pod_preempt")
    assert r["ok"] and r["preempting"] and [v["group"] for v in r["victims"]] == ["o-half"], r
    assert r["reserved_leaf_cells"] == 2 and sorted(reserved(m, "g")) == [(node, 2), (node, 3)]
    assert m.apply({"op": "vc_status", "vc": "vc1"})["reserved_leaf_cells"] == 4  # virtual: all four
    plan = m.apply({"op": "group_status", "group": "g"})["planned_placement"]
    assert plan == [{"node": node, "leaf_cells": [2, 3, 0, 1]}]  # free leaves first (fewest opportunistic users)
    r = run(m, {"op": "allocate", "group": pspec("o2", "vc1", -1, 1, 1), "wait": False})
    assert not r["ok"], r  # before: placed on the free half of the preemptor's node
    # snapshot/restore keeps the Reserving bindings exactly
    copy = SchedulerStateMachine.from_snapshot(m.snapshot())
    assert copy.snapshot() == m.snapshot() and check(copy) == []
    for mm in (m, copy):
        r = run(mm, {"op": "pod_delete", "pod": {"uid": "o0"}})
        assert r["scheduled"][0]["preemption_completed"]
        placed = mm.apply({"op": "group_status", "group": "g"})["placement"]
        assert [{"node": p["node"], "leaf_cells": p["leaf_cells"]} for p in placed] == plan
    assert m.digest() == copy.digest()


def test_cancelling_a_reservation_on_an_opportunistic_victim() -> None:
    """Cell e4 for a Reserving cell whose victim is opportunistic: the preemptor's
    virtual cell is released, the victim keeps running on the physical cell."""
    m = SchedulerStateMachine(load_config(pair_config()))
    run(m, {"op": "allocate", "group": pspec("o-full", "vc1", -1, 1, 4)})
    bound(m, "o0", pspec("o-half", "vc1", -1, 1, 2))
    schedule(m, "g0", pspec("g", "vc1", 0, 1, 4), op="pod_preempt")
    before = m.apply({"op": "vc_status", "vc": "vc1"})
    r = run(m, {"op": "pod_delete", "pod": {"uid": "g0"}})
    assert r["preemption_cancelled"]
    after = m.apply({"op": "vc_status", "vc": "vc1"})
    assert before["reserved_leaf_cells"] == 4 and after["reserved_leaf_cells"] == 0
    assert after["cells"][0]["bound_to"] is None and after["cells"][0]["free_leaf_cells"] == 4
    assert m.group("o-half") is not None and m.group("o-half").preempted_by is None


def test_a_running_pod_outranks_a_reservation() -> None:
    """AddAllocatedPod on a Reserved cell: cell e8 (i), "there is currently a Preempting
    AG on this cell but another Allocated AG is now associated with the cell": the
    Preempting AG goes back to Pending (AG e5), its reservation is released."""
    m, node = preempting_on_half_free_node()
    spec = pspec("running", "vc-a", -1, 1, 2)
    info = {"node": node, "leafCellIsolation": [0, 1], "cellChain": "K80-RACK",
            "affinityGroupBindInfo": [{"podPlacements": [
                {"physicalNode": node, "physicalLeafCellIndices": [0, 1], "preassignedCellTypes": ["", ""]}]}]}
    r = run(m, {"op": "add_allocated_pod", "pod": pod("r0"), "spec": {**spec, "leafCellNumber": 2},
                "bind_info": info})
    assert r["ok"] and r["state"] == "Bound" and r["scheduled"][0]["group"] == "high", r
    assert not m.preemptors and m.group("low").preempted_by is None
    # a device a victim (not a reservation) holds is still refused
    info2 = {**info, "leafCellIsolation": [2, 3], "affinityGroupBindInfo": [{"podPlacements": [
        {"physicalNode": node, "physicalLeafCellIndices": [2, 3], "preassignedCellTypes": ["", ""]}]}]}
    r = run(m, {"op": "add_allocated_pod", "pod": pod("r1"), "spec": {**pspec("r2", "vc-a", -1, 1, 2),
                                                                      "leafCellNumber": 2}, "bind_info": info2})
    assert "already used by affinity group low" in r["error"]


def test_snapshot_restore_with_reservations() -> None:
    """Reservations are state: the snapshot carries them (the digest changes when a
    group enters Preempting with free cells), restore rebuilds them exactly and the
    restored machine decides like the original."""
    m, node = preempting_on_half_free_node()
    blob = m.snapshot()
    copy = SchedulerStateMachine.from_snapshot(blob)
    assert copy.snapshot() == blob and check(copy) == []
    assert reserved(copy, "high") == [(node, 0), (node, 1)]
    for mm in (m, copy):
        assert not run(mm, {"op": "allocate", "group": pspec("x", "vc-b", 2, 1, 2), "wait": False})["ok"]
        run(mm, {"op": "pod_delete", "pod": {"uid": "l0"}})
        assert mm.group("high") is not None
    assert m.snapshot() == copy.snapshot()
