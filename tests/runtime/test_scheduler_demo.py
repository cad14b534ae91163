"""``cellar demo --machine scheduler`` (short) and its checker.

The demo runs 3 real replicas, a job stream and a sequencer SIGKILL; it must exit 0
with matching digests, invariants holding everywhere and no acknowledged allocation
lost or doubled. The checker itself must catch a lost acknowledgement, a doubled
placement and a replica holding a group its log does not.
"""

from __future__ import annotations

import json
import subprocess
import sys

from store.scheduler_demo import HistoryCollector, Workload, check_history


def test_short_scheduler_demo_exits_0_with_every_check_passing():
    out = subprocess.run([sys.executable, "-m", "store.cli", "demo", "--machine", "scheduler", "--seconds", "4",
                          "--sessions", "4", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["ok"] and report["digests_match"] and report["invariants_hold"] and report["problems"] == []
    assert report["acked_allocations"] > 20 and report["events"]["placed"] >= report["acked_allocations"]
    assert report["events"].get("preempted", 0) > 0 and report["events"]["node_health"] == 2
    assert report["sequencer"]["killed"] is not None
    assert len({r["digest"] for r in report["replicas_state"]}) == 1


def _placed(pos: int, g: str, node: str = "n0", leaves: list | None = None) -> dict:
    return {"type": "placed", "group": g, "position": pos,
            "placement": [{"node": node, "leaf_cells": leaves or [0]}]}


def test_checker_catches_lost_doubled_and_diverging_state():
    w = Workload(1, ["n0"])
    w.acked_placed = {"a": {"n0": [0]}, "b": {"n0": [1]}}
    w.acked_released = {"a"}
    good = [{"type": "initialized", "position": 1}, _placed(2, "a"), _placed(3, "b", leaves=[1]),
            {"type": "released", "group": "a", "position": 4}]
    hist = {0: {"from": 1, "events": good}, 1: {"from": 3, "events": good[2:]}}
    assert check_history(hist, {0: {"b"}, 1: {"b"}}, w) == []
    # b acknowledged but never committed: lost
    lost = [e for e in good if e.get("group") != "b"]
    assert any("no placed event (lost)" in p for p in check_history({0: {"from": 1, "events": lost}}, {0: set()}, w))
    # a placed twice
    doubled = good[:2] + [_placed(3, "a")] + good[2:]
    assert any("doubled" in p for p in check_history({0: {"from": 1, "events": doubled}}, {0: {"b"}}, w))
    # a replica holds a group its log released; another's events differ
    problems = check_history({0: {"from": 1, "events": good}, 1: {"from": 1, "events": good[:3]}},
                             {0: {"b"}, 1: {"a", "b"}}, w)
    assert any("replica 1: events at position 4 differ" in p for p in problems)
    assert any("replica 1: holds 2 groups" in p for p in problems)
    # an acknowledged release with no event; a placement that differs from the ack
    w.acked_released = {"a", "b"}
    w.acked_placed["b"] = {"n0": [2]}
    problems = check_history({0: {"from": 1, "events": good}}, {0: {"b"}}, w)
    assert any("release of b" in p for p in problems) and any("placement" in p for p in problems)


class _FakeReplica:
    """``GET /v1/events`` of a replica that keeps only its last ``keep`` events."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.events: list[dict] = []
        self.first = 1  # the first position it still keeps every event of

    def commit(self, n: int) -> None:
        for _ in range(n):
            pos = (self.events[-1]["position"] if self.events else self.first - 1) + 1
            self.events.append({"position": pos, "type": "placed", "group": f"g{pos}"})
        if len(self.events) > self.keep:
            del self.events[:len(self.events) - self.keep]
            self.first = self.events[0]["position"]

    def page(self, after: int, limit: int) -> dict:
        return {"from": self.first, "events": [e for e in self.events if e["position"] > after][:limit]}


class _FakeHTTP:
    def __init__(self, replicas: list[_FakeReplica]) -> None:
        self.replicas = replicas
        self.endpoints = [f"http://r{i}" for i in range(len(replicas))]

    async def one(self, endpoint: str, method: str, path: str) -> tuple[int, dict]:
        from urllib.parse import parse_qs, urlsplit

        q = parse_qs(urlsplit(path).query)
        r = self.replicas[self.endpoints.index(endpoint)]
        return 200, r.page(int(q["after"][0]), int(q["limit"][0]))


async def test_the_history_is_collected_across_the_replicas_bound_and_a_restart():
    """The demo reads each replica's history while it runs: more events in all than a
    replica keeps still make one whole history from position 1 (the run that found it:
    the compiled build made the demo fast enough to overflow FEED_HISTORY_MAX); a
    replica whose kept history jumped past what was read (a restart) starts over."""
    steady, restarted = _FakeReplica(keep=50), _FakeReplica(keep=50)
    http = _FakeHTTP([steady, restarted])
    collector = HistoryCollector(2)
    for _ in range(10):
        steady.commit(40)
        restarted.commit(40)
        await collector.poll(http, strict=True)
    restarted.commit(200)  # far more than it keeps since the last read: a gap
    steady.commit(30)
    await collector.poll(http, strict=True)
    got = collector.histories()
    assert got[0]["from"] == 1
    assert [e["position"] for e in got[0]["events"]] == list(range(1, 431))
    assert got[1]["from"] == restarted.first == 551
    assert [e["position"] for e in got[1]["events"]] == list(range(551, 601))
