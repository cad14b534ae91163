"""Coalesced writes (store/scheduler_service.py) and ``POST /v1/batch`` (store/http_api.py):
writes made in the same loop turn share a log entry, each still its own command with
its own answer; every replica ends with the same state. No timed assertion."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import aiohttp
import pytest

from scheduler_state.invariants import check
from store.embed import EmbeddedScheduler, SchedulerError
from store.server import free_ports

DEMO = Path(__file__).resolve().parents[2] / "examples" / "hived-demo.yaml"  # vc-prod: 48 GPUs


def spec(name: str, vc: str = "vc-prod", gpus: int = 1, prio: int = 1) -> dict:
    return {"virtualCluster": vc, "priority": prio,
            "affinityGroup": {"name": name, "members": [{"podNumber": 1, "leafCellNumber": gpus}]}}


@pytest.fixture
async def trio(tmp_path):
    ports = free_ports(9)
    peers = {i: f"127.0.0.1:{ports[i]}" for i in range(3)}
    reps = [EmbeddedScheduler(i, peers, tmp_path / f"s{i}", str(DEMO), client=f"127.0.0.1:{ports[3 + i]}",
                              http=f"127.0.0.1:{ports[6 + i]}", fsync="never")
            for i in range(3)]
    await asyncio.gather(*(r.start(ready_timeout_s=None) for r in reps))
    await asyncio.gather(*(r.wait_ready(30) for r in reps))
    yield reps, [f"http://127.0.0.1:{ports[6 + i]}" for i in range(3)]
    for r in reps:
        await r.stop()


async def converged(reps, timeout_s: float = 20.0) -> str:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        st = [r.status() for r in reps]
        if len({(s["applied"], s["digest"]) for s in st}) == 1:
            return st[0]["digest"]
        assert asyncio.get_running_loop().time() < deadline, st
        await asyncio.sleep(0.05)


async def test_concurrent_calls_share_log_entries_each_with_its_own_answer(trio):
    reps, _ = trio
    r0 = reps[0]
    stats = r0.service.stats
    entries_before, calls_before = stats["batches"], stats["calls"]
    names = [f"c{i}" for i in range(24)]
    # 24 one-GPU groups and 2 that cannot be placed, all in one loop turn
    tasks = [r0.allocate(spec(n), wait=False) for n in names]
    tasks += [r0.allocate(spec("too-big", gpus=64), wait=False), r0.allocate(spec(names[0]), wait=False)]
    out = await asyncio.gather(*tasks, return_exceptions=True)
    placed = out[:24]
    assert all(isinstance(r, dict) and r["ok"] and r["group"] == n for r, n in zip(placed, names)), out
    # the same name twice in one entry: one placed, the other refused with its own error
    assert isinstance(out[25], SchedulerError) and "already allocated" in str(out[25])
    assert isinstance(out[24], SchedulerError) and "larger than any cell" in str(out[24])
    assert stats["batches"] > entries_before  # coalesced ...
    assert stats["calls"] - calls_before < len(tasks)  # ... into fewer log entries than calls
    # the leaf cells were given once each
    cells = [(p["node"], c) for r in placed for p in r["placement"] for c in p["leaf_cells"]]
    assert len(cells) == len(set(cells)) == 24
    rel = await asyncio.gather(*(r0.release(n) for n in names[:12]))
    assert all(r["ok"] and r["released"] for r in rel)
    digest = await converged(reps)
    assert digest and all(check(r.service.node.machine.inner) == [] for r in reps)
    assert len(r0.service.node.machine.inner.groups) == 12
    # each command has its events in the feed, on every replica alike
    feeds = [r.service.history()["events"] for r in reps]
    assert feeds[0] == feeds[1] == feeds[2]
    assert sum(e["type"] == "placed" for e in feeds[0]) >= 24


async def test_http_batch_answers_each_request_as_its_own_endpoint(trio):
    reps, urls = trio
    rng = random.Random(2)
    reqs = [{"op": "allocate", "group": spec(f"h{i}", gpus=rng.choice([1, 2, 4, 8]) if i != 1 else 1),
             "wait": False} for i in range(6)]
    bad = [{"op": "allocate", "group": {"virtualCluster": "vc-nope", "priority": 1,
                                        "affinityGroup": {"name": "x", "members": [{"podNumber": 1,
                                                                                    "leafCellNumber": 1}]}}},
           {"op": "release", "group": "never-existed"},
           {"op": "explode"},
           {"op": "allocate", "group": spec("dup"), "wait": False},
           {"op": "allocate", "group": spec("dup"), "wait": False}]
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{urls[1]}/v1/batch", json={"requests": reqs + bad}) as r:
            assert r.status == 200
            out = (await r.json())["results"]
        assert len(out) == len(reqs) + len(bad)
        for item in out[:6]:
            assert item["status"] in (201, 409), item
        assert out[1]["status"] == 201 and out[1]["body"]["group"] == "h1"
        v, g, e, d1, d2 = out[6:]
        assert v["status"] == 400 and v["body"]["field"] == "requests[0].group.virtualCluster" \
            .replace("[0]", f"[{len(reqs)}]")
        assert g["status"] == 404 and g["body"]["field"] == f"requests[{len(reqs) + 1}].name"
        assert e["status"] == 400 and e["body"]["field"] == f"requests[{len(reqs) + 2}].op"
        assert sorted([d1["status"], d2["status"]]) == [201, 409]
        # a release through the batch, read back from another replica
        async with s.post(f"{urls[1]}/v1/batch", json={"requests": [{"op": "release", "group": "h1"}]}) as r:
            assert r.status == 200 and (await r.json())["results"][0]["status"] == 200
        async with s.get(f"{urls[2]}/v1/inspect/affinitygroups/h1") as r:
            assert r.status == 404
        for body in ({"requests": []}, {"requests": "x"}, [1], {"requests": [{}] * 257}, {"requests": [], "x": 1}):
            async with s.post(f"{urls[0]}/v1/batch", json=body) as r:
                assert r.status == 400 and (await r.json())["field"] == "requests", body
    await converged(reps)
    assert "vc-nope" not in str(reps[0].service.history()["events"])


async def test_a_group_the_log_could_not_carry_is_a_400_and_stops_no_replica(trio):
    """An unknown field with a JSON integer beyond 64 bits (or nested deeper than any
    spec) passed the spec parser; the node then failed to encode it and stopped, one
    replica per attempt (two of three before the 503s). Now it is refused before anything
    is proposed (scheduler_state.replicated.validate)."""
    reps, urls = trio
    deep: list = []
    for _ in range(300):
        deep = [deep]
    for i, extra in enumerate((10**30, deep)):
        body = {**spec(f"evil{i}"), "zzz": extra}
        async with aiohttp.ClientSession() as s:
            for url in urls:
                async with s.post(url + "/v1/groups", data=json.dumps(body),
                                  headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 400, (r.status, await r.text())
                    assert (await r.json())["field"] == "body"
    assert all(r.node.failure is None for r in reps)
    async with aiohttp.ClientSession() as s:  # and the cluster serves on
        async with s.post(urls[0] + "/v1/groups", json=spec("fine")) as r:
            assert r.status == 201, await r.text()
