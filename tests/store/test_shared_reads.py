"""Shared inspect reads (scheduler_state.replicated): a read marked ``shared`` may get the
result object of an earlier read of the same state; any non-read command invalidates it;
unmarked reads (the embedding API) always get a fresh object; results never differ from
a fresh read."""

from __future__ import annotations

from scheduler_state.bench import generate_config
from scheduler_state.config import load_config
from scheduler_state.replicated import SHARED, ReplicatedScheduler


def spec(name: str) -> dict:
    return {"virtualCluster": "vc0", "priority": 1, "leafCellType": "GPU",
            "affinityGroup": {"name": name, "members": [{"podNumber": 1, "leafCellNumber": 2}]}}


def test_shared_reads_reuse_until_a_command_and_equal_fresh_reads():
    r = ReplicatedScheduler(load_config(generate_config(32, 2)))
    shared = {"op": "inspect", "view": "clusterstatus", SHARED: True}
    a = r.query(dict(shared))
    assert a["ok"] and r.query(dict(shared)) is a
    fresh = r.query({"op": "inspect", "view": "clusterstatus"})
    assert fresh is not a and fresh == a
    digest = r.digest()
    assert r.apply(dict(shared)) is a  # a shared read that took the log path
    assert r.digest() == digest  # reads change no state
    r.apply({"op": "allocate", "group": spec("g1")})
    b = r.query(dict(shared))
    assert b is not a and b == r.query({"op": "inspect", "view": "clusterstatus"})
    assert r.query({"op": "inspect", "view": "affinitygroup", "name": "g1", SHARED: True})["ok"]
    # a refused command invalidates too (conservative)
    r.apply({"op": "release", "group": "nope"})
    assert r.query(dict(shared)) is not b
    r.apply({"op": "release", "group": "g1"})
    # per (view, name); bad names are refused as before
    assert r.query({"op": "inspect", "view": "affinitygroup", "name": "g1", SHARED: True})["not_found"]
    assert not r.query({"op": "inspect", "view": "affinitygroup", "name": ["x"], SHARED: True})["ok"]


def test_restore_drops_shared_results():
    r = ReplicatedScheduler(load_config(generate_config(32, 2)))
    snap = r.snapshot()
    r.apply({"op": "allocate", "group": spec("g1")})
    shared = {"op": "inspect", "view": "affinitygroups", SHARED: True}
    before = r.query(dict(shared))
    assert [g["metadata"]["name"] for g in before["result"]["items"]] == ["g1"]
    r.restore(snap)
    assert r.query(dict(shared))["result"]["items"] == []
