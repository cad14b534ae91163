"""scheduler_state.machine: the command set, its errors (state unchanged, acceptance 3),
leases, partial release, suggested nodes, queries, snapshots, and HiveD-format request
files replayed against the configs they were written for: ours (examples/hived-features:
fleet, pinned) by default, HiveD's own (design, basic) with ``-m shared``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml

from scheduler_state import SchedulerStateMachine, check, load_config
from tests.scheduler_state.helpers import (
    FEATURES,
    allocate,
    apply_ok,
    assert_unchanged,
    machine,
    nodes_of,
    spec,
    status,
)

V100 = ["gpu-v0", "gpu-v1", "gpu-v2", "gpu-v3"]  # mixed.yaml's V100 rack; gpu-t0 is its T4 node


def rejected(m: SchedulerStateMachine, cmd: Any, *fragments: str) -> dict[str, Any]:
    before = m.snapshot()
    r = m.apply(cmd)
    assert r["ok"] is False and "error" in r, r
    for f in fragments:
        assert f in r["error"], f"{f!r} not in {r['error']!r}"
    assert "internal error" not in r["error"]
    assert_unchanged(m, before)
    assert check(m) == []
    return r


@pytest.fixture
def busy() -> SchedulerStateMachine:
    """mixed.yaml with some groups running and one waiting."""
    m = machine("mixed")
    allocate(m, "a", "vision", 0, 1, 2, "V100")
    allocate(m, "b", "speech", 3, 2, 8, "V100")
    allocate(m, "o", "vision", -1, 1, 1, "V100")
    allocate(m, "w", "vision", 0, 3, 8, "V100")  # waits: vision has one V100 node
    return m


def test_malformed_commands(busy: SchedulerStateMachine) -> None:
    m = busy
    rejected(m, "allocate", "command must be a mapping")
    rejected(m, ["allocate"], "command must be a mapping")
    rejected(m, {"op": "launch"}, "unknown op 'launch'", "allocate")
    rejected(m, {}, "unknown op")
    rejected(m, {"op": "allocate"}, "group must be a mapping")
    rejected(m, {"op": "allocate", "group": "virtualCluster: [vc1"}, "malformed YAML in group spec")
    rejected(m, {"op": "release"}, "group must be a non-empty string")
    rejected(m, {"op": "release", "group": "nope"}, "group nope does not exist")
    rejected(m, {"op": "set_node_health", "node": "gpu-v0"}, "healthy must be true or false")
    rejected(m, {"op": "set_node_health", "node": "10.0.0.1", "healthy": False}, "node 10.0.0.1 is not in the config")
    rejected(m, {"op": "vc_status", "vc": "vc9"}, "VC vc9 does not exist")
    rejected(m, {"op": "group_status", "group": "nope"}, "does not exist")
    rejected(m, {"op": "reconfigure"}, "config must be YAML text or a mapping")


def test_invalid_requests_leave_state_unchanged(busy: SchedulerStateMachine) -> None:
    m = busy

    def alloc(**kw: Any) -> dict[str, Any]:
        group = spec("x", "vision", 0, 1, 1)
        extra = kw.pop("cmd", {})
        group.update(kw)
        return {"op": "allocate", "group": group, **extra}

    rejected(m, alloc(virtualCluster="vc9"), "VC vc9 does not exist")
    rejected(m, alloc(leafCellType="K80"), "leaf cell type K80 does not exist")
    rejected(m, alloc(affinityGroup={"name": "x", "members": [{"podNumber": 1, "leafCellNumber": 9}]}),
             "request larger than any cell", "pods of up to 9")
    rejected(m, alloc(affinityGroup={"name": "x", "members": [{"podNumber": 5, "leafCellNumber": 8}]},
                      leafCellType="V100"), "request larger than any cell", "40 leaf cells")
    rejected(m, alloc(affinityGroup={"name": "x", "members": [{"podNumber": -1, "leafCellNumber": 1}]}),
             "podNumber must be a positive integer")
    rejected(m, alloc(affinityGroup={"name": "x", "members": [{"podNumber": 1, "leafCellNumber": -2}]}),
             "leafCellNumber must be a positive integer")
    rejected(m, alloc(affinityGroup={"name": "x", "members": []}), "non-empty list")
    rejected(m, alloc(affinityGroup={"members": [{"podNumber": 1, "leafCellNumber": 1}]}), "affinityGroup.name")
    rejected(m, alloc(priority=-2), "priority -2 is less than -1")
    rejected(m, alloc(priority=1001), "greater than 1000")
    rejected(m, alloc(priority="high"), "priority must be an integer")
    rejected(m, alloc(priority=True), "priority must be an integer")
    rejected(m, alloc(lazyPreemptionEnable="yes"), "lazyPreemptionEnable must be true or false")
    rejected(m, alloc(leafCellNumber=2), "does not contain the pod's leafCellNumber 2")
    rejected(m, alloc(pinnedCellId="P"), "VC vision does not have pinned cell P")
    rejected(m, alloc(cmd={"wait": "no"}), "wait must be true or false")
    rejected(m, alloc(cmd={"suggestedNodes": "gpu-v0"}), "suggestedNodes must be a list")
    rejected(m, alloc(cmd={"now_ms": -1, "ttl_ms": 10}), "now_ms must be >= 0")
    rejected(m, alloc(cmd={"now_ms": 5, "ttl_ms": 0}), "ttl_ms must be >= 1")
    rejected(m, {"op": "allocate", "group": spec("a", "vision", 0, 1, 1)}, "group a is already allocated")
    rejected(m, {"op": "allocate", "group": spec("w", "vision", 0, 1, 1)}, "group w is already waiting")
    # A VC without cells of the requested type (mixed.yaml's speech VC has no T4).
    rejected(m, {"op": "allocate", "group": spec("d", "speech", 0, 1, 1, "T4")},
             "VC speech does not have leaf cell type T4")


def test_request_as_hived_annotation_text() -> None:
    m = machine("mixed")
    text = """
virtualCluster: vision
priority: 10
leafCellType: V100
leafCellNumber: 2
affinityGroup:
  name: job/pcn
  members:
  - podNumber: 2
    leafCellNumber: 2
"""
    r = apply_ok(m, {"op": "allocate", "group": text})
    assert r["ok"] and r["group"] == "job/pcn" and [p["leaf_cell_number"] for p in r["placement"]] == [2, 2]
    single = apply_ok(m, {"op": "allocate", "group": {"virtualCluster": "speech", "leafCellNumber": 3,
                                                     "affinityGroup": None, "name": "ns/pod-0"}})
    assert single["ok"] and single["group"] == "ns/pod-0"


def test_queries(busy: SchedulerStateMachine) -> None:
    m = busy
    assert m.apply({"op": "list_groups"}) == {"ok": True, "allocated": ["a", "b", "o"], "pending": ["w"]}
    cs = m.apply({"op": "cluster_status"})
    v100 = cs["chains"]["V100-RACK"]
    assert (v100["leaf_cells"], v100["used_leaf_cells"], v100["opportunistic_leaf_cells"]) == (32, 19, 1)
    assert cs["pending"] == ["w"] and cs["groups"] == 3
    vc = m.apply({"op": "vc_status", "vc": "speech"})
    assert vc["guaranteed_leaf_cells_by_priority"] == {"3": 16}
    assert sorted(c["bound_to"] is not None for c in vc["cells"]) == [True, True]
    assert status(m, "w")["state"] == "pending" and status(m, "w")["queue_position"] == 0
    a = status(m, "a")
    assert a["virtual_placement"] == [["vision/0/0/0/0", "vision/0/0/0/1"]]
    before = m.snapshot()
    for op in ("list_groups", "cluster_status"):
        m.apply({"op": op})
    assert_unchanged(m, before)


def test_release_cancels_waiting_and_retries_queue(busy: SchedulerStateMachine) -> None:
    m = busy
    r = apply_ok(m, {"op": "release", "group": "w"})
    assert r["cancelled"] and m.apply({"op": "list_groups"})["pending"] == []
    # A pending group is placed by the release that makes room for it.
    assert allocate(m, "big", "speech", 3, 1, 8, "V100")["waiting"]
    freed = apply_ok(m, {"op": "release", "group": "b"})
    assert [s["group"] for s in freed["scheduled"]] == ["big"]
    assert status(m, "big")["state"] == "allocated"


def test_wait_false_does_not_queue() -> None:
    m = machine("mixed")
    r = allocate(m, "too-big", "vision", 0, 2, 8, "V100", wait=False)
    assert r == {"ok": False, "group": "too-big", "waiting": True, "queued": False, "reason": r["reason"]}
    assert m.apply({"op": "list_groups"})["pending"] == []


def test_partial_release_and_gang_release() -> None:
    m = machine("mixed")
    allocate(m, "inc", "speech", 0, 4, 2, "V100")
    allocate(m, "gang", "vision", 0, 2, 2, "V100", gangReleaseEnable=True)
    used = lambda: m.apply({"op": "cluster_status"})["chains"]["V100-RACK"]["used_leaf_cells"]  # noqa: E731
    assert used() == 12
    r = apply_ok(m, {"op": "release", "group": "inc", "pods": [0, 1]})
    assert r["released"] is False and used() == 12  # HiveD: held until the last pod ends
    r = apply_ok(m, {"op": "release", "group": "gang", "pods": [1]})
    assert r["released"] is False and used() == 12  # gang release: the same
    assert status(m, "gang")["placement"][1]["released"] is True
    r = apply_ok(m, {"op": "release", "group": "gang", "pods": [0]})
    assert r["released"] is True and used() == 8
    rejected(m, {"op": "release", "group": "inc", "pods": [7]}, "pod indices in 0..3")
    rejected(m, {"op": "release", "group": "inc", "pods": []}, "non-empty list")
    assert apply_ok(m, {"op": "release", "group": "inc", "pods": [2, 3, 3]})["released"] is True
    assert used() == 0


def test_suggested_nodes_are_honoured_unless_ignored() -> None:
    m = machine("mixed")
    ignored = allocate(m, "ignored", "speech", 0, 1, 8, "V100", suggestedNodes=["gpu-v3"])
    assert nodes_of(ignored) == ["gpu-v0"]  # HiveD's default: ignoreK8sSuggestedNodes true
    honoured = allocate(m, "honoured", "speech", 0, 1, 8, "V100", suggestedNodes=["gpu-v3"],
                        ignoreK8sSuggestedNodes=False)
    assert nodes_of(honoured) == ["gpu-v3"]
    opp = allocate(m, "opp", "vision", -1, 1, 1, "V100", suggestedNodes=["gpu-v2"],
                   ignoreK8sSuggestedNodes=False)
    assert nodes_of(opp) == ["gpu-v2"]
    r = allocate(m, "nowhere", "vision", 0, 1, 1, "V100", suggestedNodes=["gpu-v0"],
                 ignoreK8sSuggestedNodes=False, wait=False)
    assert r["waiting"] and "suggested" in r["reason"]


def test_leases_grant_renew_expire() -> None:
    m = machine("mixed")
    r = allocate(m, "a", "vision", 0, 1, 8, "V100", now_ms=1_000, ttl_ms=500)
    assert r["lease_expires_ms"] == 1_500
    allocate(m, "b", "speech", 0, 1, 8, "V100")
    waiting = allocate(m, "c", "vision", 0, 1, 8, "V100")
    assert waiting["queued"]
    rejected(m, {"op": "lease_renew", "group": "b", "now_ms": 1_100, "ttl_ms": 10}, "has no lease")
    g = apply_ok(m, {"op": "lease_grant", "group": "b", "now_ms": 1_100, "ttl_ms": 2_000})
    assert g["lease_expires_ms"] == 3_100
    assert apply_ok(m, {"op": "lease_renew", "group": "a", "now_ms": 1_400, "ttl_ms": 500})["lease_expires_ms"] == 1_900
    nothing = apply_ok(m, {"op": "lease_expire", "now_ms": 1_899})
    assert nothing["expired"] == [] and nothing["scheduled"] == []
    gone = apply_ok(m, {"op": "lease_expire", "now_ms": 1_900})
    assert gone["expired"] == ["a"] and [s["group"] for s in gone["scheduled"]] == ["c"]
    rejected(m, {"op": "lease_renew", "group": "a", "now_ms": 2_000, "ttl_ms": 10}, "group a does not exist")
    # Time never moves backwards: an older now_ms is read as the latest one seen.
    back = apply_ok(m, {"op": "lease_expire", "now_ms": 10})
    assert back["now_ms"] == 1_900 and back["expired"] == []
    rejected(m, {"op": "lease_grant", "group": "b", "now_ms": 1_000, "ttl_ms": "5"}, "ttl_ms must be an integer")
    # A renew after the lease ran out (before anyone expired it) is refused.
    rejected(m, {"op": "lease_renew", "group": "b", "now_ms": 3_100, "ttl_ms": 10}, "expired at 3100")
    assert apply_ok(m, {"op": "lease_expire", "now_ms": 5_000})["expired"] == ["b"]


def test_lease_on_waiting_group_cancels_it() -> None:
    m = machine("mixed")
    allocate(m, "a", "vision", 0, 1, 8, "V100")
    allocate(m, "w", "vision", 0, 1, 8, "V100", now_ms=0, ttl_ms=100)
    r = apply_ok(m, {"op": "lease_expire", "now_ms": 100})
    assert r["cancelled"] == ["w"] and r["expired"] == []
    assert m.apply({"op": "list_groups"})["pending"] == []


def test_snapshot_restore_exact_and_behaviour_preserved(busy: SchedulerStateMachine) -> None:
    m = busy
    allocate(m, "lazy", "speech", 0, 1, 2, "V100", lazyPreemptionEnable=True)
    apply_ok(m, {"op": "set_node_health", "node": "gpu-t0", "healthy": False})
    apply_ok(m, {"op": "lease_grant", "group": "b", "now_ms": 7, "ttl_ms": 70})
    snap = m.snapshot()
    other = SchedulerStateMachine(load_config(FEATURES / "pinned.yaml"))  # any config
    other.restore(snap)
    assert other.snapshot() == snap and check(other) == []
    # Both continue identically.
    cmds = [
        {"op": "allocate", "group": spec("p", "speech", 9, 1, 8, "V100")},
        {"op": "release", "group": "a"},
        {"op": "set_node_health", "node": "gpu-t0", "healthy": True},
        {"op": "lease_expire", "now_ms": 100},
        {"op": "allocate", "group": spec("q", "vision", -1, 2, 2, "V100")},
    ]
    for c in cmds:
        assert m.apply(c) == other.apply(c)
        assert m.snapshot() == other.snapshot()
    state = msgpack.unpackb(snap)
    assert list(state) == sorted(state)  # canonical: sorted keys
    with pytest.raises(ValueError):
        other.restore(msgpack.packb({"format": 99}))


def _pod_specs(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(pod name, scheduling spec) of every Pod document in a HiveD request file."""
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "Pod":
            ann = doc["metadata"]["annotations"]["hivedscheduler.microsoft.com/pod-scheduling-spec"]
            out.append((doc["metadata"]["name"], yaml.safe_load(ann)))
    return out


def _groups(path: Path) -> dict[str, dict[str, Any]]:
    """The affinity groups of a request file: one per group name, or per pod when the pod
    has no affinityGroup (HiveD names a one-pod group after the pod)."""
    groups: dict[str, dict[str, Any]] = {}
    for pod, s in _pod_specs(path):
        if s.get("affinityGroup") is None:
            s = dict(s, name=pod)
        groups.setdefault(s["affinityGroup"]["name"] if s.get("affinityGroup") else pod, s)
    return groups


def test_fleet_request_on_fleet_config() -> None:
    m = SchedulerStateMachine(load_config(FEATURES / "fleet.yaml"))
    groups = _groups(FEATURES / "fleet-request.yaml")
    assert sorted(groups) == ["sweep-export-0", "sweep/eval", "sweep/ib", "sweep/train"]
    results = {name: apply_ok(m, {"op": "allocate", "group": s}) for name, s in groups.items()}
    assert all(r["ok"] for r in results.values()), results
    train = results["sweep/train"]
    assert [p["leaf_cell_number"] for p in train["placement"]] == [8, 4, 4, 4, 2]
    # 22 GPUs: 2.75 H100 nodes, all in one chain (the only vision scope that big).
    assert train["chain"] == "H100-RACK4" and len(set(nodes_of(train))) == 3
    # The 4-GPU pods pack onto one node, as do the 2-GPU pod and a 4-GPU one.
    assert sorted(nodes_of(train).count(n) for n in set(nodes_of(train))) == [1, 2, 2]
    assert results["sweep/ib"]["pinned_cell_id"] == "VIS-IB"
    assert set(nodes_of(results["sweep/ib"])) <= {"ib-0", "ib-1"}
    # A typeless group goes to the first chain where vision has (non-pinned) cells.
    assert results["sweep/eval"]["chain"] == "H100-NODE"
    assert len(set(nodes_of(results["sweep/eval"]))) == 1
    export = results["sweep-export-0"]
    assert export["placement"][0]["leaf_cell_number"] == 8


def test_pinned_request_on_pinned_config() -> None:
    """nlp-tune (nlp, 9 x 1 A100), cv-shared (cv) and cv-pinned (cv, pinned CV-PIN): each
    VC has one 8-GPU node for each, so eight of nine pods run and one waits."""
    m = SchedulerStateMachine(load_config(FEATURES / "pinned.yaml"))
    specs = _pod_specs(FEATURES / "pinned-request.yaml")
    assert [pod for pod, _ in specs] == ["nlp-tune-0", "cv-shared-0", "cv-pinned-0"]
    for pod, s in specs:
        job = pod.rsplit("-", 1)[0]
        results = [apply_ok(m, {"op": "allocate", "group": dict(s, name=f"{job}-{i}")}) for i in range(9)]
        assert [r["ok"] for r in results] == [True] * 8 + [False], job
        nodes = {n for r in results[:8] for n in nodes_of(r)}
        assert len(nodes) == 1
        if "pinnedCellId" in s:
            assert nodes == {"a100-1"}
        else:
            assert "a100-1" not in nodes


@pytest.mark.shared
def test_hived_design_request_on_design_config(hived: Path) -> None:
    m = SchedulerStateMachine(load_config(hived / "config" / "design.yaml"))
    groups = _groups(hived / "request" / "design-request.yaml")
    assert sorted(groups) == ["JOBX-E-0", "JOBX/PCN-ABC", "JOBX/PCN-D", "JOBX/PCN-F"]
    results = {name: apply_ok(m, {"op": "allocate", "group": s}) for name, s in groups.items()}
    assert all(r["ok"] for r in results.values()), results
    abc = results["JOBX/PCN-ABC"]
    assert [p["leaf_cell_number"] for p in abc["placement"]] == [16, 8, 8, 8, 4]
    assert len({abc["chain"]}) == 1 and len(set(nodes_of(abc))) == 3  # 44 GPUs: 2.75 DGX-2 nodes
    assert results["JOBX/PCN-F"]["pinned_cell_id"] == "VC1-YQW-IB-DGX2"
    assert set(nodes_of(results["JOBX/PCN-F"])) <= {"0.1.0.0", "0.1.0.1"}
    assert nodes_of(results["JOBX-E-0"]) and results["JOBX-E-0"]["placement"][0]["leaf_cell_number"] == 16


@pytest.mark.shared
def test_hived_basic_request_on_basic_config(hived: Path) -> None:
    """demo1 (VC1, 5 x 1 K80), demo2nopinned (VC2) and demo2pinned (VC2, pinned VC2-K80):
    each VC has one 4-GPU node for each, so four of five pods run and one waits."""
    m = SchedulerStateMachine(load_config(hived / "config" / "basic.yaml"))
    for pod, s in _pod_specs(hived / "request" / "basic-request.yaml"):
        job = pod.rsplit("-", 1)[0]
        results = [apply_ok(m, {"op": "allocate", "group": dict(s, name=f"{job}-{i}")}) for i in range(5)]
        assert [r["ok"] for r in results] == [True] * 4 + [False], job
        nodes = {n for r in results[:4] for n in nodes_of(r)}
        assert len(nodes) == 1
        if "pinnedCellId" in s:
            assert nodes == {"10.151.41.21"}
        else:
            assert "10.151.41.21" not in nodes


@pytest.mark.parametrize("exc", [MemoryError, RecursionError])
def test_out_of_memory_or_stack_stops_the_replica_instead_of_answering(
        busy: SchedulerStateMachine, exc: type[BaseException], monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug answers "internal error" alike on every replica, but running out of memory
    or stack is this replica's own condition: an answer would differ from the others'.
    It leaves apply (and so the core: the node stops, crash-only) instead."""
    import scheduler_state.machine as machine_module

    def exhausted(m: Any, cmd: Any) -> Any:
        raise exc()

    def buggy(m: Any, cmd: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setitem(machine_module._HANDLERS, "release", exhausted)
    with pytest.raises(exc):
        busy.apply({"op": "release", "group": "a"})
    monkeypatch.setitem(machine_module._HANDLERS, "release", buggy)
    r = busy.apply({"op": "release", "group": "a"})
    assert r == {"ok": False, "error": "internal error: the scheduler could not apply this command (a bug)"}
