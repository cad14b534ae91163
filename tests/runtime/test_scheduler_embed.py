"""The embedding API (store/embed.py): three replicas in this test's event loop.

Allocate on one, read from the others (linearizable), follow the change feed on every
replica (the same events at the same positions), preemption and expiry in the feed,
the sequencer stopped and a new one taking over, /metrics and the CLI against the
embedded replicas' HTTP API. Waits are bounded polls.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from scheduler_state.invariants import check
from store.embed import EmbeddedScheduler, SchedulerError
from store.server import free_ports

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = str(EXAMPLES / "hived-small.yaml")


def spec(name: str, vc: str = "vc-a", prio: int = 10, gpus: int = 2, pods: int = 1) -> dict:
    return {"virtualCluster": vc, "priority": prio, "leafCellType": "K80",
            "affinityGroup": {"name": name, "members": [{"podNumber": pods, "leafCellNumber": gpus}]}}


@pytest.fixture
async def trio(tmp_path):
    ports = free_ports(9)
    peers = {i: f"127.0.0.1:{ports[i]}" for i in range(3)}
    reps = [EmbeddedScheduler(i, peers, tmp_path / f"s{i}", SMALL, client=f"127.0.0.1:{ports[3 + i]}",
                              http=f"127.0.0.1:{ports[6 + i]}", fsync="never", lease_check_s=0.1)
            for i in range(3)]
    await asyncio.gather(*(r.start(ready_timeout_s=None) for r in reps))
    await asyncio.gather(*(r.wait_ready(30) for r in reps))
    yield reps, [f"127.0.0.1:{ports[6 + i]}" for i in range(3)]
    for r in reps:
        await r.stop()


async def take(feed, n: int, timeout_s: float = 10.0) -> list[dict]:
    out = []
    async with asyncio.timeout(timeout_s):
        async for e in feed:
            out.append(e)
            if len(out) == n:
                break
    return out


async def test_embedded_replicas_allocate_feed_preempt_expire(trio):
    reps, _ = trio
    feeds = [r.events() for r in reps]
    seq = [r for r in reps if r.is_sequencer]
    assert len(seq) == 1 and all(r.leader_hint == seq[0].node_id for r in reps)

    low = await reps[0].allocate(spec("low", prio=1, gpus=4, pods=2))
    assert low["ok"] and len(low["placement"]) == 2
    for r in reps[1:]:  # linearizable reads from the others, at once
        g = await r.affinity_group("low")
        assert g["status"]["state"] == "Allocated"
    # vc-a holds 2 nodes (8 GPUs): a higher priority gang of 8 preempts "low"
    high = await reps[1].allocate(spec("high", prio=50, gpus=4, pods=2))
    assert high["ok"] and high["preempted"] == ["low"]
    assert await reps[2].affinity_group("low") is None
    # a gang that cannot fit waits (queued), released -> it is placed
    queued = await reps[2].allocate(spec("next", prio=50, gpus=4, pods=1))
    assert not queued["ok"] and queued["queued"]
    await reps[0].release("high")
    # a lease: stamped here, expired by the sequencer
    await reps[0].allocate(spec("leased", vc="vc-b", gpus=1), ttl_ms=100)
    with pytest.raises(SchedulerError, match="VC nope"):
        await reps[0].allocate(spec("x", vc="nope"))

    want = ["placed:low", "preempted:low", "placed:high", "queued:next", "released:high", "placed:next",
            "placed:leased", "expired:leased"]
    got = [await take(f, len(want)) for f in feeds]
    for events in got:
        assert [f"{e['type']}:{e['group']}" for e in events] == want
    # the same positions on every replica (the log's order); increasing
    positions = [[e["position"] for e in events] for events in got]
    assert positions[0] == positions[1] == positions[2] and positions[0] == sorted(positions[0])
    # resume after a position: the kept history replays what came after it
    again = reps[1].events(after=positions[0][3])
    assert [e["type"] for e in await take(again, 4)] == ["released", "placed", "placed", "expired"]
    again.close()
    for r in reps:
        assert check(r.node.machine.inner) == []


async def test_sequencer_stops_and_a_new_one_serves(trio):
    reps, endpoints = trio
    old = next(r for r in reps if r.is_sequencer)
    others = [r for r in reps if r is not old]
    await others[0].allocate(spec("a1"))
    await old.stop()
    deadline = time.monotonic() + 30
    while True:  # the survivors elect a new sequencer and keep serving writes
        try:
            await others[1].allocate(spec("a2"))
            break
        except Exception:
            assert time.monotonic() < deadline, "no progress after the sequencer stopped"
            await asyncio.sleep(0.2)
    hints = {r.leader_hint for r in others}
    assert hints == {others[0].node_id} or hints == {others[1].node_id}
    names = [g["metadata"]["name"] for g in await others[0].affinity_groups()]
    assert names == ["a1", "a2"]


async def test_metrics_and_cli_against_embedded_replicas(trio):
    reps, endpoints = trio
    await reps[0].allocate(spec("m1"))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{endpoints[1]}/v1/inspect/affinitygroups/") as r:
            assert r.status == 200
        async with http.get(f"http://{endpoints[1]}/metrics") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    for series in ("cellar_applied_commands_total", "cellar_apply_seconds_bucket", "cellar_proposals_pending",
                   "cellar_view", "cellar_sequencer", "cellar_is_sequencer", "cellar_lease_valid",
                   "cellar_scheduler_groups", 'cellar_scheduler_commands_total{op="allocate",outcome="ok"}',
                   'cellar_http_requests_total{method="GET",path="/v1/inspect/affinitygroups/",status="200"}'):
        assert series in text, series

    # the change feed over HTTP: kept events, then a long poll answered by a commit
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{endpoints[2]}/v1/events?after=0") as r:
            feed = await r.json()
        assert feed["from"] == 1 and [e["type"] for e in feed["events"]] == ["initialized", "placed"]
        last = feed["events"][-1]["position"]

        async def poll() -> dict:
            async with http.get(f"http://{endpoints[2]}/v1/events?after={last}&wait_s=10") as r:
                return await r.json()

        waiting = asyncio.create_task(poll())
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await reps[0].release("m1")
        got = await asyncio.wait_for(waiting, 10)
        assert [(e["type"], e["group"]) for e in got["events"]] == [("released", "m1")]
        async with http.get(f"http://{endpoints[2]}/v1/events?after=x") as r:
            assert r.status == 400 and (await r.json())["field"] == "after"

    async def cli(*args: str) -> tuple[int, str, str]:
        p = await asyncio.create_subprocess_exec(sys.executable, "-m", "store.cli", "scheduler", *args,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(p.communicate(), 60)
        return p.returncode, out.decode(), err.decode()

    dead = "127.0.0.1:1"  # refuses: the CLI moves on to the next endpoint
    eps = ",".join([dead, *endpoints])
    code, out, err = await cli("groups", "--endpoints", eps, "--json")
    assert code == 0, err
    assert json.loads(out)["items"] == []
    code, out, err = await cli("allocate", str(EXAMPLES / "job-gang.json"), "--endpoints", eps)
    assert code == 0 and "placed job1/workers" in out, err
    code, out, err = await cli("allocate", str(EXAMPLES / "job-gang.json"), "--endpoints", eps)
    assert code == 1 and err.count("\n") == 1 and "already allocated" in err and "Traceback" not in err
    code, out, err = await cli("status", "--endpoints", eps, "--invariants", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 4 and "error" in rows[0]
    assert all(r["invariants"] == [] for r in rows[1:])
    code, out, err = await cli("health", "node-3", "off", "--endpoints", eps)
    assert code == 0 and "node-3 marked bad" in out
    code, out, err = await cli("vcs", "--endpoints", eps)
    assert code == 0 and "vc-a" in out and "vc-b" in out
    code, out, err = await cli("release", "job1/workers", "--endpoints", eps)
    assert code == 0 and "released job1/workers" in out
    code, out, err = await cli("release", "job1/workers", "--endpoints", eps)
    assert code == 1 and "404" in err and err.count("\n") == 1
    code, out, err = await cli("groups", "--endpoints", dead)
    assert code == 1 and "no replica could answer" in err and err.count("\n") == 1
