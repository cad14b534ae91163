"""Placement: which leaf cells a group gets, and which physical cells back them.

Two pure searches (they read the cluster and write only their own scratch state):

- :class:`Placer` picks leaf cells for a group's pods inside one scope: a VC's virtual
  cells of one chain or one pinned cell (guaranteed groups), or a chain's physical cells
  (opportunistic groups). It is HiveD's topology-aware scheduler in spirit: *nearest
  leaf cells first*. It looks for the lowest cell that can hold the whole group (best fit:
  the candidate with the fewest available leaves that still suffices, ties by id), goes
  down while one child suffices, and only spreads pods over several nodes when no single
  node can hold them all (first-fit-decreasing, best-fit node per pod). Inside a node a
  pod takes the lowest sub-cell that holds it, so two 1-leaf pods of one group land on
  buddy leaves (the feature README's buddy example). Each pod stays inside one node.
- :class:`MapPlan` maps chosen virtual leaves to physical leaves (HiveD's
  ``mapVirtualPlacementToPhysical``): a bound virtual cell keeps its physical cell; an
  unbound preassigned cell gets one by buddy allocation from the lowest non-empty free
  level at or above its own (split on demand, which is what keeps every VC's quota
  satisfiable; a higher level only when the lowest offers only bad or non-suggested
  cells and VC safety still holds: HiveD's safe relaxed split); an unbound inner cell
  gets an unbound physical child of
  its parent's physical cell, so topology inside a preassigned cell is preserved. Among
  candidates it prefers healthy, suggested, fewest opportunistic users, lowest id.

Availability ("count") depends on the mode: free leaves (no preemption), leaves free or
used at a lower priority in the VC (preemption), or free healthy unpinned physical leaves
(opportunistic).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from scheduler_state.cells import ID_BITS, ID_MASK, Cluster, CountIndex, PCell, PChain, VCell, VScope, counts_shortfall

Cell = Any  # PCell or VCell: the search only reads level, children, id, nodeish, parent


class Placer:
    """Topology-aware leaf selection over one scope with a given availability count."""

    __slots__ = ("cnt", "delta", "node_ok")

    def __init__(self, cnt: Callable[[Cell], int], delta: dict[Cell, int], node_ok: Callable[[Cell], bool]) -> None:
        self.cnt = cnt
        self.delta = delta  # leaves picked so far by this search, per cell (shared with cnt)
        self.node_ok = node_ok

    def place(self, roots: Iterable[Cell], spread_nodes: Callable[[int], list[Cell]],
              pods: Sequence[int], spread_index: tuple[CountIndex, list[Cell]] | None = None) -> list[list[Cell]] | None:
        """Leaf cells per pod (in ``pods`` order), or None if the scope cannot hold them.

        ``spread_index``: the node index (a ``cells.CountIndex``, read only if a spread
        is needed, and the cell list its keys resolve in) whose counts are this
        placer's own when nothing is picked yet; ``spread_nodes`` lists the same nodes.
        Then the spread over nodes reads the index's order instead of counting and
        sorting the nodes again."""
        n = len(pods)
        if n == 1 or min(pods) == max(pods):
            order: Sequence[int] = range(n)  # (sizes descending, then index): as given
            sizes = list(pods)
        else:
            order = sorted(range(n), key=lambda i: (-pods[i], i))
            sizes = [pods[i] for i in order]
        total = sum(sizes)
        found: list[list[Cell]] | None = None
        for root in roots:
            found = self._try(root, sizes, total)
            if found is not None:
                break
        if found is None and len(sizes) > 1:
            if spread_index is not None and not self.delta:  # a failed search picks nothing
                found = self._spread_indexed(spread_index[0].sorted_keys(), spread_index[1], sizes)
            else:
                found = self._spread(spread_nodes(sizes[-1]), sizes)
        if found is None:
            return None
        if isinstance(order, range):
            return found
        out: list[list[Cell]] = [[] for _ in pods]
        for j, i in enumerate(order):
            out[i] = found[j]
        return out

    def _try(self, c: Cell, sizes: list[int], total: int) -> list[list[Cell]] | None:
        if c.nodeish or c.level == 1:
            return self._in_node(c, sizes, total)
        cnt = self.cnt
        if c.children[0].leaves >= total:  # (siblings are alike; a count never exceeds leaves)
            kids = sorted((n, ch.id, ch) for ch in c.children if (n := cnt(ch)) >= total)
            for _, _, ch in kids:
                found = self._try(ch, sizes, total)
                if found is not None:
                    return found
        if len(sizes) > 1:
            return self._spread(self._nodes_under(c), sizes)
        return None

    def _in_node(self, c: Cell, sizes: list[int], total: int) -> list[list[Cell]] | None:
        if not self.node_ok(c):
            return None
        cnt = self.cnt
        # Go down to the lowest cell that still holds the whole group (nearest leaves).
        while c.level > 1:
            best = None
            best_n = 0
            for ch in c.children:
                n = cnt(ch)
                if n >= total and (best is None or n < best_n):
                    best, best_n = ch, n
            if best is None:
                break
            c = best
        out = []
        for k in sizes:
            leaves: list[Cell] = []
            self._pick(c, k, leaves)
            out.append(leaves)
        return out

    def _nodes_under(self, c: Cell) -> list[Cell]:
        """The node cells under ``c`` (in no particular order: ``_spread`` orders them)."""
        if c.node_cells is not None:
            return c.node_cells
        out = []
        stack = [c]
        while stack:
            x = stack.pop()
            if x.nodeish:
                out.append(x)
            elif x.level > 1:
                stack.extend(x.children)
        return out

    def _spread(self, nodes: list[Cell], sizes: list[int]) -> list[list[Cell]] | None:
        """First-fit decreasing over nodes, each pod to the node with the fewest leaves
        that still suffice; decided on counts first so a failure leaves no picks behind."""
        cnt = self.cnt
        keys: list[tuple[int, int]] = []
        by_id: dict[int, Cell] = {}
        for n in nodes:
            k = cnt(n)
            if k > 0 and self.node_ok(n):
                keys.append((k, n.id))
                by_id[n.id] = n
        keys.sort()
        chosen = []
        for k in sizes:
            i = bisect_left(keys, (k, -1))
            if i == len(keys):
                return None
            have, nid = keys.pop(i)
            chosen.append(by_id[nid])
            if have > k:
                insort(keys, (have - k, nid))
        out = []
        for k, n in zip(sizes, chosen):
            leaves: list[Cell] = []
            self._pick(n, k, leaves)
            out.append(leaves)
        return out

    def _spread_indexed(self, index_keys: list[int], cells: list[Cell], sizes: list[int]) -> list[list[Cell]] | None:
        """``_spread`` over the nodes of an index with count >= the smallest pod, when
        the index's counts are this placer's (nothing picked yet): the same choice, the
        keys already in (count, id) order."""
        node_ok = self.node_ok
        # Nodes that fail node_ok are dropped when first met rather than all filtered
        # up front: the same choices (such a node is never chosen, and dropping it
        # moves no other key), node_ok asked only of the nodes looked at.
        keys = index_keys[bisect_left(index_keys, sizes[-1] << ID_BITS):]
        chosen = []
        for k in sizes:
            i = bisect_left(keys, k << ID_BITS)
            while i < len(keys) and not node_ok(cells[keys[i] & ID_MASK]):
                del keys[i]
            if i == len(keys):
                return None
            key = keys.pop(i)
            have = key >> ID_BITS
            chosen.append(cells[key & ID_MASK])
            if have > k:
                insort(keys, (have - k) << ID_BITS | key & ID_MASK)
        out = []
        for k, n in zip(sizes, chosen):
            leaves: list[Cell] = []
            self._pick(n, k, leaves)
            out.append(leaves)
        return out

    def _pick(self, c: Cell, k: int, out: list[Cell]) -> None:
        """Take ``k`` available leaves under ``c``, as close together as possible."""
        cnt = self.cnt
        if k > 1 and cnt(c) == k:
            self._take_all(c, out)  # every available leaf of c: no choice to make
            return
        while c.level > 1:
            best = None
            best_n = 0
            for ch in c.children:
                n = cnt(ch)
                if n >= k and (best is None or n < best_n):
                    best, best_n = ch, n
            if best is None:
                break
            c = best
        if c.level == 1:
            self._consume(c)
            out.append(c)
            return
        # No single child holds k: fill from the children with most available leaves.
        kids = sorted(((n, ch.id, ch) for ch in c.children if (n := cnt(ch)) > 0), key=lambda t: (-t[0], t[1]))
        for n, _, ch in kids:
            take = n if n < k else k
            self._pick(ch, take, out)
            k -= take
            if k == 0:
                return
        raise AssertionError(f"count of {c!r} promised more leaves than it has")

    def _take_all(self, c: Cell, out: list[Cell]) -> None:
        cnt = self.cnt
        leafs = c.leafs
        if leafs is not None and cnt(c) == len(leafs):
            # every leaf below c is available (each counts at most one): all of them,
            # in the order the walk below would find them; c and each ancestor get
            # len(leafs) picked. The cells below c are left as they are: once c counts
            # 0 no search of this placer goes below it (they all descend through cells
            # that count more than 0, and a failed search picks nothing), so their
            # counts are never read again.
            delta = self.delta
            get = delta.get
            k = len(leafs)
            a = c
            while a is not None:
                delta[a] = get(a, 0) + k
                a = a.parent
            out.extend(leafs)
            return
        stack = [c]
        found = []
        while stack:
            x = stack.pop()
            if x.level == 1:
                if cnt(x) > 0:
                    found.append(x)
            else:
                stack.extend(ch for ch in reversed(x.children) if cnt(ch) > 0)
        for leaf in found:
            self._consume(leaf)
        out.extend(found)

    def _consume(self, leaf: Cell) -> None:
        delta = self.delta
        c = leaf
        while c is not None:
            delta[c] = delta.get(c, 0) + 1
            c = c.parent


# -- count functions ------------------------------------------------------------------


def virtual_free_placer(suggested: frozenset[str] | None, avoid_doomed: bool = False) -> Placer:
    delta: dict[Cell, int] = {}
    get = delta.get

    def cnt(c: VCell) -> int:
        return c.free - get(c, 0)

    ok = _virtual_node_ok(suggested)
    if avoid_doomed:
        def ok_healthy(c: VCell, ok: Callable[[VCell], bool] = ok) -> bool:
            r = c.root  # not under a doomed bad preassigned cell (health.is_doomed)
            return ok(c) and not (r.pcell is not None and r.free == r.leaves and r.scope.pinned_id is None)
        return Placer(cnt, delta, ok_healthy)
    return Placer(cnt, delta, ok)


def virtual_preempt_placer(scope: VScope, priority: int, suggested: frozenset[str] | None,
                           users: Iterable[Any]) -> Placer:
    """Leaves free or used by a group of lower priority in this scope count as available."""
    delta: dict[Cell, int] = {}
    extra: dict[Cell, int] = {}
    for g in users:
        if g.priority >= priority:
            continue
        for pod in g.pods:
            if pod.vleaves is None:
                continue
            for v in pod.vleaves:
                if v is None or v.scope is not scope:
                    continue
                c = v
                while c is not None:
                    extra[c] = extra.get(c, 0) + 1
                    c = c.parent
    get = delta.get
    xget = extra.get

    def cnt(c: VCell) -> int:
        return c.free + xget(c, 0) - get(c, 0)

    return Placer(cnt, delta, _virtual_node_ok(suggested))


def physical_placer(suggested: frozenset[str] | None, away_from_guaranteed: bool = False) -> Placer:
    """Free healthy unpinned physical leaves. With ``away_from_guaranteed`` a node that
    holds leaves of guaranteed groups (``used > opp``) takes no pod: HiveD's
    opportunistic scheduler does not pack across priorities (``crossPriorityPack``
    false in ``topology_aware_scheduler.go``: opportunistic pods "stay away from
    guaranteed pods")."""
    delta: dict[Cell, int] = {}
    get = delta.get

    def cnt(c: PCell) -> int:
        return c.oavail - get(c, 0)

    if away_from_guaranteed:
        if suggested is None:
            return Placer(cnt, delta, lambda c: c.used == c.opp)
        return Placer(cnt, delta, lambda c: c.used == c.opp and c.node in suggested)
    if suggested is None:
        return Placer(cnt, delta, _always)
    return Placer(cnt, delta, lambda c: c.node in suggested)


def _always(c: Cell) -> bool:
    return True


def _virtual_node_ok(suggested: frozenset[str] | None) -> Callable[[VCell], bool]:
    # A virtual node bound to a bad (or non-suggested) physical node cannot take new pods;
    # an unbound one can: the mapping will look for a usable physical cell.
    if suggested is None:
        def ok(c: VCell) -> bool:
            p = c.pcell
            return p is None or p.bad == 0
    else:
        def ok(c: VCell) -> bool:
            p = c.pcell
            return p is None or (p.bad == 0 and p.node in suggested)
    return ok


def indexed_roots(index_keys: list[int], cells: list[Any], total: int) -> Iterable[Any]:
    """Cells of a (count, id) index (``cells.ckey``) with count >= total, fewest first."""
    i = bisect_left(index_keys, total << ID_BITS)
    for j in range(i, len(index_keys)):
        yield cells[index_keys[j] & ID_MASK]


def counted_roots(roots: list[Any], cnt: Callable[[Any], int], total: int) -> list[Any]:
    ranked = sorted((n, r.id, r) for r in roots if (n := cnt(r)) >= total)
    return [c for _, _, c in ranked]


# -- virtual to physical mapping -----------------------------------------------------------


class MapPlan:
    """A tentative binding of virtual cells to physical cells; changes nothing until
    the caller commits it."""

    __slots__ = ("cluster", "suggested", "plan", "taken", "removed", "extra", "failure", "planned")

    def __init__(self, cluster: Cluster, suggested: frozenset[str] | None) -> None:
        self.cluster = cluster
        self.suggested = suggested
        self.plan: dict[VCell, PCell] = {}
        self.taken: set[int] = set()  # physical ids claimed by this plan (membership only)
        self.removed: set[int] = set()  # free-list cells this plan split or took
        self.extra: dict[int, list[PCell]] = {}  # level -> cells freed by this plan's splits
        self.failure: str | None = None
        self.planned: dict[int, int] = {}  # level -> preassigned cells this plan binds

    def _suggested_ok(self, p: PCell) -> bool:
        s = self.suggested
        if s is None:
            return True
        if p.node is not None:
            return p.node in s
        return any(n in s for n in self.cluster.nodes_of(p))

    def _rank(self, p: PCell) -> tuple[bool, bool, int, int]:
        return (p.bad > 0, not self._suggested_ok(p), p.opp, p.id)

    def physical(self, v: VCell) -> PCell | None:
        p = v.pcell
        if p is not None:
            return p
        p = self.plan.get(v)
        if p is not None:
            return p
        if v.parent is None:
            p = self._buddy(v.scope.chain, v.level)
        else:
            pp = self.physical(v.parent)
            if pp is None:
                return None
            taken = self.taken
            best = None
            if self.suggested is None and pp.bad == 0:
                # Common case: rank is (opportunistic users, id) and children come in id
                # order, so the first candidate without opportunistic users is the best.
                best_opp = 0
                for ch in pp.children:
                    if ch.vcell is not None or ch.id in taken:
                        continue
                    if ch.opp == 0:
                        best = ch
                        break
                    if best is None or ch.opp < best_opp:
                        best, best_opp = ch, ch.opp
            else:
                best_rank = None
                for ch in pp.children:
                    if ch.vcell is not None or ch.id in taken:
                        continue
                    r = self._rank(ch)
                    if best_rank is None or r < best_rank:
                        best, best_rank = ch, r
            p = best
            if p is None:
                self.failure = f"VC safety broken: no unbound physical cell under {pp.addr} for {v.addr}"
        if p is None:
            return None
        self.plan[v] = p
        self.taken.add(p.id)
        return p

    def full_node(self, leaves: list[VCell]) -> tuple[VCell, PCell] | None:
        """``(v, p)`` when ``leaves`` are every leaf of one unbound, unplanned virtual
        node cell ``v`` whose physical cell ``p`` is wholly unbound, untaken and free of
        opportunistic users: then ``physical`` would pick, leaf after leaf, each cell's
        first available child, i.e. the physical subtree cell by cell in the same
        position (``v.sub[i]`` maps to ``p.sub[i]``, so ``leaves`` to ``p.leafs``).
        None when that does not hold (``physical`` leaf by leaf then gives the same
        answer as ever: what this did, planning the node cell, is what its first leaf
        would have done first)."""
        v = leaves[0].ncell
        if v.pcell is not None or v in self.plan or v.sub is None or v.leafs != leaves:
            return None
        p = self.physical(v)
        if p is None or p.opp or p.sub is None or len(p.sub) != len(v.sub):
            return None
        if p.chain.low_roots:  # else nothing below p can be bound or planned (PChain.low_roots)
            taken = self.taken
            for x in p.below:
                if x.vcell is not None or x.id in taken:
                    return None
        # The cells below v and p are not entered in the plan: nothing looks them up.
        # ``physical`` climbs from other pods' leaves, never under v (every leaf of v is
        # this pod's), and picks children of planned or bound cells, never under p (p
        # is planned for v alone); later full_node calls stop at p, which is taken.
        return v, p

    def _buddy(self, chain: PChain, level: int) -> PCell | None:
        """A free physical cell of ``level`` for an unbound preassigned cell: HiveD's
        ``buddyAlloc`` takes the lowest free level at or above ``level`` (splitting one
        cell there), which always keeps VC safety. If that level offers only bad (or
        non-suggested) cells, HiveD's ``safeRelaxedBuddyAlloc`` splits a cell of a
        higher level -- only as far as the free cells left can still serve every VC's
        unbound preassigned cells (VC safety); ``_relaxed`` does the same."""
        pcells = self.cluster.pcells
        removed = self.removed
        chosen = None
        for lvl in range(level, chain.info.top_level + 1):
            best = None
            best_rank = None
            # Free cells are ordered by (opportunistic users, id): the first usable one
            # is the best unless bad or non-suggested cells must be skipped.
            for key in chain.free[lvl].keys:
                cid = key & ID_MASK
                if cid in removed:
                    continue
                c = pcells[cid]
                r = self._rank(c)
                if best_rank is None or r < best_rank:
                    best, best_rank = c, r
                if not r[0] and not r[1]:
                    break
            for c in self.extra.get(lvl, ()):
                if c.id in removed:
                    continue
                r = self._rank(c)
                if best_rank is None or r < best_rank:
                    best, best_rank = c, r
            if best is not None:
                chosen = best
                break
        if chosen is None:
            self.failure = f"VC safety broken: no free {chain.info.types[level - 1]} cell in chain {chain.info.name}"
            return None
        target, path = self._descend(chosen, level)
        if target.bad or not self._suggested_ok(target):
            relaxed = self._relaxed(chain, level, chosen.level)
            if relaxed is not None:
                chosen, target, path = relaxed
        removed.add(chosen.id)
        for c, kids in path:
            self.extra.setdefault(c.level - 1, []).extend(k for k in kids if k is not None)
        self.planned[level] = self.planned.get(level, 0) + 1
        return target

    def _descend(self, c: PCell, level: int) -> tuple[PCell, list[tuple[PCell, list[PCell | None]]]]:
        """Split ``c`` down to ``level`` taking the best-ranked child each time; the path
        (each split cell with the children left free)."""
        path: list[tuple[PCell, list[PCell | None]]] = []
        while c.level > level:
            kids = sorted(c.children, key=self._rank)
            path.append((c, list(kids[1:])))
            c = kids[0]
        return c, path

    def _relaxed(self, chain: PChain, level: int, lowest: int) -> tuple[PCell, PCell, list[Any]] | None:
        """A usable (healthy, suggested) free cell of ``level`` inside a free cell of the
        lowest free level or above, whose split keeps VC safety; free cells in list
        order, lowest level first. None if there is none (the group waits)."""
        pcells = self.cluster.pcells
        removed = self.removed
        info = chain.info
        counts = [0] * (info.top_level + 1)
        for lvl in range(1, info.top_level + 1):
            counts[lvl] = sum(1 for key in chain.free[lvl].keys if key & ID_MASK not in removed) + \
                sum(1 for c in self.extra.get(lvl, ()) if c.id not in removed)
        demand = list(chain.demand)
        for lvl, n in self.planned.items():
            demand[lvl] -= n
        for lvl in range(lowest, info.top_level + 1):
            cands = [pcells[key & ID_MASK] for key in chain.free[lvl].keys if key & ID_MASK not in removed]
            cands += [c for c in self.extra.get(lvl, ()) if c.id not in removed]
            for c in cands:
                target = self._usable_below(c, level)
                if target is None:
                    continue
                if lvl > lowest:
                    trial = list(counts)
                    trial[lvl] -= 1
                    for x in range(lvl - 1, level - 1, -1):
                        trial[x] += info.child_numbers[x] - 1
                    trial_demand = list(demand)
                    trial_demand[level] -= 1
                    if counts_shortfall(info, trial, trial_demand) is not None:
                        break  # every cell of this level splits alike: try a higher level
                path: list[tuple[PCell, list[PCell | None]]] = []
                xc = target
                while xc is not c:
                    parent = xc.parent
                    assert parent is not None
                    path.append((parent, [k for k in parent.children if k is not xc]))
                    xc = parent
                path.reverse()
                return c, target, path
        return None

    def _usable_below(self, c: PCell, level: int) -> PCell | None:
        """The best-ranked healthy, suggested cell of ``level`` under ``c`` (or ``c``)."""
        if c.level == level:
            return c if not c.bad and self._suggested_ok(c) else None
        if not c.bad and self.suggested is None:
            return self._descend(c, level)[0]
        best = None
        best_rank = None
        stack = [c]
        while stack:
            x = stack.pop()
            if x.level == level:
                r = self._rank(x)
                if not r[0] and not r[1] and (best_rank is None or r < best_rank):
                    best, best_rank = x, r
            elif x.level > level and x.vcell is None:
                stack.extend(x.children)
        return best
