"""Real replicas behind delaying proxies learn which peers are near (issue 15).

Three ``cellar serve`` processes, every peer connection through a ``DelayProxy``; round
trips R0-R1 20 ms, R1-R2 50 ms, R0-R2 80 ms, so the ring order each replica starts from
(R1 asks R2 first, R2 asks R0 first) is wrong for R1 and R2. No peer order is configured
anywhere: each replica's status must come to show the nearest-first order (R1: R0 then
R2; R2: R1 then R0) and the round trips it measured. Orders only; no timing asserted."""

from __future__ import annotations

import asyncio
import time

from bench.geo_bench import GeoRun
from store.client import CellarClient

MATRIX = [[0.05, 20.0, 80.0], [20.0, 0.05, 50.0], [80.0, 50.0, 0.05]]
WANT = {0: [1, 2], 1: [0, 2], 2: [1, 0]}


async def test_replicas_behind_proxies_order_their_peers_nearest_first(tmp_path):
    run = GeoRun("sdpaxos", ["A", "B", "C"], MATRIX, clients_per_site=1, seconds=1.0, warmup=0.0, jitter=0.0,
                 seed=1, fsync="never", root=str(tmp_path), say=lambda _msg: None, progress=None)
    try:
        await run.start()
        async with CellarClient(run.cluster.client_addresses, timeout_s=2.0) as client:
            deadline = time.monotonic() + 20.0
            while True:  # bounded by the deadline
                statuses = await client.statuses(digest=False)
                orders = {i: st.get("nearness", {}).get("live_order") for i, st in enumerate(statuses)}
                rtt = {i: st.get("nearness", {}).get("rtt_ms", {}) for i, st in enumerate(statuses)}
                # Every pair measured, from both ends (an order can be right before the far
                # pair's first sample: R2 orders its measured R1 before an unmeasured R0).
                measured = all(len(r) == 2 and all(v is not None for v in r.values()) for r in rtt.values())
                if orders == WANT and measured:
                    break
                assert time.monotonic() < deadline, f"orders {orders}, want {WANT}; rtt {rtt}"
                await asyncio.sleep(0.2)
            # The far pair reads farther than the near one.
            assert rtt[1]["0"] < rtt[1]["2"] and rtt[2]["1"] < rtt[2]["0"], rtt
    finally:
        await run.stop()
