"""HiveD configuration: parse and validate ``physicalCluster`` and ``virtualClusters``.

The input is HiveD's own config file, unchanged (``kubeApiServerAddress`` and other keys
the scheduler model does not use are ignored). Public interface:

- ``load_config(source)`` takes YAML text, a parsed ``dict`` or a ``pathlib.Path`` and
  returns a validated :class:`Config`, or raises :class:`ConfigError` whose message names
  the offending entry (``cellTypes.K80-NODE``, ``physicalCells[1].cellChildren[0]``,
  ``virtualClusters.vc1.virtualCells[0]`` ...).
- ``Config.to_dict()`` is a compact, msgpack-friendly form that ``load_config`` accepts
  back unchanged (it is what snapshots carry).

Validated constraints (HiveD's ``config/design.yaml`` lists them):

1. cell types form a forest: every ``childCellType`` chain ends at a leaf type, no cycles;
   when ``skuTypes`` is given, every leaf type must be one of them, and each sku type is
   a mapping whose ``gpu``/``cpu`` are non-negative integers and ``memory`` a quantity;
2. each top-level physical cell's type chain has exactly one ``isNodeLevel`` type, at or
   below the top; node-level cells carry a ``cellAddress`` (the K8s node name), node names
   are unique and leaf addresses are device indices in decimal digits, unique within a node;
3. each physical cell specifies its full hierarchy: ``cellChildren`` is empty (inferred) or
   has exactly ``childCellNumber`` entries;
4. ``pinnedCellId`` values are unique, not nested, and each is referred to by one VC once;
5. ``virtualCells.cellType`` is a dotted path that starts with a top-level physical cell
   type and follows ``childCellType`` links; ``cellNumber`` is a non-negative integer;
6. all VC quotas (pinned cells included) fit the physical cluster, checked per chain and
   level the way buddy allocation will need them.

Addresses are inferred as HiveD does: a top-level cell defaults to its index in
``physicalCells``; below the node level the default restarts from 0 per node, so leaf
cells get device indices ``0..n-1``; a cell's full address is its parent's plus ``/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import re
from pathlib import Path
from typing import Any

import yaml

# Bounds: a config is external input, so its size is limited before anything is built.
PHYSICAL_CELLS_MAX = 4_000_000
CHILD_CELL_NUMBER_MAX = 100_000
CELL_NUMBER_MAX = 1_000_000
LEVELS_MAX = 32  # cell levels in one chain (recursion in parsing and placement follows it)
CELL_TYPES_MAX = 10_000


class ConfigError(ValueError):
    """A config that HiveD would reject; the message names the offending entry."""


@dataclass(frozen=True)
class CellTypeSpec:
    name: str
    child: str
    child_number: int
    is_node_level: bool


@dataclass
class PhysicalSpec:
    """One physical cell with inferred address; children are full (never partial)."""

    cell_type: str
    address: str  # own address (node name for node-level cells, device index for leaves)
    path: str  # full address: ancestors' addresses joined by "/"
    pinned_id: str | None
    children: list[PhysicalSpec]
    label: str  # where it came from in the YAML, for error messages


@dataclass(frozen=True)
class VirtualCellSpec:
    path: tuple[str, ...]  # e.g. ("K80-NODE-POOL", "K80-NODE")
    number: int
    label: str

    @property
    def chain(self) -> str:
        return self.path[0]

    @property
    def cell_type(self) -> str:
        return self.path[-1]


@dataclass(frozen=True)
class VirtualClusterSpec:
    name: str
    virtual_cells: tuple[VirtualCellSpec, ...]
    pinned_ids: tuple[str, ...]


@dataclass
class ChainInfo:
    """The type chain under one top-level physical cell type (HiveD's CellChain)."""

    name: str
    types: list[str]  # index = level - 1: types[0] is the leaf type, types[-1] the top
    child_numbers: list[int]  # child_numbers[i] = children of a types[i] cell (0 for leaf)
    leaves_per_level: list[int]  # leaf cells inside one cell of level i + 1
    node_level: int  # 1-based level of the node-level type

    @property
    def top_level(self) -> int:
        return len(self.types)

    @property
    def leaf_type(self) -> str:
        return self.types[0]

    def level_of(self, cell_type: str) -> int | None:
        for i, t in enumerate(self.types):
            if t == cell_type:
                return i + 1
        return None


@dataclass
class Config:
    sku_types: dict[str, Any]
    cell_types: dict[str, CellTypeSpec]
    physical_cells: list[PhysicalSpec]
    virtual_clusters: dict[str, VirtualClusterSpec]  # insertion order = sorted VC names
    chains: dict[str, ChainInfo]  # in order of first appearance in physicalCells
    raw: dict[str, Any] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Compact msgpack-friendly form; ``load_config(c.to_dict())`` rebuilds ``c``."""
        return self.raw

    def node_names(self) -> list[str]:
        """Distinct K8s node names, sorted (a node may hold cells of several chains)."""
        out: list[str] = []
        for top in self.physical_cells:
            _collect_nodes(top, self.chains[top.cell_type], self.chains[top.cell_type].top_level, out)
        return sorted(set(out))

    def summary(self) -> dict[str, Any]:
        """Counts for the ``validate`` CLI and the status queries."""
        chains = {}
        for top in self.physical_cells:
            ch = self.chains[top.cell_type]
            entry = chains.setdefault(
                ch.name, {"leafCellType": ch.leaf_type, "topCells": 0, "nodes": 0, "leafCells": 0}
            )
            entry["topCells"] += 1
            entry["leafCells"] += ch.leaves_per_level[-1]
            nodes: list[str] = []
            _collect_nodes(top, ch, ch.top_level, nodes)
            entry["nodes"] += len(nodes)
        vcs = {}
        for vc in self.virtual_clusters.values():
            leaves = 0
            for v in vc.virtual_cells:
                ch = self.chains[v.chain]
                leaves += v.number * ch.leaves_per_level[ch.level_of(v.cell_type) - 1]  # type: ignore[operator]
            vcs[vc.name] = {"virtualCells": sum(v.number for v in vc.virtual_cells),
                            "pinnedCells": len(vc.pinned_ids), "nonPinnedLeafCells": leaves}
        return {"chains": chains, "virtualClusters": vcs}


def _collect_nodes(spec: PhysicalSpec, chain: ChainInfo, level: int, out: list[str]) -> None:
    if level == chain.node_level:
        out.append(spec.address)
        return
    for c in spec.children:
        _collect_nodes(c, chain, level - 1, out)


def load_config(source: str | bytes | dict[str, Any] | Path) -> Config:
    """Parse and validate a HiveD config; raise ``ConfigError`` naming the bad entry."""
    if isinstance(source, Path):
        try:
            source = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if isinstance(source, (str, bytes)):
        try:
            doc = yaml.safe_load(source)
        except yaml.YAMLError as exc:
            raise ConfigError(f"malformed YAML: {' '.join(str(exc).split())}") from None
    else:
        doc = source
    if not isinstance(doc, dict):
        raise ConfigError("config must be a YAML mapping with physicalCluster and virtualClusters")
    return _Parser(doc).parse()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _scalar_str(v: Any, label: str, what: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise ConfigError(f"{label}: {what} must be a string or number, got {type(v).__name__}")
    return str(v)


def _plain(v: Any) -> Any:
    """Reduce arbitrary YAML values to msgpack-friendly ones (for skuTypes)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


SKU_QUANTITIES = ("gpu", "cpu")  # HiveD's SkuType: gpu, cpu (int32) and memory (a quantity)
_INT32_MAX = (1 << 31) - 1
# A non-negative Kubernetes quantity: a decimal number with an optional binary (Ki..Ei),
# decimal (n, u, m, k, M..E) or exponent suffix.
_QUANTITY = re.compile(r"\+?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?")


def _sku_name(k: Any) -> str:
    if isinstance(k, bool) or not isinstance(k, (str, int)) or k == "":
        raise ConfigError(f"physicalCluster.skuTypes: {k!r} is not a sku type name")
    return str(k)


def _sku(name: Any, v: Any) -> Any:
    """One ``skuTypes`` entry: a mapping whose ``gpu`` and ``cpu`` (if given) are
    non-negative integers and whose ``memory`` is a quantity (``8192Mi``) or a number
    of bytes; other fields are kept as given (HiveD ignores them)."""
    label = f"physicalCluster.skuTypes.{name}"
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ConfigError(f"{label}: must be a mapping (gpu, cpu, memory), got {type(v).__name__}")
    for field in SKU_QUANTITIES:
        n = v.get(field)
        if n is not None and (not _is_int(n) or not 0 <= n <= _INT32_MAX):
            raise ConfigError(f"{label}: {field} must be a non-negative integer, got {n!r}")
    mem = v.get("memory")
    if mem is not None and not ((isinstance(mem, str) and _QUANTITY.fullmatch(mem)) or (_is_int(mem) and mem >= 0)):
        raise ConfigError(f"{label}: memory must be a quantity such as 8192Mi or a number of bytes, got {mem!r}")
    return _plain(v)


class _Parser:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.cell_count = 0

    def parse(self) -> Config:
        pc = self.doc.get("physicalCluster")
        if not isinstance(pc, dict):
            raise ConfigError("physicalCluster: missing or not a mapping")
        sku_raw = pc.get("skuTypes") or {}
        if not isinstance(sku_raw, dict):
            raise ConfigError("physicalCluster.skuTypes: must be a mapping")
        sku_types = {_sku_name(k): _sku(k, v) for k, v in sku_raw.items()}
        cell_types = self._cell_types(pc.get("cellTypes"), sku_types)
        chains: dict[str, ChainInfo] = {}
        physical = self._physical_cells(pc.get("physicalCells"), cell_types, chains)
        vcs = self._virtual_clusters(self.doc.get("virtualClusters"), cell_types, chains)
        self._check_pinned(physical, vcs)
        self._check_quota_fit(physical, vcs, chains)
        raw = {
            "physicalCluster": {
                "skuTypes": sku_types,
                "cellTypes": {
                    n: {"childCellType": t.child, "childCellNumber": t.child_number, "isNodeLevel": t.is_node_level}
                    for n, t in cell_types.items()
                },
                "physicalCells": [self._raw_physical(s) for s in pc["physicalCells"]],
            },
            "virtualClusters": {
                vc.name: {
                    "virtualCells": [{"cellType": ".".join(v.path), "cellNumber": v.number} for v in vc.virtual_cells],
                    "pinnedCells": [{"pinnedCellId": p} for p in vc.pinned_ids],
                }
                for vc in vcs.values()
            },
        }
        return Config(sku_types, cell_types, physical, vcs, chains, raw)

    # -- cellTypes -------------------------------------------------------------------

    def _cell_types(self, raw: Any, sku_types: dict[str, Any]) -> dict[str, CellTypeSpec]:
        if not isinstance(raw, dict) or not raw:
            raise ConfigError("physicalCluster.cellTypes: missing or empty")
        if len(raw) > CELL_TYPES_MAX:
            raise ConfigError(f"physicalCluster.cellTypes: more than {CELL_TYPES_MAX} cell types")
        out: dict[str, CellTypeSpec] = {}
        for name, spec in raw.items():
            label = f"cellTypes.{name}"
            if not isinstance(name, str) or not name or "." in name:
                raise ConfigError(f"{label}: cell type names must be non-empty strings without '.'")
            if name in sku_types:
                raise ConfigError(f"{label}: {name} is a skuType (a leaf) and cannot have children")
            if not isinstance(spec, dict):
                raise ConfigError(f"{label}: must be a mapping with childCellType and childCellNumber")
            child = spec.get("childCellType")
            if not isinstance(child, str) or not child or "." in child:
                raise ConfigError(f"{label}: childCellType must be a non-empty cell type name")
            number = spec.get("childCellNumber")
            if not _is_int(number) or number <= 0:
                raise ConfigError(f"{label}: childCellNumber must be a positive integer, got {number!r}")
            if number > CHILD_CELL_NUMBER_MAX:
                raise ConfigError(f"{label}: childCellNumber {number} exceeds {CHILD_CELL_NUMBER_MAX}")
            node = spec.get("isNodeLevel", False)
            if node is None:
                node = False
            if not isinstance(node, bool):
                raise ConfigError(f"{label}: isNodeLevel must be true or false, got {node!r}")
            out[name] = CellTypeSpec(name, child, number, node)
        for name, t in out.items():
            if t.child not in out and sku_types and t.child not in sku_types:
                raise ConfigError(
                    f"cellTypes.{name}: unknown cell type {t.child!r} (neither a cellType nor a skuType)"
                )
        # Cycles: each type has one child, so walking from any type either ends at a leaf
        # or revisits a type.
        for name in out:
            seen = [name]
            cur = out[name].child
            while cur in out:
                if cur in seen:
                    cycle = " -> ".join(seen[seen.index(cur):] + [cur])
                    raise ConfigError(f"cellTypes.{name}: cell types form a cycle ({cycle}); they must form a forest")
                seen.append(cur)
                if len(seen) >= LEVELS_MAX:
                    raise ConfigError(f"cellTypes.{name}: more than {LEVELS_MAX} levels below it")
                cur = out[cur].child
        return out

    def _chain(self, top: str, cell_types: dict[str, CellTypeSpec], label: str) -> ChainInfo:
        types_top_down = [top]
        while types_top_down[-1] in cell_types:
            types_top_down.append(cell_types[types_top_down[-1]].child)
        types = list(reversed(types_top_down))
        child_numbers = [cell_types[t].child_number if t in cell_types else 0 for t in types]
        leaves = [1]
        for i in range(1, len(types)):
            leaves.append(leaves[-1] * child_numbers[i])
        node_levels = [i + 1 for i, t in enumerate(types) if t in cell_types and cell_types[t].is_node_level]
        if len(node_levels) != 1:
            which = "no" if not node_levels else f"{len(node_levels)} ({', '.join(types[i - 1] for i in node_levels)})"
            raise ConfigError(
                f"{label}: cell type chain {' > '.join(types_top_down)} has {which} isNodeLevel types; "
                "each physical cell must contain exactly one node level"
            )
        return ChainInfo(top, types, child_numbers, leaves, node_levels[0])

    # -- physicalCells ----------------------------------------------------------------

    def _physical_cells(
        self, raw: Any, cell_types: dict[str, CellTypeSpec], chains: dict[str, ChainInfo]
    ) -> list[PhysicalSpec]:
        if not isinstance(raw, list) or not raw:
            raise ConfigError("physicalCluster.physicalCells: missing or empty list")
        out: list[PhysicalSpec] = []
        nodes: dict[str, str] = {}
        for i, spec in enumerate(raw):
            label = f"physicalCells[{i}]"
            if not isinstance(spec, dict):
                raise ConfigError(f"{label}: must be a mapping with cellType")
            ct = spec.get("cellType")
            if not isinstance(ct, str) or not ct:
                raise ConfigError(f"{label}: cellType missing")
            if ct not in cell_types:
                raise ConfigError(f"{label}: unknown cellType {ct!r}")
            if ct not in chains:
                chains[ct] = self._chain(ct, cell_types, label)
            chain = chains[ct]
            total = chain.leaves_per_level[-1]
            self.cell_count += sum(total // n for n in chain.leaves_per_level)
            if self.cell_count > PHYSICAL_CELLS_MAX:
                raise ConfigError(f"{label}: physical cluster exceeds {PHYSICAL_CELLS_MAX} cells")
            out.append(self._physical(spec, chain, chain.top_level, i, "", label, nodes, None))
        return out

    def _physical(
        self,
        spec: dict[str, Any] | None,
        chain: ChainInfo,
        level: int,
        default_index: int,
        prefix: str,
        label: str,
        nodes: dict[str, str],
        node: str | None,
    ) -> PhysicalSpec:
        spec = spec or {}
        if not isinstance(spec, dict):
            raise ConfigError(f"{label}: must be a mapping")
        ctype = chain.types[level - 1]
        given_type = spec.get("cellType")
        if given_type not in (None, "", ctype):
            raise ConfigError(f"{label}: cellType {given_type!r} does not match the parent's childCellType {ctype!r}")
        addr_raw = spec.get("cellAddress")
        if addr_raw is None or addr_raw == "":
            if level == chain.node_level:
                raise ConfigError(f"{label}: node-level cell ({ctype}) needs a cellAddress (its K8s node name)")
            address = str(default_index)
        else:
            address = _scalar_str(addr_raw, label, "cellAddress")
        pinned = spec.get("pinnedCellId")
        if pinned is not None and (not isinstance(pinned, str) or not pinned):
            raise ConfigError(f"{label}: pinnedCellId must be a non-empty string")
        path = prefix + address
        if level == chain.node_level:
            node = address
        if level == 1:
            if spec.get("cellChildren"):
                raise ConfigError(f"{label}: leaf cell ({ctype}) cannot have cellChildren")
            # A device index: decimal digits only. Python's int() would also take "1_0"
            # (device 10), " 3", "+3", "-1" and non-ASCII digits.
            if not (address.isascii() and address.isdigit()):
                raise ConfigError(f"{label}: leaf cell address {address!r} must be an integer device index "
                                  "(decimal digits)")
            return PhysicalSpec(ctype, address, path, pinned, [], label)
        n = chain.child_numbers[level - 1]
        kids_raw = spec.get("cellChildren")
        if kids_raw is None:
            kids_raw = []
        if not isinstance(kids_raw, list):
            raise ConfigError(f"{label}: cellChildren must be a list")
        if kids_raw and len(kids_raw) != n:
            raise ConfigError(
                f"{label}: {ctype} needs all {n} children (childCellNumber) or none, got {len(kids_raw)}"
            )
        if not kids_raw:
            kids_raw = [None] * n
        base = 0 if level == chain.node_level else default_index * n
        children = [
            self._physical(k, chain, level - 1, base + j, path + "/", f"{label}.cellChildren[{j}]", nodes, node)
            for j, k in enumerate(kids_raw)
        ]
        if level == chain.node_level:
            # A node may hold cells of several chains (design.yaml's node 1.0.0.2 has CT1
            # and DGX1-P100 devices), but each device (node, index) exists once.
            for leaf in _leaves(children):
                key = f"{address}/{int(leaf.address)}"
                if key in nodes:
                    raise ConfigError(
                        f"{leaf.label}: device {int(leaf.address)} of node {address!r} is already defined at {nodes[key]}"
                    )
                nodes[key] = leaf.label
        return PhysicalSpec(ctype, address, path, pinned, children, label)

    def _raw_physical(self, spec: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if not isinstance(spec, dict):
            return out
        if spec.get("cellType"):
            out["cellType"] = spec["cellType"]
        if spec.get("cellAddress") not in (None, ""):
            out["cellAddress"] = str(spec["cellAddress"])
        if spec.get("pinnedCellId"):
            out["pinnedCellId"] = spec["pinnedCellId"]
        if spec.get("cellChildren"):
            out["cellChildren"] = [self._raw_physical(c) for c in spec["cellChildren"]]
        return out

    # -- virtualClusters ---------------------------------------------------------------

    def _virtual_clusters(
        self, raw: Any, cell_types: dict[str, CellTypeSpec], chains: dict[str, ChainInfo]
    ) -> dict[str, VirtualClusterSpec]:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError("virtualClusters: must be a mapping of VC name to spec")
        out: dict[str, VirtualClusterSpec] = {}
        # Sorted names: construction order must not depend on the YAML's mapping order,
        # or a replica restoring a snapshot (whose maps are sorted) would number cells
        # differently from one that read the file.
        for name in sorted(raw, key=str):
            spec = raw[name]
            label = f"virtualClusters.{name}"
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{label}: VC names must be non-empty strings")
            if spec is None:
                spec = {}
            if not isinstance(spec, dict):
                raise ConfigError(f"{label}: must be a mapping with virtualCells")
            cells_raw = spec.get("virtualCells") or []
            if not isinstance(cells_raw, list):
                raise ConfigError(f"{label}.virtualCells: must be a list")
            cells = []
            for i, c in enumerate(cells_raw):
                cl = f"{label}.virtualCells[{i}]"
                if not isinstance(c, dict):
                    raise ConfigError(f"{cl}: must be a mapping with cellType and cellNumber")
                ct = c.get("cellType")
                if not isinstance(ct, str) or not ct:
                    raise ConfigError(f"{cl}: cellType missing")
                path = tuple(ct.split("."))
                if path[0] not in chains:
                    if path[0] in cell_types or any(path[0] == ch.leaf_type for ch in chains.values()):
                        raise ConfigError(
                            f"{cl}: cellType {ct!r} must start with a cell type used at the top of physicalCells"
                        )
                    raise ConfigError(f"{cl}: unknown cell type {path[0]!r} in {ct!r}")
                for a, b in zip(path, path[1:]):
                    if a not in cell_types or cell_types[a].child != b:
                        raise ConfigError(f"{cl}: in {ct!r}, {b!r} is not the childCellType of {a!r}")
                number = c.get("cellNumber")
                if not _is_int(number) or number < 0:
                    raise ConfigError(f"{cl}: cellNumber must be a non-negative integer, got {number!r}")
                if number > CELL_NUMBER_MAX:
                    raise ConfigError(f"{cl}: cellNumber {number} exceeds {CELL_NUMBER_MAX}")
                cells.append(VirtualCellSpec(path, number, cl))
            pinned_raw = spec.get("pinnedCells") or []
            if not isinstance(pinned_raw, list):
                raise ConfigError(f"{label}.pinnedCells: must be a list")
            pins = []
            for i, p in enumerate(pinned_raw):
                pid = p.get("pinnedCellId") if isinstance(p, dict) else None
                if not isinstance(pid, str) or not pid:
                    raise ConfigError(f"{label}.pinnedCells[{i}]: pinnedCellId missing")
                pins.append(pid)
            out[name] = VirtualClusterSpec(name, tuple(cells), tuple(pins))
        return out

    def _check_pinned(self, physical: list[PhysicalSpec], vcs: dict[str, VirtualClusterSpec]) -> None:
        found: dict[str, str] = {}

        def walk(s: PhysicalSpec, inside: str | None) -> None:
            if s.pinned_id is not None:
                if s.pinned_id in found:
                    raise ConfigError(
                        f"{s.label}: pinnedCellId {s.pinned_id!r} is already used at {found[s.pinned_id]}"
                    )
                if inside is not None:
                    raise ConfigError(f"{s.label}: pinned cell {s.pinned_id!r} is nested inside pinned cell {inside!r}")
                found[s.pinned_id] = s.label
                inside = s.pinned_id
            for c in s.children:
                walk(c, inside)

        for top in physical:
            walk(top, None)
        owner: dict[str, str] = {}
        for vc in vcs.values():
            for i, pid in enumerate(vc.pinned_ids):
                label = f"virtualClusters.{vc.name}.pinnedCells[{i}]"
                if pid not in found:
                    raise ConfigError(f"{label}: pinnedCellId {pid!r} is not defined in physicalCells")
                if pid in owner:
                    raise ConfigError(f"{label}: pinnedCellId {pid!r} is already referred to by VC {owner[pid]!r}")
                owner[pid] = vc.name

    def _check_quota_fit(
        self, physical: list[PhysicalSpec], vcs: dict[str, VirtualClusterSpec], chains: dict[str, ChainInfo]
    ) -> None:
        """Every VC cell must be obtainable by buddy allocation at the same time.

        Pinned cells are carved out first (they are bound statically); what remains is
        checked top-down: demand at a level is served by free cells at that level, and
        every unused cell splits into children for the level below.
        """
        free: dict[str, list[int]] = {name: [0] * (ch.top_level + 1) for name, ch in chains.items()}
        pinned_at: dict[str, tuple[str, int]] = {}

        def carve(s: PhysicalSpec, chain: ChainInfo, level: int) -> bool:
            """Count maximal free cells in s; return True if s holds a pinned cell."""
            if s.pinned_id is not None:
                pinned_at[s.pinned_id] = (chain.name, level)
                return True
            has = [carve(c, chain, level - 1) for c in s.children]
            if not any(has):
                return False
            for c, h in zip(s.children, has):
                if not h:
                    free[chain.name][level - 1] += 1
            return True

        for top in physical:
            ch = chains[top.cell_type]
            if not carve(top, ch, ch.top_level):
                free[ch.name][ch.top_level] += 1
        demand: dict[str, list[int]] = {name: [0] * (ch.top_level + 1) for name, ch in chains.items()}
        who: dict[tuple[str, int], list[str]] = {}
        for vc in vcs.values():
            for v in vc.virtual_cells:
                ch = chains[v.chain]
                lvl = ch.level_of(v.cell_type)
                assert lvl is not None
                demand[ch.name][lvl] += v.number
                if v.number:
                    who.setdefault((ch.name, lvl), []).append(vc.name)
        for name, ch in chains.items():
            available = 0
            for lvl in range(ch.top_level, 0, -1):
                available += free[name][lvl]
                need = demand[name][lvl]
                if need > available:
                    vcs_named = ", ".join(sorted(set(who.get((name, lvl), []))))
                    raise ConfigError(
                        f"virtualClusters: quota does not fit the physical cluster: chain {name} needs "
                        f"{need} {ch.types[lvl - 1]} cells (VCs {vcs_named}) but only {available} are available"
                    )
                left = available - need
                if lvl > 1:
                    available = left * ch.child_numbers[lvl - 1]
        for vc in vcs.values():
            for v in vc.virtual_cells:
                if v.chain not in chains:  # unreachable: checked in _virtual_clusters
                    raise ConfigError(f"{v.label}: unknown chain {v.chain!r}")


def _leaves(children: list[PhysicalSpec]) -> list[PhysicalSpec]:
    out: list[PhysicalSpec] = []
    stack = list(reversed(children))
    while stack:
        s = stack.pop()
        if s.children:
            stack.extend(reversed(s.children))
        else:
            out.append(s)
    return out
