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
  ended, the group still runs, when ``partial`` is true).
- ``cancelled``: a pending group left the queue (``release`` or its lease ended).
- ``expired``: a placed group's lease ended (``lease_expire``).
- ``dropped``: a pending group that no longer parses against the config left the queue.
- ``node_health``: a node was marked healthy or bad (``node``, ``healthy``).
- ``initialized`` / ``reconfigured``: the config was set (``config_hash`` for init).

Commands that changed nothing (refused, read-only, an ``init`` after the first) give no
event.
"""

from __future__ import annotations

from typing import Any

EVENT_TYPES = ("placed", "preempted", "lazy_preempted", "queued", "released", "cancelled", "expired", "dropped",
               "node_health", "initialized", "reconfigured")


def _scheduled(result: dict[str, Any], via: str, out: list[dict[str, Any]]) -> None:
    for s in result.get("scheduled") or ():
        name = s.get("group")
        if "dropped" in s:
            out.append({"type": "dropped", "group": name, "reason": s["dropped"]})
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
