"""Real ``cellar serve`` processes on 127.0.0.1, stopped by PID after each test."""

from __future__ import annotations

import asyncio
import time

import pytest

from store.client import CellarClient
from store.server import LocalCluster


@pytest.fixture
def make_cluster(tmp_path):
    made: list[LocalCluster] = []

    def make(replicas: int = 3, **kwargs) -> LocalCluster:
        cluster = LocalCluster(str(tmp_path / f"c{len(made)}"), replicas, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop_all()


async def converged(cellar: CellarClient, nodes: list[int], timeout_s: float = 30.0) -> list[dict]:
    """Wait (bounded) until every node reports the same executed slot and digest."""
    deadline = time.monotonic() + timeout_s
    last: list = []
    while time.monotonic() < deadline:
        last = []
        for i in nodes:
            try:
                last.append(await cellar.status(i))
            except Exception as e:
                last.append({"error": repr(e)})
        if all("digest" in s for s in last) and len({(s["exec_slot"], s["digest"]) for s in last}) == 1:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"replicas did not converge within {timeout_s} s: {last}")


async def committing(cellar: CellarClient, key: str = "probe", timeout_s: float = 20.0) -> None:
    """The cluster commits a write (bounded)."""
    await asyncio.wait_for(cellar.session().put(key, "ok"), timeout_s)
