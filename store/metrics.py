"""``GET /metrics``: a scheduler replica's Prometheus text (prometheus-client).

One registry per replica (never the process-global one, so several replicas in one
process, as in tests and the embedding API, do not collide). Two kinds of series:

- **Read at scrape time** from the node (``ReplicaCollector``): nothing on the hot
  path pays for them.

  ======================================  ==========================================
  ``cellar_applied_commands_total``       commands applied by this replica's machine
                                          (every committed command, reads that took
                                          the log path included)
  ``cellar_executed_slot``                global log position executed up to
  ``cellar_proposals_pending``            proposals of this replica not yet ordered
  ``cellar_view``                         the protocol's view (ballot round)
  ``cellar_sequencer``                    the sequencer's (leader's) replica id
  ``cellar_is_sequencer``                 1 if this replica is it
  ``cellar_lease_valid``                  1 while this replica holds a read lease
                                          (SDPaxos sequencer; absent for Multi-Paxos)
  ``cellar_peers_connected``              replicas reachable, this one included
  ``cellar_ready``                        1 once the config check passed and a
                                          majority is reachable (``/readyz``)
  ``cellar_wal_fsyncs_total``             fsyncs of the write-ahead log
  ``cellar_loop_lag_max_seconds``         the longest event-loop pause in the last
                                          minute (how late the tick timer ran)
  ``cellar_loop_pauses_total``            loop pauses of 50 ms or more since start
  ``cellar_scheduler_groups``             allocated affinity groups
  ``cellar_scheduler_pending_groups``     groups waiting in the pending queue
  ``cellar_scheduler_leaf_cells``         leaf cells by ``state`` (used, free, bad;
                                          a bad leaf is also used or free)
  ======================================  ==========================================

- **Counted as things happen**: ``cellar_apply_seconds`` (a histogram of one
  ``apply``, taken by the machine's observer), ``cellar_scheduler_commands_total``
  (by ``op`` and ``outcome``: ok, waiting, error), ``cellar_http_requests_total`` (by
  route ``path`` template, ``method`` and ``status``; the template, not the raw
  path, so group names do not explode the series count) and
  ``cellar_http_request_seconds``.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from store.scheduler_service import SchedulerService

APPLY_BUCKETS_S = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
APPLY_BUCKETS_NS = tuple(round(b * 1e9) for b in APPLY_BUCKETS_S)
HTTP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OPS = frozenset({"init", "allocate", "release", "set_node_health", "lease_grant", "lease_renew", "lease_expire",
                 "reconfigure", "cluster_status", "vc_status", "group_status", "list_groups", "inspect"})


class ReplicaCollector:
    """The scrape-time series (module docstring)."""

    def __init__(self, service: SchedulerService) -> None:
        self.service = service

    def collect(self) -> Any:
        service = self.service
        node = service.node
        replica = node.replica
        st = replica.status()
        node_id = str(node.cfg.node_id)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["replica"])
            g.add_metric([node_id], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["replica"])
            c.add_metric([node_id], value)
            return c

        yield counter("cellar_applied_commands", "Commands applied by this replica's machine.",
                      replica.executor.applied)
        yield gauge("cellar_executed_slot", "Global log position executed up to.", st.get("exec_slot", 0))
        yield gauge("cellar_proposals_pending", "Proposals of this replica not yet ordered.", st.get("pending", 0))
        yield gauge("cellar_view", "The protocol's view.", st.get("view", 0))
        lead = st.get("sequencer", st.get("leader"))
        yield gauge("cellar_sequencer", "The sequencer's (leader's) replica id (-1: none known).",
                    -1 if lead is None else lead)
        yield gauge("cellar_is_sequencer", "1 if this replica is the sequencer (leader).",
                    1 if lead == node.cfg.node_id else 0)
        if "lease" in st:
            yield gauge("cellar_lease_valid", "1 while this replica holds the read lease.", 1 if st["lease"] else 0)
        yield gauge("cellar_peers_connected", "Replicas reachable, this one included.", node.peers_reachable())
        ready = service.ready and not node._down and node.peers_reachable() >= node.quorum
        yield gauge("cellar_ready", "1 once the config check passed and a majority is reachable.", 1 if ready else 0)
        if node.wal is not None:
            yield counter("cellar_wal_fsyncs", "fsyncs of the write-ahead log.", node.wal.stats["fsyncs"])
        lag = node.loop_lag.status(time.monotonic())
        yield gauge("cellar_loop_lag_max_seconds", "Longest event-loop pause in the last minute.",
                    lag["lag_max_ms_60s"] / 1000)
        yield counter("cellar_loop_pauses", "Event-loop pauses of 50 ms or more since start.", lag["pauses_50ms"])
        inner = getattr(node.machine, "inner", None)
        if inner is not None:
            yield gauge("cellar_scheduler_groups", "Allocated affinity groups.", len(inner.groups))
            yield gauge("cellar_scheduler_pending_groups", "Groups waiting in the pending queue.", len(inner.pending))
            used, free, bad = leaf_counts(inner)
            g = GaugeMetricFamily("cellar_scheduler_leaf_cells", "Leaf cells by state.", labels=["replica", "state"])
            g.add_metric([node_id, "used"], used)
            g.add_metric([node_id, "free"], free)
            g.add_metric([node_id, "bad"], bad)
            yield g


def leaf_counts(inner: Any) -> tuple[int, int, int]:
    """(used, free, bad) physical leaf cells of a ``SchedulerStateMachine``, from the
    top cells' counters (free counts a bad leaf no group holds: HiveD keeps it free)."""
    used = bad = total = 0
    for chain in inner.cluster.chains.values():
        for top in chain.tops:
            used += top.used
            bad += top.bad
            total += top.leaves
    return used, total - used, bad


class AppliedCollector:
    """``cellar_scheduler_commands_total`` and ``cellar_apply_seconds``: counted in
    plain ints by ``SchedulerMetrics.applied`` (it runs for every command on every
    replica, inside apply: prometheus-client's labelled counter and histogram take a
    lock and a label lookup per call, most of the observer's time in the scheduler
    benchmark's profile), and turned into series only when scraped."""

    def __init__(self) -> None:
        self.commands: dict[tuple[str, str], int] = {}
        self.buckets = [0] * (len(APPLY_BUCKETS_NS) + 1)  # per bucket, the last one +Inf
        self.sum_ns = 0

    def collect(self) -> Any:
        c = CounterMetricFamily("cellar_scheduler_commands", "Scheduler commands applied, by op and outcome.",
                                labels=["op", "outcome"])
        for (op, outcome), n in sorted(self.commands.items()):
            c.add_metric([op, outcome], n)
        yield c
        h = HistogramMetricFamily("cellar_apply_seconds", "Time of one apply on this replica.")
        total, cumulative = 0, []
        for le, n in zip([*(str(b) for b in APPLY_BUCKETS_S), "+Inf"], self.buckets):
            total += n
            cumulative.append((le, total))
        h.add_metric([], cumulative, self.sum_ns / 1e9)
        yield h


class SchedulerMetrics:
    """The registry of one replica and the counters the service and API feed."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, service: SchedulerService) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ReplicaCollector(service))  # type: ignore[arg-type]
        self._applied = AppliedCollector()
        self.registry.register(self._applied)  # type: ignore[arg-type]
        self.http_requests = Counter("cellar_http_requests", "HTTP requests by route, method and status.",
                                     ["path", "method", "status"], registry=self.registry)
        self.http_seconds = Histogram("cellar_http_request_seconds", "HTTP request time by route.", ["path"],
                                      buckets=HTTP_BUCKETS_S, registry=self.registry)

    def applied(self, command: Any, result: Any, apply_ns: int) -> None:
        """Count one applied command (the machine's observer, via the service): must
        never raise."""
        if command is None:
            return  # a restore
        op = command.get("op") if type(command) is dict else None
        if op not in OPS:
            op = "other"
        if type(result) is dict:
            outcome = "ok" if result.get("ok") else "waiting" if result.get("waiting") else "error"
        else:
            outcome = "error"
        a = self._applied
        key = (op, outcome)
        a.commands[key] = a.commands.get(key, 0) + 1
        a.buckets[bisect_left(APPLY_BUCKETS_NS, apply_ns)] += 1  # le: a value on a bound counts in it
        a.sum_ns += apply_ns

    def request(self, path: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(path, method, str(status)).inc()
        self.http_seconds.labels(path).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
