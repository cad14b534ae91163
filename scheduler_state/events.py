"""Committed scheduler events, read off one applied command and its result.

``events_of(command, result) -> list[dict]`` turns what ``apply`` did into the change
feed's events, in the order they happened inside the command. It is pure (no state of
its own): every replica that applies the same log derives the same events. Each event
is a dict with ``type`` and, for group events, ``group``:

- ``placed``: a group got its cells: a direct ``allocate`` (with ``vc``, ``priority``,
  ``chain`` and ``placement``, the same ``[{"node", "leaf_cells", ...}]`` as the
  allocate result) or a waiting group scheduled after cells were freed (``via``: the
  op that freed them; no placement: read it with ``inspect``).
- ``preempted``: a victim lost its cells to a higher-priority group (``by``);
  ``lazy_preempted``: a victim kept its cells but was demoted to opportunistic.
- ``queued``: an ``allocate`` that could not be placed now joined the pending queue.
- ``released``: a group's cells were freed by ``release`` (``pods``: only some pods
  ended, the group still runs and keeps its cells, when ``partial`` is true).
- ``cancelled``: a pending group left the queue (``release`` or its lease ended).
- ``expired``: a placed group's lease ended (``lease_expire``).
- ``dropped``: a pending group that no longer parses against the config left the queue.
- ``node_health``: a node was marked healthy or bad (``node``, ``healthy``).
- ``initialized`` / ``reconfigured``: the config was set (``config_hash`` for init).
- Pod-level commands (``pods.py``): ``pod_binding`` (a pod got its slot: ``pod``,
  ``group``, ``node``, ``leaf_cells``; preceded by ``placed`` with ``via: "pod"`` when
  its group was placed by it, or ``via: "add_allocated_pod"``), ``pod_bound``,
  ``pod_deleted`` (then ``released`` when the group's last pod went),
  ``preempting`` (a group entered HiveD's Preempting state: ``victims``; groups it
  lazily preempted on the way are ``lazy_preempted``) and
  ``preemption_cancelled`` (``reason``); a Preempting group placed once its victims
  left is ``placed`` with ``via`` the op that freed the cells.

Commands that changed nothing (refused, read-only, an ``init`` after the first) give no
event.
"""

from __future__ import annotations

from typing import Any

EVENT_TYPES = ("placed", "preempted", "lazy_preempted", "queued", "released", "cancelled", "expired", "dropped",
               "node_health", "initialized", "reconfigured", "pod_binding", "pod_bound", "pod_deleted", "preempting",
               "preemption_cancelled")


def _scheduled(result: dict[str, Any], via: str, out: list[dict[str, Any]]) -> None:
    for s in result.get("scheduled") or ():
        name = s.get("group")
        if "dropped" in s:
            out.append({"type": "dropped", "group": name, "reason": s["dropped"]})
            continue
        if "preemption_cancelled" in s:
            out.append({"type": "preemption_cancelled", "group": name, "reason": s["preemption_cancelled"]})
            continue
        for v in s.get("preempted") or ():
            out.append({"type": "preempted", "group": v, "by": name})
        for v in s.get("lazy_preempted") or ():
            out.append({"type": "lazy_preempted", "group": v, "by": name})
        out.append({"type": "placed", "group": name, "via": via})


def events_of(command: Any, result: Any) -> list[dict[str, Any]]:
    """The events one applied ``command`` produced (module docstring); [] if none."""
    if not isinstance(command, dict) or not isinstance(result, dict):
        return []
    op = command.get("op")
    out: list[dict[str, Any]] = []
    if op == "allocate":
        if result.get("ok"):
            name = result.get("group")
            for v in result.get("preempted") or ():
                out.append({"type": "preempted", "group": v, "by": name})
            for v in result.get("lazy_preempted") or ():
                out.append({"type": "lazy_preempted", "group": v, "by": name})
            out.append({"type": "placed", "group": name, "vc": result.get("vc"), "priority": result.get("priority"),
                        "chain": result.get("chain"), "placement": result.get("placement")})
            _scheduled(result, "preemption", out)
        elif result.get("waiting") and result.get("queued"):
            out.append({"type": "queued", "group": result.get("group"), "reason": result.get("reason")})
        return out
    if op in ("pod_schedule", "pod_preempt", "pod_bind", "pod_delete", "add_allocated_pod"):
        return _pod_events(op, result)
    if not result.get("ok"):
        return []
    if op == "release":
        name = result.get("group")
        if result.get("cancelled"):
            out.append({"type": "cancelled", "group": name, "why": "release"})
        elif result.get("released"):
            out.append({"type": "released", "group": name})
        else:
            out.append({"type": "released", "group": name, "partial": True, "pods": command.get("pods")})
        _scheduled(result, "release", out)
    elif op == "lease_expire":
        for name in result.get("expired") or ():
            out.append({"type": "expired", "group": name})
        for name in result.get("cancelled") or ():
            out.append({"type": "cancelled", "group": name, "why": "lease"})
        _scheduled(result, "lease_expire", out)
    elif op == "set_node_health":
        if result.get("changed"):
            out.append({"type": "node_health", "node": result.get("node"), "healthy": command.get("healthy")})
        _scheduled(result, "set_node_health", out)
    elif op == "init":
        if result.get("initialized"):
            out.append({"type": "initialized", "config_hash": result.get("config_hash")})
    elif op == "reconfigure":
        out.append({"type": "reconfigured"})
        _scheduled(result, "reconfigure", out)
    return out


def _pod_events(op: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    _scheduled_first = [s for s in result.get("scheduled") or () if "preemption_cancelled" in s]
    for s in _scheduled_first:
        out.append({"type": "preemption_cancelled", "group": s.get("group"), "reason": s["preemption_cancelled"]})
    rest = {**result, "scheduled": [s for s in result.get("scheduled") or () if "preemption_cancelled" not in s]}
    if not result.get("ok"):
        return out
    name = result.get("group")
    if op in ("pod_schedule", "add_allocated_pod"):
        if result.get("again"):
            return out
        if result.get("group_placed"):
            for v in result.get("lazy_preempted") or ():
                out.append({"type": "lazy_preempted", "group": v, "by": name})
            out.append({"type": "placed", "group": name, "via": "pod" if op == "pod_schedule" else op,
                        "vc": result.get("vc"), "priority": result.get("priority"), "chain": result.get("chain"),
                        "placement": result.get("placement")})
        kind = "pod_binding" if op == "pod_schedule" else "pod_bound"
        out.append({"type": kind, "pod": result.get("pod"), "group": name, "node": result.get("node"),
                    "leaf_cells": result.get("leaf_cells")})
    elif op == "pod_bind":
        if not result.get("again"):
            out.append({"type": "pod_bound", "pod": result.get("pod"), "group": name, "node": result.get("node"),
                        "leaf_cells": result.get("leaf_cells")})
    elif op == "pod_preempt":
        gone = result.get("preempted") or []
        if result.get("preempting") or gone:
            out.append({"type": "preempting", "group": name, "victims": [v["group"] for v in result.get("victims") or ()]
                        + list(gone)})
        for v in result.get("lazy_preempted") or ():
            out.append({"type": "lazy_preempted", "group": v, "by": name})
        for v in gone:
            out.append({"type": "preempted", "group": v, "by": name})
        _scheduled(rest, "pod_preempt", out)
    elif op == "pod_delete":
        out.append({"type": "pod_deleted", "pod": result.get("pod"), "group": name})
        if result.get("preemption_cancelled"):
            out.append({"type": "preemption_cancelled", "group": name, "reason": "its pods were all deleted"})
        if result.get("released"):
            if result.get("preempted_by"):  # the last pod of a Being-preempted group
                out.append({"type": "preempted", "group": name, "by": result["preempted_by"]})
            else:
                out.append({"type": "released", "group": name})
        _scheduled(rest, "pod_delete", out)
    return out
