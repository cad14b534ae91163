"""Invariants of a ``SchedulerStateMachine``, recomputed from scratch.

``check(machine) -> list[str]``: an empty list means every invariant holds; otherwise each
string names one violation. It never changes the machine and is meant to run after every
step of randomized tests and on every replica of a replicated run (``jepsen_like`` calls
it on the state each replica restores from its snapshot).

Checked:

1. **No leaf held twice**: every physical leaf is in at most one group's placement, and
   its ``user`` field agrees; pods of one group never share a leaf either.
2. **Guaranteed groups stay in their VC**: each leaf of a guaranteed group is bound to a
   virtual leaf of the group's VC (and of its pinned cell, if it named one), used by that
   group at its priority; bindings are mutual and follow the trees (a bound virtual
   cell's parent is bound to the physical cell's parent, same level and type).
3. **Quota**: per VC and scope, guaranteed leaves in use never exceed the scope's quota;
   only the VC's own preassigned cells are bound on its behalf.
4. **Buddy accounting**: the free lists hold exactly the maximal physical cells that no
   bound preassigned cell touches; their keys and every counter (free, used,
   opportunistic, bad, available, unpinned), every index and each scope's counts of
   unbound and unused preassigned cells per level match a recount.
5. **VC safety**: the free lists can serve all unbound preassigned cells at once, so no
   VC's guaranteed requests can be blocked by others (checked per chain and level).
6. **Pods** (``pods.py``): every tracked pod is in exactly one place -- one slot of an
   allocated group (Binding or Bound, on a pod that was not released) or one Preempting
   group's pod list -- and the UID index agrees; a pod-tracked group has one slot per
   pod. A Preempting group is neither allocated nor pending, has at least one pod and
   at least one victim; its victims are exactly the allocated groups marked Being
   preempted by it (so a group is the victim of one preemptor at a time), and each
   victim holds some of the cells the Preempting group's plan will use.
   **Reservations**: the cells reserved for a Preempting group are used by its
   reservation alone, at its priority, bound to planned virtual leaves of its VC, and
   never overlap another group's allocation (no leaf held twice, rule 1); its
   reserved cells plus its victims' cells are exactly its plan (every planned
   device, physical and virtual leaf, is reserved or held by one of its victims; an
   opportunistic victim's leaf may be bound only to a virtual leaf reserved by its
   preemptor). A group's kept bind info YAML (``Group.bind_yaml``, derived) is that of
   its pods' placements.
7. **Virtual-cell health** (``health.py``, HiveD's doomed bad cells): every virtual cell
   bound with no leaf in use below it (other than a pinned cell) is a health binding,
   and every health binding is to a bad physical cell (doomed-bad bindings only to bad
   cells); a bad node cell under a bound cell is bound; per chain, level and VC the
   doomed rule is at its fixpoint: no VC has doomed cells while its unbound cells are
   fewer than the healthy free cells, and none has more unbound cells than healthy free
   cells while a bad free cell could be doomed without breaking VC safety.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler_state.cells import (
    FREE_PRIORITY,
    ID_BITS,
    ID_MASK,
    OPPORTUNISTIC_PRIORITY,
    PCell,
    VCell,
    ckey,
    safety_shortfall,
)

from scheduler_state import health as _health

if TYPE_CHECKING:
    from scheduler_state.machine import SchedulerStateMachine

ERRORS_MAX = 50  # enough to diagnose; a broken state would otherwise list thousands


def check(machine: SchedulerStateMachine) -> list[str]:
    out: list[str] = []
    try:
        _check(machine, out)
    except _Enough:
        pass
    return out


class _Enough(Exception):
    pass


def _err(out: list[str], msg: str) -> None:
    out.append(msg)
    if len(out) >= ERRORS_MAX:
        raise _Enough


def _check(m: SchedulerStateMachine, out: list[str]) -> None:
    cl = m.cluster
    # 1 + 2: placements.
    holder: dict[int, str] = {}
    vholder: dict[int, str] = {}
    for name in sorted(m.groups):
        g = m.groups[name]
        if g.name != name:
            _err(out, f"group registered as {name} is named {g.name}")
        for pi, pod in enumerate(g.pods):
            if len(pod.pleaves) != len(pod.devices):
                _err(out, f"group {name} pod {pi}: {len(pod.pleaves)} cells for {len(pod.devices)} devices")
            if pod.vleaves is not None and len(pod.vleaves) != len(pod.pleaves):
                _err(out, f"group {name} pod {pi}: virtual and physical placements differ in length")
            nodes = {node for node, _, _ in pod.devices}
            if len(nodes) > 1:
                _err(out, f"group {name} pod {pi} spans nodes {sorted(nodes)}")
            for i, p in enumerate(pod.pleaves):
                if p is None:
                    continue
                node, idx, _ = pod.devices[i]
                if p.level != 1 or p.node != node or p.leaf_index != idx:
                    _err(out, f"group {name} pod {pi}: cell {p.addr} is not device {node}/{idx}")
                if p.id in holder:
                    _err(out, f"leaf {p.addr} held by both {holder[p.id]} and {name}")
                holder[p.id] = name
                if p.user is not g:
                    _err(out, f"leaf {p.addr} is in {name}'s placement but its user is {p.user!r}")
                if p.prio != g.cell_priority:
                    _err(out, f"leaf {p.addr} has priority {p.prio}, group {name} {g.cell_priority}")
                v = pod.vleaves[i] if pod.vleaves is not None else None
                if g.opportunistic:
                    if v is not None:
                        _err(out, f"opportunistic group {name} holds virtual leaf {v.addr}")
                    if p.vcell is not None and (p.vcell.user is None or p.vcell.user.reserving is None or
                                                g.preempted_by != p.vcell.user.name):
                        # (bound only to a virtual leaf reserved by the group preempting it)
                        _err(out, f"leaf {p.addr} of opportunistic group {name} is bound to {p.vcell.addr}")
                    continue
                if v is None:
                    _err(out, f"guaranteed group {name} holds {p.addr} without a virtual cell")
                    continue
                if v.vc != g.req.vc:
                    _err(out, f"group {name} of VC {g.req.vc} uses virtual cell {v.addr} of VC {v.vc}")
                if (v.scope.pinned_id or None) != (g.req.pinned_id or None):
                    _err(out, f"group {name} (pinned {g.req.pinned_id}) uses {v.addr} of scope {v.scope.key}")
                if v.pcell is not p or p.vcell is not v:
                    _err(out, f"group {name}: {v.addr} and {p.addr} are not bound to each other")
                if v.user is not g or v.prio != g.priority:
                    _err(out, f"virtual leaf {v.addr} user/priority disagree with group {name}")
                if v.id in vholder:
                    _err(out, f"virtual leaf {v.addr} held by both {vholder[v.id]} and {name}")
                vholder[v.id] = name
    _check_holds(m, holder, vholder, out)
    for p in cl.pcells:
        if p.level == 1 and p.user is not None and p.id not in holder:
            _err(out, f"leaf {p.addr} has user {p.user.name} but is in no group's placement")
        if p.level == 1 and p.user is None and p.prio != FREE_PRIORITY:
            _err(out, f"free leaf {p.addr} has priority {p.prio}")
    for v in cl.vcells:
        if v.level == 1 and v.user is not None and v.id not in vholder:
            _err(out, f"virtual leaf {v.addr} has user {v.user.name} but is in no placement")
    # 2: bindings follow the trees; 3: quota.
    for v in cl.vcells:
        p = v.pcell
        if p is None:
            continue
        if p.vcell is not v:
            _err(out, f"{v.addr} -> {p.addr} but {p.addr} -> {p.vcell!r}")
        if p.level != v.level or p.ctype != v.ctype or p.chain is not v.scope.chain:
            _err(out, f"{v.addr} ({v.ctype}) bound to {p.addr} ({p.ctype}) of another level or chain")
        if v.parent is not None and (v.parent.pcell is None or v.parent.pcell is not p.parent):
            _err(out, f"{v.addr} bound to {p.addr} but its parent is not bound to {p.addr}'s parent")
        pinned_root = v.parent is None and v.scope.pinned_id is not None
        if not pinned_root and v.free == v.leaves and (v not in cl.hbound or not p.bad):
            _err(out, f"{v.addr} is bound to {p.addr} with no used leaf below it (and is no health binding "
                      f"to a bad cell)")
        if pinned_root and cl.pinned_cells.get(v.scope.pinned_id) is not p:  # type: ignore[arg-type]
            _err(out, f"pinned cell {v.scope.pinned_id} bound to {p.addr}")
    for p in cl.pcells:
        if p.vcell is not None and p.vcell.pcell is not p:
            _err(out, f"{p.addr} -> {p.vcell.addr} is not mutual")
    for vc in sorted(cl.vc_scopes):
        for scope in cl.scopes_of(vc):
            used = sum(r.leaves - r.free for r in scope.roots)
            if used > scope.leaves:
                _err(out, f"VC {vc} scope {scope.key} uses {used} leaves over its quota {scope.leaves}")
            if scope.free != scope.leaves - used:
                _err(out, f"scope {scope.key}: free counter {scope.free}, recount {scope.leaves - used}")
    # 4: counters, indexes and free lists.
    _check_counters(m, out)
    # 6: pods and preemption states.
    _check_pods(m, out)
    # 7: health bindings and doomed bad cells (health.py).
    for msg in _health.violations(cl):
        _err(out, msg)
    for name, chain in cl.chains.items():
        expect: list[PCell] = []
        for top in chain.tops:
            _maximal_free(top, expect)
        want = sorted((c.level, c.id) for c in expect)
        have = sorted((lvl, key & ID_MASK) for lvl in range(1, chain.info.top_level + 1)
                      for key in chain.free[lvl].keys)
        if want != have:
            _err(out, f"chain {name}: free lists {have[:8]}... differ from maximal unbound cells {want[:8]}...")
        for lvl in range(1, chain.info.top_level + 1):
            keys = chain.free[lvl].keys
            if keys != sorted(keys):
                _err(out, f"chain {name}: free list at level {lvl} is not sorted")
            for key in keys:
                c = cl.pcells[key & ID_MASK]
                if not c.in_free or c.fkey != key or key >> ID_BITS != c.opp or c.level != lvl:
                    _err(out, f"chain {name}: free-list entry {(key >> ID_BITS, key & ID_MASK)} disagrees with "
                              f"cell {c.addr}")
        demand = [0] * (chain.info.top_level + 1)
        for vc in cl.vc_scopes:
            scope = cl.vc_scopes[vc].get(name)
            if scope is not None:
                for r in scope.roots:
                    if r.pcell is None:
                        demand[r.level] += 1
        if demand != chain.demand:
            _err(out, f"chain {name}: unbound preassigned cells {demand[1:]}, counter says {chain.demand[1:]}")
        # 5: VC safety.
        short = safety_shortfall(chain, demand)
        if short is not None:
            _err(out, f"VC safety broken: {short}")


def _check_holds(m: SchedulerStateMachine, holder: dict[int, str], vholder: dict[int, str], out: list[str]) -> None:
    """Rule 6, reservations: the cells reserved for a Preempting group (``hold``) are
    used by it alone, at its priority, in its VC; with its victims' cells they are
    exactly its plan (each planned device either reserved or a victim's)."""
    cl = m.cluster
    for pname in sorted(getattr(m, "preemptors", {})):
        pre = m.preemptors[pname]
        hold = pre.hold
        if hold.reserving is not pre or hold.name != pname or hold.priority != pre.req.priority:
            _err(out, f"preempting group {pname}: its reservation is not its own")
        if pname in m.groups and m.groups[pname] is hold:
            _err(out, f"preempting group {pname}: its reservation is registered as an allocated group")
        if len(hold.pods) != len(pre.plan) or len(pre.vplan) != len(pre.plan):
            _err(out, f"preempting group {pname}: plan, virtual plan and reservation differ in shape")
            continue
        victims = set(pre.victims)
        for i, (pod, vrow, prow) in enumerate(zip(hold.pods, pre.vplan, pre.plan)):
            if len(vrow) != len(prow) or len(pod.pleaves) != len(prow) or len(pod.vleaves) != len(prow):
                _err(out, f"preempting group {pname} pod {i}: plan rows differ in length")
                continue
            for j, (v, dev) in enumerate(zip(vrow, prow)):
                c = cl.leaf_by_device.get(dev)
                rp, rv = pod.pleaves[j], pod.vleaves[j]
                if c is None or v.level != 1 or v.vc != pre.req.vc or (
                        (v.scope.pinned_id or None) != (pre.req.pinned_id or None)):
                    _err(out, f"preempting group {pname}: planned device {dev} / {v.addr} is not a leaf of its VC")
                    continue
                if pod.devices[j][:2] != dev:
                    _err(out, f"preempting group {pname}: reservation device {pod.devices[j]} is not planned {dev}")
                if rp is not None and rp is not c:
                    _err(out, f"preempting group {pname}: reserved {rp.addr} is not planned device {dev}")
                if rv is not None and rv is not v:
                    _err(out, f"preempting group {pname}: reserved {rv.addr} is not planned {v.addr}")
                if rp is not None and rv is None:
                    _err(out, f"preempting group {pname}: {c.addr} reserved without its virtual leaf")
                if rv is not None:
                    if v.user is not hold or v.prio != hold.priority or v.pcell is not c or c.vcell is not v:
                        _err(out, f"preempting group {pname}: reserved {v.addr} is not its own, bound to {c.addr}")
                    if v.id in vholder:
                        _err(out, f"virtual leaf {v.addr} held by both {vholder[v.id]} and {pname} (reserved)")
                    vholder[v.id] = pname
                elif v.user is None or v.user.name not in victims or v.pcell is not c:
                    _err(out, f"preempting group {pname}: planned {v.addr} is neither reserved nor its victim's "
                              f"(bound to {c.addr})")
                if rp is not None:
                    if c.user is not hold or c.prio != hold.priority:
                        _err(out, f"preempting group {pname}: reserved leaf {c.addr} is used by {c.user!r}")
                    if c.id in holder:  # reserved cells never overlap another group's allocation
                        _err(out, f"leaf {c.addr} held by both {holder[c.id]} and {pname} (reserved)")
                    holder[c.id] = pname
                elif c.user is None or c.user.name not in victims:
                    _err(out, f"preempting group {pname}: planned leaf {c.addr} is neither reserved nor held by "
                              f"one of its victims ({c.user!r})")


def _maximal_free(top: PCell, out: list[PCell]) -> None:
    """Collect the maximal cells under ``top`` that no bound preassigned cell touches."""
    holds: dict[int, bool] = {}

    def has_root(c: PCell) -> bool:
        r = c.vcell is not None and c.vcell.parent is None
        for ch in c.children:
            r = has_root(ch) or r
        holds[c.id] = r
        return r

    def collect(c: PCell) -> None:
        if c.vcell is not None and c.vcell.parent is None:
            return  # a bound preassigned cell: reserved whole
        if not holds[c.id]:
            out.append(c)
            return
        for ch in c.children:
            collect(ch)

    has_root(top)
    collect(top)


def _check_counters(m: SchedulerStateMachine, out: list[str]) -> None:
    cl = m.cluster

    def prec(c: PCell) -> tuple[int, int, int, int, int]:
        if c.level == 1:
            used = 1 if c.user is not None else 0
            opp = 1 if used and c.prio == OPPORTUNISTIC_PRIORITY else 0
            bad = 1 if c.node in cl.bad_nodes else 0
            avail = 1 if not used and not bad and not c.in_pinned else 0
            r = (used, opp, bad, avail, 0 if c.in_pinned else 1)
        else:
            sums = [prec(ch) for ch in c.children]
            r = tuple(sum(x[i] for x in sums) for i in range(5))  # type: ignore[assignment]
        if (c.used, c.opp, c.bad, c.oavail, c.unpinned) != r:
            _err(out, f"{c.addr}: counters (used, opp, bad, avail, unpinned) "
                      f"{(c.used, c.opp, c.bad, c.oavail, c.unpinned)}, recount {r}")
        return r

    def vrec(c: VCell) -> int:
        free = (1 if c.user is None else 0) if c.level == 1 else sum(vrec(ch) for ch in c.children)
        if c.free != free:
            _err(out, f"{c.addr}: free counter {c.free}, recount {free}")
        return free

    for chain in cl.chains.values():
        for top in chain.tops:
            prec(top)
        # (reading an index brings it up to date: CountIndex re-keys on read)
        want = sorted(ckey(c.oavail, c.id) for c in chain.tops)
        if chain.root_index.sorted_keys() != want or sorted(chain.root_index.at.values()) != want:
            _err(out, f"chain {chain.info.name}: top-cell index out of date")
        want = sorted(ckey(c.oavail, c.id) for c in chain.nodes)
        if chain.node_index.sorted_keys() != want or sorted(chain.node_index.at.values()) != want:
            _err(out, f"chain {chain.info.name}: node index out of date")
    for vc in sorted(cl.vc_scopes):
        for scope in cl.scopes_of(vc):
            for r in scope.roots:
                vrec(r)
            unbound = [0] * len(scope.unbound)
            unused = [0] * len(scope.unused)
            for r in scope.roots:
                unbound[r.level] += r.pcell is None
                unused[r.level] += r.free == r.leaves
            if (unbound, unused) != (scope.unbound, scope.unused):
                _err(out, f"scope {scope.key}: roots unbound per level {unbound[1:]}, unused {unused[1:]}; "
                          f"counters say {scope.unbound[1:]}, {scope.unused[1:]}")
            want = sorted(ckey(r.free, r.id) for r in scope.roots)
            if scope.root_index.sorted_keys() != want or sorted(scope.root_index.at.values()) != want:
                _err(out, f"scope {scope.key}: root index out of date")
            want = sorted(ckey(n.free, n.id) for n in scope.nodes)
            if scope.node_index.sorted_keys() != want or sorted(scope.node_index.at.values()) != want:
                _err(out, f"scope {scope.key}: node index out of date")


def _check_pods(m: SchedulerStateMachine, out: list[str]) -> None:
    refs = getattr(m, "pod_refs", {})
    preemptors = getattr(m, "preemptors", {})
    seen = 0
    for name in sorted(m.groups):
        g = m.groups[name]
        if g.slots is not None:
            if len(g.slots) != len(g.pods):
                _err(out, f"group {name}: {len(g.slots)} pod slots for {len(g.pods)} pods")
            for i, ref in enumerate(g.slots):
                if ref is None:
                    continue
                seen += 1
                if refs.get(ref.uid) is not ref:
                    _err(out, f"group {name} slot {i}: pod {ref.uid} is not indexed by its UID")
                if ref.group != name or ref.slot != i:
                    _err(out, f"group {name} slot {i}: pod {ref.uid} says group {ref.group} slot {ref.slot}")
                if ref.state not in ("Binding", "Bound"):
                    _err(out, f"group {name} slot {i}: pod {ref.uid} in state {ref.state}")
                if i < len(g.pods) and g.pods[i].released:
                    _err(out, f"group {name} slot {i}: pod {ref.uid} holds a released pod slot")
        if getattr(g, "bind_yaml", None) is not None:
            from scheduler_state.pods import _members_lines, bind_info

            if g.bind_yaml != _members_lines(bind_info(g, 0)["affinityGroupBindInfo"]):
                _err(out, f"group {name}: its kept bind info YAML differs from its pods' placements")
        if g.preempted_by is not None:
            p = preemptors.get(g.preempted_by)
            if p is None or name not in p.victims:
                _err(out, f"group {name} is being preempted by {g.preempted_by}, which does not list it")
    for pname in sorted(preemptors):
        p = preemptors[pname]
        if p.name != pname:
            _err(out, f"preemptor registered as {pname} is named {p.name}")
        if pname in m.groups or pname in m.pending_by_name:
            _err(out, f"preempting group {pname} is also allocated or pending")
        if not p.pods:
            _err(out, f"preempting group {pname} has no pod")
        if not p.victims:
            _err(out, f"preempting group {pname} has no victim left (it should have been placed)")
        planned = {d for row in p.plan for d in row}
        for v in p.victims:
            if v not in m.groups or m.groups[v].preempted_by != pname:
                _err(out, f"victim {v} of preempting group {pname} is gone or not marked by it")
                continue
            # the reservation is the victims' cells it will use: each victim holds some
            held = {(node, idx) for pod in m.groups[v].pods for (node, idx, _), c in zip(pod.devices, pod.pleaves)
                    if c is not None}
            if not held & planned:
                _err(out, f"victim {v} of preempting group {pname} holds none of its planned cells")
        for ref in p.pods:
            seen += 1
            if refs.get(ref.uid) is not ref or ref.group != pname or ref.state != "Preempting":
                _err(out, f"preempting group {pname}: pod {ref.uid} record disagrees ({ref.group}, {ref.state})")
    if seen != len(refs):
        _err(out, f"{len(refs)} pods indexed by UID, {seen} found in groups and preemptors")
