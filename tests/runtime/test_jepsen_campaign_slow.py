"""Longer ``cellar jepsen`` runs with every nemesis mixed (partition when iptables
works, kill, pause, clock, disk), KV and scheduler workloads, 3 and 5 replicas
(``-m slow``, about 40 s each). Every run must be valid and every disk fault handled as
the WAL's recovery rules say."""

from __future__ import annotations

import json

import pytest

from jepsen_like.nemesis import iptables_available
from jepsen_like.runner import VALID, RunSpec, run_test

# xdist_group: one worker for every cluster on 127.0.0.20-22 (jepsen_like.db), which
# the partition nemesis cuts with iptables (tests/runtime/test_nemesis.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback-hosts")]


def _all() -> list[str]:
    return ([] if iptables_available() else ["partition"]) + ["kill", "pause", "clock", "disk"]


@pytest.mark.parametrize("workload,nodes,seed", [("kv", 3, 11), ("kv", 5, 12), ("scheduler", 3, 13), ("scheduler", 5, 14)])
async def test_every_nemesis_mixed_is_valid(tmp_path, workload, nodes, seed):
    spec = RunSpec(workload=workload, nemesis=_all(), nodes=nodes, seconds=30, sessions=12, keys=4, seed=seed,
                   out_root=str(tmp_path))
    r = await run_test(spec)
    assert r["verdict"] == VALID, json.dumps({k: r.get(k) for k in ("checks", "faults")}, default=str)[:4000]
    assert len(r["faults"]) >= 4
    assert r["checks"].get("disk_faults_handled", True) is True
