"""Physical and virtual cell trees, buddy free lists and the counters placement reads.

This module owns the cell-level state of one configured cluster (:class:`Cluster`);
``machine.py`` owns the groups and commands and is the only caller of the mutators here.

Model (HiveD's, see ``pkg/algorithm`` in microsoft/hivedscheduler):

- A **chain** is the type chain under one top-level physical cell type; all physical
  cells of that type form the chain's forest. Levels count from 1 (leaf, one device) up.
- Each VC owns **virtual cells**: for every ``virtualCells`` entry, ``cellNumber``
  preassigned (root) cells of the given type with their full subtrees; for every pinned
  cell, one virtual tree statically bound to that physical cell. A VC's non-pinned cells
  of one chain form a :class:`VScope`; each pinned cell is a scope of its own.
- **Lazy binding**: a virtual cell is bound to a physical cell (same chain and level)
  only while some leaf below it is used. Binding a preassigned root takes a physical
  cell out of the chain's **buddy free lists** (split on demand); unbinding it gives the
  cell back (merge with free buddies). The free lists therefore always hold exactly the
  maximal physical cells that no bound root touches.
- Counters kept incrementally (all are sums over a cell's leaves): virtual ``free``
  (leaves not used by the VC's guaranteed groups); physical ``used``, ``opp`` (used by
  opportunistic groups, the free-list ordering key), ``bad`` (on bad nodes) and
  ``oavail`` (unused, healthy, outside pinned cells: what opportunistic groups may take);
  per scope and level, the preassigned cells that are unbound and that have no used
  leaf (``VScope.unbound`` / ``unused``, read by ``health.py``). ``PCell.unpinned``
  (leaves outside pinned cells) is static.
- Sorted key indexes (:class:`CountIndex`, brought up to date when read) over roots and
  node cells make placement choices ``min`` over canonical keys ``(count, id)``; ids are
  assigned in config order, so every decision depends on the logical state only, never
  on history or hashing. The buddy free lists are :class:`KeyIndex` lists kept eagerly.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import TYPE_CHECKING, Any

from scheduler_state.config import ChainInfo, Config, PhysicalSpec

if TYPE_CHECKING:
    from scheduler_state.machine import Group

FREE_PRIORITY = -2  # HiveD's freePriority: below every real priority
OPPORTUNISTIC_PRIORITY = -1
MAX_GUARANTEED_PRIORITY = 1000


ID_BITS = 32
ID_MASK = (1 << ID_BITS) - 1


def ckey(count: int, cid: int) -> int:
    """The index key of ``(count, id)``: one int, ``count << 32 | id``, so the indexes
    sort and bisect on int comparisons (tuples compared element by element cost several
    times more); the order is the tuples' (counts are >= 0, ids < 2**32)."""
    return count << ID_BITS | cid


class KeyIndex:
    """A sorted list of ``ckey(count, id)`` keys; ids (``key & ID_MASK``) resolve
    through the owner's cell list, counts are ``key >> ID_BITS``."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: list[int] = []

    def add(self, key: int) -> None:
        insort(self.keys, key)

    def remove(self, key: int) -> None:
        keys = self.keys
        i = bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            raise AssertionError(f"key {key} missing from index")
        del keys[i]

    def first_at_least(self, count: int) -> int:
        """Position of the first key whose count is >= ``count``."""
        return bisect_left(self.keys, count << ID_BITS)

    def __len__(self) -> int:
        return len(self.keys)


class CountIndex:
    """Cells of one kind (a scope's roots or node cells: count ``free``; a chain's tops
    or nodes: count ``oavail``) sorted by ``ckey(count, id)``, brought up to date when
    read. ``Cluster.reindex`` (after each batch of counter updates) marks the cells
    whose count may have moved in ``stale``; ``sorted_keys()`` re-keys the marked cells
    and returns the keys. Between two reads a cell touched many times is re-keyed once,
    or not at all when its count came back (an allocation and a release on one node),
    and an index nobody reads (a chain's, when no opportunistic group is placed) costs
    one mark per touch. What a read sees is exactly the eager index: every counter
    change of an indexed cell is touched (the same ``Touched`` sets as ever).

    ``at`` holds each cell's key as it stands in ``keys`` (a nodeish root is in two
    indexes, each re-keyed at its own reads)."""

    __slots__ = ("keys", "at", "stale", "physical")

    def __init__(self, physical: bool) -> None:
        self.keys: list[int] = []
        self.at: dict[Any, int] = {}
        self.stale: dict[Any, None] = {}  # insertion-ordered (determinism: nothing depends on it)
        self.physical = physical

    def add(self, c: Any) -> None:
        key = (c.oavail if self.physical else c.free) << ID_BITS | c.id
        self.at[c] = key
        insort(self.keys, key)

    def sorted_keys(self) -> list[int]:
        """The keys in order, every count current (the list itself: do not modify it)."""
        if self.stale:
            keys = self.keys
            at = self.at
            physical = self.physical
            for c in self.stale:
                key = (c.oavail if physical else c.free) << ID_BITS | c.id
                old = at[c]
                if key != old:
                    i = bisect_left(keys, old)
                    if i == len(keys) or keys[i] != old:
                        raise AssertionError(f"key {old} missing from index")
                    del keys[i]
                    insort(keys, key)
                    at[c] = key
            self.stale.clear()
        return self.keys

    def __len__(self) -> int:
        return len(self.keys)


class PCell:
    __slots__ = (
        "id", "chain", "level", "ctype", "addr", "name", "parent", "children", "node", "leaf_index",
        "pinned_id", "in_pinned", "nodeish", "leaves", "leafs", "sub", "below", "inner", "ncell", "node_cells",
        "vcell", "in_free", "fkey", "used", "opp", "bad", "oavail", "user", "prio", "unpinned",
    )
    leafs: Any
    sub: Any
    below: Any
    inner: Any
    ncell: Any
    node_cells: Any

    def __init__(self, cid: int, chain: PChain, level: int, spec: PhysicalSpec, parent: PCell | None,
                 node: str | None, in_pinned: bool) -> None:
        self.id = cid
        self.chain = chain
        self.level = level
        self.ctype = spec.cell_type
        self.addr = spec.path
        self.name = spec.address
        self.parent = parent
        self.children: list[PCell] = []
        self.node = node
        self.leaf_index = int(spec.address) if level == 1 else -1
        self.pinned_id = spec.pinned_id
        self.in_pinned = in_pinned or spec.pinned_id is not None
        self.nodeish = level == chain.info.node_level
        self.leaves = chain.info.leaves_per_level[level - 1]
        self.vcell: VCell | None = None
        self.in_free = False
        self.fkey: int | None = None
        self.used = 0
        self.opp = 0
        self.bad = 0
        self.oavail = 0 if self.in_pinned else self.leaves
        self.unpinned = self.oavail  # leaves below outside pinned cells (static)
        self.user: Group | None = None
        self.prio = FREE_PRIORITY
        self.ncell = None  # static, set by _static_lists

    def __repr__(self) -> str:
        return f"PCell({self.addr} {self.ctype})"


class VCell:
    __slots__ = (
        "id", "vc", "scope", "level", "ctype", "addr", "parent", "children", "root", "nodeish", "leaves",
        "leafs", "sub", "below", "inner", "ncell", "node_cells", "pcell", "free", "user", "prio",
    )
    leafs: Any
    sub: Any
    below: Any
    inner: Any
    ncell: Any
    node_cells: Any

    def __init__(self, cid: int, scope: VScope, level: int, ctype: str, addr: str, parent: VCell | None) -> None:
        self.id = cid
        self.vc = scope.vc
        self.scope = scope
        self.level = level
        self.ctype = ctype
        self.addr = addr
        self.parent = parent
        self.children: list[VCell] = []
        self.root: VCell = parent.root if parent is not None else self
        info = scope.chain.info
        # A "node" for placement: a node-level cell, or a preassigned cell below the node
        # level (HiveD's cluster view treats such a cell as one node: its leaves are on
        # one physical node, but two such cells may be on different nodes).
        self.nodeish = level == info.node_level or (parent is None and level < info.node_level)
        self.leaves = info.leaves_per_level[level - 1]
        self.pcell: PCell | None = None
        self.free = self.leaves
        self.user: Group | None = None
        self.prio = FREE_PRIORITY
        self.ncell = None  # static, set by _static_lists

    def __repr__(self) -> str:
        return f"VCell({self.addr} {self.ctype})"


class PChain:
    """Physical cells of one chain: top cells, buddy free lists, opportunistic indexes."""

    __slots__ = ("info", "tops", "nodes", "free", "root_index", "node_index", "index", "demand", "low_roots")

    def __init__(self, info: ChainInfo, index: int) -> None:
        self.info = info
        self.index = index  # position in config order, for deterministic chain iteration
        self.tops: list[PCell] = []
        self.nodes: list[PCell] = []
        self.free: list[KeyIndex] = [KeyIndex() for _ in range(info.top_level + 1)]  # [0] unused
        self.root_index = CountIndex(True)  # tops by (oavail, id)
        self.node_index = CountIndex(True)  # nodes by (oavail, id)
        # Unbound non-pinned preassigned cells of all VCs, per level (HiveD's
        # allVCFreeCellNum): what the free lists must always be able to serve.
        self.demand = [0] * (info.top_level + 1)
        # Static: some VC (or pinned) cell of this chain is a root below the node level.
        # Without such roots a physical cell below an unbound node cell is never bound
        # (bindings go up in lockstep to a root, at or above the node level).
        self.low_roots = False


class VScope:
    """A VC's virtual cells in one chain (non-pinned), or one pinned cell."""

    __slots__ = ("vc", "chain", "pinned_id", "roots", "nodes", "root_index", "node_index", "leaves", "free", "key",
                 "node_leaves_max", "by_level", "unbound", "unused")

    def __init__(self, vc: str, chain: PChain, pinned_id: str | None) -> None:
        self.vc = vc
        self.chain = chain
        self.pinned_id = pinned_id
        self.roots: list[VCell] = []
        self.nodes: list[VCell] = []
        self.root_index = CountIndex(False)  # roots by (free, id)
        self.node_index = CountIndex(False)  # node cells by (free, id)
        self.leaves = 0
        self.free = 0  # free leaves over all roots
        self.key = f"{vc}/{pinned_id}" if pinned_id else f"{vc}/{chain.info.name}"
        self.node_leaves_max = 0
        self.by_level: dict[int, list[VCell]] | None = None  # roots per level (health.roots_at)
        # Roots per level that are unbound, and that have no used leaf (unbound ones
        # included): kept in step by bind/unbind and the free counts, so health's doomed
        # rule reads them instead of scanning every root after every command; the
        # invariant checker recounts them.
        self.unbound = [0] * (chain.info.top_level + 1)
        self.unused = [0] * (chain.info.top_level + 1)

    def max_node_leaves(self) -> int:
        return self.node_leaves_max


class Cluster:
    """All cells of one config, with free lists and bindings. Built fresh from a Config."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pcells: list[PCell] = []
        self.vcells: list[VCell] = []
        self.chains: dict[str, PChain] = {}
        self.leaf_by_device: dict[tuple[str, int], PCell] = {}
        self.node_leaves: dict[str, list[PCell]] = {}
        self.pinned_cells: dict[str, PCell] = {}
        self.vc_scopes: dict[str, dict[str, VScope]] = {}  # vc -> chain -> scope
        self.vc_pinned: dict[str, dict[str, VScope]] = {}  # vc -> pinned id -> scope
        self.chains_by_leaf_type: dict[str, list[PChain]] = {}
        self.bad_nodes: set[str] = set()  # membership only; sorted whenever listed
        # Health bindings (HiveD's doomed bad cells and bad cells bound under bound
        # cells): virtual cells bound to bad physical cells without a used leaf below.
        # Membership and sorted iteration only (machine._reconcile_health).
        self.hbound: dict[VCell, None] = {}
        # Derived, not state: bumped whenever a node's health changes; health.bad_cells
        # caches per chain against it.
        self.bad_version = 0
        self.bad_cache: dict[str, tuple[int, Any]] = {}
        # Derived, not state: machine._candidates per request shape (config-only answers).
        self.candidates_cache: dict[tuple[Any, ...], Any] = {}
        for i, (name, info) in enumerate(config.chains.items()):
            self.chains[name] = PChain(info, i)
            self.chains_by_leaf_type.setdefault(info.leaf_type, []).append(self.chains[name])
        for spec in config.physical_cells:
            chain = self.chains[spec.cell_type]
            top = self._build_physical(spec, chain, chain.info.top_level, None, None, False)
            chain.tops.append(top)
        for chain in self.chains.values():
            for top in chain.tops:
                self._free_add(top)
                chain.root_index.add(top)
            for nc in chain.nodes:
                chain.node_index.add(nc)
        for vc in config.virtual_clusters.values():
            scopes: dict[str, VScope] = {}
            pinned: dict[str, VScope] = {}
            self.vc_scopes[vc.name] = scopes
            self.vc_pinned[vc.name] = pinned
            n = 0
            for vspec in vc.virtual_cells:
                chain = self.chains[vspec.chain]
                scope = scopes.get(chain.info.name)
                if scope is None:
                    scope = scopes[chain.info.name] = VScope(vc.name, chain, None)
                level = chain.info.level_of(vspec.cell_type)
                assert level is not None
                for _ in range(vspec.number):
                    self._build_virtual(scope, level, f"{vc.name}/{n}", None)
                    chain.demand[level] += 1
                    n += 1
            for pid in vc.pinned_ids:
                p = self.pinned_cells[pid]
                scope = pinned[pid] = VScope(vc.name, p.chain, pid)
                root = self._build_virtual(scope, p.level, f"{vc.name}/{n}", None)
                n += 1
                # Pinned cells are bound statically (HiveD's initPinnedCells).
                self.take_from_free(p)
                root.pcell = p
                p.vcell = root
            for scope in list(scopes.values()) + list(pinned.values()):
                scope.node_leaves_max = max((c.leaves for c in scope.nodes), default=0)
                for r in scope.roots:
                    if r.level < scope.chain.info.node_level:
                        scope.chain.low_roots = True
                    scope.root_index.add(r)
                    scope.unbound[r.level] += r.pcell is None
                    scope.unused[r.level] += 1
                for c in scope.nodes:
                    scope.node_index.add(c)

    # -- construction -------------------------------------------------------------

    def _build_physical(self, spec: PhysicalSpec, chain: PChain, level: int, parent: PCell | None,
                        node: str | None, in_pinned: bool) -> PCell:
        if level == chain.info.node_level:
            node = spec.address
        c = PCell(len(self.pcells), chain, level, spec, parent, node, in_pinned)
        self.pcells.append(c)
        if c.pinned_id is not None:
            self.pinned_cells[c.pinned_id] = c
        if c.nodeish:
            chain.nodes.append(c)
        if level == 1:
            assert node is not None
            self.leaf_by_device[(node, c.leaf_index)] = c
            self.node_leaves.setdefault(node, []).append(c)
        c.children = [self._build_physical(s, chain, level - 1, c, node, c.in_pinned) for s in spec.children]
        if c.children:
            c.oavail = sum(ch.oavail for ch in c.children)  # pinned leaves below are not available
            c.unpinned = c.oavail
        _static_lists(c, chain.info.node_level)
        return c

    def _build_virtual(self, scope: VScope, level: int, addr: str, parent: VCell | None) -> VCell:
        info = scope.chain.info
        c = VCell(len(self.vcells), scope, level, info.types[level - 1], addr, parent)
        self.vcells.append(c)
        if parent is None:
            scope.roots.append(c)
            scope.leaves += c.leaves
            scope.free += c.leaves
        if c.nodeish:
            scope.nodes.append(c)
        if level > 1:
            c.children = [
                self._build_virtual(scope, level - 1, f"{addr}/{i}", c) for i in range(info.child_numbers[level - 1])
            ]
        _static_lists(c, info.node_level)
        return c

    # -- buddy free lists ----------------------------------------------------------

    def _free_add(self, c: PCell) -> None:
        c.in_free = True
        c.fkey = c.opp << ID_BITS | c.id
        c.chain.free[c.level].add(c.fkey)

    def _free_remove(self, c: PCell) -> None:
        assert c.fkey is not None
        c.chain.free[c.level].remove(c.fkey)
        c.in_free = False
        c.fkey = None

    def free_rekey(self, c: PCell) -> None:
        """The ordering key of a free cell changed (its opportunistic usage)."""
        if c.fkey != c.opp << ID_BITS | c.id:
            self._free_remove(c)
            self._free_add(c)

    def take_from_free(self, p: PCell) -> None:
        """Remove ``p`` from the free lists, splitting the free ancestor that holds it."""
        path = [p]
        a = p
        while not a.in_free:
            a = a.parent  # type: ignore[assignment]
            if a is None:
                raise AssertionError(f"{p.addr} is not free: cannot bind it")
            path.append(a)
        self._free_remove(a)
        # Split down: the buddies along the path become free cells one level lower.
        for i in range(len(path) - 1, 0, -1):
            parent, child = path[i], path[i - 1]
            for sib in parent.children:
                if sib is not child:
                    self._free_add(sib)

    def give_to_free(self, p: PCell) -> None:
        """Return ``p`` to the free lists, merging it with free buddies recursively."""
        c = p
        while True:
            parent = c.parent
            if parent is None:
                self._free_add(c)
                return
            for s in parent.children:
                if s is not c and not s.in_free:
                    self._free_add(c)
                    return
            for s in parent.children:
                if s is not c:
                    self._free_remove(s)
            c = parent

    def free_ancestor(self, p: PCell) -> PCell | None:
        a: PCell | None = p
        while a is not None and not a.in_free:
            a = a.parent
        return a


    # -- health bindings (HiveD's doomed bad cells; machine._reconcile_health) ---------

    def health_bind(self, v: VCell, p: PCell) -> None:
        """Bind ``v`` to the bad physical cell ``p`` with no leaf in use: a preassigned
        cell takes ``p`` out of the free lists (a doomed bad cell); an inner cell follows
        its parent (a bad child of a bound cell, so placement sees it)."""
        v.pcell = p
        p.vcell = v
        if v.parent is None:
            self.take_from_free(p)
            p.chain.demand[v.level] -= 1
            v.scope.unbound[v.level] -= 1
        self.hbound[v] = None

    def health_unbind(self, v: VCell) -> None:
        p = v.pcell
        assert p is not None
        v.pcell = None
        p.vcell = None
        if v.parent is None:
            self.give_to_free(p)
            p.chain.demand[v.level] += 1
            v.scope.unbound[v.level] += 1
        self.hbound.pop(v, None)

    # -- bindings and leaf usage (the only code that changes counters) ----------------

    def bind(self, v: VCell, p: PCell) -> None:
        """Bind a virtual leaf to a physical leaf, and ancestors in lockstep as needed."""
        while v.pcell is None:
            v.pcell = p
            p.vcell = v
            if v.parent is None:
                self.take_from_free(p)
                p.chain.demand[v.level] -= 1
                v.scope.unbound[v.level] -= 1
                return
            v = v.parent
            p = p.parent  # type: ignore[assignment]
        if v.pcell is not p:
            raise AssertionError(f"{v.addr} is bound to {v.pcell.addr}, not {p.addr}")

    def unbind(self, v: VCell) -> None:
        """Unbind a virtual leaf, and ancestors that no longer have bound children."""
        if v.parent is None and v.scope.pinned_id is not None:
            return  # a pinned cell stays bound
        while True:
            p = v.pcell
            assert p is not None
            v.pcell = None
            p.vcell = None
            parent = v.parent
            if parent is None:
                self.give_to_free(p)
                p.chain.demand[v.level] += 1
                v.scope.unbound[v.level] += 1
                return
            if parent.parent is None and parent.scope.pinned_id is not None:
                return
            for ch in parent.children:
                if ch.pcell is not None:
                    return
            v = parent

    def use_leaf(self, g: Group, p: PCell, prio: int, v: VCell | None, t: Touched) -> None:
        """Give leaf ``p`` (and virtual leaf ``v``, already bound to it) to group ``g``."""
        if v is not None:
            v.user = g
            v.prio = prio
            _virtual_up(v, -1, t.v)
        p.user = g
        p.prio = prio
        _physical_up(p, 1, prio == OPPORTUNISTIC_PRIORITY, p.bad == 0 and not p.in_pinned, t)

    def use_virtual(self, g: Group, v: VCell, p: PCell, prio: int, t: Touched) -> None:
        """Bind virtual leaf ``v`` to ``p`` and give ``v`` alone to ``g``: a Preempting
        group's reservation of a virtual leaf whose physical leaf a victim still uses
        (HiveD's Reserving cell: the preemptor's binding and priority, the victim's pods)."""
        self.bind(v, p)
        v.user = g
        v.prio = prio
        _virtual_up(v, -1, t.v)

    def unuse_virtual(self, v: VCell, t: Touched) -> None:
        """Undo ``use_virtual`` (the physical leaf is left as it is)."""
        v.user = None
        v.prio = FREE_PRIORITY
        _virtual_up(v, 1, t.v)
        self.unbind(v)

    def unuse_leaf(self, p: PCell, v: VCell | None, t: Touched) -> None:
        """Take leaf ``p`` (and its virtual leaf ``v``, then unbound) from its group."""
        if v is not None:
            v.user = None
            v.prio = FREE_PRIORITY
            _virtual_up(v, 1, t.v)
            self.unbind(v)
        opp = p.prio == OPPORTUNISTIC_PRIORITY
        p.user = None
        p.prio = FREE_PRIORITY
        _physical_up(p, -1, opp, p.bad == 0 and not p.in_pinned, t)

    def use_pod(self, g: Group, pleaves: list[PCell], prio: int, vleaves: list[VCell] | None, t: Touched) -> None:
        """``bind`` (when virtual) and ``use_leaf`` for each leaf of one pod: the same
        state, but the cells from a leaf's node up are updated once for each run of
        leaves under the same node rather than once per leaf."""
        if vleaves is not None:
            bind = self.bind
            for v, p in zip(vleaves, pleaves):
                bind(v, p)
                v.user = g
                v.prio = prio
            _virtual_up_many(vleaves, -1, t.v)
        opp = prio == OPPORTUNISTIC_PRIORITY
        for p in pleaves:
            p.user = g
            p.prio = prio
        _physical_up_many(pleaves, 1, opp, t)

    def use_node(self, g: Group, vnode: VCell, pnode: PCell, prio: int, t: Touched) -> bool:
        """``use_pod`` of a guaranteed pod holding every leaf of the unbound virtual node
        cell ``vnode``, mapped cell by cell onto the same positions of ``pnode``'s
        subtree (``MapPlan.full_node``), whose leaves are all unused, healthy and
        unpinned: the same state, each cell of the two subtrees updated once rather than
        once per leaf below it. False, changing nothing, when that does not hold. (The
        callers pass pods of more than one leaf: the node cells are not leaves.)"""
        if vnode.pcell is not None or pnode.vcell is not None or pnode.oavail != pnode.leaves or \
                prio == OPPORTUNISTIC_PRIORITY:
            return False
        self.bind(vnode, pnode)  # the node cell and up, as its first leaf's bind would
        # Each cell below the two node cells has all its leaves taken now: the virtual
        # ones had every leaf free (vnode was unbound: a used leaf binds its ancestors),
        # the physical ones every leaf unused, healthy and unpinned (pnode.oavail ==
        # pnode.leaves), so the counts are set rather than adjusted.
        for x, y in zip(vnode.inner, pnode.inner):
            x.pcell = y
            y.vcell = x
            x.free = 0
            y.used = y.leaves
            y.oavail = 0
        leafs = pnode.leafs
        for v, p in zip(vnode.leafs, leafs):  # the leaves likewise, and their user
            v.pcell = p
            p.vcell = v
            v.free = 0
            p.used = 1
            p.oavail = 0
            v.user = p.user = g
            v.prio = p.prio = prio
        n = len(leafs)
        _virtual_up(vnode, -n, t.v)
        _physical_up(pnode, n, False, True, t)
        return True

    def unuse_pod(self, pleaves: list[PCell | None], vleaves: list[VCell | None] | None, t: Touched) -> None:
        """``unuse_leaf`` for every tracked (not None) leaf of one pod, in bulk as
        ``use_pod``; leaf by leaf when its leaves are of mixed kinds."""
        if vleaves is not None and len(pleaves) > 1 and self._unuse_node(pleaves, vleaves, t):
            return
        if vleaves is None:
            pl = [p for p in pleaves if p is not None]
            vl: list[VCell] = []
        else:
            pl = []
            vl = []
            for p, v in zip(pleaves, vleaves):
                if p is not None:
                    pl.append(p)
                    if v is not None:
                        vl.append(v)
        if not pl:
            return
        opp = pl[0].prio == OPPORTUNISTIC_PRIORITY
        mixed = len(pleaves) != (len(vleaves) if vleaves is not None else len(pleaves)) or (opp and bool(vl))
        if not mixed:
            for p in pl:
                if (p.prio == OPPORTUNISTIC_PRIORITY) is not opp:
                    mixed = True
                    break
        if mixed:
            for i, p in enumerate(pleaves):
                if p is not None:
                    self.unuse_leaf(p, vleaves[i] if vleaves is not None else None, t)
            return
        if vl:
            for v in vl:
                v.user = None
                v.prio = FREE_PRIORITY
            top = _virtual_up_many(vl, 1, t.v)
            if top is not None and top.nodeish and len(vl) == len(top.leafs) and top.sub is not None:
                # the pod held every leaf of its node cell: the whole subtree unbinds (as
                # leaf by leaf would, each cell once its last child went), then the node
                # cell itself and up as ``unbind`` goes
                for x in top.below:
                    p = x.pcell
                    x.pcell = None
                    p.vcell = None
                self.unbind(top)
            else:
                unbind = self.unbind
                for v in vl:
                    unbind(v)
        for p in pl:
            p.user = None
            p.prio = FREE_PRIORITY
        _physical_up_many(pl, -1, opp, t)

    def _unuse_node(self, pl: list[PCell | None], vl: list[VCell | None], t: Touched) -> bool:
        """``unuse_pod`` of a guaranteed pod whose virtual leaves ``vl`` are every leaf
        of one node cell and whose physical leaves ``pl`` (bound to them, so every leaf
        of that cell's physical cell) are all healthy and unpinned: each cell of the two
        subtrees updated once (as ``use_node``), the same state. False, changing
        nothing, when that does not hold."""
        vnode = vl[0]
        if vnode is None:
            return False
        vnode = vnode.ncell
        pnode = vnode.pcell
        if vnode.leafs != vl or pnode is None or pnode.bad or pnode.unpinned != pnode.leaves or len(pl) != len(vl):
            return False
        for p in pl:
            if p is None or p.prio == OPPORTUNISTIC_PRIORITY:
                return False
        # Every leaf below the two node cells was this pod's (a guaranteed pod's, on
        # healthy unpinned cells) and is free now: the counts are set, as in use_node.
        # The leaves ``pl`` are those bound to ``vl``.
        for x in vnode.inner:
            x.free = x.leaves
            p = x.pcell
            x.pcell = None
            p.vcell = None
        for y in pnode.inner:
            y.used = 0
            y.oavail = y.leaves
        for v in vl:
            p = v.pcell  # type: ignore[union-attr]
            assert p is not None
            v.pcell = p.vcell = None  # type: ignore[union-attr]
            v.user = p.user = None  # type: ignore[union-attr]
            v.prio = p.prio = FREE_PRIORITY  # type: ignore[union-attr]
            v.free = 1  # type: ignore[union-attr]
            p.used = 0
            p.oavail = 1
        n = len(vl)
        _virtual_up(vnode, n, t.v)
        self.unbind(vnode)  # the node cell and up, as ``unbind`` of its last leaf would
        _physical_up(pnode, -n, False, True, t)
        return True

    def demote_leaf(self, p: PCell, v: VCell, t: Touched) -> None:
        """Lazy preemption of one leaf: the group keeps ``p`` as an opportunistic user
        and gives its virtual leaf back to the VC."""
        v.user = None
        v.prio = FREE_PRIORITY
        c: VCell | None = v
        while c is not None:
            c.free += 1
            if c.parent is None:
                c.scope.free += 1
                _root_free_moved(c, 1)
                t.v[c] = None
            elif c.nodeish:
                t.v[c] = None
            c = c.parent
        self.unbind(v)
        p.prio = OPPORTUNISTIC_PRIORITY
        q: PCell | None = p
        while q is not None:
            q.opp += 1
            if q.in_free:
                t.f[q] = None
            q = q.parent

    def promote_leaf(self, g: Group, p: PCell, v: VCell, prio: int, t: Touched) -> None:
        """Undo ``demote_leaf`` (a lazy preemption that turned out not to help)."""
        q: PCell | None = p
        while q is not None:
            q.opp -= 1
            if q.in_free:
                t.f[q] = None
            q = q.parent
        p.prio = prio
        self.bind(v, p)
        v.user = g
        v.prio = prio
        c: VCell | None = v
        while c is not None:
            c.free -= 1
            if c.parent is None:
                c.scope.free -= 1
                _root_free_moved(c, -1)
                t.v[c] = None
            elif c.nodeish:
                t.v[c] = None
            c = c.parent

    def set_node_bad(self, node: str, bad: bool, t: Touched) -> None:
        d = 1 if bad else -1
        for p in self.node_leaves[node]:
            avail = p.user is None and not p.in_pinned
            q: PCell | None = p
            while q is not None:
                q.bad += d
                if avail:
                    q.oavail -= d
                    if q.nodeish or q.parent is None:
                        t.p[q] = None
                q = q.parent
        if bad:
            self.bad_nodes.add(node)
        else:
            self.bad_nodes.discard(node)
        self.bad_version += 1

    def reindex(self, t: Touched) -> None:
        """After a batch of counter updates: the touched roots and nodes are marked in
        their indexes (re-keyed when next read, ``CountIndex``), the touched free cells
        re-keyed in the free lists."""
        for v in t.v:
            scope = v.scope
            if v.parent is None:
                scope.root_index.stale[v] = None
            if v.nodeish:
                scope.node_index.stale[v] = None
        for p in t.p:
            chain = p.chain
            if p.parent is None:
                chain.root_index.stale[p] = None
            if p.nodeish:
                chain.node_index.stale[p] = None
        if t.f:
            for p in t.f:
                if p.in_free:
                    self.free_rekey(p)

    # -- queries used by placement and invariants ------------------------------------

    def scopes_of(self, vc: str) -> list[VScope]:
        return list(self.vc_scopes[vc].values()) + list(self.vc_pinned[vc].values())

    def nodes_of(self, p: PCell) -> list[str]:
        """K8s node names under a physical cell (one name at or below the node level)."""
        if p.node is not None:
            return [p.node]
        out: list[str] = []
        stack = [p]
        while stack:
            c = stack.pop()
            if c.nodeish:
                out.append(c.node)  # type: ignore[arg-type]
            else:
                stack.extend(c.children)
        return out

    def status_of_chain(self, chain: PChain) -> dict[str, Any]:
        info = chain.info
        used = sum(t.used for t in chain.tops)
        opp = sum(t.opp for t in chain.tops)
        bad = sum(t.bad for t in chain.tops)
        leaves = sum(t.leaves for t in chain.tops)
        return {
            "leaf_cell_type": info.leaf_type,
            "leaf_cells": leaves,
            "used_leaf_cells": used,
            "guaranteed_leaf_cells": used - opp,
            "opportunistic_leaf_cells": opp,
            "bad_leaf_cells": bad,
            "free_cells": {info.types[lvl - 1]: len(chain.free[lvl]) for lvl in range(info.top_level, 0, -1)},
        }


def _virtual_up(c: VCell, d: int, tv: dict) -> None:
    """``free`` += d on ``c`` and its ancestors (and the scope's at the root); roots and
    node cells go to ``tv`` (their index keys may be stale)."""
    while True:
        c.free += d
        parent = c.parent
        if parent is None:
            c.scope.free += d
            _root_free_moved(c, d)
            tv[c] = None
            return
        if c.nodeish:
            tv[c] = None
        c = parent


def _root_free_moved(r: VCell, d: int) -> None:
    """Root ``r``'s free count just moved by ``d``: ``VScope.unused`` in step."""
    now = r.free == r.leaves
    if now is not (r.free - d == r.leaves):
        r.scope.unused[r.level] += 1 if now else -1


def _physical_up(q: PCell, d: int, opp: bool, avail: bool, t: Touched) -> None:
    """``used`` += d on leaf ``q`` and its ancestors; with ``opp`` also ``opp`` += d
    (free-list cells to ``t.f``); with ``avail`` also ``oavail`` -= d (tops and nodes to
    ``t.p``)."""
    if avail and not opp:  # the common case, in a loop of its own
        tp = t.p
        while True:
            q.used += d
            q.oavail -= d
            parent = q.parent
            if parent is None:
                tp[q] = None
                return
            if q.nodeish:
                tp[q] = None
            q = parent
    tf = t.f
    tp = t.p
    c: PCell | None = q
    while c is not None:
        c.used += d
        if opp:
            c.opp += d
            if c.in_free:
                tf[c] = None
        if avail:
            c.oavail -= d
            if c.nodeish or c.parent is None:
                tp[c] = None
        c = c.parent


def _virtual_up_many(leaves: list[VCell], d: int, tv: dict) -> VCell | None:
    """``_virtual_up(leaf, d)`` for each of ``leaves``: below its node cell each leaf
    alone, from the node up once per run of leaves under the same node. Returns that
    node cell (or the root above the leaves) when all leaves are under one, else None."""
    top = None
    n = 0
    runs = 0
    for c in leaves:
        while not c.nodeish and c.parent is not None:
            c.free += d
            c = c.parent
        if c is top:
            n += 1
            continue
        if top is not None:
            _virtual_up(top, n * d, tv)
        top, n = c, 1
        runs += 1
    if top is not None:
        _virtual_up(top, n * d, tv)
    return top if runs == 1 else None


def _physical_up_many(leaves: list[PCell], d: int, opp: bool, t: Touched) -> None:
    """``_physical_up(leaf, d, opp, avail)`` for each of ``leaves`` (``avail`` its own:
    healthy and outside pinned cells), from the node up once per run of leaves under
    the same node with the same ``avail``. When ``leaves`` are every leaf of one
    healthy unpinned node cell, each cell below it moves by its leaf count in one pass."""
    tf = t.f
    node = leaves[0].ncell
    if node is not None and len(leaves) > 1 and node.leafs == leaves and not node.bad and \
            node.unpinned == node.leaves:
        for y in node.below:
            m = y.leaves * d
            y.used += m
            if opp:
                y.opp += m
                if y.in_free:
                    tf[y] = None
            y.oavail -= m
        _physical_up(node, len(leaves) * d, opp, True, t)
        return
    top = None
    n = 0
    top_avail = False
    for q in leaves:
        avail = q.bad == 0 and not q.in_pinned
        while not q.nodeish and q.parent is not None:
            q.used += d
            if opp:
                q.opp += d
                if q.in_free:
                    tf[q] = None
            if avail:
                q.oavail -= d
            q = q.parent
        if q is top and avail is top_avail:
            n += 1
            continue
        if top is not None:
            _physical_up(top, n * d, opp, top_avail, t)
        top, n, top_avail = q, 1, avail
    if top is not None:
        _physical_up(top, n * d, opp, top_avail, t)


def _static_lists(c: Any, node_level: int) -> None:
    """Static lists, so placement and the bookkeeping read these instead of walking
    the tree (which never changes once built). At or below the node level: a cell's
    leaf cells left to right (``leafs``), its subtree (``sub``, pre-order), ``below``
    (``sub`` without the cell itself), ``inner`` (``below`` without the leaf cells) and
    ``ncell``, the node cell at or above it (the first ancestor-or-self that is
    ``nodeish``: the node-level cell, or a virtual root below the node level; nodeish
    cells never nest). Above the node level: ``node_cells``, the node cells under it.
    The others are None above the node level (not needed: they would cost memory and
    build time in proportion to the cluster) and on leaf cells other than node cells
    (their parent lists them)."""
    c.node_cells = None
    if c.level > node_level:
        # the node cells under c (nodeish cells never nest)
        nodes: list[Any] = []
        for ch in c.children:
            if ch.nodeish:
                nodes.append(ch)
            elif ch.node_cells is not None:
                nodes += ch.node_cells
        c.node_cells = nodes
    if c.level > node_level or (c.level == 1 and not c.nodeish):
        c.leafs = None
        c.sub = None
        c.below = None
        c.inner = None
        return
    if c.level == 1:
        c.leafs = [c]
        c.sub = [c]
        c.below = []
        c.inner = []
        c.ncell = c
        return
    leafs: list[Any] = []
    sub = [c]
    for ch in c.children:
        if ch.sub is None:  # a leaf cell
            leafs.append(ch)
            sub.append(ch)
        else:
            leafs += ch.leafs
            sub += ch.sub
    c.leafs = leafs
    c.sub = sub
    c.below = sub[1:]
    c.inner = [x for x in c.below if x.level > 1]
    if c.nodeish:
        for x in sub:
            x.ncell = c


class Touched:
    """Cells whose index keys may be stale after a batch of leaf updates."""

    __slots__ = ("v", "p", "f")

    def __init__(self) -> None:
        self.v: dict[VCell, None] = {}  # virtual roots / nodes (free count)
        self.p: dict[PCell, None] = {}  # physical tops / nodes (oavail)
        self.f: dict[PCell, None] = {}  # free-list cells (opportunistic count)


def safety_shortfall(chain: PChain, demand: list[int]) -> str | None:
    """Check that the free lists can serve every unbound preassigned cell at once.

    ``demand[level]`` counts unbound non-pinned roots at that level over all VCs. Walks
    top-down like the config check: free cells at a level serve that level's demand, the
    rest split into children for the level below. Returns None or a description.
    """
    return counts_shortfall(chain.info, [len(k) for k in chain.free], demand)


def counts_shortfall(info: ChainInfo, counts: list[int], demand: list[int]) -> str | None:
    """``safety_shortfall`` on free-cell counts per level (``counts[level]``): the same
    check on a tentative state (a split being considered)."""
    available = 0
    for lvl in range(info.top_level, 0, -1):
        available += counts[lvl]
        if demand[lvl] > available:
            return (f"chain {info.name}: {demand[lvl]} unbound {info.types[lvl - 1]} VC cells "
                    f"but only {available} obtainable from the free lists")
        if lvl > 1:
            available = (available - demand[lvl]) * info.child_numbers[lvl - 1]
    return None
