"""The root and node indexes (``cells.CountIndex``) are brought up to date when read:
whenever a search reads one, it must hold exactly the keys an eagerly kept index would,
so when (and how often) indexes are read never changes a decision."""

from __future__ import annotations

import random

from scheduler_state import SchedulerStateMachine, check
from scheduler_state.bench import _group_spec, generate_config
from scheduler_state.cells import ckey
from scheduler_state.config import load_config


def _indexes(m: SchedulerStateMachine) -> list[tuple[object, list[object], bool]]:
    cl = m.cluster
    out: list[tuple[object, list[object], bool]] = []
    for chain in cl.chains.values():
        out += [(chain.root_index, chain.tops, True), (chain.node_index, chain.nodes, True)]
    for vc in sorted(cl.vc_scopes):
        for scope in cl.scopes_of(vc):
            out += [(scope.root_index, scope.roots, False), (scope.node_index, scope.nodes, False)]
    return out


def _read_all(m: SchedulerStateMachine) -> None:
    """Read every index (re-keying it) and compare it with a recount."""
    for index, cells, physical in _indexes(m):
        want = sorted(ckey(c.oavail if physical else c.free, c.id) for c in cells)  # type: ignore[attr-defined]
        assert index.sorted_keys() == want  # type: ignore[attr-defined]


def test_reading_indexes_at_any_time_changes_nothing() -> None:
    """Two replicas of the bench workload (with bad nodes, so health bindings and
    preemption come in): one reads every index after every command, the other only when
    its searches do. Same results, same snapshots, and every read index is current."""
    config = load_config(generate_config(128, 4))
    eager, lazy = SchedulerStateMachine(config), SchedulerStateMachine(config)
    rng = random.Random(5)
    for i in range(1200):
        running = sorted(eager.groups)
        roll = rng.random()
        if roll < 0.04:
            cmd = {"op": "set_node_health", "node": f"node-{rng.randrange(8):03d}-{rng.randrange(16):02d}",
                   "healthy": rng.random() < 0.6}
        elif len(running) < 50 and roll < 0.6 or not running:
            cmd = {"op": "allocate", "group": _group_spec(rng, f"g{i}", 4), "wait": rng.random() < 0.3}
        else:
            cmd = {"op": "release", "group": rng.choice(running)}
        assert eager.apply(cmd) == lazy.apply(cmd)
        _read_all(eager)
        if i % 300 == 299:
            assert eager.snapshot() == lazy.snapshot()
    assert eager.snapshot() == lazy.snapshot()
    assert check(lazy) == [] and check(eager) == []
