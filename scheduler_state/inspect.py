"""HiveD's inspect views of the scheduler state (read-only, JSON-ready).

The shapes and field names are those HiveD's web server returns (``pkg/api/types.go``
in microsoft/hivedscheduler: ``AffinityGroupList``, ``AffinityGroup``,
``ClusterStatus``, ``PhysicalCellStatus``, ``VirtualCellStatus``), so HiveD's users
and tools read Cellar's ``/v1/inspect/...`` the same way. What differs:

- ``state`` of an affinity group is ``Allocated``, ``Pending`` (the group-level queue,
  with ``queuePosition``), or, for pod-level preemption (``pods.py``), ``Preempting``
  (with ``preemptingPods`` and the planned ``physicalPlacement``) and ``BeingPreempted``.
  Pod-tracked groups list ``allocatedPods`` (UIDs). Group-level ``allocate`` still
  preempts atomically.
- ``lazyPreemptionStatus`` has the ``preemptor`` but no ``preemptionTime`` (the
  machine keeps no wall clock).
- Cell states: a leaf cell is ``Free``, ``Used``, or, for a Preempting group's plan
  (``state-machine.md``), ``Reserved`` (reserved for it) or ``Reserving`` (a victim
  still holds it); an inner cell is ``Used`` when some leaf below it is not free
  (reserved ones included), else ``Free``. An inner cell's priority is the highest of
  its leaves', ``-2`` (HiveD's free priority) when free; a reserved leaf has its
  Preempting group's priority. A cell is ``Bad`` when any leaf below it is on a bad
  node.

Every function is pure: the same state gives the same bytes (lists in config or
allocation order, dict keys sorted by the encoder).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scheduler_state.cells import FREE_PRIORITY, PCell, VCell

if TYPE_CHECKING:
    from scheduler_state.machine import Group, Pending, SchedulerStateMachine

INSPECT_VIEWS = ("affinitygroups", "affinitygroup", "clusterstatus", "physicalcluster", "virtualclusters",
                 "virtualcluster")


def affinity_group(g: Group) -> dict[str, Any]:
    physical: dict[str, list[int]] = {}
    virtual: dict[str, list[str]] = {}
    for pod in g.pods:
        vleaves = pod.vleaves if pod.vleaves is not None else [None] * len(pod.pleaves)
        for p, v in zip(pod.pleaves, vleaves):
            if p is None:
                continue
            physical.setdefault(p.node, []).append(p.leaf_index)  # type: ignore[arg-type]
            if v is not None:
                virtual.setdefault(v.root.addr, []).append(v.addr)
    status: dict[str, Any] = {"vc": g.req.vc, "priority": g.priority,
                              "state": "BeingPreempted" if g.preempted_by is not None else "Allocated"}
    if physical:
        status["physicalPlacement"] = {node: sorted(idx) for node, idx in physical.items()}
    if virtual:
        status["virtualPlacement"] = {root: sorted(addrs) for root, addrs in virtual.items()}
    if g.slots is not None and any(r is not None for r in g.slots):
        status["allocatedPods"] = [r.uid for r in g.slots if r is not None]
    if g.lazy_by is not None:
        status["lazyPreemptionStatus"] = {"preemptor": g.lazy_by}
    return {"metadata": {"name": g.name}, "status": status}


def preempting_group(p: Any) -> dict[str, Any]:
    """A group in HiveD's Preempting state (``pods.Preemptor``)."""
    physical: dict[str, list[int]] = {}
    for row in p.plan:
        for node, idx in row:
            physical.setdefault(node, []).append(idx)
    status: dict[str, Any] = {"vc": p.req.vc, "priority": p.req.priority, "state": "Preempting"}
    if physical:
        status["physicalPlacement"] = {node: sorted(idx) for node, idx in physical.items()}
    status["preemptingPods"] = [r.uid for r in p.pods]
    return {"metadata": {"name": p.name}, "status": status}


def pending_group(e: Pending, position: int) -> dict[str, Any]:
    return {"metadata": {"name": e.req.name},
            "status": {"vc": e.req.vc, "priority": e.req.priority, "state": "Pending", "queuePosition": position}}


def affinity_groups(m: SchedulerStateMachine) -> dict[str, Any]:
    items = [affinity_group(g) for g in sorted(m.groups.values(), key=lambda g: g.seq)]
    items += [preempting_group(p) for p in sorted(m.preemptors.values(), key=lambda p: p.seq)]
    items += [pending_group(e, i) for i, e in enumerate(m.pending)]
    return {"items": items}


def reservation_states(m: SchedulerStateMachine) -> dict[Any, str]:
    """Leaf cells (physical and virtual) of Preempting groups' plans -> ``Reserved`` or
    ``Reserving`` (HiveD's cell states; empty without Preempting groups)."""
    out: dict[Any, str] = {}
    cl = m.cluster
    for pre in m.preemptors.values():
        for pod, vrow, prow in zip(pre.hold.pods, pre.vplan, pre.plan):
            for j, v in enumerate(vrow):
                state = "Reserved" if pod.pleaves[j] is not None else "Reserving"
                out[v] = state
                out[cl.leaf_by_device[prow[j]]] = state
    return out


def _pcell_base(p: PCell, marks: dict[Any, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "leafCellType": p.chain.info.leaf_type,
        "cellType": p.ctype,
        "cellAddress": p.addr,
        "cellState": (marks.get(p) if marks else None) or ("Used" if p.used else "Free"),
        "cellHealthiness": "Bad" if p.bad else "Healthy",  # HiveD: bad if ANY leaf below is bad
        "cellPriority": _pprio(p),
    }
    if p.nodeish:
        out["isNodeLevel"] = True
    return out


def _pprio(p: PCell) -> int:
    if not p.used:
        return FREE_PRIORITY
    if p.level == 1:
        return p.prio
    return max(_pprio(c) for c in p.children)


def _vcell_base(v: VCell, marks: dict[Any, str] | None = None) -> dict[str, Any]:
    used = v.free < v.leaves
    p = v.pcell
    out: dict[str, Any] = {
        "leafCellType": v.scope.chain.info.leaf_type,
        "cellType": v.ctype,
        "cellAddress": v.addr,
        "cellState": (marks.get(v) if marks else None) or ("Used" if used else "Free"),
        # HiveD: a virtual cell bound to a bad physical cell (doomed bad included) is bad
        "cellHealthiness": "Bad" if p is not None and p.bad else "Healthy",
        "cellPriority": _vprio(v) if used else FREE_PRIORITY,
    }
    if v.nodeish and v.level == v.scope.chain.info.node_level:
        out["isNodeLevel"] = True
    return out


def _vprio(v: VCell) -> int:
    if v.level == 1:
        return v.prio
    return max(_vprio(c) for c in v.children)


def physical_cell(p: PCell, marks: dict[Any, str] | None = None) -> dict[str, Any]:
    out = _pcell_base(p, marks)
    if p.children:
        out["cellChildren"] = [physical_cell(c, marks) for c in p.children]
    v = p.vcell
    if v is not None:
        out["vc"] = v.vc
        out["virtualCell"] = _vcell_base(v, marks)
    return out


def virtual_cell(v: VCell, marks: dict[Any, str] | None = None) -> dict[str, Any]:
    out = _vcell_base(v, marks)
    if v.children:
        out["cellChildren"] = [virtual_cell(c, marks) for c in v.children]
    p = v.pcell
    if p is not None:
        out["physicalCell"] = _pcell_base(p, marks)
    return out


def physical_cluster(m: SchedulerStateMachine) -> list[dict[str, Any]]:
    marks = reservation_states(m)
    return [physical_cell(top, marks) for chain in m.cluster.chains.values() for top in chain.tops]


def virtual_cluster(m: SchedulerStateMachine, vc: str) -> list[dict[str, Any]]:
    marks = reservation_states(m)
    return [virtual_cell(r, marks) for scope in m.cluster.scopes_of(vc) for r in scope.roots]


def virtual_clusters(m: SchedulerStateMachine) -> dict[str, list[dict[str, Any]]]:
    return {vc: virtual_cluster(m, vc) for vc in sorted(m.cluster.vc_scopes)}


def cluster_status(m: SchedulerStateMachine) -> dict[str, Any]:
    return {"physicalCluster": physical_cluster(m), "virtualClusters": virtual_clusters(m)}
