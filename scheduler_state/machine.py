"""``SchedulerStateMachine``: HiveD's scheduler as a deterministic replicated state machine.

It implements ``consensus.core.statemachine.StateMachine``: ``apply(command) -> result``,
``snapshot() -> bytes``, ``restore(bytes)``. Build it from a config with
``SchedulerStateMachine(load_config(...))`` or ``SchedulerStateMachine.from_yaml(text)``.

Commands are plain dicts with an ``op``; results are dicts with ``ok``. A bad command
returns ``{"ok": False, "error": "..."}`` naming the problem and changes nothing.

Mutating commands:

- ``{"op": "allocate", "group": SPEC, "suggestedNodes": [...]?, "wait": true?,
  "now_ms": int?, "ttl_ms": int?}``: place one affinity group, all or nothing (a gang;
  a job made of several groups is scheduled incrementally, one command per group).
  ``SPEC`` is HiveD's pod scheduling spec (see ``requests.py``). Success:
  ``{"ok": True, "group", "state": "allocated", "chain", "placement": [{"leaf_cell_number",
  "node", "leaf_cells"}...], "preempted": [...], "lazy_preempted": [...], "scheduled": [...]}``.
  If the cells are not available now (quota in use, bad nodes, suggested nodes) the result
  is ``{"ok": False, "waiting": True, "queued": bool, "reason"}`` and, unless ``wait`` is
  false, the group joins the pending queue (HiveD's persistent Pending state): it is
  retried in FIFO order after every command that can free cells (release, preemption,
  node healthy, lease expiry, reconfigure) and those results list it under ``scheduled``.
  ``now_ms``/``ttl_ms`` grant a lease at once.
- ``{"op": "release", "group": name, "pods": [i, ...]?}``: delete a group (or cancel a
  pending one). With ``pods``, only those pods end; as in HiveD the group's cells stay
  reserved for it until its last pod ends (then it is deleted and its cells freed). A
  slot that a Kubernetes pod holds (``pod_schedule``) ends with ``pod_delete`` instead.
- ``{"op": "set_node_health", "node": name, "healthy": bool}``: cells on bad nodes are
  never given to new groups; groups already there keep them (as in HiveD). VC cells
  that can only be backed by bad cells are doomed bad (``health.py``), reported as
  ``doomed_bad_cells`` and in ``vc_status``.
- ``{"op": "reconfigure", "config": yaml text or mapping}``: work-preserving
  reconfiguration. Running groups keep their cells; cells no longer in the config are
  ignored (the group keeps running, untracked); a guaranteed group that no longer fits
  its VC (VC deleted, quota shrunk) is lazily preempted: it keeps running as an
  opportunistic group. Bad nodes, leases and the pending queue carry over.
- ``{"op": "lease_grant" | "lease_renew", "group", "now_ms", "ttl_ms"}`` and
  ``{"op": "lease_expire", "now_ms"}``: leases on groups (allocated or pending). Time is
  only what commands carry; the machine keeps the largest ``now_ms`` seen and never
  moves backwards. Expiry releases (or cancels) every group whose lease ended.

Read-only queries: ``{"op": "what_if", ...}`` (a dry run of ``allocate`` or
``pod_schedule``, ``pods.py``), ``{"op": "cluster_status"}``, ``{"op": "vc_status", "vc"}``,
``{"op": "group_status", "group"}``, ``{"op": "list_groups"}`` and ``{"op": "inspect",
"view", "name"?}`` (HiveD's web server shapes, ``inspect.py``). They go through
``apply`` when they take the log path, or through ``query`` (which refuses anything
else) when served by a lease or locally.

As a ``consensus.core.statemachine.ReplicatedMachine``: every mutating command may
write the single key ``SCHEDULER_KEY`` (``keys_of``; conservative: one allocation can
preempt any group and moves the clock) and every read-only query reads it
(``read_key``), so a lease read waits for the last *mutating* slot only, never for
slots holding other reads or no-ops.

Priorities and preemption (HiveD's): priority >= 0 is guaranteed and stays inside its
VC's cells; -1 is opportunistic and may use any free healthy cell outside pinned cells.
A guaranteed group may take cells of lower-priority groups of its own VC (intra-VC
preemption) and physical cells of opportunistic groups of any VC (inter-VC). A victim
with ``lazyPreemptionEnable`` is first only demoted to opportunistic, keeping its cells;
it is preempted for real only if the preemptor's physical cells land on them.
Preemption is atomic here: victims lose all their cells within the same command (HiveD
waits for the victims' pods to be deleted; a replicated log has no such gap).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, ClassVar

import msgpack  # type: ignore[import-untyped]

from scheduler_state.cells import (
    OPPORTUNISTIC_PRIORITY,
    Cluster,
    CountIndex,
    PCell,
    PChain,
    Touched,
    VCell,
    VScope,
    safety_shortfall,
)
from scheduler_state import health as _health
from scheduler_state import inspect as hived_inspect
from scheduler_state.config import Config, ConfigError, load_config
from scheduler_state.placement import (
    MapPlan,
    counted_roots,
    indexed_roots,
    physical_placer,
    virtual_free_placer,
    virtual_preempt_placer,
)
from scheduler_state.requests import Request, RequestError, parse_request, request_from_record

SNAPSHOT_FORMAT = 1
READ_OPS = frozenset({"cluster_status", "vc_status", "group_status", "list_groups", "inspect", "pod_status",
                      "list_pods", "what_if"})
SCHEDULER_KEY = "scheduler"  # the one key of the lease-read history (module docstring)
PENDING_MAX = 4096  # bound on the pending queue; a full queue answers "waiting", unqueued
TIME_MS_MAX = 2**62  # now_ms + ttl_ms <= 2**63: inside msgpack's uint64 (a lease at 2**63 is past int64)


class CommandError(ValueError):
    """A malformed command: reported as an error result, state unchanged."""


class Pod:
    """One pod of a group: its devices (bind info) and the cells tracking them.

    ``devices`` survive reconfiguration (like HiveD's pod bind info); ``pleaves`` maps
    them to the current config's leaf cells (None: no longer in the config, ignored).
    """

    __slots__ = ("k", "devices", "pleaves", "vleaves", "released")

    def __init__(self, k: int, devices: list[tuple[str | None, int, str | None]], pleaves: list[PCell | None],
                 vleaves: list[VCell | None] | None) -> None:
        self.k = k
        self.devices = devices  # (node, leaf index, preassigned cell type or None)
        self.pleaves = pleaves
        self.vleaves = vleaves
        self.released = False


class Group:
    """An allocated affinity group."""

    __slots__ = ("name", "seq", "req", "priority", "pods", "lazy_by", "lease_ms", "chain", "slots", "preempted_by",
                 "bind_yaml", "reserving")

    def __init__(self, req: Request, seq: int, chain: str) -> None:
        self.name = req.name
        self.seq = seq
        self.req = req
        self.priority = req.priority
        self.pods: list[Pod] = []
        self.lazy_by: str | None = None  # set when lazily preempted (now opportunistic)
        self.lease_ms: int | None = None
        self.chain = chain
        # Pod-level tracking (pods.py): the K8s pod holding each pod slot, or None for a
        # group scheduled only at the group level.
        self.slots: list[Any] | None = None
        self.preempted_by: str | None = None  # a Preempting group waits for this one to go
        # Derived, not state: the YAML of its pods' placements in HiveD's pod bind info,
        # made at the first pod-level answer (pods.bind_info_yaml); its pods are fixed by then.
        self.bind_yaml: str | None = None
        # Set on the cells a Preempting group reserved (pods.Preemptor.hold), not on an
        # allocated group: the Preemptor they are held for (HiveD's Reserved cells).
        self.reserving: Any = None

    @property
    def opportunistic(self) -> bool:
        return self.priority == OPPORTUNISTIC_PRIORITY or self.lazy_by is not None

    @property
    def cell_priority(self) -> int:
        return OPPORTUNISTIC_PRIORITY if self.opportunistic else self.priority

    def __repr__(self) -> str:
        return f"Group({self.name})"


class Pending:
    __slots__ = ("seq", "req", "lease_ms")

    def __init__(self, seq: int, req: Request, lease_ms: int | None) -> None:
        self.seq = seq
        self.req = req
        self.lease_ms = lease_ms


class _Attempt:
    """Outcome of one placement attempt.

    With ``mode`` "no_victims" or "dry" (pod-level scheduling) a placement that needs
    victims is not committed: ``blocked`` is True, ``preempted`` names the victims and
    ``plan`` holds the physical devices per pod. In "dry" mode a placement without
    victims is not committed either: ``placeable`` is True (and ``plan`` set). In
    "reserve" mode (pod_preempt) a placement with victims makes its group Preempting
    (``preemptor``, pods.reserve) and one without is not committed.

    ``cancelled``: Preempting groups of lower priority whose cells (reserved, or their
    victims') the placement overwrites: cancelled when it is committed (HiveD's e5)."""

    __slots__ = ("group", "reason", "preempted", "lazy_preempted", "blocked", "placeable", "plan", "cancelled",
                 "preemptor")

    def __init__(self, group: Group | None, reason: str | None = None,
                 preempted: list[str] | None = None, lazy_preempted: list[str] | None = None) -> None:
        self.group = group
        self.reason = reason
        self.preempted = preempted or []
        self.lazy_preempted = lazy_preempted or []
        self.blocked = False
        self.placeable = False
        self.plan: list[list[tuple[str, int]]] | None = None
        self.cancelled: list[str] = []
        self.preemptor: Any = None


def is_read(command: Any) -> bool:
    """A read-only query (``READ_OPS``). False for anything else, malformed commands
    included: an ``op`` that is not a string (a list, a map) must not raise here, on
    the proposal path or in apply, on every replica."""
    if not isinstance(command, dict):
        return False
    op = command.get("op")
    return type(op) is str and op in READ_OPS


def _int(cmd: dict[str, Any], key: str, minimum: int) -> int:
    v = cmd.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise CommandError(f"{key} must be an integer, got {v!r}")
    if v < minimum:
        raise CommandError(f"{key} must be >= {minimum}, got {v}")
    if v > TIME_MS_MAX:
        raise CommandError(f"{key} must be <= {TIME_MS_MAX}")
    return v


def _str(cmd: dict[str, Any], key: str) -> str:
    v = cmd.get(key)
    if not isinstance(v, str) or not v:
        raise CommandError(f"{key} must be a non-empty string")
    return v


def _canonical(obj: Any) -> Any:
    """Dicts with sorted keys, tuples as lists: one byte string per logical state."""
    if isinstance(obj, dict):
        return {k: _canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, (list, tuple)):
        return [_canonical(x) for x in obj]
    return obj


class NotFound(CommandError):
    """The named group, VC or node does not exist (result carries ``not_found``)."""


def _snapshot_state(data: bytes) -> dict[str, Any]:
    state = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(state, dict) or state.get("format") != SNAPSHOT_FORMAT:
        raise ValueError("not a scheduler_state snapshot (format mismatch)")
    return state


class SchedulerStateMachine:
    """HiveD's cells, VCs and affinity groups behind a deterministic ``apply``.

    Implements ``consensus.core.statemachine.ReplicatedMachine``."""

    name: ClassVar[str] = "scheduler"

    def __init__(self, config: Config) -> None:
        self._reset(config)

    @classmethod
    def from_yaml(cls, text: str) -> SchedulerStateMachine:
        return cls(load_config(text))

    @classmethod
    def from_snapshot(cls, data: bytes) -> SchedulerStateMachine:
        """The machine a ``snapshot()`` describes (``restore`` into a new machine)."""
        state = _snapshot_state(data)
        m = cls(load_config(state["config"]))
        m._load(state)
        return m

    def _reset(self, config: Config) -> None:
        self.config = config
        self.cluster = Cluster(config)
        self.groups: dict[str, Group] = {}
        self.vc_groups: dict[str, dict[str, Group]] = {vc: {} for vc in config.virtual_clusters}
        self.pending: list[Pending] = []
        self.pending_by_name: dict[str, Pending] = {}
        self.clock_ms = 0
        self.next_seq = 0
        # Pod-level state (pods.py): every pod HiveD would track (Binding, Bound,
        # Preempting) by UID, and the groups in HiveD's Preempting state by name.
        self.pod_refs: dict[str, Any] = {}
        self.preemptors: dict[str, Any] = {}

    def _take(self, other: SchedulerStateMachine) -> None:
        """Become ``other`` (a restore, a reconfiguration): every attribute ``_reset``
        sets, spelled out (the compiled build's instances have no ``__dict__``)."""
        self.config = other.config
        self.cluster = other.cluster
        self.groups = other.groups
        self.vc_groups = other.vc_groups
        self.pending = other.pending
        self.pending_by_name = other.pending_by_name
        self.clock_ms = other.clock_ms
        self.next_seq = other.next_seq
        self.pod_refs = other.pod_refs
        self.preemptors = other.preemptors

    # -- StateMachine protocol ------------------------------------------------------

    def apply(self, command: Any) -> dict[str, Any]:
        if not isinstance(command, dict):
            return {"ok": False, "error": "command must be a mapping with an 'op'"}
        op = command.get("op")
        handler = _HANDLERS.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown op {str(op)[:40]!r}; known: {', '.join(sorted(_HANDLERS))}"}
        try:
            result = handler(self, command)
            cl = self.cluster
            if (cl.bad_nodes or cl.hbound) and op not in READ_OPS:
                # HiveD's doomed bad cells and bad-cell bindings (health.py): brought to
                # its rules at every command boundary (a no-op without bad nodes).
                _health.reconcile(cl)
            return result
        except NotFound as missing:
            return {"ok": False, "error": str(missing), "not_found": True}
        except (CommandError, RequestError, ConfigError) as refused:
            return {"ok": False, "error": str(refused)}
        except (MemoryError, RecursionError):
            # Not the command's fault: how much memory or stack a replica has differs
            # from one replica (and build) to the next, so any answer here would differ
            # too, after a partial change. Raised out of apply, it stops this replica
            # (crash-only, docs/runtime.md) instead of letting it diverge.
            raise
        except Exception:  # noqa: BLE001 - the protocol forbids raising out of apply
            # Validation runs before any change, so this means a bug, not bad input. The
            # answer names no exception: the compiled build (scheduler_state.compiled)
            # raises other types and texts for the same bug than the .py files, and every
            # replica, of either build, must answer alike.
            return {"ok": False, "error": "internal error: the scheduler could not apply this command (a bug)"}

    def query(self, op: Any) -> dict[str, Any]:
        """A read-only query (``READ_OPS``) on the local state; anything else is refused."""
        if not is_read(op):
            name = op.get("op") if isinstance(op, dict) else op
            return {"ok": False, "error": f"{str(name)[:40]!r} is not a read-only query; "
                                          f"read-only: {', '.join(sorted(READ_OPS))}"}
        return self.apply(op)

    @staticmethod
    def read_key(op: Any) -> str | None:
        return SCHEDULER_KEY if is_read(op) else None

    @staticmethod
    def keys_of(command: Any) -> list:
        if is_read(command):
            return []
        return [SCHEDULER_KEY]  # malformed ones too: conservative

    def digest(self) -> str:
        return hashlib.sha256(self.snapshot()).hexdigest()[:16]

    def snapshot(self) -> bytes:
        groups = []
        for g in sorted(self.groups.values(), key=lambda g: g.seq):
            pods = []
            for pod in g.pods:
                leaves = []
                for i, (node, idx, rtype) in enumerate(pod.devices):
                    p = pod.pleaves[i]
                    v = pod.vleaves[i] if pod.vleaves is not None else None
                    leaves.append([node, idx, rtype, p.id if p is not None else -1, v.id if v is not None else -1])
                pods.append({"k": pod.k, "released": pod.released, "virtual": pod.vleaves is not None,
                             "leaves": leaves})
            rec = {"seq": g.seq, "spec": g.req.to_record(), "chain": g.chain, "lazy_by": g.lazy_by,
                   "lease_ms": g.lease_ms, "pods": pods}
            _pods.snapshot_group(g, rec)
            groups.append(rec)
        state = {
            "format": SNAPSHOT_FORMAT,
            "config": self.config.to_dict(),
            "bad_nodes": sorted(self.cluster.bad_nodes),
            "clock_ms": self.clock_ms,
            "next_seq": self.next_seq,
            "groups": groups,
            "pending": [{"seq": e.seq, "spec": e.req.to_record(), "lease_ms": e.lease_ms} for e in self.pending],
        }
        _pods.snapshot_machine(self, state)
        if self.cluster.hbound:  # absent without bad nodes: such states snapshot as before
            state["health_bindings"] = [[v.id, v.pcell.id] for v in sorted(self.cluster.hbound, key=lambda v: v.id)
                                        if v.pcell is not None]
        return msgpack.packb(_canonical(state), use_bin_type=True)

    def restore(self, data: bytes) -> None:
        self._take(SchedulerStateMachine.from_snapshot(data))

    def _load(self, state: dict[str, Any]) -> None:
        cl = self.cluster
        t = Touched()
        for node in state["bad_nodes"]:
            cl.set_node_bad(node, True, t)
        self.clock_ms = state["clock_ms"]
        self.next_seq = state["next_seq"]
        for rec in state["groups"]:
            g = Group(request_from_record(rec["spec"]), rec["seq"], rec["chain"])
            g.lazy_by = rec["lazy_by"]
            g.lease_ms = rec["lease_ms"]
            prio = g.cell_priority
            for prec in rec["pods"]:
                devices, pleaves, vleaves = [], [], []
                for node, idx, rtype, pid, vid in prec["leaves"]:
                    devices.append((node, idx, rtype))
                    p = cl.pcells[pid] if pid >= 0 else None
                    v = cl.vcells[vid] if vid >= 0 else None
                    if p is not None:
                        if p.level != 1 or p.node != node or p.leaf_index != idx or p.user is not None:
                            raise ValueError(f"snapshot inconsistent: leaf {pid} is not free device {node}/{idx}")
                        if v is not None:
                            cl.bind(v, p)
                        cl.use_leaf(g, p, prio, v, t)
                    pleaves.append(p)
                    vleaves.append(v)
                pod = Pod(prec["k"], devices, pleaves, vleaves if prec["virtual"] else None)
                pod.released = prec["released"]
                g.pods.append(pod)
            _pods.load_group(self, g, rec)
            self._add_group(g)
        for rec in state["pending"]:
            e = Pending(rec["seq"], request_from_record(rec["spec"]), rec["lease_ms"])
            self.pending.append(e)
            self.pending_by_name[e.req.name] = e
        _pods.load_machine(self, state, t)
        pairs = [(cl.vcells[vid], cl.pcells[pid]) for vid, pid in state.get("health_bindings", ())]
        for v, p in sorted(pairs, key=lambda vp: (-vp[0].level, vp[0].id)):
            if v.pcell is None:
                cl.health_bind(v, p)
            elif v.pcell is not p:
                raise ValueError(f"snapshot inconsistent: {v.addr} bound to {v.pcell.addr}, not {p.addr}")
            else:
                cl.hbound[v] = None
        cl.reindex(t)

    # -- bookkeeping ------------------------------------------------------------------

    def _add_group(self, g: Group) -> None:
        self.groups[g.name] = g
        vcg = self.vc_groups.get(g.req.vc)
        if vcg is not None:
            vcg[g.name] = g

    def _drop_group(self, g: Group) -> None:
        del self.groups[g.name]
        vcg = self.vc_groups.get(g.req.vc)
        if vcg is not None:
            vcg.pop(g.name, None)

    def _remove_group(self, g: Group, t: Touched) -> None:
        unuse_pod = self.cluster.unuse_pod
        for pod in g.pods:  # each pod's cells freed, its leaves no longer tracked
            vl = pod.vleaves
            unuse_pod(pod.pleaves, vl, t)
            pod.pleaves = [None] * len(pod.pleaves)
            if vl is not None:
                pod.vleaves = [None] * len(vl)
        if g.slots is not None:
            for ref in g.slots:
                if ref is not None:
                    self.pod_refs.pop(ref.uid, None)
        if g.preempted_by is not None:  # a victim gone: its preemptor waits for one fewer
            p = self.preemptors.get(g.preempted_by)
            if p is not None and g.name in p.victims:
                p.victims.remove(g.name)
                _pods.reserve_free(self, p, t)  # its planned cells: Reserving -> Reserved
        self._drop_group(g)

    # -- request validation -------------------------------------------------------------

    def _candidates(self, req: Request) -> tuple[list[Any], str | None]:
        """Scopes (guaranteed) or chains (opportunistic) that could ever hold ``req``.

        Raises RequestError for requests HiveD rejects outright: unknown VC, pinned cell
        or leaf type, and groups larger than any cell of the physical cluster. A group
        that fits the cluster but not its VC's quota is not an error: it waits (the
        feature README's gang example), and the second value says why.

        The answer depends on the request's shape and the config only (never on cell
        state), so it is cached per shape on the cluster, which a new config replaces.
        Callers must not modify the returned list.
        """
        pods = req.pod_sizes
        key = (req.vc, req.leaf_type, req.pinned_id, req.priority == OPPORTUNISTIC_PRIORITY, max(pods), req.total)
        cache = self.cluster.candidates_cache
        hit = cache.get(key)
        if hit is None:
            try:
                hit = self._candidates_uncached(req)
            except RequestError as exc:
                hit = exc
            if len(cache) >= 4096:
                cache.clear()
            cache[key] = hit
        if isinstance(hit, RequestError):
            raise RequestError(str(hit))
        return hit

    def _candidates_uncached(self, req: Request) -> tuple[list[Any], str | None]:
        cl = self.cluster
        if req.vc not in cl.vc_scopes:
            raise RequestError(f"VC {req.vc} does not exist")
        ltype = req.leaf_type
        if ltype is not None and ltype not in cl.chains_by_leaf_type:
            raise RequestError(f"leaf cell type {ltype} does not exist in the cluster")
        pods = req.pods
        kmax = max(pods)
        total = req.total
        if req.pinned_id is not None:
            scope = cl.vc_pinned[req.vc].get(req.pinned_id)
            if scope is None:
                raise RequestError(f"VC {req.vc} does not have pinned cell {req.pinned_id}")
            if ltype is not None and ltype != scope.chain.info.leaf_type:
                raise RequestError(
                    f"pinned cell {req.pinned_id} has leaf cell type {scope.chain.info.leaf_type}, not {ltype}"
                )
            if kmax > scope.max_node_leaves() or total > scope.leaves:
                raise RequestError(
                    f"request larger than any cell: {total} leaf cells (pods of up to {kmax}) do not fit "
                    f"pinned cell {req.pinned_id} ({scope.leaves} leaf cells, {scope.max_node_leaves()} per node)"
                )
            return [scope], None
        chains = cl.chains_by_leaf_type[ltype] if ltype is not None else list(cl.chains.values())
        fits = [ch for ch in chains if _chain_fits(ch, kmax, total)]
        if not fits:
            what = f"leaf cell type {ltype}" if ltype is not None else "any leaf cell type"
            raise RequestError(
                f"request larger than any cell: {total} leaf cells (pods of up to {kmax}) do not fit "
                f"any chain of {what}"
            )
        if req.opportunistic:
            return fits, None
        scopes = [s for s in cl.vc_scopes[req.vc].values() if ltype is None or s.chain.info.leaf_type == ltype]
        if ltype is not None and not scopes:
            raise RequestError(f"VC {req.vc} does not have leaf cell type {ltype}")
        if not scopes:
            raise RequestError(f"VC {req.vc} has only pinned cells: name one with pinnedCellId")
        scopes.sort(key=lambda s: s.chain.index)
        ok = [s for s in scopes if s.max_node_leaves() >= kmax and s.leaves >= total]
        if not ok:
            return [], (f"VC {req.vc} quota cannot hold {total} leaf cells with pods of up to {kmax} "
                        f"({', '.join(f'{s.key}: {s.leaves}' for s in scopes)})")
        return ok, None

    # -- allocation -----------------------------------------------------------------------

    def _attempt(self, req: Request, seq: int, known: tuple[list[Any], str | None] | None = None,
                 mode: str = "commit") -> _Attempt:
        """Place ``req``. ``mode``: "commit" (preempt victims atomically), "no_victims"
        (commit only a placement without victims), "dry" (commit nothing), "reserve"
        (a placement with victims becomes a Preempting group); see _Attempt."""
        cands, why = known if known is not None else self._candidates(req)
        if not cands:
            return _Attempt(None, why)
        if req.opportunistic:
            return self._attempt_opportunistic(req, seq, cands, mode)
        return self._attempt_guaranteed(req, seq, cands, mode)

    def _attempt_opportunistic(self, req: Request, seq: int, chains: list[PChain], mode: str = "commit") -> _Attempt:
        cl = self.cluster
        sugg = req.suggested_filter()
        pods = req.pods
        total = req.total
        for chain in chains:
            nodes = chain.node_index  # read (so re-keyed) only when a spread needs it

            def spread(kmin: int, nodes: Any = nodes) -> list[Any]:
                return list(indexed_roots(nodes.sorted_keys(), cl.pcells, kmin))

            # HiveD spreads opportunistic pods away from guaranteed ones: first only
            # nodes without guaranteed leaves, then (if that fails) any node.
            found = None
            guaranteed = any(top.used != top.opp for top in chain.tops)
            for away in ((True, False) if guaranteed else (False,)):
                placer = physical_placer(sugg, away)
                found = placer.place(indexed_roots(chain.root_index.sorted_keys(), cl.pcells, total), spread, pods,
                                     (nodes, cl.pcells))
                if found is not None:
                    break
            if found is None:
                continue
            if mode in ("dry", "reserve"):  # (an opportunistic group never has victims)
                a = _Attempt(None)
                a.placeable = True
                a.plan = [[(p.node, p.leaf_index) for p in leaves] for leaves in found]
                return a
            g = Group(req, seq, chain.info.name)
            t = Touched()
            for k, leaves in zip(pods, found):
                cl.use_pod(g, leaves, OPPORTUNISTIC_PRIORITY, None, t)
                g.pods.append(Pod(k, [(p.node, p.leaf_index, None) for p in leaves], list(leaves), None))
            cl.reindex(t)
            self._add_group(g)
            return _Attempt(g)
        where = f"leaf cell type {req.leaf_type}" if req.leaf_type else "any leaf cell type"
        return _Attempt(None, f"not enough free healthy leaf cells of {where} for an opportunistic group")

    def _attempt_guaranteed(self, req: Request, seq: int, scopes: list[VScope], mode: str = "commit") -> _Attempt:
        cl = self.cluster
        sugg = req.suggested_filter()
        pods = req.pods
        total = req.total
        reason = None
        held = None  # a Preempting group holding cells this request could otherwise preempt
        doomed_scopes = {v.scope for v in cl.hbound if _health.is_doomed(v)} if cl.hbound else ()
        for scope in scopes:
            # Doomed bad cells are avoided while healthy ones remain: a first free pass
            # without them (only when the scope has some), then the usual passes.
            doomed = scope in doomed_scopes
            for preempt in ((None, False, True) if doomed else (False, True)):
                avoid_doomed = preempt is None
                preempt = bool(preempt)
                if not preempt:
                    if scope.free < total:
                        continue
                    placer = virtual_free_placer(sugg, avoid_doomed)
                    roots: Any = indexed_roots(scope.root_index.sorted_keys(), cl.vcells, total)
                    nodes = scope.node_index  # read (so re-keyed) only when a spread needs it

                    def spread(kmin: int, nodes: Any = nodes) -> list[Any]:
                        return list(indexed_roots(nodes.sorted_keys(), cl.vcells, kmin))
                    sindex: Any = (nodes, cl.vcells)
                else:
                    lower = []
                    for g in self.vc_groups[req.vc].values():
                        if not g.opportunistic and g.priority < req.priority:
                            by = self._reserved_by(g, req.priority)
                            if by is None:
                                lower.append(g)
                            elif held is None or by.seq < held.seq:
                                held = by
                    if self.preemptors:  # cells reserved at a lower priority may be overwritten (e6)
                        for p in self.preemptors.values():
                            if p.req.vc == req.vc and p.req.priority < req.priority:
                                lower.append(p.hold)
                    if not lower:
                        continue
                    placer = virtual_preempt_placer(scope, req.priority, sugg, lower)
                    roots = counted_roots(scope.roots, placer.cnt, total)

                    def spread(kmin: int, nodes: Any = scope) -> list[Any]:
                        return nodes.nodes
                    sindex = None
                found = placer.place(roots, spread, pods, sindex)
                if found is None:
                    continue
                outcome = self._realize(req, seq, scope, found, sugg, mode)
                if outcome.group is not None or outcome.blocked or outcome.placeable:
                    return outcome
                reason = outcome.reason
        if reason is None:
            reason = (f"VC {req.vc} has not enough available cells for {total} leaf cells "
                      f"(pods {pods}) at priority {req.priority}")
            if held is not None:
                reason += (f"; cells of lower-priority groups are being preempted by affinity group {held.name} "
                           f"(priority {held.req.priority})")
            for p in sorted(self.preemptors.values(), key=lambda p: p.seq) if self.preemptors else ():
                n = p.reserved_leaves() if p.req.vc == req.vc and p.req.priority >= req.priority else 0
                if n:
                    reason += (f"; {n} leaf cells are reserved for Preempting affinity group {p.name} "
                               f"(priority {p.req.priority})")
            if cl.hbound:
                bad_names = sorted({n for v in cl.hbound if v.scope in scopes and v.pcell is not None
                                    for n in cl.nodes_of(v.pcell) if n in cl.bad_nodes})
                if bad_names:
                    doomed_addrs = sorted(v.addr for v in cl.hbound if v.scope in scopes and _health.is_doomed(v))
                    reason += (f"; its cells on bad nodes: {', '.join(bad_names)}"
                               + (f" (doomed bad cells: {', '.join(doomed_addrs)})" if doomed_addrs else ""))
        return _Attempt(None, reason)

    def _realize(self, req: Request, seq: int, scope: VScope, vplace: list[list[VCell]],
                 sugg: frozenset[str] | None, mode: str = "commit") -> _Attempt:
        """Map a virtual placement to physical cells; preempt; commit. All or nothing."""
        cl = self.cluster
        victims: dict[str, Group] = {}
        lazy: dict[str, Group] = {}
        holds: dict[str, Group] = {}  # reservations of Preempting groups (lower priority) overwritten
        for leaves in vplace:
            top = leaves[0].ncell
            if top.free == top.leaves and top.leafs == leaves:
                continue  # a whole node cell with no leaf in use: no user to look at
            for v in leaves:
                u = v.user
                if u is not None:
                    if u.reserving is not None:
                        holds[u.name] = u
                    else:
                        (lazy if u.req.lazy_preemption else victims)[u.name] = u
        lazy_list = sorted(lazy.values(), key=lambda g: g.seq) if lazy else []
        t = Touched()
        saved = [(g, self._lazy_preempt(g, req.name, t)) for g in lazy_list] if lazy_list else []
        plan = MapPlan(cl, sugg)
        pplace: list[list[PCell]] = []
        wholes: list[tuple[VCell, PCell] | None] = []  # per pod: its whole node cells, if mapped so
        failure = None
        for leaves in vplace:
            whole = plan.full_node(leaves) if len(leaves) > 1 else None
            if whole is not None:
                pnode = whole[1]
                if not pnode.bad and not pnode.used and (sugg is None or pnode.node in sugg):
                    # every check below passes for each leaf: the node is healthy,
                    # suggested (its leaves are on it) and unused
                    pplace.append(list(pnode.leafs))
                    wholes.append(whole)
                    continue
            fast = whole[1].leafs if whole is not None else None
            row: list[Any] = []
            for i, v in enumerate(leaves):
                p = fast[i] if fast is not None else plan.physical(v)
                if p is None:
                    failure = plan.failure
                elif p.bad:
                    failure = f"mapping the VC placement would need bad node {p.node}"
                elif sugg is not None and p.node not in sugg:
                    failure = f"mapping the VC placement would need node {p.node}, not among the suggested nodes"
                elif p.user is not None and p.prio != OPPORTUNISTIC_PRIORITY and p.user.name not in victims and \
                        p.user.reserving is None:
                    failure = f"internal: {p.addr} is held by {p.user.name}, which is not a victim"
                if failure is not None:
                    break
                row.append(p)
            if failure is not None:
                break
            pplace.append(row)
            wholes.append(None)
        if failure is not None:
            for g, vl in reversed(saved):
                self._unlazy(g, vl, t)
            cl.reindex(t)
            return _Attempt(None, failure)
        for row, whole in zip(pplace, wholes):
            if whole is not None:
                continue  # a whole unused physical node (checked above): no user
            for p in row:
                u = p.user
                if u is not None and u.name not in victims and u.reserving is None:
                    victims[u.name] = u  # an opportunistic user of a physical cell we need
        ordered = sorted(victims.values(), key=lambda g: g.seq) if victims else []
        held = next((h for x in ordered if (h := self._reserved_by(x, req.priority)) is not None), None) \
            if ordered else None
        if held is None and holds:
            held = next((h.reserving for h in holds.values() if h.reserving.req.priority >= req.priority), None)
        if held is not None:  # HiveD: Reserving/Reserved cells go only to a higher-priority group
            for g, vl in reversed(saved):
                self._unlazy(g, vl, t)
            cl.reindex(t)
            return _Attempt(None, f"the cells it needs are being preempted by affinity group {held.name} "
                                  f"(priority {held.req.priority})")
        # Preempting groups (of lower priority) whose cells this placement overwrites:
        # reserved ones, or their victims' (HiveD e3/e6: cancelled, e5).
        over = {h.name: h.reserving for h in holds.values()} if holds else {}
        if self.preemptors:
            for x in ordered + lazy_list:
                if x.preempted_by is not None and x.preempted_by in self.preemptors:
                    over[x.preempted_by] = self.preemptors[x.preempted_by]
        cancel = sorted(over.values(), key=lambda p: p.seq) if over else []
        if mode == "dry" or (mode == "no_victims" and ordered) or (mode == "reserve" and not ordered):
            # Not committed: undo the lazy demotions, report the plan (pods.py).
            for g, vl in reversed(saved):
                self._unlazy(g, vl, t)
            cl.reindex(t)
            out = _Attempt(None, None if not ordered else "needs preemption",
                           [x.name for x in ordered], [x.name for x in lazy_list if x.name not in victims])
            out.blocked = bool(ordered)
            out.placeable = not ordered
            out.plan = [[(p.node, p.leaf_index) for p in row] for row in pplace]  # type: ignore[misc]
            out.cancelled = [p.name for p in cancel]
            return out
        for p in cancel:
            _pods.cancel_preemption(self, p, t)
        if mode == "reserve":  # Preempting: victims marked, the free cells of the plan reserved
            pre = _pods.reserve(self, req, seq, ordered, vplace, pplace, t)
            cl.reindex(t)
            out = _Attempt(None, "needs preemption", [x.name for x in ordered],
                           [x.name for x in lazy_list if x.name not in victims])
            out.blocked = True
            out.plan = pre.plan
            out.cancelled = [p.name for p in cancel]
            out.preemptor = pre
            return out
        for g in ordered:
            self._remove_group(g, t)
        g = Group(req, seq, scope.chain.info.name)
        prio = req.priority
        devices: list[tuple[str | None, int, str | None]]
        for k, vleaves, pleaves, whole in zip(req.pod_sizes, vplace, pplace, wholes):
            if whole is not None and cl.use_node(g, whole[0], whole[1], prio, t):
                rtype = whole[0].root.ctype
                devices = [(p.node, p.leaf_index, rtype) for p in pleaves]
            else:
                cl.use_pod(g, pleaves, prio, vleaves, t)
                devices = [(p.node, p.leaf_index, v.root.ctype) for v, p in zip(vleaves, pleaves)]
            g.pods.append(Pod(k, devices, list(pleaves), list(vleaves)))
        cl.reindex(t)
        self._add_group(g)
        out = _Attempt(g, None, [x.name for x in ordered], [x.name for x in lazy_list if x.name not in victims])
        out.cancelled = [p.name for p in cancel]
        return out

    def _reserved_by(self, g: Group, priority: int) -> Any:
        """The Preempting group (pods.py) whose victim ``g`` is, if its priority is at
        least ``priority``: then ``g``'s cells are not available to such a request."""
        if g.preempted_by is None:
            return None
        p = self.preemptors.get(g.preempted_by)
        return p if p is not None and p.req.priority >= priority else None

    def _lazy_preempt(self, g: Group, preemptor: str, t: Touched) -> list[list[VCell | None] | None]:
        """Demote ``g`` to opportunistic: it keeps its physical cells, gives back its
        virtual ones (HiveD's lazyPreemptAffinityGroup). Returns what ``_unlazy`` needs."""
        cl = self.cluster
        saved = []
        for pod in g.pods:
            saved.append(pod.vleaves)
            if pod.vleaves is not None:
                for v, p in zip(pod.vleaves, pod.pleaves):
                    if v is not None and p is not None:
                        cl.demote_leaf(p, v, t)
            pod.vleaves = None
        g.lazy_by = preemptor
        return saved

    def _unlazy(self, g: Group, saved: list[list[VCell | None] | None], t: Touched) -> None:
        cl = self.cluster
        g.lazy_by = None
        for pod, vl in zip(g.pods, saved):
            pod.vleaves = vl
            if vl is not None:
                for v, p in zip(vl, pod.pleaves):
                    if v is not None and p is not None:
                        cl.promote_leaf(g, p, v, g.priority, t)

    # -- pending queue --------------------------------------------------------------------

    def _retry_pending(self) -> list[dict[str, Any]]:
        """One FIFO pass over waiting groups (bounded by the queue length). Preempting
        groups whose victims are all gone are placed first (pods.py): the cells their
        victims left are theirs, never a waiting group's."""
        _health.reconcile(self.cluster)
        out: list[dict[str, Any]] = _pods.complete_preemptions(self) if self.preemptors else []
        if not self.pending:
            return out
        # Requests of the same shape fail alike until something is placed, so a shape
        # that failed in this pass is not searched again (a long queue of equal jobs
        # costs one search, not one per job).
        failed: set[tuple[Any, ...]] = set()
        for e in list(self.pending):
            if self.pending_by_name.get(e.req.name) is not e:
                continue
            r = e.req
            shape = (r.vc, r.priority, r.pinned_id, r.leaf_type, tuple(sorted(r.pods)), r.suggested_filter())
            if shape in failed:
                continue
            try:
                attempt = self._attempt(e.req, e.seq)
            except RequestError as exc:
                self._unqueue(e)
                out.append({"group": e.req.name, "dropped": str(exc)})
                continue
            if attempt.group is None:
                failed.add(shape)
            else:
                failed.clear()
                out += _pods.cancelled_entries(attempt.cancelled, e.req.name)
                self._unqueue(e)
                attempt.group.lease_ms = e.lease_ms
                out.append({"group": e.req.name, "preempted": attempt.preempted,
                            "lazy_preempted": attempt.lazy_preempted})
        return out

    def _unqueue(self, e: Pending) -> None:
        self.pending.remove(e)
        del self.pending_by_name[e.req.name]

    # -- command handlers ------------------------------------------------------------------

    def _cmd_allocate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        req = parse_request(cmd.get("group"), cmd.get("suggestedNodes"))
        wait = cmd.get("wait", True)
        if not isinstance(wait, bool):
            raise CommandError("wait must be true or false")
        lease = None
        now = self.clock_ms
        if "ttl_ms" in cmd or "now_ms" in cmd:
            now = max(_int(cmd, "now_ms", 0), self.clock_ms)
            lease = now + _int(cmd, "ttl_ms", 1)
        if req.name in self.groups:
            raise CommandError(f"group {req.name} is already allocated")
        if req.name in self.pending_by_name:
            raise CommandError(f"group {req.name} is already waiting (release it to cancel)")
        if req.name in self.preemptors:
            raise CommandError(f"group {req.name} is already preempting (delete its pods to cancel)")
        known = self._candidates(req)  # request errors before anything changes
        seq = self.next_seq
        attempt = self._attempt(req, seq, known)
        g = attempt.group
        if g is None:
            queued = wait and len(self.pending) < PENDING_MAX
            if queued:
                # Only a placed or queued group changes the state: it takes a number
                # (and its lease moves the clock); a refused attempt leaves no trace.
                self.next_seq += 1
                self.clock_ms = now
                e = Pending(seq, req, lease)
                self.pending.append(e)
                self.pending_by_name[req.name] = e
            return {"ok": False, "group": req.name, "waiting": True, "queued": queued, "reason": attempt.reason}
        self.next_seq += 1
        self.clock_ms = now
        g.lease_ms = lease
        result = self._group_view(g)
        result["ok"] = True
        result["preempted"] = attempt.preempted
        result["lazy_preempted"] = attempt.lazy_preempted
        result["scheduled"] = (_pods.cancelled_entries(attempt.cancelled, g.name) if attempt.cancelled else []) + (
            self._retry_pending() if attempt.preempted or attempt.cancelled else [])
        return result

    def _cmd_release(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name = _str(cmd, "group")
        e = self.pending_by_name.get(name)
        if e is not None:
            if cmd.get("pods") is not None:
                raise CommandError(f"group {name} is waiting; release it whole to cancel it")
            self._unqueue(e)
            return {"ok": True, "group": name, "cancelled": True, "scheduled": []}
        if name in self.preemptors:
            if cmd.get("pods") is not None:
                raise CommandError(f"group {name} is preempting; release it whole to cancel its preemption")
            p = self.preemptors[name]
            freed = p.reserved_leaves() > 0  # its reserved cells are free again: the queue is retried
            _pods.cancel_preemption(self, p)
            return {"ok": True, "group": name, "cancelled": True, "scheduled": self._retry_pending() if freed else []}
        g = self.groups.get(name)
        if g is None:
            raise CommandError(f"group {name} does not exist")
        pods = cmd.get("pods")
        t = Touched()
        if pods is None:
            self._remove_group(g, t)
            self.cluster.reindex(t)
            return {"ok": True, "group": name, "released": True, "scheduled": self._retry_pending()}
        if not isinstance(pods, list) or not pods or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(g.pods) for i in pods):
            raise CommandError(f"pods must be a non-empty list of pod indices in 0..{len(g.pods) - 1}")
        if g.slots is not None:
            held = [(i, g.slots[i].uid) for i in sorted(set(pods)) if g.slots[i] is not None]
            if held:
                i, uid = held[0]
                raise CommandError(f"pod slot {i} of group {name} holds Kubernetes pod {uid}: end it with "
                                   f"pod_delete (the extender's delete), not a partial release")
        # HiveD's DeleteAllocatedPod: a pod's slot ends, its cells stay with the group
        # until the last pod is gone (allPodsReleased), whatever gangReleaseEnable says
        # (HiveD's algorithm records the flag but never consults it to free cells).
        for i in sorted(set(pods)):
            g.pods[i].released = True
        done = all(p.released for p in g.pods)
        if not done:
            return {"ok": True, "group": name, "released": False, "scheduled": []}
        self._remove_group(g, t)
        self.cluster.reindex(t)
        return {"ok": True, "group": name, "released": True, "scheduled": self._retry_pending()}

    def _cmd_set_node_health(self, cmd: dict[str, Any]) -> dict[str, Any]:
        node = _str(cmd, "node")
        healthy = cmd.get("healthy")
        if not isinstance(healthy, bool):
            raise CommandError("healthy must be true or false")
        cl = self.cluster
        if node not in cl.node_leaves:
            raise CommandError(f"node {node} is not in the config")
        if (node not in cl.bad_nodes) == healthy:
            return {"ok": True, "node": node, "changed": False, "scheduled": []}
        t = Touched()
        cl.set_node_bad(node, not healthy, t)
        cl.reindex(t)
        _health.reconcile(cl)
        return {"ok": True, "node": node, "changed": True, "doomed_bad_cells": self._doomed_view(),
                "scheduled": self._retry_pending() if healthy else []}

    def _doomed_view(self) -> dict[str, list[str]]:
        """VC -> addresses of its doomed bad cells (HiveD's vcDoomedBadCells)."""
        out: dict[str, list[str]] = {}
        for v in sorted(self.cluster.hbound, key=lambda v: v.id):
            if _health.is_doomed(v):
                out.setdefault(v.vc, []).append(v.addr)
        return dict(sorted(out.items()))

    def _cmd_lease_grant(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name = _str(cmd, "group")
        now = max(_int(cmd, "now_ms", 0), self.clock_ms)
        ttl = _int(cmd, "ttl_ms", 1)
        holder = self.groups.get(name) or self.pending_by_name.get(name)
        if holder is None:
            raise CommandError(f"group {name} does not exist")
        self.clock_ms = now
        holder.lease_ms = now + ttl
        return {"ok": True, "group": name, "lease_expires_ms": holder.lease_ms}

    def _cmd_lease_renew(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name = _str(cmd, "group")
        now = max(_int(cmd, "now_ms", 0), self.clock_ms)
        ttl = _int(cmd, "ttl_ms", 1)
        holder = self.groups.get(name) or self.pending_by_name.get(name)
        if holder is None:
            raise CommandError(f"group {name} does not exist")
        if holder.lease_ms is None:
            raise CommandError(f"group {name} has no lease to renew")
        if holder.lease_ms <= now:
            raise CommandError(f"lease of group {name} expired at {holder.lease_ms} (now {now})")
        self.clock_ms = now
        holder.lease_ms = now + ttl
        return {"ok": True, "group": name, "lease_expires_ms": holder.lease_ms}

    def _cmd_lease_expire(self, cmd: dict[str, Any]) -> dict[str, Any]:
        now = max(_int(cmd, "now_ms", 0), self.clock_ms)
        self.clock_ms = now
        expired_pending = [e for e in self.pending if e.lease_ms is not None and e.lease_ms <= now]
        for e in expired_pending:
            self._unqueue(e)
        expired = sorted((g for g in self.groups.values() if g.lease_ms is not None and g.lease_ms <= now),
                         key=lambda g: g.seq)
        t = Touched()
        for g in expired:
            self._remove_group(g, t)
        self.cluster.reindex(t)
        return {"ok": True, "now_ms": now, "expired": [g.name for g in expired],
                "cancelled": [e.req.name for e in expired_pending],
                "scheduled": self._retry_pending() if expired else []}

    def _cmd_reconfigure(self, cmd: dict[str, Any]) -> dict[str, Any]:
        raw = cmd.get("config")
        if not isinstance(raw, (str, dict)):
            raise CommandError("config must be YAML text or a mapping")
        config = load_config(raw)
        new = SchedulerStateMachine(config)
        report = new._adopt(self)
        self._take(new)
        report["scheduled"] = self._retry_pending()
        report["ok"] = True
        return report

    def _adopt(self, old: SchedulerStateMachine) -> dict[str, Any]:
        """Re-add the old machine's groups to this fresh one (work-preserving
        reconfiguration, HiveD's recovery from pod bind info)."""
        cl = self.cluster
        t = Touched()
        for node in sorted(old.cluster.bad_nodes):
            if node in cl.node_leaves:
                cl.set_node_bad(node, True, t)
        self.clock_ms = old.clock_ms
        self.next_seq = old.next_seq
        lazy: list[str] = []
        ignored: dict[str, int] = {}
        # Preempting is a volatile state in HiveD (lost when it restarts with a new
        # config): preemptions in progress are cancelled; their pods wait again.
        for p in sorted(old.preemptors.values(), key=lambda p: p.seq):
            _pods.cancel_preemption(old, p)
        self.pod_refs = old.pod_refs
        for og in sorted(old.groups.values(), key=lambda g: g.seq):
            g = Group(og.req, og.seq, og.chain)
            g.lease_ms = og.lease_ms
            g.lazy_by = og.lazy_by
            g.slots = og.slots
            for op in og.pods:
                if op.released and all(p is None for p in op.pleaves):
                    # freed before (a state from an older version freed a released pod's
                    # cells at once): nothing to track
                    pleaves: list[PCell | None] = [None] * len(op.devices)
                else:
                    pleaves = [cl.leaf_by_device.get((node, idx)) for node, idx, _ in op.devices]  # type: ignore[arg-type]
                pod = Pod(op.k, list(op.devices), pleaves, None)
                pod.released = op.released
                g.pods.append(pod)
                missing = 0 if op.released else sum(1 for p in pleaves if p is None)
                if missing:
                    ignored[g.name] = ignored.get(g.name, 0) + missing
            if not g.opportunistic:
                why = self._readd_guaranteed(g, t)
                if why is not None:
                    g.lazy_by = f"reconfiguration: {why}"
                    lazy.append(g.name)
            if g.opportunistic:
                for pod in g.pods:
                    pod.vleaves = None
                    for p in pod.pleaves:
                        if p is not None:
                            cl.use_leaf(g, p, OPPORTUNISTIC_PRIORITY, None, t)
            self._add_group(g)
        cl.reindex(t)
        dropped = []
        for e in old.pending:
            try:
                self._candidates(e.req)
            except RequestError as exc:
                dropped.append({"group": e.req.name, "dropped": str(exc)})
                continue
            self.pending.append(Pending(e.seq, e.req, e.lease_ms))
            self.pending_by_name[e.req.name] = self.pending[-1]
        return {"lazy_preempted": lazy, "ignored_leaf_cells": ignored, "dropped": dropped}

    def _readd_guaranteed(self, g: Group, t: Touched) -> str | None:
        """Find virtual cells for a running guaranteed group's physical cells (HiveD's
        mapPhysicalCellToVirtual); on failure undo and return why."""
        cl = self.cluster
        done: list[tuple[PCell, VCell]] = []

        def undo(why: str) -> str:
            for p, v in reversed(done):
                cl.unuse_leaf(p, v, t)
            return why

        scopes = cl.vc_pinned.get(g.req.vc) if g.req.pinned_id else cl.vc_scopes.get(g.req.vc)
        if scopes is None:
            return undo(f"VC {g.req.vc} no longer exists")
        for pod in g.pods:
            vleaves: list[VCell | None] = []
            for (node, idx, rtype), p in zip(pod.devices, pod.pleaves):
                if p is None:
                    vleaves.append(None)
                    continue
                scope = scopes.get(g.req.pinned_id if g.req.pinned_id else p.chain.info.name)
                if scope is None or scope.chain is not p.chain:
                    where = g.req.pinned_id or p.chain.info.name
                    return undo(f"VC {g.req.vc} has no cells for {where}")
                v = self._virtual_for(p, scope, rtype)
                if v is None:
                    return undo(f"VC {g.req.vc} has no free {rtype} cell for device {node}/{idx}")
                cl.bind(v, p)
                cl.use_leaf(g, p, g.priority, v, t)
                done.append((p, v))
                vleaves.append(v)
            pod.vleaves = vleaves
        chains = sorted({p.chain.info.name for p, _ in done})
        for name in chains:
            chain = cl.chains[name]
            short = safety_shortfall(chain, chain.demand)
            if short is not None:
                for pod in g.pods:
                    pod.vleaves = None
                return undo(f"keeping it would break VC safety ({short})")
        return None

    def _virtual_for(self, p: PCell, scope: VScope, rtype: str | None) -> VCell | None:
        level = p.chain.info.level_of(rtype) if rtype is not None else None
        if level is None:
            return None
        path = [p]
        while path[-1].level < level:
            path.append(path[-1].parent)  # type: ignore[arg-type]
        top = path[-1]
        v: VCell | None
        if top.vcell is not None:
            v = top.vcell
            if v.scope is not scope:
                return None
        else:
            if self.cluster.free_ancestor(top) is None:
                return None
            v = next((r for r in scope.roots if r.level == level and r.pcell is None), None)
            if v is None:
                return None
        claimed: dict[VCell, PCell] = {v: top}
        for pc in reversed(path[:-1]):
            if pc.vcell is not None:
                if pc.vcell.parent is not v:
                    return None
                v = pc.vcell
            else:
                nxt = next((c for c in v.children if c.pcell is None and c not in claimed), None)
                if nxt is None:
                    return None
                v = nxt
            claimed[v] = pc
        return v if v.user is None else None

    # -- queries ----------------------------------------------------------------------------

    def _group_view(self, g: Group) -> dict[str, Any]:
        placement = []
        for pod in g.pods:
            devices, pleaves = pod.devices, pod.pleaves
            if len(devices) == len(pleaves):
                ignored = pleaves.count(None)
            else:
                ignored = len(devices) - sum(1 for _, p in zip(devices, pleaves) if p is not None)
            placement.append({
                "leaf_cell_number": pod.k,
                "node": devices[0][0] if devices else None,
                "leaf_cells": [d[1] for d in devices],
                "ignored_leaf_cells": ignored,
                "released": pod.released,
            })
        view: dict[str, Any] = {
            "group": g.name,
            "state": "allocated",
            "vc": g.req.vc,
            "priority": g.priority,
            "opportunistic": g.opportunistic,
            "chain": g.chain,
            "placement": placement,
        }
        if g.req.pinned_id:
            view["pinned_cell_id"] = g.req.pinned_id
        if g.lazy_by is not None:
            view["lazy_preempted_by"] = g.lazy_by
        if g.lease_ms is not None:
            view["lease_expires_ms"] = g.lease_ms
        virtual = [[v.addr for v in pod.vleaves if v is not None] for pod in g.pods if pod.vleaves is not None]
        if virtual:
            view["virtual_placement"] = virtual
        return view

    def _cmd_group_status(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name = _str(cmd, "group")
        g = self.groups.get(name)
        if g is not None:
            return {"ok": True, **self._group_view(g)}
        e = self.pending_by_name.get(name)
        if e is not None:
            pos = self.pending.index(e)
            out = {"ok": True, "group": name, "state": "pending", "vc": e.req.vc, "priority": e.req.priority,
                   "queue_position": pos, "spec": e.req.spec()}
            if e.lease_ms is not None:
                out["lease_expires_ms"] = e.lease_ms
            return out
        p = self.preemptors.get(name)
        if p is not None:
            return {"ok": True, "group": name, "state": "preempting", "vc": p.req.vc, "priority": p.req.priority,
                    "victims": _pods.victims_view(self, p.victims), "preempting_pods": [r.uid for r in p.pods],
                    "planned_placement": [{"node": row[0][0] if row else None, "leaf_cells": [i for _, i in row]}
                                          for row in p.plan],
                    # per pod, the planned leaf cells reserved for it (HiveD's Reserved cells)
                    "reserved_placement": [{"node": row[0][0] if row else None,
                                            "leaf_cells": [c.leaf_index for c in pod.pleaves if c is not None]}
                                           for row, pod in zip(p.plan, p.hold.pods)]}
        raise CommandError(f"group {name} does not exist")

    def _cmd_list_groups(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True,
                "allocated": [g.name for g in sorted(self.groups.values(), key=lambda g: g.seq)],
                "pending": [e.req.name for e in self.pending]}

    def _cmd_cluster_status(self, cmd: dict[str, Any]) -> dict[str, Any]:
        cl = self.cluster
        return {
            "ok": True,
            "chains": {name: cl.status_of_chain(ch) for name, ch in cl.chains.items()},
            "bad_nodes": sorted(cl.bad_nodes),
            "virtual_clusters": sorted(cl.vc_scopes),
            "groups": len(self.groups),
            "pending": [e.req.name for e in self.pending],
            "clock_ms": self.clock_ms,
        }

    def _cmd_vc_status(self, cmd: dict[str, Any]) -> dict[str, Any]:
        vc = _str(cmd, "vc")
        cl = self.cluster
        if vc not in cl.vc_scopes:
            raise CommandError(f"VC {vc} does not exist")
        cells = []
        for scope in cl.scopes_of(vc):
            for r in scope.roots:
                entry = {"address": r.addr, "cell_type": r.ctype, "chain": scope.chain.info.name,
                         "leaf_cells": r.leaves, "free_leaf_cells": r.free,
                         "bound_to": r.pcell.addr if r.pcell is not None else None,
                         "health": _health.cell_health(r)}
                if r.pcell is not None and r.pcell.bad:  # its bad parts, bound so placement skips them
                    entry["bad_cells"] = [x.addr for x in _bound_below(r) if x.pcell is not None and x.pcell.bad]
                if scope.pinned_id:
                    entry["pinned_cell_id"] = scope.pinned_id
                cells.append(entry)
        used: dict[str, int] = {}
        opp = 0
        for g in self.vc_groups[vc].values():
            n = sum(1 for pod in g.pods for p in pod.pleaves if p is not None)
            if g.opportunistic:
                opp += n
            else:
                used[str(g.priority)] = used.get(str(g.priority), 0) + n
        health = {h: sum(1 for c in cells if c["health"] == h) for h in ("healthy", "bad", "doomed-bad")}
        # virtual leaves reserved for the VC's Preempting groups (not free, not listed above)
        reserved = sum(1 for p in self.preemptors.values() if p.req.vc == vc
                       for pod in p.hold.pods for v in pod.vleaves if v is not None)
        return {"ok": True, "vc": vc, "cells": cells, "cell_health": health,
                "guaranteed_leaf_cells_by_priority": dict(sorted(used.items(), key=lambda kv: int(kv[0]))),
                "reserved_leaf_cells": reserved,
                "opportunistic_leaf_cells": opp,
                "groups": [g.name for g in sorted(self.vc_groups[vc].values(), key=lambda g: g.seq)]}

    def _cmd_inspect(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """HiveD's inspect views (``inspect.py``); ``result`` is the web server's body."""
        view = cmd.get("view")
        if view not in hived_inspect.INSPECT_VIEWS:
            raise CommandError(f"view must be one of {', '.join(hived_inspect.INSPECT_VIEWS)}")
        if view == "affinitygroups":
            return {"ok": True, "result": hived_inspect.affinity_groups(self)}
        if view == "clusterstatus":
            return {"ok": True, "result": hived_inspect.cluster_status(self)}
        if view == "physicalcluster":
            return {"ok": True, "result": hived_inspect.physical_cluster(self)}
        if view == "virtualclusters":
            return {"ok": True, "result": hived_inspect.virtual_clusters(self)}
        name = _str(cmd, "name")
        if view == "virtualcluster":
            if name not in self.cluster.vc_scopes:
                raise NotFound(f"VC {name} does not exist")
            return {"ok": True, "result": hived_inspect.virtual_cluster(self, name)}
        g = self.groups.get(name)
        if g is not None:
            return {"ok": True, "result": hived_inspect.affinity_group(g)}
        p = self.preemptors.get(name)
        if p is not None:
            return {"ok": True, "result": hived_inspect.preempting_group(p)}
        e = self.pending_by_name.get(name)
        if e is not None:
            return {"ok": True, "result": hived_inspect.pending_group(e, self.pending.index(e))}
        raise NotFound(f"affinity group {name} does not exist")

    # -- Python-side conveniences (tests, invariants, tools) ---------------------------------

    def group(self, name: str) -> Group | None:
        return self.groups.get(name)

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        """``ask("vc_status", vc="vc1")``: a read-only query by keywords."""
        return self.query({"op": op, **fields})


def _bound_below(r: VCell) -> list[VCell]:
    """Bound virtual cells under ``r`` (not ``r``), in config order."""
    out = []
    stack = [ch for ch in r.children if ch.pcell is not None]
    while stack:
        x = stack.pop()
        out.append(x)
        stack.extend(ch for ch in x.children if ch.pcell is not None)
    return sorted(out, key=lambda x: x.id)


def _chain_fits(chain: PChain, kmax: int, total: int) -> bool:
    info = chain.info
    return info.leaves_per_level[info.node_level - 1] >= kmax and len(chain.tops) * info.leaves_per_level[-1] >= total


_HANDLERS: dict[str, Callable[[SchedulerStateMachine, dict[str, Any]], dict[str, Any]]] = {
    "allocate": SchedulerStateMachine._cmd_allocate,
    "release": SchedulerStateMachine._cmd_release,
    "set_node_health": SchedulerStateMachine._cmd_set_node_health,
    "reconfigure": SchedulerStateMachine._cmd_reconfigure,
    "lease_grant": SchedulerStateMachine._cmd_lease_grant,
    "lease_renew": SchedulerStateMachine._cmd_lease_renew,
    "lease_expire": SchedulerStateMachine._cmd_lease_expire,
    "cluster_status": SchedulerStateMachine._cmd_cluster_status,
    "vc_status": SchedulerStateMachine._cmd_vc_status,
    "group_status": SchedulerStateMachine._cmd_group_status,
    "list_groups": SchedulerStateMachine._cmd_list_groups,
    "inspect": SchedulerStateMachine._cmd_inspect,
}

from scheduler_state import pods as _pods  # noqa: E402 - pod-level commands use the classes above

_HANDLERS.update(_pods.HANDLERS)

__all__ = ["SchedulerStateMachine", "CommandError", "NotFound", "Group", "Pod", "Pending", "READ_OPS",
           "SCHEDULER_KEY"]
