"""Helpers for the hand-written simulator schedules (test_core_bugs, test_review*):
a quiet cluster with idle clients, stepping until a condition holds, and the
exception a schedule raises when the rule under test breaks."""

from __future__ import annotations

from consensus.sim import SimConfig, Simulation
from consensus.sim.simulator import Client

NEVER = 10**9  # an election deadline that never comes: the schedule picks who stands


class RuleBroken(AssertionError):
    """The rule under test does not hold (the schedule's preconditions did)."""


def attach_clients(sim: Simulation, n: int) -> list:
    """An idle client 100 + r at every replica r; returns the list replies go to."""
    replies: list = []
    sim._on_reply = lambda cid, seq, result: replies.append((cid, seq, result))
    for node in range(n):
        sim.clients[100 + node] = Client(100 + node, node, active=False)
    return replies


def quiet(replicas: int = 5, seconds: float = 6.0, **kw) -> tuple[Simulation, list]:
    """A LAN cluster without a workload, run for one second (R0 serves view 0)."""
    cfg = SimConfig(replicas=replicas, rtt="lan", clients_per_site=0, seconds=seconds, **kw)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)
    return sim, attach_clients(sim, replicas)


def step_until(sim: Simulation, pred, start_ms: float, limit_ms: float, step_ms: float = 1) -> float | None:
    """Advance in steps of ``step_ms`` until ``pred()`` holds: the time it did, or None."""
    t = start_ms
    while t < limit_ms:
        t += step_ms
        sim.run(until_ms=t)
        if pred():
            return t
    return None


def exec_order(sim: Simulation, ids: set) -> dict:
    """Position of each command id in the merged executed log (first incarnation that has it)."""
    pos: dict = {}
    for log in sim.exec_logs:
        k = 0
        for _label, cmds in log:
            for cmd in cmds:
                if cmd in ids and cmd not in pos:
                    pos[cmd] = k
            k += 1
    return pos


def hole_then_writes(sim: Simulation, phase: dict, z_node: int) -> int:
    """N=5 phantom set-up (test_review4..6): with ``phase["p"] = "hide"`` the caller's
    filter loses R0's O-accept of slot h; R0 writes H (slot h), R4 writes W (h+1),
    ``z_node`` writes a=Z (h+2). Returns h."""
    r0 = sim.nodes[0]
    h = phase["h"] = r0.next_slot
    phase["p"] = "hide"
    for node, cid, op, until in ((0, 100, ["put", "h", "H"], 1110), (4, 104, ["put", "w", "W"], 1120),
                                 (z_node, 100 + z_node, ["put", "a", "Z"], 1140)):
        sim.nodes[node].propose(cid, 1, op)
        sim._drain(node)
        sim.run(until_ms=until)
    return h
