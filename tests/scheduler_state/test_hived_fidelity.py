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
