"""A longer crash campaign with real processes (``python3 -m pytest -m slow tests/runtime``).

Random faults for ``CELLAR_SOAK_SECONDS`` (default 60): SIGKILL and restart of a random
minority, SIGSTOP/SIGCONT pauses (the lease holder included), under a read/write load.
Afterwards: every replica converges to one digest, every acknowledged write is there,
and the client history is linearizable. The fault schedule is drawn from
``CELLAR_SOAK_SEED`` (printed on failure), every loop is bounded.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

import pytest

from store.loadgen import run_load
from jepsen_like.checker import check
from jepsen_like.models import KV
from store.client import CellarClient

from .conftest import committing, converged
from .test_crash import check_acked


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("replicas", [3, 5])
async def test_crash_and_pause_soak(make_cluster, replicas):
    seconds = float(os.environ.get("CELLAR_SOAK_SECONDS", "60"))
    seed = int(os.environ.get("CELLAR_SOAK_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    cluster = make_cluster(replicas, extra_args=["--snapshot-every", "500"])
    cluster.start_all()
    await cluster.await_ready()
    faults: list[tuple] = []
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=30.0) as cellar:
        await committing(cellar)

        async def nemesis():
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds - 3
            while loop.time() < end:
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                victims = rng.sample(range(replicas), rng.randint(1, (replicas - 1) // 2))
                kind = rng.choice(["kill", "kill", "pause"])
                faults.append((round(loop.time(), 2), kind, victims))
                for v in victims:
                    os.kill(cluster.procs[v].pid, signal.SIGSTOP) if kind == "pause" else cluster.kill(v)
                await asyncio.sleep(rng.uniform(0.2, 2.0))
                for v in victims:
                    if kind == "pause":
                        os.kill(cluster.procs[v].pid, signal.SIGCONT)
                    else:
                        cluster.start(v)
                        await cluster.await_ready(v)

        nem = asyncio.create_task(nemesis())
        res = await run_load(cellar, sessions=32, seconds=seconds, keys=20, read_fraction=0.3, record_history=True)
        await nem
        context = f"seed {seed}, faults {faults}"
        await converged(cellar, list(range(replicas)), timeout_s=60)
        await check_acked(cellar, res.acked_writes)
    verdict = check(res.history_ops(), KV(), timeout_s=300)
    assert verdict.linearizable is True, f"{verdict.reason} ({context})"
