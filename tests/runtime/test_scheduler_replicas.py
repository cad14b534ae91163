"""Three real ``cellar serve --machine scheduler`` replicas driven through the HTTP API.

Allocate through one replica, read the same placement from the other two at once (the
reads are linearizable: no retry, no wait); a replica started with another HiveD
config exits with one line and status 2; a replica cut off from the majority answers
503 with Retry-After. Waits are bounded polls, never sleeps for synchronization.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from store.client import CellarClient

from .conftest import converged

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = str(EXAMPLES / "hived-small.yaml")
OTHER = str(EXAMPLES / "hived-small-vc-c.yaml")
GANG = json.loads((EXAMPLES / "job-gang.json").read_text())


def urls(cluster) -> list[str]:
    return [f"http://127.0.0.1:{p}" for p in cluster.http_ports]


async def all_ready(http: aiohttp.ClientSession, bases: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(bases)
    while waiting:
        assert time.monotonic() < deadline, f"not ready within {timeout_s} s: {waiting}"
        try:
            async with http.get(waiting[0] + "/readyz") as r:
                if r.status == 200:
                    waiting.pop(0)
                    continue
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)


async def test_allocate_on_one_replica_read_from_the_others(make_cluster):
    cluster = make_cluster(3, http=True, fsync="never", extra_args=["--machine", "scheduler", "--hived-config", SMALL])
    cluster.start_all()
    await cluster.await_ready()
    bases = urls(cluster)
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await all_ready(http, bases)
        async with http.post(bases[0] + "/v1/groups", json=GANG) as r:
            assert r.status == 201, await r.text()
            placed = await r.json()
        nodes = {p["node"]: sorted(p["leaf_cells"]) for p in placed["placement"]}
        assert len(nodes) == 2 and all(len(v) == 4 for v in nodes.values())
        for base in bases[1:]:  # linearizable: the acknowledged write is visible at once
            async with http.get(base + "/v1/inspect/affinitygroups/job1%2Fworkers") as r:
                assert r.status == 200, await r.text()
                group = await r.json()
            assert group["status"]["state"] == "Allocated"
            assert group["status"]["physicalPlacement"] == nodes
        # a second gang in vc-b, allocated through replica 2, seen from replica 0 and 1
        spec = {"virtualCluster": "vc-b", "priority": 5, "leafCellNumber": 2, "name": "job2"}
        async with http.post(bases[2] + "/v1/groups", json=spec) as r:
            assert r.status == 201, await r.text()
        for base in bases[:2]:
            async with http.get(base + "/v1/inspect/clusterstatus/virtualclusters/vc-b") as r:
                cells = await r.json()
            assert any(c["cellState"] == "Used" for c in cells)
        async with http.delete(bases[1] + "/v1/groups/job2") as r:
            assert r.status == 200
        async with http.get(bases[0] + "/v1/inspect/affinitygroups/job2") as r:
            assert r.status == 404
        # a lease: now_ms stamped by replica 0, expiry proposed by the sequencer
        async with http.post(bases[0] + "/v1/groups", json={"group": dict(spec, name="leased"), "ttl_ms": 200}) as r:
            assert r.status == 201, await r.text()
        deadline = time.monotonic() + 15
        while True:
            async with http.get(bases[1] + "/v1/inspect/affinitygroups/leased") as r:
                if r.status == 404:
                    break
            assert time.monotonic() < deadline, "lease never expired"
            await asyncio.sleep(0.1)
        async with http.post(bases[1] + "/v1/groups", json={"virtualCluster": "nope", "leafCellNumber": 1,
                                                            "name": "x"}) as r:
            assert r.status == 400 and (await r.json())["field"] == "group.virtualCluster"
    async with CellarClient(cluster.client_addresses) as cellar:
        states = await converged(cellar, [0, 1, 2])
    assert len({s["digest"] for s in states}) == 1

    # A replica restarted with another config is refused: one line, status 2.
    cluster.stop(2)
    cluster.extra_args = ["--machine", "scheduler", "--hived-config", OTHER]
    cluster.start(2)
    status = cluster.procs[2].wait(timeout=30)
    assert status == 2, cluster.log_tail(2)
    lines = Path(cluster.root, "node2.log").read_text().strip().splitlines()
    assert "differs from the config this cluster was initialized with" in lines[-1], lines[-3:]

    # Replica 0 alone (1 of 3 down, then 2 of 3): 503 with Retry-After, never an ack.
    cluster.stop(1)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        deadline = time.monotonic() + 20
        while True:
            async with http.post(bases[0] + "/v1/groups", json=dict(spec, name="job3")) as r:
                if r.status == 503:
                    assert r.headers["Retry-After"] == "1"
                    break
                assert r.status != 201, "acknowledged without a majority"
            assert time.monotonic() < deadline
        async with http.get(bases[0] + "/readyz") as r:
            assert r.status == 503


def test_hived_config_is_required_and_checked(tmp_path):
    base = [sys.executable, "-m", "store.cli", "serve", "--id", "0", "--peers", "0=127.0.0.1:1,1=127.0.0.1:2,2=127.0.0.1:3", "--data-dir",
            str(tmp_path / "d")]
    out = subprocess.run(base + ["--machine", "scheduler"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "needs --hived-config" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("physicalCluster: {}\n")
    out = subprocess.run(base + ["--machine", "scheduler", "--hived-config", str(bad)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--hived-config" in out.stderr
