"""scheduler_state.placement: nearest leaf cells, packing, and buddy allocation at the
lowest free level, on an inline two-rack cluster of 8-GPU nodes."""

from __future__ import annotations

from scheduler_state import SchedulerStateMachine, load_config
from tests.scheduler_state.helpers import allocate, apply_ok, nodes_of

CONFIG = """
physicalCluster:
  skuTypes: {GPU: {gpu: 1}}
  cellTypes:
    GPU-2: {childCellType: GPU, childCellNumber: 2}
    GPU-4: {childCellType: GPU-2, childCellNumber: 2}
    NODE: {childCellType: GPU-4, childCellNumber: 2, isNodeLevel: true}
    RACK: {childCellType: NODE, childCellNumber: 4}
  physicalCells:
  - cellType: RACK
    cellChildren: [{cellAddress: a0}, {cellAddress: a1}, {cellAddress: a2}, {cellAddress: a3}]
  - cellType: RACK
    cellChildren: [{cellAddress: b0}, {cellAddress: b1}, {cellAddress: b2}, {cellAddress: b3}]
virtualClusters:
  racks: {virtualCells: [{cellType: RACK, cellNumber: 1}]}
  nodes: {virtualCells: [{cellType: RACK.NODE, cellNumber: 3}]}
"""


def fresh() -> SchedulerStateMachine:
    return SchedulerStateMachine(load_config(CONFIG))


def leaves(result: dict) -> list[int]:
    return sorted(i for p in result["placement"] for i in p["leaf_cells"])


def test_pod_takes_the_lowest_cell_that_holds_it() -> None:
    m = fresh()
    three = allocate(m, "three", "racks", 0, 1, 3)
    assert leaves(three) == [0, 1, 2]  # one GPU-4 cell
    pair = allocate(m, "pair", "racks", 0, 2, 2)
    assert set(nodes_of(pair)) == set(nodes_of(three)) and leaves(pair) == [4, 5, 6, 7]  # the other GPU-4
    one = allocate(m, "one", "racks", 0, 1, 1)
    assert nodes_of(one) == nodes_of(three) and leaves(one) == [3]  # packs the node


def test_gang_stays_in_the_lowest_common_cell() -> None:
    m = fresh()
    small = allocate(m, "small", "racks", 0, 1, 2)
    gang = allocate(m, "gang", "racks", 0, 3, 8)
    assert len(set(nodes_of(gang))) == 3 and nodes_of(small)[0] not in nodes_of(gang)
    assert {n[0] for n in nodes_of(gang) + nodes_of(small)} == {nodes_of(small)[0][0]}  # one rack


def test_buddy_allocation_splits_only_when_needed() -> None:
    m = fresh()
    racks = allocate(m, "r", "racks", 0, 1, 1)  # binds the racks VC's rack: a whole physical rack
    rack_of_r = nodes_of(racks)[0][0]
    first = allocate(m, "n1", "nodes", 0, 1, 8)
    second = allocate(m, "n2", "nodes", 0, 1, 8)
    # The nodes VC's cells come from the other rack, split once: buddies of one rack.
    assert {nodes_of(first)[0][0], nodes_of(second)[0][0]} == {"b" if rack_of_r == "a" else "a"}
    free = m.apply({"op": "cluster_status"})["chains"]["RACK"]["free_cells"]
    assert free == {"RACK": 0, "NODE": 2, "GPU-4": 0, "GPU-2": 0, "GPU": 0}
    apply_ok(m, {"op": "release", "group": "n1"})
    apply_ok(m, {"op": "release", "group": "n2"})
    free = m.apply({"op": "cluster_status"})["chains"]["RACK"]["free_cells"]
    assert free["RACK"] == 1 and free["NODE"] == 0  # merged back


def test_quota_owner_preempts_opportunistic_groups_anywhere() -> None:
    m = fresh()
    opp = allocate(m, "opp", "nodes", -1, 8, 8)  # the whole cluster
    assert opp["ok"] and len(set(nodes_of(opp))) == 8
    owner = allocate(m, "owner", "racks", 0, 4, 8)
    assert owner["ok"] and owner["preempted"] == ["opp"]
