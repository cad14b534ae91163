"""The scheduler workload of ``cellar jepsen`` (issue 14): affinity groups allocated and
released through the scheduler service's HTTP API under faults, checked on every
replica's final state (jepsen_like.scheduler_workload).

- the checker on hand-made histories: a correct one is valid; a lost acknowledged
  allocation, a cell held twice (in the final state or in real time), a stale read, a
  replica whose invariants fail, replicas that disagree: each is caught;
- a short run of real scheduler replicas under kills, pauses and clock skew is valid.
"""

from __future__ import annotations

import json

import pytest

from jepsen_like.history import Op
from jepsen_like.runner import VALID, RunSpec, run_test
from jepsen_like.scheduler_workload import check_scheduler

# Under xdist, on one worker: these clusters listen on 127.0.0.20-22 (jepsen_like.db)
# and the nemesis' iptables rules cut those addresses, so no two may run at once.
pytestmark = pytest.mark.xdist_group("loopback-hosts")

N0 = [["node-0", 0], ["node-0", 1]]
N1 = [["node-1", 0], ["node-1", 1]]


class H:
    """A hand-made history: ``op(process, f, value, type, t_invoke, t_done, result)``."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def op(self, p: int, f: str, name: str, typ: str, t0: float, t1: float, result=None) -> H:
        self.ops.append(Op(len(self.ops), t0, p, "invoke", f, (name, None)))
        self.ops.append(Op(len(self.ops), t1, p, typ, f, (name, result)))
        return self

    def sorted(self) -> list[Op]:
        return sorted(self.ops, key=lambda o: (o.time, o.type != "invoke"))


def final(groups: dict, nodes: int = 3, invariants: list | None = None) -> dict:
    return {"groups": {n: dict(groups) for n in range(nodes)},
            "statuses": {n: {"invariants": list(invariants or []) if n == 0 else []} for n in range(nodes)}}


def good() -> H:
    return (H().op(0, "allocate", "a", "ok", 0.0, 0.1, N0)
            .op(1, "allocate", "b", "fail", 0.2, 0.3)
            .op(0, "read", "a", "ok", 0.4, 0.5, N0)
            .op(0, "release", "a", "ok", 0.6, 0.7)
            .op(1, "allocate", "c", "ok", 0.8, 0.9, N0)  # a's cells, after a's release
            .op(0, "read", "a", "ok", 1.0, 1.1, None)
            .op(2, "allocate", "d", "info", 1.0, 2.0))  # indeterminate: either way


def test_a_correct_history_is_valid():
    for d_present in (False, True):
        groups = {"c": N0, **({"d": N1} if d_present else {})}
        r = check_scheduler(good().sorted(), final(groups), 3)
        assert r["valid"], r["problems"]


def test_a_lost_acknowledged_allocation_is_caught():
    r = check_scheduler(good().sorted(), final({}), 3)
    assert not r["valid"] and not r["acknowledged_allocations_survive"]
    r = check_scheduler(good().sorted(), final({"c": N1}), 3)  # moved
    assert not r["acknowledged_allocations_survive"]
    r = check_scheduler(good().sorted(), final({"c": N0, "a": [["node-2", 0]]}), 3)  # released, back
    assert not r["acknowledged_allocations_survive"]
    r = check_scheduler(good().sorted(), final({"c": N0, "b": N1}), 3)  # failed, present
    assert not r["acknowledged_allocations_survive"]


def test_a_cell_held_twice_is_caught():
    h = H().op(0, "allocate", "a", "ok", 0.0, 0.1, N0).op(1, "allocate", "b", "ok", 0.2, 0.3, N0)
    r = check_scheduler(h.sorted(), final({"a": N0, "b": N0}), 3)
    assert not r["no_cell_twice"]
    # in real time only: a was released *after* b was acknowledged on its cells
    h.op(0, "release", "a", "ok", 0.4, 0.5)
    r = check_scheduler(h.sorted(), final({"b": N0}), 3)
    assert not r["no_cell_twice"] and r["acknowledged_allocations_survive"]


def test_a_stale_read_is_caught():
    h = H().op(0, "allocate", "a", "ok", 0.0, 0.1, N0).op(1, "read", "a", "ok", 0.2, 0.3, None)
    assert not check_scheduler(h.sorted(), final({"a": N0}), 3)["reads"]
    h = (H().op(0, "allocate", "a", "ok", 0.0, 0.1, N0).op(0, "release", "a", "ok", 0.2, 0.3)
         .op(1, "read", "a", "ok", 0.4, 0.5, N0))
    assert not check_scheduler(h.sorted(), final({}), 3)["reads"]


def test_failed_invariants_and_disagreeing_replicas_are_caught():
    r = check_scheduler(good().sorted(), final({"c": N0}, invariants=["leaf node-0/0 held twice"]), 3)
    assert not r["valid"] and not r["invariants"]
    f = final({"c": N0})
    f["groups"][2] = {}
    r = check_scheduler(good().sorted(), f, 3)
    assert not r["final_states_agree"]


async def test_a_short_scheduler_run_under_faults_is_valid(tmp_path):
    spec = RunSpec(workload="scheduler", nemesis=["kill", "pause", "clock", "disk"], nodes=3, seconds=9, sessions=6,
                   seed=8, out_root=str(tmp_path))
    r = await run_test(spec)
    assert r["verdict"] == VALID, json.dumps({k: r.get(k) for k in ("checks", "faults")}, default=str)[:3000]
    sc = r["checks"]["scheduler"]
    assert sc["valid"] and sc["allocations_acknowledged"] > 0 and r["faults"]
    assert r["checks"]["converged"] and all(d is not None for d in r["checks"]["digests"])
    assert "release ok" in r["workload"]["counts"]
