"""HiveD's pod scheduling spec, validated into a :class:`Request` for one affinity group.

An ``allocate`` command carries the spec of one affinity group, in HiveD's field names
(as in the ``hivedscheduler.microsoft.com/pod-scheduling-spec`` annotation), either as a
mapping or as that annotation's YAML text::

    virtualCluster: vc1          # required
    priority: 100                # -1 (opportunistic) .. 1000; default 0
    pinnedCellId: VC2-K80        # optional: only the VC's pinned cell
    leafCellType: K80            # optional: only this SKU; any type if absent or null
    leafCellNumber: 4            # the pod's leaf cells (used when members are absent)
    affinityGroup:               # the gang; null means a group of this one pod
      name: job/group            # group name (``name`` at top level if affinityGroup is null)
      members:
      - {podNumber: 2, leafCellNumber: 4}
    lazyPreemptionEnable: false
    gangReleaseEnable: false
    ignoreK8sSuggestedNodes: true   # HiveD's default: suggested nodes are ignored

Fields HiveD knows but Cellar does not model (``quota``) and unknown fields are ignored,
as HiveD's YAML decoding ignores them. ``parse_request`` raises :class:`RequestError`.
"""

from __future__ import annotations

from typing import Any

import yaml

from scheduler_state.cells import MAX_GUARANTEED_PRIORITY, OPPORTUNISTIC_PRIORITY

PODS_PER_GROUP_MAX = 10_000
LEAF_CELLS_PER_POD_MAX = 100_000
NAME_BYTES_MAX = 253  # a K8s object name
SUGGESTED_NODES_MAX = 100_000


class RequestError(ValueError):
    """The request itself is invalid (HiveD answers such pods with a bad-request error)."""


class Request:
    """One validated affinity group request. Immutable by convention (nothing assigns
    to a Request once built); equality and hash are over the fields below, as a frozen
    dataclass's would be. A plain class with ``__slots__`` because one is built for
    every ``allocate`` and pod command: a frozen dataclass sets each field through
    ``object.__setattr__``, several times the cost."""

    __slots__ = ("name", "vc", "priority", "pinned_id", "leaf_type", "members", "lazy_preemption",
                 "gang_release", "ignore_suggested", "suggested", "pod_sizes", "total")

    def __init__(self, name: str, vc: str, priority: int, pinned_id: str | None, leaf_type: str | None,
                 members: tuple[tuple[int, int], ...], lazy_preemption: bool, gang_release: bool,
                 ignore_suggested: bool, suggested: tuple[str, ...] | None) -> None:
        self.name = name
        self.vc = vc
        self.priority = priority
        self.pinned_id = pinned_id
        self.leaf_type = leaf_type
        self.members = members  # (podNumber, leafCellNumber), as given
        self.lazy_preemption = lazy_preemption
        self.gang_release = gang_release
        self.ignore_suggested = ignore_suggested
        self.suggested = suggested  # sorted, or None when not given
        # Derived from ``members`` once (placement reads them several times per command).
        if len(members) == 1:
            n, k = members[0]
            self.pod_sizes: tuple[int, ...] = (k,) * n
            self.total = n * k
        else:
            sizes: list[int] = []
            total = 0
            for n, k in members:
                sizes += [k] * n
                total += n * k
            self.pod_sizes = tuple(sizes)
            self.total = total

    def _fields(self) -> tuple[Any, ...]:
        return (self.name, self.vc, self.priority, self.pinned_id, self.leaf_type, self.members,
                self.lazy_preemption, self.gang_release, self.ignore_suggested, self.suggested)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (f"Request(name={self.name!r}, vc={self.vc!r}, priority={self.priority!r}, "
                f"pinned_id={self.pinned_id!r}, leaf_type={self.leaf_type!r}, members={self.members!r}, "
                f"lazy_preemption={self.lazy_preemption!r}, gang_release={self.gang_release!r}, "
                f"ignore_suggested={self.ignore_suggested!r}, suggested={self.suggested!r})")

    @property
    def pods(self) -> list[int]:
        """Leaf cells per pod, members expanded in order (a new list each time)."""
        return list(self.pod_sizes)

    @property
    def opportunistic(self) -> bool:
        return self.priority == OPPORTUNISTIC_PRIORITY

    def suggested_filter(self) -> frozenset[str] | None:
        """The nodes placements must stay within, or None (HiveD's default ignores them)."""
        if self.ignore_suggested or self.suggested is None:
            return None
        return frozenset(self.suggested)

    def spec(self) -> dict[str, Any]:
        """The normalized spec in HiveD's field names (msgpack-friendly)."""
        out: dict[str, Any] = {
            "virtualCluster": self.vc,
            "priority": self.priority,
            "affinityGroup": {
                "name": self.name,
                "members": [{"podNumber": n, "leafCellNumber": k} for n, k in self.members],
            },
            "lazyPreemptionEnable": self.lazy_preemption,
            "gangReleaseEnable": self.gang_release,
            "ignoreK8sSuggestedNodes": self.ignore_suggested,
        }
        if self.pinned_id is not None:
            out["pinnedCellId"] = self.pinned_id
        if self.leaf_type is not None:
            out["leafCellType"] = self.leaf_type
        return out

    def to_record(self) -> dict[str, Any]:
        rec = self.spec()
        if self.suggested is not None:
            rec["suggestedNodes"] = list(self.suggested)
        return rec


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(spec: dict[str, Any], key: str, default: bool) -> bool:
    v = spec.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"{key} must be true or false, got {v!r}")
    return v


_SHORT = NAME_BYTES_MAX // 4  # a str this long or shorter is within NAME_BYTES_MAX (4 bytes a character at most)


def _name(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise RequestError(f"{what} must be a non-empty string")
    if len(v) > NAME_BYTES_MAX // 4 and len(v.encode()) > NAME_BYTES_MAX:  # (4 bytes a character at most)
        raise RequestError(f"{what} is longer than {NAME_BYTES_MAX} bytes")
    return v


def parse_request(group: Any, suggested: Any = None) -> Request:
    """Validate one affinity group's spec (a mapping or the annotation's YAML text).

    The common shapes (plain ``str`` / ``int`` values, short names) are checked inline;
    anything else goes through the general helpers, with the same checks in the same
    order, so every error is the one it always was."""
    if isinstance(group, str):
        try:
            group = yaml.safe_load(group)
        except yaml.YAMLError as exc:
            raise RequestError(f"malformed YAML in group spec: {' '.join(str(exc).split())}") from None
    if not isinstance(group, dict):
        raise RequestError("group must be a mapping (HiveD's pod scheduling spec)")
    get = group.get
    vc = get("virtualCluster")
    if type(vc) is not str or not vc or len(vc) > _SHORT:
        vc = _name(vc, "virtualCluster")
    priority = get("priority", 0)
    if priority is None:
        priority = 0
    if type(priority) is not int and not _is_int(priority):
        raise RequestError(f"priority must be an integer, got {priority!r}")
    if priority < OPPORTUNISTIC_PRIORITY:
        raise RequestError(f"priority {priority} is less than {OPPORTUNISTIC_PRIORITY} (opportunistic)")
    if priority > MAX_GUARANTEED_PRIORITY:
        raise RequestError(f"priority {priority} is greater than {MAX_GUARANTEED_PRIORITY}")
    pinned = get("pinnedCellId") or None
    if pinned is not None:
        pinned = _name(pinned, "pinnedCellId")
    leaf_type = get("leafCellType") or None
    if leaf_type is not None and (type(leaf_type) is not str or len(leaf_type) > _SHORT):
        leaf_type = _name(leaf_type, "leafCellType")
    pod_leaves = get("leafCellNumber")
    if pod_leaves is not None and (not _is_int(pod_leaves) or pod_leaves <= 0):
        raise RequestError(f"leafCellNumber must be a positive integer, got {pod_leaves!r}")
    ag = get("affinityGroup")
    npods = 0
    if ag is None:
        name = _name(get("name"), "affinityGroup.name (or name, when affinityGroup is null)")
        if pod_leaves is None:
            raise RequestError("leafCellNumber is required when affinityGroup is null")
        members: list[tuple[int, int]] = [(1, pod_leaves)]
        npods = 1
    else:
        if not isinstance(ag, dict):
            raise RequestError("affinityGroup must be a mapping with name and members")
        name = ag.get("name")
        if type(name) is not str or not name or len(name) > _SHORT:
            name = _name(name, "affinityGroup.name")
        raw_members = ag.get("members")
        if raw_members is None:
            if pod_leaves is None:
                raise RequestError("affinityGroup.members (or leafCellNumber) is required")
            raw_members = [{"podNumber": 1, "leafCellNumber": pod_leaves}]
        if not isinstance(raw_members, list) or not raw_members:
            raise RequestError("affinityGroup.members must be a non-empty list")
        members = []
        for i, m in enumerate(raw_members):
            if not isinstance(m, dict):
                raise RequestError(f"affinityGroup.members[{i}] must be a mapping with podNumber and leafCellNumber")
            n, k = m.get("podNumber"), m.get("leafCellNumber")
            if (type(n) is not int and not _is_int(n)) or n <= 0:
                raise RequestError(f"affinityGroup.members[{i}].podNumber must be a positive integer, got {n!r}")
            if (type(k) is not int and not _is_int(k)) or k <= 0:
                raise RequestError(f"affinityGroup.members[{i}].leafCellNumber must be a positive integer, got {k!r}")
            if k > LEAF_CELLS_PER_POD_MAX:
                raise RequestError(f"affinityGroup.members[{i}].leafCellNumber {k} exceeds {LEAF_CELLS_PER_POD_MAX}")
            members.append((n, k))
            npods += n
        if pod_leaves is not None and all(k != pod_leaves for _, k in members):
            raise RequestError(
                f"affinityGroup.members does not contain the pod's leafCellNumber {pod_leaves}"
            )
    if npods > PODS_PER_GROUP_MAX:
        raise RequestError(f"affinity group has more than {PODS_PER_GROUP_MAX} pods")
    if pinned is not None and priority == OPPORTUNISTIC_PRIORITY:
        raise RequestError(f"opportunistic pods cannot use pinned cell {pinned}")
    sugg: tuple[str, ...] | None = None
    if suggested is not None:
        if not isinstance(suggested, (list, tuple)) or not all(isinstance(s, str) for s in suggested):
            raise RequestError("suggestedNodes must be a list of node names")
        if len(suggested) > SUGGESTED_NODES_MAX:
            raise RequestError(f"suggestedNodes has more than {SUGGESTED_NODES_MAX} entries")
        sugg = tuple(sorted(set(suggested)))
    lazy = get("lazyPreemptionEnable")
    if lazy is None:
        lazy = False
    elif lazy is not True and lazy is not False:
        lazy = _bool(group, "lazyPreemptionEnable", False)
    gang = get("gangReleaseEnable")
    if gang is None:
        gang = False
    elif gang is not True and gang is not False:
        gang = _bool(group, "gangReleaseEnable", False)
    ignore = get("ignoreK8sSuggestedNodes")
    if ignore is None:
        ignore = True
    elif ignore is not True and ignore is not False:
        ignore = _bool(group, "ignoreK8sSuggestedNodes", True)
    return Request(name, vc, priority, pinned, leaf_type, tuple(members), lazy, gang, ignore, sugg)


def request_from_record(rec: dict[str, Any]) -> Request:
    """Inverse of ``Request.to_record`` (snapshots)."""
    return parse_request(rec, rec.get("suggestedNodes"))
