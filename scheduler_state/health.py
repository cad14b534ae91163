"""Virtual-cell health: HiveD's doomed bad cells, as a reconciliation after each command.

HiveD (``pkg/algorithm/hived_algorithm.go``, the comments on ``badFreeCells``,
``vcDoomedBadCells`` and ``tryBindDoomedBadCell`` / ``tryUnbindDoomedBadCell``; the
feature README's *Bad Hardware Awareness* only says "avoid scheduling pods to bad
hardware"):

- A cell is bad if ANY of its leaves is on a bad node (here ``PCell.bad > 0``).
- "A preassigned cell in a VC is 'doomed to be bad' when the healthy free cells in the
  physical cluster is fewer than the VC's free cells (thus certain free cells in the VC
  will be inevitably bound to bad physical cells at this moment despite the dynamic
  cell binding)." Per chain, level and VC: while the VC's unbound preassigned cells of
  that level outnumber the healthy free cells of that level (free, or obtainable by
  splitting a free ancestor), one of them is bound to a bad free cell of that level --
  a *doomed bad* binding. It is unbound when the VC's unbound cells become fewer than
  the healthy free cells (HiveD's release condition), or at once when its physical
  cell is healthy again.
- "Marking doomed bad cells can help the intra-VC scheduler avoid finding placements
  that will be inevitably mapped to bad physical nodes": the bad parts of a bound cell
  are bound too (HiveD's ``setBadCell`` / ``allocateBadCell``: a bad physical cell
  under a bound one is bound to an unbound virtual child), so placement skips them;
  healthy parts stay usable.

Here these *health bindings* are kept in ``Cluster.hbound`` (virtual cells bound with no
leaf in use below them) and reconciled by :func:`reconcile` at the end of every
mutating command (and before a node's return is acted upon and before the pending
queue is retried), so the rules hold at every command boundary and a decision depends
on the logical state only. Deliberate choices where HiveD's are incidental: which bad
cell a VC is doomed to (most bad leaves first, then config order; HiveD takes the
first of a list in event order), which doomed cell is released first (config order),
levels top-down and VCs in name order; and a doomed binding that would split a free
cell other VCs' unbound cells still need is not made (HiveD makes it and logs "broken
safety"): VC safety (invariant 5) holds at all times.
"""

from __future__ import annotations

from scheduler_state.cells import Cluster, PCell, PChain, VCell, VScope, counts_shortfall

PASSES_MAX = 8  # a pass that changes nothing ends the loop long before


def is_doomed(r: VCell) -> bool:
    """A preassigned cell bound with no leaf in use: only a doomed bad binding is so."""
    return r.parent is None and r.pcell is not None and r.free == r.leaves and r.scope.pinned_id is None


def reconcile(cl: Cluster) -> bool:
    """Bring health bindings to HiveD's rules; True if anything changed."""
    if not cl.bad_nodes and not cl.hbound:
        return False
    changed = False
    for _ in range(PASSES_MAX):
        if not _pass(cl):
            break
        changed = True
    return changed


def _pass(cl: Cluster) -> bool:
    changed = False
    # (a) bindings whose physical cell is healthy again go, lowest level first; one
    # with a leaf in use below (or bound children) is an ordinary binding now.
    for v in sorted(cl.hbound, key=lambda v: (v.level, v.id)):
        if v not in cl.hbound:
            continue
        p = v.pcell
        if p is None:
            del cl.hbound[v]
            continue
        if p.bad:
            continue
        if v.free < v.leaves or any(ch.pcell is not None for ch in v.children):
            del cl.hbound[v]
            continue
        _unbind_unused(cl, v)
        changed = True
    # (b) a preassigned cell left bound, unused, by its bad children is doomed-like.
    for v in list(cl.hbound):
        r = v.root
        if r not in cl.hbound and is_doomed(r):
            cl.hbound[r] = None
    # (c) bad node cells under a bound cell are bound (HiveD's setBadCell).
    for node in sorted(cl.bad_nodes):
        for n in _node_cells(cl, node):
            if n.vcell is not None or n.in_free:
                continue
            path = [n]
            a = n.parent
            while a is not None and a.vcell is None and not a.in_free:
                path.append(a)
                a = a.parent
            if a is None or a.vcell is None:
                continue
            va = a.vcell
            for pc in reversed(path):
                vch = next(ch for ch in va.children if ch.pcell is None)
                cl.health_bind(vch, pc)
                va = vch
            changed = True
    # (d) doomed bad cells, per chain, level (top-down) and VC (by name).
    for chain in cl.chains.values():
        if _doom_chain(cl, chain):
            changed = True
    return changed


def _node_cells(cl: Cluster, node: str) -> list[PCell]:
    """The node-level cells of ``node`` (one per chain it carries), in config order;
    static, so cached."""
    key = "node:" + node
    hit = cl.bad_cache.get(key)
    if hit is None:
        hit = cl.bad_cache[key] = (0, _node_cells_of(cl, node))
    return hit[1]


def _node_cells_of(cl: Cluster, node: str) -> list[PCell]:
    out: dict[int, PCell] = {}
    for leaf in cl.node_leaves.get(node, ()):
        c: PCell | None = leaf
        while c is not None and not c.nodeish:
            c = c.parent
        if c is not None:
            out[c.id] = c
    return [out[k] for k in sorted(out)]


def _unbind_unused(cl: Cluster, v: VCell) -> None:
    """Unbind ``v`` and then its ancestors left bound with nothing below them."""
    cl.health_unbind(v)
    x = v.parent
    while x is not None and x.pcell is not None and x.free == x.leaves \
            and not any(ch.pcell is not None for ch in x.children) \
            and not (x.parent is None and x.scope.pinned_id is not None):
        cl.health_unbind(x)
        x = x.parent


def chain_scopes(cl: Cluster, chain: PChain) -> list[VScope]:
    name = chain.info.name
    return [cl.vc_scopes[vc][name] for vc in sorted(cl.vc_scopes) if name in cl.vc_scopes[vc]]


def bad_cells(cl: Cluster, chain: PChain) -> list[list[PCell]]:
    """Cells of ``chain`` with a bad leaf, per level, in config order (cached until the
    set of bad nodes changes: ``Cluster.bad_version``)."""
    hit = cl.bad_cache.get(chain.info.name)
    if hit is not None and hit[0] == cl.bad_version:
        return hit[1]
    out = _bad_cells(cl, chain)
    cl.bad_cache[chain.info.name] = (cl.bad_version, out)
    return out


def _bad_cells(cl: Cluster, chain: PChain) -> list[list[PCell]]:
    top = chain.info.top_level
    out: list[list[PCell]] = [[] for _ in range(top + 1)]
    seen: set[int] = set()
    for node in sorted(cl.bad_nodes):
        for leaf in cl.node_leaves.get(node, ()):
            if leaf.chain is not chain:
                continue
            c: PCell | None = leaf
            while c is not None and c.id not in seen:
                seen.add(c.id)
                out[c.level].append(c)
                c = c.parent
    for cells in out:
        cells.sort(key=lambda c: c.id)
    return out


def total_left(chain: PChain, lvl: int) -> int:
    """Cells of level ``lvl`` free or obtainable by splitting a free ancestor (HiveD's
    totalLeftCellNum)."""
    per = chain.info.leaves_per_level
    free = chain.free
    total = 0
    for big in range(lvl, len(free)):  # levels lvl .. top
        total += len(free[big].keys) * (per[big - 1] // per[lvl - 1])
    return total


def healthy_left(cl: Cluster, chain: PChain, lvl: int, bad: list[list[PCell]]) -> int:
    """Healthy cells of level ``lvl`` that are free or obtainable by splitting a free
    ancestor (HiveD's totalLeftCellNum - len(badFreeCells))."""
    return total_left(chain, lvl) - sum(1 for c in bad[lvl] if cl.free_ancestor(c) is not None)


def doom_candidate(cl: Cluster, chain: PChain, lvl: int, bad: list[list[PCell]]) -> PCell | None:
    """A bad free (or obtainable) cell of level ``lvl`` whose taking keeps VC safety:
    most bad leaves first, then config order."""
    info = chain.info
    for c in sorted(bad[lvl], key=lambda c: (-c.bad, c.id)):
        a = cl.free_ancestor(c)
        if a is None:
            continue
        counts = [len(k) for k in chain.free]
        counts[a.level] -= 1
        for x in range(a.level - 1, lvl - 1, -1):
            counts[x] += info.child_numbers[x] - 1
        demand = list(chain.demand)
        demand[lvl] -= 1
        if counts_shortfall(info, counts, demand) is None:
            return c
    return None


def _doom_chain(cl: Cluster, chain: PChain) -> bool:
    doomed_levels = {v.level for v in cl.hbound if is_doomed(v) and v.scope.chain is chain}
    if not doomed_levels and not any(t.bad for t in chain.tops):
        return False
    scopes = chain_scopes(cl, chain)
    if not scopes:
        return False
    bad = bad_cells(cl, chain)
    changed = False
    for lvl in range(chain.info.top_level, 0, -1):
        # No VC has more unbound cells of this level than all VCs together (the chain's
        # demand): with no doomed cell here and demand within the healthy free cells,
        # the rule has nothing to do at this level.
        if lvl not in doomed_levels and (not chain.demand[lvl]  # (then healthy >= 0 = demand below)
                                         or chain.demand[lvl] <= total_left(chain, lvl) - len(bad[lvl])):
            continue
        # healthy free cells of this level: they change only when a doomed binding is
        # made or released below, so they are counted again only then
        healthy = healthy_left(cl, chain, lvl, bad)
        if lvl not in doomed_levels and chain.demand[lvl] <= healthy:
            continue
        for scope in scopes:
            roots = roots_at(scope, lvl)
            if not roots:
                continue
            while True:
                # the scope's counters say how many roots are unbound, and whether any
                # bound one is unused (doomed): then only are the roots listed
                unbound = scope.unbound[lvl]
                doomed = [r for r in roots if is_doomed(r)] if scope.unused[lvl] > unbound else []
                rel = next((r for r in doomed if not r.pcell.bad), None)  # type: ignore[union-attr]
                if rel is None and doomed and unbound < healthy:
                    rel = doomed[0]
                if rel is not None:
                    release_doomed(cl, rel)
                    changed = True
                    healthy = healthy_left(cl, chain, lvl, bad)
                    continue
                if unbound > healthy:
                    cand = doom_candidate(cl, chain, lvl, bad)
                    if cand is None:
                        break
                    doom(cl, next(r for r in roots if r.pcell is None), cand)
                    changed = True
                    healthy = healthy_left(cl, chain, lvl, bad)
                    continue
                break
    return changed


def roots_at(scope: VScope, lvl: int) -> list[VCell]:
    """The scope's preassigned cells of level ``lvl``, in config order (static)."""
    by_level = scope.by_level
    if by_level is None:
        by_level = scope.by_level = {}
        for r in scope.roots:
            by_level.setdefault(r.level, []).append(r)
    return by_level.get(lvl, [])


def doom(cl: Cluster, r: VCell, p: PCell) -> None:
    """Bind the unbound preassigned cell ``r`` to the bad free cell ``p``, and its bad
    parts down to the node level."""
    cl.health_bind(r, p)
    _bind_bad_below(cl, r, p)


def _bind_bad_below(cl: Cluster, v: VCell, p: PCell) -> None:
    if p.level <= p.chain.info.node_level:
        return
    for pc in p.children:
        if pc.bad and pc.vcell is None:
            vch = next(ch for ch in v.children if ch.pcell is None)
            cl.health_bind(vch, pc)
            _bind_bad_below(cl, vch, pc)


def release_doomed(cl: Cluster, r: VCell) -> None:
    """Unbind a doomed preassigned cell and everything bound below it (all unused)."""
    below: list[VCell] = []
    stack = [ch for ch in r.children if ch.pcell is not None]
    while stack:
        x = stack.pop()
        below.append(x)
        stack.extend(ch for ch in x.children if ch.pcell is not None)
    for x in sorted(below, key=lambda x: (x.level, x.id)):
        cl.health_unbind(x)
    cl.health_unbind(r)


def cell_health(v: VCell) -> str:
    """``healthy``, ``bad`` (bound to a physical cell with a bad leaf) or ``doomed-bad``
    (a preassigned cell doomed to a bad physical cell)."""
    p = v.pcell
    if p is None or not p.bad:
        return "healthy"
    return "doomed-bad" if is_doomed(v) else "bad"


def violations(cl: Cluster) -> list[str]:
    """What the invariant checker asks of health bindings (``invariants.py`` rule 7)."""
    out: list[str] = []
    for v in sorted(cl.hbound, key=lambda v: v.id):
        if v.pcell is None or not v.pcell.bad:
            out.append(f"health binding {v.addr} -> {v.pcell.addr if v.pcell else None} is not to a bad cell")
    for v in cl.vcells:
        p = v.pcell
        if p is None or (v.parent is None and v.scope.pinned_id is not None):
            continue
        if v.free == v.leaves and v not in cl.hbound:
            out.append(f"{v.addr} is bound to {p.addr} with no used leaf below it and is no health binding")
    for node in sorted(cl.bad_nodes):
        for n in _node_cells(cl, node):
            if n.vcell is None and not n.in_free and cl.free_ancestor(n) is None:
                a = n.parent
                while a is not None and a.vcell is None:
                    a = a.parent
                if a is not None:
                    out.append(f"bad node cell {n.addr} under bound {a.addr} is not bound")
    for chain in cl.chains.values():
        bad = bad_cells(cl, chain)
        for lvl in range(chain.info.top_level, 0, -1):
            healthy = healthy_left(cl, chain, lvl, bad)
            cand = None
            for scope in chain_scopes(cl, chain):
                roots = roots_at(scope, lvl)
                unbound = sum(1 for r in roots if r.pcell is None)
                doomed = [r for r in roots if is_doomed(r)]
                if doomed and unbound < healthy:
                    out.append(f"VC {scope.vc}: {len(doomed)} doomed {chain.info.types[lvl - 1]} cells but only "
                               f"{unbound} unbound for {healthy} healthy free cells")
                if unbound > healthy:
                    if cand is None:
                        cand = doom_candidate(cl, chain, lvl, bad) or False
                    if cand:
                        out.append(f"VC {scope.vc}: {unbound} unbound {chain.info.types[lvl - 1]} cells for "
                                   f"{healthy} healthy free cells, and {cand.addr} could be doomed")
    return out
