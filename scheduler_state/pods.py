"""Pods, not only groups: HiveD's pod-level scheduling as commands of the machine.

Kubernetes schedules one pod at a time. HiveD answers each pod of an affinity group G
from G's state (``hived_algorithm.go``: ``Schedule``, ``AddAllocatedPod``,
``DeleteAllocatedPod``, ``DeleteUnallocatedPod``); these commands do the same inside
the replicated log. Every pod is named by its Kubernetes identity ``{"uid", "namespace",
"name"}`` and carries HiveD's pod scheduling spec (``spec``: a mapping or the
``hivedscheduler.microsoft.com/pod-scheduling-spec`` annotation's YAML text) with the
pod's own ``leafCellNumber``. When ``affinityGroup`` is null the group is the pod alone,
named ``namespace/name`` (HiveD's v1 defaulting).

Commands (results are dicts with ``ok``; a malformed command changes nothing):

- ``pod_schedule`` (the extender's *filter* phase): ``{"pod", "spec", "suggestedNodes"?}``.
  * G is allocated: the pod takes the first free slot of G's placement with its
    leafCellNumber (HiveD keeps the placement decided for the group); ``state:
    "Binding"``, ``node``, ``leaf_cells``, ``bind_info`` (HiveD's ``PodBindInfo``) and
    ``annotations`` (``pod-bind-info`` YAML, ``pod-leaf-cell-isolation`` "0,1,...").
  * G is new: the whole group is placed now (the same search as ``allocate``), this
    pod takes its first slot, the other slots stay reserved for G's later pods
    (``group_placed: true``). If the placement needs victims nothing changes: ``ok:
    false, waiting: true`` with ``victims`` (groups and their pods) -- HiveD creates
    no preemption in the filter phase. If nothing fits: ``waiting`` with ``reason``.
  * G is Preempting: the pod joins G's preempting pods; ``waiting`` with the victims
    still to go.
  * The pod is already Binding: the same answer again (idempotent, HiveD "insists on
    the previous bind result"); already Bound: an error.
- ``pod_preempt`` (the extender's *preempt* phase), same fields. For a new group whose
  placement needs victims, G enters HiveD's **Preempting** state: the placement (its
  physical and virtual leaf cells) and the victims are recorded, each victim group is
  **Being preempted** (whole group: all its pods are named; its planned cells are
  HiveD's *Reserving* cells) and **the free cells of the plan are reserved for G**
  (HiveD's *Reserved* cells, ``state-machine.md`` cell e5; ``reserved_leaf_cells``).
  Lazy-preemptible groups on its virtual cells are demoted now (``lazy_preempted``).
  Victims with no live pod (groups allocated at group level, or whose pods are all
  gone) leave at once. A Preempting group of lower priority whose cells (reserved or
  its victims') the placement overwrites is cancelled (HiveD: "further preempted by a
  higher-priority affinity group"); one of equal or higher priority makes this pod
  wait. For a Preempting G whose recorded placement now touches a bad node or (when G
  does not ignore K8s suggested nodes) a node outside ``suggestedNodes``, the
  preemption is cancelled and G is planned afresh. Placeable without victims:
  ``preempting: false`` and nothing changes (the next filter places it).
- ``pod_bind``: ``{"pod", "node", "leaf_cells"?}``: a Binding pod becomes Bound; the
  node (and leaf cells, when given) must be those of its slot ("Pod binding node
  mismatch: expected X, received Y"). Binding again to the same node is answered
  again (idempotent).
- ``pod_delete``: ``{"pod"}``: a Binding/Bound pod frees its slot; when G has no pod
  left G is deleted and its cells freed (HiveD's ``allPodsReleased``: cells stay with
  the group until its last pod is gone). A Preempting pod leaves G's preempting pods;
  the last one cancels G's preemption (its reserved cells are free again, its victims
  plain Allocated again; the pending queue is retried when cells were freed).
- ``add_allocated_pod``: ``{"pod", "spec", "bind_info"}`` (HiveD's AddAllocatedPod,
  used for recovery and for reconfiguration from running pods): ``bind_info`` is
  HiveD's ``PodBindInfo`` (mapping or the ``pod-bind-info`` YAML). If G exists the pod
  takes the slot whose devices equal its node and leaf cells; otherwise G is created
  from ``affinityGroupBindInfo`` (every pod's devices, preassigned cell types), like
  work-preserving reconfiguration: devices no longer in the config are ignored, a
  guaranteed group that no longer fits its VC is lazily preempted. Devices already used
  by another group are refused; devices reserved for a Preempting group are taken and
  that preemption is cancelled (a running pod outranks a reservation: HiveD's cell
  e8 (i)).

**Reservations** (HiveD's ``state-machine.md``; ``Preemptor.hold``). The cells of a
Preempting group P's plan are never given to a group of P's priority or lower: its
free cells are *used* by P's reservation at P's priority (a group outside
``groups``, so counts, free lists, indexes and VC quota all see them taken, for
``allocate``, pod-level scheduling, opportunistic groups, the pending queue and
``what_if`` alike), and its victims' cells are protected while they run. When a victim
leaves, its planned cells become reserved for P (Reserving -> Reserved). Only a group
of strictly higher priority may take them -- by ``allocate``, the filter or the
preempt phase, with or without victims of its own -- and that cancels P (HiveD's AG
e5): its reserved cells are free again, its victims plain Allocated again. P is also
cancelled when its pods are all deleted, by a group-level ``release``, when its plan
leaves the suggested or healthy nodes (preempt phase), by ``reconfigure`` and by
``add_allocated_pod`` on a reserved device.

When the last victim of a Preempting group is gone (its pods deleted, or released,
expired...), the preemptor is placed **in the same command**, exactly on its plan (all
reserved for it by then), before the pending queue is retried; its pods then take their
slots at their next ``pod_schedule``.

Read-only: ``pod_status`` (``{"pod": {"uid"}}``), ``list_pods``.

Determinism: pods live in the groups' slots (lists) and the preemptors (ordered by
sequence number); the UID index is a lookup table only, never iterated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from scheduler_state import health as _health
from scheduler_state.cells import OPPORTUNISTIC_PRIORITY, PCell, Touched, VCell
from scheduler_state.machine import CommandError, Group, NotFound, Pod, _str
from scheduler_state.requests import NAME_BYTES_MAX, Request, RequestError, parse_request, request_from_record

if TYPE_CHECKING:
    from scheduler_state.machine import SchedulerStateMachine

BINDING, BOUND, PREEMPTING = "Binding", "Bound", "Preempting"
ANNOTATION_SPEC = "hivedscheduler.microsoft.com/pod-scheduling-spec"
ANNOTATION_BIND_INFO = "hivedscheduler.microsoft.com/pod-bind-info"
ANNOTATION_ISOLATION = "hivedscheduler.microsoft.com/pod-leaf-cell-isolation"
LEAVES_MAX = 100_000


class PodRef:
    """One Kubernetes pod the scheduler tracks: in a group's slot (Binding, Bound) or
    among a Preempting group's pods (``slot`` -1)."""

    __slots__ = ("uid", "namespace", "name", "group", "slot", "state")

    def __init__(self, uid: str, namespace: str, name: str, group: str, slot: int, state: str) -> None:
        self.uid = uid
        self.namespace = namespace
        self.name = name
        self.group = group
        self.slot = slot
        self.state = state

    def key(self) -> str:
        """HiveD's pod key in messages: ``uid(namespace/name)``."""
        return f"{self.uid}({self.namespace}/{self.name})"


class Preemptor:
    """An affinity group in HiveD's Preempting state: its planned placement, the groups
    (Being preempted) it waits for, and the cells of its plan reserved for it."""

    __slots__ = ("name", "seq", "req", "victims", "pods", "plan", "vplan", "hold")

    def __init__(self, name: str, seq: int, req: Request, victims: list[str], plan: list[list[tuple[str, int]]],
                 vplan: list[list[VCell]], hold: Group) -> None:
        self.name = name
        self.seq = seq
        self.req = req
        self.victims = victims  # group names, in allocation order
        self.pods: list[PodRef] = []
        self.plan = plan  # (node, leaf index) per pod, as planned at preemption time
        self.vplan = vplan  # the virtual leaf planned for each of those devices
        # The reservation: a group (not in ``groups``) that uses the planned cells no
        # victim holds, at this group's priority. Per device, both leaves (HiveD's
        # Reserved cell), the virtual leaf only (Reserving: an opportunistic victim
        # runs on the physical leaf) or neither (Reserving: a victim of its VC holds
        # both); a victim's cells become Reserved when it leaves (``reserve_free``).
        self.hold = hold

    def reserved_leaves(self) -> int:
        """Physical leaf cells reserved (HiveD's Reserved cells)."""
        return sum(1 for pod in self.hold.pods for p in pod.pleaves if p is not None)


# -- input ------------------------------------------------------------------------------


def _ident(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise CommandError(f"{what} must be a non-empty string")
    if len(v) > NAME_BYTES_MAX // 4 and len(v.encode()) > NAME_BYTES_MAX:  # (4 bytes a character at most)
        raise CommandError(f"{what} is longer than {NAME_BYTES_MAX} bytes")
    return v


def pod_identity(cmd: dict[str, Any], full: bool) -> tuple[str, str | None, str | None]:
    """``(uid, namespace, name)`` of ``cmd["pod"]``; with ``full`` the name is required
    and the namespace defaults to ``default``."""
    pod = cmd.get("pod")
    if not isinstance(pod, dict):
        raise CommandError("pod must be a mapping with uid, namespace and name")
    uid = _ident(pod.get("uid"), "pod.uid")
    name = pod.get("name")
    namespace = pod.get("namespace")
    if full or name is not None:
        name = _ident(name, "pod.name")
    if full and namespace is None:
        namespace = "default"
    if namespace is not None:
        namespace = _ident(namespace, "pod.namespace")
    return uid, namespace, name


def parse_pod_spec(spec: Any, namespace: str, name: str, suggested: Any = None) -> tuple[Request, int]:
    """HiveD's pod scheduling spec of one pod: its group's request and the pod's
    leafCellNumber (required, as HiveD's v1 validation requires it)."""
    if isinstance(spec, str):
        try:
            spec = yaml.safe_load(spec)
        except yaml.YAMLError as exc:
            raise RequestError(f"malformed YAML in pod scheduling spec: {' '.join(str(exc).split())}") from None
    if not isinstance(spec, dict):
        raise RequestError("spec must be a mapping (HiveD's pod scheduling spec)")
    k = spec.get("leafCellNumber")
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise RequestError(f"leafCellNumber must be a positive integer (the pod's leaf cells), got {k!r}")
    if spec.get("affinityGroup") is None and not spec.get("name"):
        spec = dict(spec)
        spec["name"] = f"{namespace}/{name}"  # HiveD: a pod without a group is its own group
    return parse_request(spec, suggested), k


def _spec_fields(r: Request) -> tuple[Any, ...]:
    """What ``Request.spec()`` is made of: two specs are equal exactly when these are."""
    return (r.vc, r.priority, r.name, r.members, r.lazy_preemption, r.gang_release, r.ignore_suggested,
            r.pinned_id, r.leaf_type)


def _same_spec(have: Request, req: Request) -> None:
    if _spec_fields(have) != _spec_fields(req):
        raise CommandError(f"pod scheduling spec differs from that of its affinity group {have.name} "
                           f"(vc {have.vc}, priority {have.priority}, members "
                           f"{[list(m) for m in have.members]})")


def _leaf_list(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not v or len(v) > LEAVES_MAX or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v):
        raise CommandError(f"{what} must be a non-empty list of leaf cell indices (integers >= 0)")
    return v


def parse_bind_info(raw: Any) -> dict[str, Any]:
    """HiveD's ``PodBindInfo`` (mapping or the pod-bind-info YAML), validated."""
    if isinstance(raw, str):
        try:
            raw = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise CommandError(f"bind_info: malformed YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise CommandError("bind_info must be HiveD's PodBindInfo (node, leafCellIsolation, cellChain, "
                           "affinityGroupBindInfo)")
    node = _ident(raw.get("node"), "bind_info.node")
    leaves = _leaf_list(raw.get("leafCellIsolation"), "bind_info.leafCellIsolation")
    chain = raw.get("cellChain")
    if chain is not None and not isinstance(chain, str):
        raise CommandError("bind_info.cellChain must be a string")
    members = raw.get("affinityGroupBindInfo")
    if not isinstance(members, list) or not members:
        raise CommandError("bind_info.affinityGroupBindInfo must be a non-empty list of {podPlacements}")
    placements: list[tuple[str, list[int], list[str | None]]] = []
    for i, m in enumerate(members):
        if not isinstance(m, dict) or not isinstance(m.get("podPlacements"), list) or not m["podPlacements"]:
            raise CommandError(f"bind_info.affinityGroupBindInfo[{i}].podPlacements must be a non-empty list")
        for j, pp in enumerate(m["podPlacements"]):
            where = f"bind_info.affinityGroupBindInfo[{i}].podPlacements[{j}]"
            if not isinstance(pp, dict):
                raise CommandError(f"{where} must be a mapping")
            pnode = _ident(pp.get("physicalNode"), f"{where}.physicalNode")
            idx = _leaf_list(pp.get("physicalLeafCellIndices"), f"{where}.physicalLeafCellIndices")
            types = pp.get("preassignedCellTypes")
            if types is None:
                types = [None] * len(idx)
            if not isinstance(types, list) or len(types) != len(idx) or not all(
                    t is None or isinstance(t, str) for t in types):
                raise CommandError(f"{where}.preassignedCellTypes must list one cell type per leaf cell")
            placements.append((pnode, idx, [t or None for t in types]))
    return {"node": node, "leaves": leaves, "chain": chain, "placements": placements}


# -- views --------------------------------------------------------------------------------


def bind_info(g: Group, slot: int) -> dict[str, Any]:
    """HiveD's ``PodBindInfo`` for the pod in ``slot`` of ``g``: its node and leaf cells,
    the chain, and every pod's placement grouped by leafCellNumber (ascending, as HiveD
    orders them), with the preassigned cell types used to find virtual cells again."""
    by_k: dict[int, list[dict[str, Any]]] = {}
    for p in g.pods:
        devices = p.devices
        by_k.setdefault(p.k, []).append({
            "physicalNode": devices[0][0] if devices else "",
            "physicalLeafCellIndices": [d[1] for d in devices],
            "preassignedCellTypes": [d[2] or "" for d in devices],
        })
    node, leaves = slot_devices(g, slot)
    return {
        "node": node,
        "leafCellIsolation": leaves,
        "cellChain": g.chain,
        "affinityGroupBindInfo": [{"podPlacements": by_k[k]} for k in sorted(by_k)],
    }


def slot_devices(g: Group, slot: int) -> tuple[str, list[int]]:
    """The node and leaf cell indices of the pod in ``slot`` (``bind_info``'s ``node``
    and ``leafCellIsolation``)."""
    devices = g.pods[slot].devices
    return (devices[0][0] if devices else ""), [d[1] for d in devices]


def annotations(info: dict[str, Any], g: Group | None = None) -> dict[str, str]:
    """The annotations HiveD writes when it binds a pod (``NewBindingPod``); ``g``:
    the group ``info`` is the bind info of (``bind_info(g, slot)``), if any."""
    return {
        ANNOTATION_BIND_INFO: bind_info_yaml(info, g),
        ANNOTATION_ISOLATION: ",".join(map(str, info["leafCellIsolation"])),
    }


def bind_info_yaml(info: dict[str, Any], g: Group | None = None) -> str:
    """``yaml.safe_dump(info, sort_keys=False, default_flow_style=False)`` of a
    ``bind_info`` result, the very same text: written line by line when every string in
    it has a context-free YAML form (``_yaml_str``), which is the rule (node names, cell
    types), else by PyYAML. PyYAML's emitter costs about a millisecond for one gang's
    bind info, and every pod_schedule and pod_bind answer carries one.

    With ``g`` (``info`` is ``bind_info(g, slot)``), the text of the group's part,
    ``affinityGroupBindInfo``, the same for each of its pods, is kept on the group
    (``Group.bind_yaml``): it is made of the group's pods' devices and leaf cell numbers,
    fixed from the group's placement until it is deleted (a restore or a
    reconfiguration builds new groups); the invariant checker compares it with a
    fresh one."""
    head = _bind_info_head(info)
    if head is not None:
        tail = g.bind_yaml if g is not None else None
        if tail is None:
            tail = _members_lines(info["affinityGroupBindInfo"])
            if g is not None:
                g.bind_yaml = tail
        if tail is not None:
            return head + tail
    return yaml.safe_dump(info, sort_keys=False, default_flow_style=False)


def _bind_info_lines(info: dict[str, Any]) -> str | None:
    """PyYAML's block style for ``bind_info``'s shape: a top mapping, sequences inside
    a mapping not indented, mappings inside a sequence item indented by two."""
    head = _bind_info_head(info)
    tail = _members_lines(info["affinityGroupBindInfo"])
    return head + tail if head is not None and tail is not None else None


def _bind_info_head(info: dict[str, Any]) -> str | None:
    node = _yaml_str(info["node"])
    chain = _yaml_str(info["cellChain"])
    leaves = info["leafCellIsolation"]
    if node is None or chain is None or not leaves:
        return None
    out = ["node: ", node, "\nleafCellIsolation:\n"]
    if not _ints(out, "- ", leaves):
        return None
    out += ["cellChain: ", chain, "\naffinityGroupBindInfo:\n"]
    return "".join(out)


def _members_lines(members: list[dict[str, Any]]) -> str | None:
    """``affinityGroupBindInfo``'s items (``_bind_info_lines``)."""
    if not members:
        return None
    out: list[str] = []
    for m in members:
        placements = m["podPlacements"]
        if not placements:
            return None
        out.append("- podPlacements:\n")
        for pp in placements:
            pnode = _yaml_str(pp["physicalNode"])
            idx = pp["physicalLeafCellIndices"]
            types = pp["preassignedCellTypes"]
            if pnode is None or not idx or not types:
                return None
            out += ["  - physicalNode: ", pnode, "\n    physicalLeafCellIndices:\n"]
            if not _ints(out, "    - ", idx):
                return None
            out.append("    preassignedCellTypes:\n")
            for t in types:
                y = _yaml_str(t)
                if y is None:
                    return None
                out += ["    - ", y, "\n"]
    return "".join(out)


def _ints(out: list[str], prefix: str, values: list[Any]) -> bool:
    for i in values:
        if type(i) is not int:
            return False
    out.append("".join([f"{prefix}{i}\n" for i in values]))  # PyYAML writes an int as str(int), plain
    return True


_YAML_STR: dict[Any, str | None] = {}  # a pure function's memo (not state): string -> _yaml_str
_YAML_STR_MAX = 4096


def _yaml_str(s: Any) -> str | None:
    """How PyYAML writes the string ``s`` as a block sequence item or mapping value,
    when that is the same wherever it stands: one line without spaces (PyYAML breaks
    long lines only at spaces) and not double-quoted (which may break anywhere past the
    80th column). None otherwise (or for a non-string): the caller falls back to PyYAML."""
    try:
        return _YAML_STR[s]
    except (KeyError, TypeError):
        pass
    out = None
    if type(s) is str:
        text = yaml.safe_dump([s], default_flow_style=False)
        if text.startswith("- ") and text.endswith("\n") and text.count("\n") == 1:
            out = text[2:-1]
            if not out or " " in out or out[0] == '"':
                out = None
        if len(_YAML_STR) >= _YAML_STR_MAX:
            _YAML_STR.clear()
        _YAML_STR[s] = out
    return out


def pod_view(m: SchedulerStateMachine, ref: PodRef) -> dict[str, Any]:
    out: dict[str, Any] = {"pod": ref.uid, "namespace": ref.namespace, "name": ref.name, "group": ref.group,
                           "state": ref.state}
    if ref.state == PREEMPTING:
        p = m.preemptors[ref.group]
        out["victims"] = victims_view(m, p.victims)
        return out
    g = m.groups[ref.group]
    info = bind_info(g, ref.slot)
    out.update(slot=ref.slot, node=info["node"], leaf_cells=info["leafCellIsolation"], bind_info=info,
               annotations=annotations(info, g))
    return out


def victims_view(m: SchedulerStateMachine, names: list[str]) -> list[dict[str, Any]]:
    """The victim groups still present, each with all its live pods (HiveD names every
    pod of a victim group) and the nodes it holds."""
    out = []
    for n in names:
        g = m.groups.get(n)
        if g is None:
            continue
        pods = []
        if g.slots is not None:
            for i, ref in enumerate(g.slots):
                if ref is not None:
                    pods.append({"uid": ref.uid, "namespace": ref.namespace, "name": ref.name,
                                 "node": g.pods[i].devices[0][0]})
        nodes = sorted({node for pod in g.pods if not pod.released for node, _, _ in pod.devices})
        out.append({"group": n, "vc": g.req.vc, "priority": g.priority, "pods": pods, "nodes": nodes})
    return out


def _is_victim(m: SchedulerStateMachine, p: Preemptor, name: str) -> bool:
    g = m.groups.get(name)
    return g is not None and g.preempted_by == p.name


def _live(g: Group) -> bool:
    return g.slots is not None and any(r is not None for r in g.slots)


def _free_slot(g: Group, k: int) -> int:
    slots = g.slots or [None] * len(g.pods)
    for i, pod in enumerate(g.pods):
        if pod.k == k and slots[i] is None and not pod.released:
            return i
    total = sum(1 for pod in g.pods if pod.k == k)
    if total == 0:
        raise CommandError(f"affinity group {g.name} has no pod of {k} leaf cells")
    raise CommandError(f"Requesting more pods than the configured number for {k} leaf cells ({total} pods) "
                       f"in affinity group {g.name}")


def _take_slot(m: SchedulerStateMachine, g: Group, slot: int, uid: str, namespace: str, name: str,
               state: str) -> PodRef:
    if g.slots is None:
        g.slots = [None] * len(g.pods)
    ref = PodRef(uid, namespace, name, g.name, slot, state)
    g.slots[slot] = ref
    m.pod_refs[uid] = ref
    return ref


# -- preemption bookkeeping ---------------------------------------------------------------


def reserve(m: SchedulerStateMachine, req: Request, seq: int, victims: list[Group], vplace: list[list[VCell]],
            pplace: list[list[PCell]], t: Touched) -> Preemptor:
    """``req`` enters HiveD's Preempting state (AG e1) on this placement: its victims
    are Being preempted (cell e2: their cells Reserving), the free cells of the plan
    are reserved for it (cell e5: Free -> Reserved)."""
    hold = Group(req, seq, vplace[0][0].scope.chain.info.name)
    p = Preemptor(req.name, seq, req, [g.name for g in victims],
                  [[(c.node, c.leaf_index) for c in row] for row in pplace],  # type: ignore[misc]
                  [list(row) for row in vplace], hold)
    hold.reserving = p
    for k, vrow, prow in zip(req.pods, vplace, pplace):
        n = len(vrow)
        hold.pods.append(Pod(k, [(c.node, c.leaf_index, v.root.ctype) for v, c in zip(vrow, prow)],  # type: ignore[misc]
                             [None] * n, [None] * n))
    m.preemptors[p.name] = p
    for g in victims:
        g.preempted_by = p.name
    reserve_free(m, p, t)
    return p


def reserve_free(m: SchedulerStateMachine, p: Preemptor, t: Touched) -> None:
    """Reserve for ``p`` every cell of its plan that no victim holds now: at
    preemption time its free cells (cell e5), later the cells a victim leaves
    (Reserving -> Reserved). A virtual leaf is reserved once no victim uses it, its
    physical leaf once no victim runs on it."""
    cl = m.cluster
    prio = p.req.priority
    for pod, vrow, prow in zip(p.hold.pods, p.vplan, p.plan):
        for j, v in enumerate(vrow):
            if pod.pleaves[j] is not None:
                continue
            c = cl.leaf_by_device[prow[j]]
            if pod.vleaves[j] is None:
                if v.user is not None:
                    continue  # a victim of its VC holds both leaves
                if c.user is not None:  # an opportunistic victim runs there
                    cl.use_virtual(p.hold, v, c, prio, t)
                    pod.vleaves[j] = v
                    continue
                cl.bind(v, c)
                cl.use_leaf(p.hold, c, prio, v, t)
                pod.vleaves[j] = v
                pod.pleaves[j] = c
            elif c.user is None:
                cl.use_leaf(p.hold, c, prio, None, t)
                pod.pleaves[j] = c


def _release_hold(m: SchedulerStateMachine, p: Preemptor, t: Touched) -> None:
    """Give back every cell reserved for ``p`` (cell e7: Reserved -> Free; a
    Reserving cell's physical leaf stays with its victim, cell e4)."""
    cl = m.cluster
    for pod in p.hold.pods:
        for j, v in enumerate(pod.vleaves):
            c = pod.pleaves[j]
            if c is not None:
                cl.unuse_leaf(c, v, t)
            elif v is not None:
                cl.unuse_virtual(v, t)
            pod.pleaves[j] = None
            pod.vleaves[j] = None


def cancel_preemption(m: SchedulerStateMachine, p: Preemptor, t: Touched | None = None) -> None:
    """Preempting -> gone: its pods wait again; its reserved cells are free again and
    its victims plain Allocated again (HiveD's AG e5/e7, cell e4/e7)."""
    own = t is None
    tt = Touched() if t is None else t
    _release_hold(m, p, tt)
    if own:
        m.cluster.reindex(tt)
    del m.preemptors[p.name]
    for ref in p.pods:
        m.pod_refs.pop(ref.uid, None)
    for v in p.victims:
        g = m.groups.get(v)
        if g is not None and g.preempted_by == p.name:
            g.preempted_by = None


def cancelled_entries(names: list[str], by: str) -> list[dict[str, Any]]:
    """``scheduled`` entries for the Preempting groups a committed placement of ``by``
    cancelled (HiveD's message)."""
    return [{"group": name, "preemption_cancelled": f"further preempted by a higher-priority affinity group {by}"}
            for name in names]


def complete_preemptions(m: SchedulerStateMachine) -> list[dict[str, Any]]:
    """Place every Preempting group whose victims are all gone (HiveD's AG e2, cell
    e8 (ii)) exactly on its plan, which is then all reserved for it, in preemption
    order. Entries join ``scheduled``."""
    out: list[dict[str, Any]] = []
    for p in sorted(m.preemptors.values(), key=lambda p: p.seq):
        if any(_is_victim(m, p, v) for v in p.victims):
            continue
        hold = p.hold
        if all(c is not None for pod in hold.pods for c in pod.pleaves):
            del m.preemptors[p.name]
            for ref in p.pods:  # its pods take their slots at their next pod_schedule
                m.pod_refs.pop(ref.uid, None)
            hold.reserving = None
            hold.slots = [None] * len(hold.pods)
            m._add_group(hold)
            out.append({"group": p.name, "preempted": [], "lazy_preempted": [], "preemption_completed": True})
            continue
        # Defensive only: once its victims are gone every cell of the plan is reserved
        # for it (invariant 6), so this is not reached through the commands.
        cancel_preemption(m, p)
        out.append({"group": p.name, "preemption_cancelled": "its planned cells are not all reserved for it"})
    return out


def _plan_problem(m: SchedulerStateMachine, p: Preemptor, sugg: frozenset[str] | None) -> str | None:
    bad = m.cluster.bad_nodes
    for row in p.plan:
        for node, _ in row:
            if node in bad:
                return f"its placement is no longer fully healthy (node {node} is bad)"
            if sugg is not None and node not in sugg:
                return f"its placement is no longer within the suggested nodes (node {node})"
    return None


# -- commands -------------------------------------------------------------------------------


def _common(m: SchedulerStateMachine, cmd: dict[str, Any]) -> tuple[str, str, str, Request, int]:
    uid, namespace, name = pod_identity(cmd, full=True)
    assert namespace is not None and name is not None
    req, k = parse_pod_spec(cmd.get("spec"), namespace, name, cmd.get("suggestedNodes"))
    return uid, namespace, name, req, k


def cmd_pod_schedule(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    return _schedule(m, cmd, "filter")


def cmd_pod_preempt(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    return _schedule(m, cmd, "preempt")


def _schedule(m: SchedulerStateMachine, cmd: dict[str, Any], phase: str) -> dict[str, Any]:
    uid, namespace, name, req, k = _common(m, cmd)
    ref = m.pod_refs.get(uid)
    if ref is not None:
        if ref.group != req.name:
            raise CommandError(f"pod {uid} belongs to affinity group {ref.group}, not {req.name}")
        if ref.state == BOUND:
            raise CommandError(f"Pod has already been bound to node {m.groups[ref.group].pods[ref.slot].devices[0][0]}")
        if ref.state == BINDING:
            node = m.groups[ref.group].pods[ref.slot].devices[0][0]
            if phase == "preempt":
                raise CommandError(f"Pod has already been binding to node {node}")
            return {"ok": True, **pod_view(m, ref), "again": True, "group_placed": False, "preempted": [],
                    "lazy_preempted": [], "scheduled": []}
    if req.name in m.pending_by_name:
        raise CommandError(f"affinity group {req.name} is waiting in the group-level pending queue; "
                           f"release it before scheduling its pods")
    scheduled: list[dict[str, Any]] = []
    g = m.groups.get(req.name)
    if g is not None:
        _same_spec(g.req, req)
        slot = _free_slot(g, k)
        if phase == "preempt":
            return {"ok": True, "preempting": False, "group": g.name, "victims": [], "scheduled": [],
                    "reason": f"affinity group {g.name} is already allocated: the pod takes its reserved "
                              f"slot at the next filter, no preemption needed"}
        ref = _take_slot(m, g, slot, uid, namespace, name, BINDING)
        return {"ok": True, **pod_view(m, ref), "group_placed": False, "preempted": [], "lazy_preempted": [],
                "scheduled": []}
    p = m.preemptors.get(req.name)
    if p is not None:
        _same_spec(p.req, req)
        problem = _plan_problem(m, p, req.suggested_filter()) if phase == "preempt" else None
        if problem is None:
            if uid not in m.pod_refs:
                ref = PodRef(uid, namespace, name, p.name, -1, PREEMPTING)
                p.pods.append(ref)
                m.pod_refs[uid] = ref
            victims = victims_view(m, p.victims)
            if phase == "preempt":
                return {"ok": True, "preempting": True, "group": p.name, "victims": victims, "preempted": [],
                        "scheduled": []}
            return {"ok": False, "waiting": True, "preempting": True, "group": p.name, "victims": victims,
                    "reason": _victims_reason(victims)}
        cancel_preemption(m, p)  # then plan afresh, as HiveD does in the same call
        scheduled.append({"group": p.name, "preemption_cancelled": problem})
    known = m._candidates(req)
    seq = m.next_seq
    if phase == "filter":
        a = m._attempt(req, seq, known, mode="no_victims")
        if a.group is not None:
            m.next_seq += 1
            g = a.group
            g.slots = [None] * len(g.pods)
            scheduled += cancelled_entries(a.cancelled, g.name)
            ref = _take_slot(m, g, _free_slot(g, k), uid, namespace, name, BINDING)
            view = m._group_view(g)
            return {"ok": True, **pod_view(m, ref), "group_placed": True, "vc": g.req.vc, "priority": g.priority,
                    "chain": g.chain, "placement": view["placement"], "preempted": [],
                    "lazy_preempted": a.lazy_preempted, "scheduled": scheduled}
        if a.blocked:
            victims = victims_view(m, a.preempted)
            return {"ok": False, "waiting": True, "preempting": False, "group": req.name, "victims": victims,
                    "reason": _victims_reason(victims), "scheduled": scheduled}
        return {"ok": False, "waiting": True, "group": req.name, "victims": [], "reason": a.reason,
                "scheduled": scheduled}
    # Preempt phase: a placement with victims makes G Preempting at once (its victims
    # Being preempted, the rest of its plan reserved; lower-priority preemptions it
    # overlaps cancelled first), one without changes nothing.
    a = m._attempt(req, seq, known, mode="reserve")
    if a.placeable:
        return {"ok": True, "preempting": False, "group": req.name, "victims": [], "scheduled": scheduled,
                "reason": "the pod can be placed without preemption: the next filter places it"}
    if a.preemptor is None:
        return {"ok": False, "waiting": True, "group": req.name, "victims": [], "reason": a.reason,
                "scheduled": scheduled}
    scheduled += cancelled_entries(a.cancelled, req.name)
    m.next_seq += 1
    p = a.preemptor
    ref = PodRef(uid, namespace, name, p.name, -1, PREEMPTING)
    p.pods.append(ref)
    m.pod_refs[uid] = ref
    victims = victims_view(m, p.victims)
    t = Touched()
    gone = []
    for v in list(p.victims):
        vg = m.groups[v]
        if not _live(vg):  # nobody to delete: it leaves now (whole group)
            m._remove_group(vg, t)
            gone.append(v)
    m.cluster.reindex(t)
    if gone:
        scheduled += m._retry_pending()
    return {"ok": True, "preempting": p.name in m.preemptors, "group": p.name,
            "victims": [v for v in victims if v["group"] not in gone], "preempted": gone,
            "lazy_preempted": a.lazy_preempted, "reserved_leaf_cells": p.reserved_leaves() if p.name in m.preemptors else 0,
            "scheduled": scheduled}


def _victims_reason(victims: list[dict[str, Any]]) -> str:
    parts = []
    for v in victims:
        pods = ", ".join(f"{p['uid']}({p['namespace']}/{p['name']})" for p in v["pods"])
        parts.append(f"{v['group']}" + (f" [{pods}]" if pods else ""))
    return "waiting for victim affinity group(s) to be preempted: " + "; ".join(parts)


def cmd_pod_bind(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    uid, namespace, name = pod_identity(cmd, full=False)
    node = _str(cmd, "node")
    leaves = cmd.get("leaf_cells")
    if leaves is not None:
        leaves = _leaf_list(leaves, "leaf_cells")
    ref = m.pod_refs.get(uid)
    if ref is None:
        raise NotFound(f"Pod cannot be bound without a scheduling placement: pod {uid} is not binding "
                       f"(never filtered, waiting or deleted), received node {node}")
    if (namespace is not None and namespace != ref.namespace) or (name is not None and name != ref.name):
        raise CommandError(f"pod {uid} is {ref.namespace}/{ref.name}, not {namespace}/{name}")
    if ref.state == PREEMPTING:
        raise CommandError(f"Pod cannot be bound without a scheduling placement: Pod current scheduling state "
                           f"{PREEMPTING}, received node {node}")
    g = m.groups[ref.group]
    pod = g.pods[ref.slot]
    expected = pod.devices[0][0]
    if node != expected:
        raise CommandError(f"Pod binding node mismatch: expected {expected}, received {node}")
    mine = [idx for _, idx, _ in pod.devices]
    if leaves is not None and leaves != mine:
        raise CommandError(f"Pod binding leaf cells mismatch: expected {mine}, received {leaves}")
    again = ref.state == BOUND
    ref.state = BOUND
    return {"ok": True, **pod_view(m, ref), "again": again}


def cmd_pod_delete(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    uid, _, _ = pod_identity(cmd, full=False)
    ref = m.pod_refs.get(uid)
    if ref is None:
        raise NotFound(f"pod {uid} is not tracked by the scheduler (waiting, deleted or never scheduled)")
    if ref.state == PREEMPTING:
        p = m.preemptors[ref.group]
        p.pods.remove(ref)
        del m.pod_refs[uid]
        cancelled = not p.pods
        freed = cancelled and p.reserved_leaves() > 0
        if cancelled:
            cancel_preemption(m, p)
        return {"ok": True, "pod": uid, "group": p.name, "state": PREEMPTING, "deleted": True, "released": False,
                "preemption_cancelled": cancelled, "scheduled": m._retry_pending() if freed else []}
    g = m.groups[ref.group]
    assert g.slots is not None
    g.slots[ref.slot] = None
    del m.pod_refs[uid]
    out: dict[str, Any] = {"ok": True, "pod": uid, "group": g.name, "state": ref.state, "deleted": True}
    if _live(g):
        out.update(released=False, scheduled=[])
        return out
    t = Touched()
    m._remove_group(g, t)
    m.cluster.reindex(t)
    out.update(released=True, preempted_by=g.preempted_by, scheduled=m._retry_pending())
    return out


def cmd_add_allocated_pod(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    uid, namespace, name, req, k = _common(m, cmd)
    info = parse_bind_info(cmd.get("bind_info"))
    node, leaves = info["node"], info["leaves"]
    if len(leaves) != k:
        raise CommandError(f"bind_info.leafCellIsolation has {len(leaves)} leaf cells; the pod's leafCellNumber "
                           f"is {k}")
    mine = [(node, i) for i in leaves]
    ref = m.pod_refs.get(uid)
    if ref is not None:
        if ref.state != PREEMPTING and ref.group == req.name and \
                [(n, i) for n, i, _ in m.groups[ref.group].pods[ref.slot].devices] == mine:
            again = ref.state == BOUND
            ref.state = BOUND
            return {"ok": True, **pod_view(m, ref), "group_placed": False, "again": again}
        raise CommandError(f"pod {uid} is already tracked in affinity group {ref.group} ({ref.state})")
    if req.name in m.pending_by_name:
        raise CommandError(f"affinity group {req.name} is waiting in the group-level pending queue")
    if req.name in m.preemptors:
        raise CommandError(f"affinity group {req.name} is preempting; delete its pods first")
    g = m.groups.get(req.name)
    if g is not None:
        _same_spec(g.req, req)
        for i, pod in enumerate(g.pods):
            if pod.k == k and not pod.released and (g.slots is None or g.slots[i] is None) and \
                    [(n, x) for n, x, _ in pod.devices] == mine:
                ref = _take_slot(m, g, i, uid, namespace, name, BOUND)
                return {"ok": True, **pod_view(m, ref), "group_placed": False, "again": False}
        raise CommandError(f"Pod placement not found in group {g.name}: node {node}, leaf cells {leaves}")
    # A new group, rebuilt from the bind info of every pod (HiveD's createAllocatedAffinityGroup).
    known = m._candidates(req)  # request errors (unknown VC, ...) before anything changes
    del known
    by_k: dict[int, list[tuple[str, list[int], list[str | None]]]] = {}
    for pl in info["placements"]:
        by_k.setdefault(len(pl[1]), []).append(pl)
    want: dict[int, int] = {}
    for kk in req.pods:
        want[kk] = want.get(kk, 0) + 1
    for kk in sorted(set(want) | set(by_k)):
        if len(by_k.get(kk, [])) != want.get(kk, 0):
            raise CommandError(f"bind_info.affinityGroupBindInfo has {len(by_k.get(kk, []))} pod placements of "
                               f"{kk} leaf cells; the affinity group has {want.get(kk, 0)}")
    cl = m.cluster
    seen: set[tuple[str, int]] = set()
    overwritten: dict[str, Preemptor] = {}  # Preempting groups whose reserved cells the pod runs on
    rows: list[tuple[int, list[tuple[str, int, str | None]], list[PCell | None]]] = []
    used: dict[int, int] = {}
    slot = -1
    for i, kk in enumerate(req.pods):
        j = used.get(kk, 0)
        used[kk] = j + 1
        pnode, idx, types = by_k[kk][j]
        devices = [(pnode, x, t) for x, t in zip(idx, types)]
        pleaves: list[PCell | None] = []
        for d in devices:
            if (d[0], d[1]) in seen:
                raise CommandError(f"bind_info lists device {d[0]}/{d[1]} twice")
            seen.add((d[0], d[1]))
            p = cl.leaf_by_device.get((d[0], d[1]))
            if p is not None and p.user is not None:
                if p.user.reserving is not None:
                    overwritten[p.user.name] = p.user.reserving
                else:
                        raise CommandError(f"device {d[0]}/{d[1]} is already used by affinity group {p.user.name}")
            pleaves.append(p)
        if slot < 0 and kk == k and [(d[0], d[1]) for d in devices] == mine:
            slot = i
        rows.append((kk, devices, pleaves))
    if slot < 0:
        raise CommandError(f"Pod placement not found in bind_info.affinityGroupBindInfo: node {node}, "
                           f"leaf cells {leaves}")
    # A running pod outranks a reservation (HiveD's cell e8 (i): a Reserved cell now
    # used by an Allocated group; its Preempting group is cancelled, AG e5).
    cancelled = sorted(overwritten.values(), key=lambda p: p.seq)
    for pre in cancelled:
        cancel_preemption(m, pre)
    chain = info["chain"]
    if chain not in cl.chains:
        found = next((p for _, _, pl in rows for p in pl if p is not None), None)
        chain = found.chain.info.name if found is not None else (chain or "")
    if not req.opportunistic:
        # A running pod outranks a doomed bad binding (advisory: it only marks a VC's
        # loss): one over its devices is released first, and re-made elsewhere if the
        # rule still asks for it when the command ends (HiveD's allocateLeafCell keeps
        # "the binding ... created before (when the cell is bad)" for the pod).
        for _, _, pleaves in rows:
            for p in pleaves:
                a = p
                while a is not None:
                    v = a.vcell
                    if v is not None and _health.is_doomed(v):
                        _health.release_doomed(cl, v)
                        break
                    a = a.parent
    seq = m.next_seq
    m.next_seq += 1
    g = Group(req, seq, chain)
    for kk, devices, pleaves in rows:
        g.pods.append(Pod(kk, devices, pleaves, None))
    t = Touched()
    lazy = []
    if not g.opportunistic:
        why = m._readd_guaranteed(g, t)
        if why is not None:
            g.lazy_by = f"add_allocated_pod: {why}"
            lazy.append(g.name)
    if g.opportunistic:
        for pod in g.pods:
            pod.vleaves = None
            for p in pod.pleaves:
                if p is not None:
                    cl.use_leaf(g, p, OPPORTUNISTIC_PRIORITY, None, t)
    m._add_group(g)
    cl.reindex(t)
    g.slots = [None] * len(g.pods)
    ref = _take_slot(m, g, slot, uid, namespace, name, BOUND)
    ignored = sum(1 for pod in g.pods for p in pod.pleaves if p is None)
    return {"ok": True, **pod_view(m, ref), "group_placed": True, "again": False, "vc": g.req.vc,
            "priority": g.priority, "chain": g.chain, "placement": m._group_view(g)["placement"],
            "lazy_preempted": lazy, "ignored_leaf_cells": ignored,
            "scheduled": [{"group": pre.name, "preemption_cancelled": f"its reserved cells are used by running pod "
                                                                     f"{uid} of affinity group {g.name}"}
                          for pre in cancelled]}


def cmd_pod_status(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    uid, _, _ = pod_identity(cmd, full=False)
    ref = m.pod_refs.get(uid)
    if ref is None:
        raise NotFound(f"pod {uid} is not tracked by the scheduler")
    return {"ok": True, **pod_view(m, ref)}


def cmd_list_pods(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    out = []
    for g in sorted(m.groups.values(), key=lambda g: g.seq):
        if g.slots is None:
            continue
        for i, ref in enumerate(g.slots):
            if ref is not None:
                out.append({"pod": ref.uid, "namespace": ref.namespace, "name": ref.name, "group": g.name,
                            "state": ref.state, "slot": i, "node": g.pods[i].devices[0][0],
                            "leaf_cells": [idx for _, idx, _ in g.pods[i].devices]})
    for p in sorted(m.preemptors.values(), key=lambda p: p.seq):
        for ref in p.pods:
            out.append({"pod": ref.uid, "namespace": ref.namespace, "name": ref.name, "group": p.name,
                        "state": PREEMPTING})
    return {"ok": True, "pods": out}


def _plan_view(req: Request, plan: list[list[tuple[str, int]]]) -> list[dict[str, Any]]:
    return [{"leaf_cell_number": k, "node": row[0][0] if row else None, "leaf_cells": [i for _, i in row]}
            for k, row in zip(req.pods, plan)]


def cmd_what_if(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    """The read-only filter (a dry run): would this pod (``pod`` + ``spec``, as
    ``pod_schedule``) or this group (``group``, as ``allocate``) be placed now, where,
    and with which victims. Nothing changes (the digest is the same before and after):
    lazy demotions tried on the way are undone, as a failed ``allocate`` undoes them.

    Result: ``placeable`` (placed now without victims), ``placement`` (the whole group's
    planned devices, per pod), ``victims`` (groups to preempt first, with their pods and
    nodes), ``lazy_preempted`` (groups that would only be demoted), ``waiting`` and
    ``reason`` when it cannot be placed now. For a pod also ``node``, ``leaf_cells`` and
    ``slot`` (the slot it would take), ``state`` when it is already tracked, and
    ``changes_state``: whether ``pod_schedule`` for it would change the state (it places
    a new group, takes a slot, or joins a Preempting group's pods) -- the extender's
    filter proposes ``pod_schedule`` only then and answers the rest from this read."""
    if "pod" in cmd:
        return _what_if_pod(m, cmd)
    req = parse_request(cmd.get("group"), cmd.get("suggestedNodes"))
    if req.name in m.groups:
        raise CommandError(f"group {req.name} is already allocated")
    if req.name in m.pending_by_name or req.name in m.preemptors:
        raise CommandError(f"group {req.name} is already waiting or preempting")
    return _what_if_new(m, req, m._candidates(req), None)


def _what_if_new(m: SchedulerStateMachine, req: Request, known: Any, k: int | None) -> dict[str, Any]:
    a = m._attempt(req, m.next_seq, known, mode="dry")
    out: dict[str, Any] = {"ok": True, "group": req.name, "placeable": a.placeable,
                           "victims": victims_view(m, a.preempted) if a.blocked else [],
                           "lazy_preempted": a.lazy_preempted}
    if a.plan is not None:
        out["placement"] = _plan_view(req, a.plan)
        if k is not None:
            slot = next(i for i, kk in enumerate(req.pods) if kk == k)
            out.update(slot=slot, node=out["placement"][slot]["node"],
                       leaf_cells=out["placement"][slot]["leaf_cells"])
    if not a.placeable:
        out["waiting"] = True
        out["reason"] = _victims_reason(out["victims"]) if a.blocked else a.reason
    return out


def _what_if_pod(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    uid, namespace, name, req, k = _common(m, cmd)
    ref = m.pod_refs.get(uid)
    if ref is not None:
        if ref.group != req.name:
            raise CommandError(f"pod {uid} belongs to affinity group {ref.group}, not {req.name}")
        if ref.state == BOUND:
            raise CommandError(f"Pod has already been bound to node {m.groups[ref.group].pods[ref.slot].devices[0][0]}")
        view = pod_view(m, ref)
        if ref.state == PREEMPTING:
            return {"ok": True, **view, "placeable": False, "waiting": True, "changes_state": False,
                    "reason": _victims_reason(view["victims"])}
        return {"ok": True, **view, "placeable": True, "victims": [], "changes_state": False}
    if req.name in m.pending_by_name:
        raise CommandError(f"affinity group {req.name} is waiting in the group-level pending queue; "
                           f"release it before scheduling its pods")
    g = m.groups.get(req.name)
    if g is not None:
        _same_spec(g.req, req)
        slot = _free_slot(g, k)
        node, leaves = slot_devices(g, slot)  # (not the whole group's bind info: not answered)
        return {"ok": True, "group": g.name, "placeable": True, "victims": [], "changes_state": True,
                "slot": slot, "node": node, "leaf_cells": leaves, "group_placed": False}
    p = m.preemptors.get(req.name)
    if p is not None:
        _same_spec(p.req, req)
        victims = victims_view(m, p.victims)
        return {"ok": True, "group": p.name, "placeable": False, "waiting": True, "preempting": True,
                "victims": victims, "changes_state": True, "reason": _victims_reason(victims)}
    out = _what_if_new(m, req, m._candidates(req), k)
    out["changes_state"] = out["placeable"]
    out["group_placed"] = out["placeable"]
    return out


HANDLERS: dict[str, Any] = {
    "what_if": cmd_what_if,
    "pod_schedule": cmd_pod_schedule,
    "pod_preempt": cmd_pod_preempt,
    "pod_bind": cmd_pod_bind,
    "pod_delete": cmd_pod_delete,
    "add_allocated_pod": cmd_add_allocated_pod,
    "pod_status": cmd_pod_status,
    "list_pods": cmd_list_pods,
}


# -- snapshots -------------------------------------------------------------------------------


def snapshot_group(g: Group, rec: dict[str, Any]) -> None:
    """Pod-level fields of a group record; absent for groups without them, so states
    that never saw a pod snapshot exactly as before."""
    if g.slots is not None:
        rec["slots"] = [[r.uid, r.namespace, r.name, r.state] if r is not None else None for r in g.slots]
    if g.preempted_by is not None:
        rec["preempted_by"] = g.preempted_by


def snapshot_machine(m: SchedulerStateMachine, state: dict[str, Any]) -> None:
    if m.preemptors:
        state["preemptors"] = [
            {"name": p.name, "seq": p.seq, "spec": p.req.to_record(), "victims": list(p.victims),
             "pods": [[r.uid, r.namespace, r.name] for r in p.pods], "plan": [[list(d) for d in row] for row in p.plan],
             "vplan": [[v.id for v in row] for row in p.vplan],
             # per device: 2 both leaves reserved, 1 the virtual leaf only, 0 none (a victim's)
             "reserved": [[2 if c is not None else 1 if v is not None else 0 for c, v in zip(pod.pleaves, pod.vleaves)]
                          for pod in p.hold.pods]}
            for p in sorted(m.preemptors.values(), key=lambda p: p.seq)
        ]


def load_group(m: SchedulerStateMachine, g: Group, rec: dict[str, Any]) -> None:
    slots = rec.get("slots")
    if slots is not None:
        g.slots = []
        for i, s in enumerate(slots):
            if s is None:
                g.slots.append(None)
                continue
            ref = PodRef(s[0], s[1], s[2], g.name, i, s[3])
            g.slots.append(ref)
            m.pod_refs[ref.uid] = ref
    g.preempted_by = rec.get("preempted_by")


def load_machine(m: SchedulerStateMachine, state: dict[str, Any], t: Touched) -> None:
    cl = m.cluster
    for rec in state.get("preemptors") or ():
        req = request_from_record(rec["spec"])
        vplan = [[cl.vcells[i] for i in row] for row in rec["vplan"]]
        plan = [[(d[0], d[1]) for d in row] for row in rec["plan"]]
        hold = Group(req, rec["seq"], vplan[0][0].scope.chain.info.name)
        p = Preemptor(rec["name"], rec["seq"], req, list(rec["victims"]), plan, vplan, hold)
        hold.reserving = p
        for k, vrow, prow, marks in zip(req.pods, vplan, plan, rec["reserved"]):
            pod = Pod(k, [(d[0], d[1], v.root.ctype) for v, d in zip(vrow, prow)], [None] * len(vrow),
                      [None] * len(vrow))
            hold.pods.append(pod)
            for j, (v, d, mark) in enumerate(zip(vrow, prow, marks)):
                c = cl.leaf_by_device[d]
                if mark == 2:
                    if c.user is not None:
                        raise ValueError(f"snapshot inconsistent: reserved leaf {c.addr} is used")
                    cl.bind(v, c)
                    cl.use_leaf(hold, c, req.priority, v, t)
                    pod.pleaves[j] = c
                    pod.vleaves[j] = v
                elif mark == 1:
                    cl.use_virtual(hold, v, c, req.priority, t)
                    pod.vleaves[j] = v
        for uid, namespace, name in rec["pods"]:
            ref = PodRef(uid, namespace, name, p.name, -1, PREEMPTING)
            p.pods.append(ref)
            m.pod_refs[uid] = ref
        m.preemptors[p.name] = p
