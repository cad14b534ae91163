"""``cellar_scheduler_commands_total`` and ``cellar_apply_seconds`` are counted in plain
ints by ``SchedulerMetrics.applied`` and become series only when scraped
(``AppliedCollector``): the same exposition as prometheus-client's own Counter and
Histogram with the same buckets, without their per-call lock and label lookup."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from store.metrics import APPLY_BUCKETS_S, SchedulerMetrics


class _Service:
    """What ``ReplicaCollector`` would read is not scraped here."""


def _series(text: str, prefix: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix) and not line.startswith("#") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_applied_counts_match_prometheus_client_s_counter_and_histogram():
    m = SchedulerMetrics.__new__(SchedulerMetrics)
    SchedulerMetrics.__init__(m, _Service())  # type: ignore[arg-type]
    m.registry.unregister(next(c for c in m.registry._collector_to_names if type(c).__name__ == "ReplicaCollector"))
    ref = CollectorRegistry()
    commands = Counter("cellar_scheduler_commands", "x", ["op", "outcome"], registry=ref)
    seconds = Histogram("cellar_apply_seconds", "x", buckets=APPLY_BUCKETS_S, registry=ref)
    cases = [({"op": "allocate"}, {"ok": True}, 10_000), ({"op": "allocate"}, {"waiting": True}, 10_001),
             ({"op": "release"}, {"ok": False}, 100_000_000), ({"op": "nope"}, None, 7),
             ("not a dict", {"ok": True}, 250_000_000), ({"op": "release"}, {"ok": True}, 0)]
    for cmd, result, ns in cases:
        m.applied(cmd, result, ns)
        op = cmd.get("op") if isinstance(cmd, dict) else None
        op = op if op in ("allocate", "release") else "other"
        outcome = "ok" if isinstance(result, dict) and result.get("ok") else \
            "waiting" if isinstance(result, dict) and result.get("waiting") else "error"
        commands.labels(op, outcome).inc()
        seconds.observe(ns / 1e9)
    m.applied(None, None, 5)  # a restore: not a command
    ours, theirs = generate_latest(m.registry).decode(), generate_latest(ref).decode()
    for prefix in ("cellar_scheduler_commands_total", "cellar_apply_seconds"):
        a, b = _series(ours, prefix), _series(theirs, prefix)
        assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-9 for k in a), (prefix, a, b)
