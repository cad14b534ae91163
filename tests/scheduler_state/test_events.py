"""scheduler_state.events: the change feed's events read off applied commands."""

from __future__ import annotations

from pathlib import Path

from scheduler_state import load_config
from scheduler_state.events import EVENT_TYPES, events_of
from scheduler_state.replicated import ReplicatedScheduler, init_command

SMALL = Path(__file__).resolve().parents[2] / "examples" / "hived-small.yaml"


def spec(name: str, vc: str = "vc-a", prio: int = 10, gpus: int = 4, pods: int = 1, gang_release: bool = False):
    return {"virtualCluster": vc, "priority": prio, "leafCellType": "K80", "gangReleaseEnable": gang_release,
            "affinityGroup": {"name": name, "members": [{"podNumber": pods, "leafCellNumber": gpus}]}}


def run(m: ReplicatedScheduler, cmd: dict) -> list[tuple]:
    return [(e["type"], e.get("group", e.get("node"))) for e in events_of(cmd, m.apply(cmd))]


def test_events_of_every_kind_of_change():
    config = load_config(SMALL)
    m = ReplicatedScheduler()
    assert run(m, init_command(config)) == [("initialized", None)]
    assert run(m, init_command(config)) == []  # a later init changes nothing
    assert run(m, {"op": "allocate", "group": spec("a", pods=2)}) == [("placed", "a")]
    assert run(m, {"op": "allocate", "group": spec("b", prio=50, pods=2)}) == [("preempted", "a"), ("placed", "b")]
    assert run(m, {"op": "allocate", "group": spec("c")}) == [("queued", "c")]
    assert run(m, {"op": "allocate", "group": spec("c")}) == []  # refused: already waiting
    # a pod of b ends: b keeps its cells until its last pod is gone (HiveD)
    assert run(m, {"op": "release", "group": "b", "pods": [0]}) == [("released", "b")]
    assert run(m, {"op": "release", "group": "b"}) == [("released", "b"), ("placed", "c")]
    assert run(m, {"op": "set_node_health", "node": "node-2", "healthy": False}) == [("node_health", "node-2")]
    assert run(m, {"op": "set_node_health", "node": "node-2", "healthy": False}) == []  # no change
    assert run(m, {"op": "allocate", "group": spec("d", vc="vc-b", gpus=1), "now_ms": 1, "ttl_ms": 10}) == [
        ("placed", "d")]
    assert run(m, {"op": "allocate", "group": spec("e", prio=10, pods=2), "now_ms": 1, "ttl_ms": 10}) == [
        ("queued", "e")]
    assert run(m, {"op": "lease_expire", "now_ms": 100}) == [("expired", "d"), ("cancelled", "e")]
    assert run(m, {"op": "release", "group": "nope"}) == []
    assert run(m, {"op": "inspect", "view": "affinitygroups"}) == []
    placed = events_of({"op": "allocate", "group": spec("f", vc="vc-b", gpus=2)},
                       m.apply({"op": "allocate", "group": spec("f", vc="vc-b", gpus=2)}))[0]
    assert placed["vc"] == "vc-b" and placed["placement"][0]["node"] and len(placed["placement"][0]["leaf_cells"]) == 2
    assert all(t in EVENT_TYPES for t in ("placed", "preempted", "queued", "released", "cancelled", "expired"))
