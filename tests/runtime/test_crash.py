"""Crash safety with real processes: SIGKILL under a write load, restart, nothing lost."""

from __future__ import annotations

import asyncio
import signal

import pytest

from store.loadgen import run_load
from jepsen_like.checker import check
from jepsen_like.models import KV
from store.client import CellarClient

from .conftest import committing, converged


async def check_acked(cellar: CellarClient, acked: dict) -> None:
    reader = cellar.session()
    wrong = {}
    for key, value in sorted(acked.items()):
        got = await reader.get(key)
        if got != value:
            wrong[key] = (value, got)
    assert not wrong, f"{len(wrong)} acknowledged writes lost or stale, e.g. {list(wrong.items())[:3]}"


# A non-sequencer kill is the mildest case: -m slow (the sequencer kills stay in the default suite).
@pytest.mark.parametrize("protocol,victim", [("sdpaxos", "sequencer"), pytest.param("sdpaxos", "other", marks=pytest.mark.slow),
                                             pytest.param("multipaxos", "sequencer", marks=pytest.mark.slow)])
async def test_kill_one_replica_under_load(make_cluster, protocol, victim):
    cluster = make_cluster(3, protocol=protocol)
    cluster.start_all()
    await cluster.await_ready()
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=20.0) as cellar:
        await committing(cellar)
        st = await cellar.status(0)
        leader = st.get("sequencer", st.get("leader"))
        target = leader if victim == "sequencer" else (leader + 1) % 3

        async def chaos():
            await asyncio.sleep(1.0)
            cluster.kill(target, signal.SIGKILL)
            await asyncio.sleep(1.0)
            cluster.start(target)
            await cluster.await_ready(target)

        chaos_task = asyncio.create_task(chaos())
        res = await run_load(cellar, sessions=32, seconds=4.0, keys=20, read_fraction=0.3, record_history=True)
        await chaos_task
        assert res.ops > 0 and res.acked_writes and res.reads
        statuses = await converged(cellar, [0, 1, 2])
        assert statuses[target]["exec_slot"] == statuses[(target + 1) % 3]["exec_slot"]  # caught up
        await check_acked(cellar, res.acked_writes)
        await committing(cellar, "after")
    verdict = check(res.history_ops(), KV(), timeout_s=60)
    assert verdict.linearizable is True, verdict.reason


async def test_kill_all_replicas_at_once_under_load(make_cluster):
    cluster = make_cluster(3)
    cluster.start_all()
    await cluster.await_ready()
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=3.0) as cellar:
        await committing(cellar)

        async def chaos():
            await asyncio.sleep(1.5)
            for i in range(3):
                cluster.kill(i, signal.SIGKILL)

        chaos_task = asyncio.create_task(chaos())
        res = await run_load(cellar, sessions=32, seconds=2.5, keys=20)
        await chaos_task
    assert len(res.acked_writes) > 50
    cluster.start_all()
    await cluster.await_ready()
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=20.0) as cellar:
        await committing(cellar, "after")
        await converged(cellar, [0, 1, 2])
        await check_acked(cellar, res.acked_writes)
