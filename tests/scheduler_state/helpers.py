"""Shared helpers for the scheduler_state tests: where the example configs are (ours,
under examples/hived-features/, and HiveD's own, in ../shared/hived for the opt-in
``shared`` tests), and short ways to build machines and issue commands."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from scheduler_state import SchedulerStateMachine, check, load_config

# Our own HiveD-format configs; the default suite runs on these.
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FEATURES = EXAMPLES / "hived-features"

# HiveD's own configs are read from the shared folder next to the repository (or
# $CELLAR_SHARED), never copied in. Only tests marked ``shared`` use them
# (``python3 -m pytest -m shared``); they skip when the folder is absent.
SHARED = Path(os.environ.get("CELLAR_SHARED") or Path(__file__).resolve().parents[2] / ".." / "shared")
HIVED = SHARED / "hived"
FEATURE = HIVED / "feature"


def require_hived() -> Path:
    if not (FEATURE / "README.md").is_file():
        pytest.skip(f"HiveD reference files not found at {HIVED.resolve()} (the ../shared/hived folder; set CELLAR_SHARED to point elsewhere)")
    return HIVED


def feature_config(n: int | str) -> Path:
    require_hived()
    return FEATURE / f"hived-config-{n}.yaml"


def hived_machine(n: int | str) -> SchedulerStateMachine:
    """A machine on HiveD's feature/hived-config-<n>.yaml (``shared`` tests only)."""
    return SchedulerStateMachine(load_config(feature_config(n)))


def example(name: str) -> Path:
    """examples/hived-features/<name>.yaml."""
    return FEATURES / f"{name}.yaml"


def machine(name: str) -> SchedulerStateMachine:
    """A machine on examples/hived-features/<name>.yaml."""
    return SchedulerStateMachine(load_config(example(name)))


def spec(name: str, vc: str, priority: int, pods: int, leaves: int, leaf_type: str | None = None,
         **extra: Any) -> dict[str, Any]:
    """A HiveD pod scheduling spec for one affinity group of ``pods`` x ``leaves``."""
    s: dict[str, Any] = {
        "virtualCluster": vc,
        "priority": priority,
        "affinityGroup": {"name": name, "members": [{"podNumber": pods, "leafCellNumber": leaves}]},
    }
    if leaf_type is not None:
        s["leafCellType"] = leaf_type
    s.update(extra)
    return s


def apply_ok(m: SchedulerStateMachine, cmd: dict[str, Any]) -> dict[str, Any]:
    """Apply, then insist on the invariants; return the result."""
    result = m.apply(cmd)
    problems = check(m)
    assert not problems, f"invariants broken after {cmd}: {problems}"
    assert "internal error" not in str(result.get("error", "")), result
    return result


def allocate(m: SchedulerStateMachine, name: str, vc: str, priority: int, pods: int, leaves: int,
             leaf_type: str | None = None, **extra: Any) -> dict[str, Any]:
    cmd_extra = {k: extra.pop(k) for k in ("wait", "suggestedNodes", "now_ms", "ttl_ms") if k in extra}
    return apply_ok(m, {"op": "allocate", "group": spec(name, vc, priority, pods, leaves, leaf_type, **extra),
                        **cmd_extra})


def nodes_of(result: dict[str, Any]) -> list[str]:
    """Node of each pod of an allocate result or group status."""
    return [p["node"] for p in result["placement"]]


def status(m: SchedulerStateMachine, name: str) -> dict[str, Any]:
    return m.apply({"op": "group_status", "group": name})


def assert_unchanged(m: SchedulerStateMachine, before: bytes) -> None:
    assert m.snapshot() == before, "a rejected command changed the state"
