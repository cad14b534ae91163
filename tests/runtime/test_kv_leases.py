"""Key-value leases on real replicas (issue 12): the sequencer proposes expiry from its
clock (store.kv_service), keepalives hold a lease, revoke deletes its keys, and leases
still expire after the sequencer is SIGKILLed (the new one extends, then expires)."""

from __future__ import annotations

import asyncio
import time

from consensus.runtime import clientwire
from store.client import CellarClient

from .conftest import committing

WAIT_S = 20.0


async def _present(s, key: str) -> bool:
    r = await s.request(clientwire.READ, {"op": "range", "key": key})
    return r["count"] == 1


async def _until_gone(s, key: str, timeout_s: float = WAIT_S) -> float:
    t0 = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while await _present(s, key):
            await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def test_leases_expire_hold_with_keepalives_and_survive_a_failover(make_cluster):
    cluster = make_cluster(3)
    cluster.start_all()
    await cluster.await_ready()
    async with CellarClient(cluster.client_addresses, timeout_s=2.0, deadline_s=30.0) as cellar:
        await committing(cellar)
        s = cellar.session(node=1)
        call = lambda op: s.request(clientwire.CALL, op)  # noqa: E731
        # Expiry without keepalives: granted with the replica's clock (no now_ms sent).
        short = await call({"op": "lease_grant", "ttl_ms": 600})
        assert short["ok"] and short["id"] > 0
        assert (await call({"op": "put", "key": "/a", "value": "1", "lease": short["id"]}))["ok"]
        assert await _present(s, "/a")
        assert await _until_gone(s, "/a") < WAIT_S
        # Keepalives hold it past several TTLs; revoke deletes its keys at once.
        held = await call({"op": "lease_grant", "ttl_ms": 800})
        await call({"op": "put", "key": "/b", "value": "2", "lease": held["id"]})
        for _ in range(10):  # 2 s, 2.5 TTLs
            assert (await call({"op": "lease_keepalive", "id": held["id"]}))["ok"]
            await asyncio.sleep(0.2)
        assert await _present(s, "/b")
        assert (await call({"op": "lease_revoke", "id": held["id"]}))["ok"]
        assert not await _present(s, "/b")
        # Failover: the sequencer dies; the lease still ends under the new one.
        last = await call({"op": "lease_grant", "ttl_ms": 1500})
        await call({"op": "put", "key": "/c", "value": "3", "lease": last["id"]})
        seq = (await cellar.status(0))["sequencer"]
        cluster.kill(seq)
        other = cellar.session(node=(seq + 1) % 3)
        assert await _until_gone(other, "/c", timeout_s=30.0) < 30.0
        sts = [await cellar.status(i) for i in range(3) if i != seq]
        assert len({st["sequencer"] for st in sts}) == 1 and sts[0]["sequencer"] != seq
