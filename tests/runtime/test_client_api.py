"""The client as a new user meets it (issue 12): the address strings ``cellar up``
prints, typed errors for what the machine refuses, ``cas(strict=True)``, and the
blocking ``SyncClient`` for scripts."""

from __future__ import annotations

import asyncio

import pytest

from store.client import CellarClient, Compacted, CompareFailed, InvalidRequest, LeaseNotFound, SyncClient, TooLarge, parse_addresses

from .conftest import committing


def test_addresses_parse_as_cellar_up_prints_them():
    assert parse_addresses("127.0.0.1:7100, 127.0.0.1:7101") == [("127.0.0.1", 7100), ("127.0.0.1", 7101)]
    assert parse_addresses(["127.0.0.1:7100", ("127.0.0.2", 7101)]) == [("127.0.0.1", 7100), ("127.0.0.2", 7101)]
    assert parse_addresses(("h", 1)) == [("h", 1)]
    assert parse_addresses("[::1]:7100") == [("::1", 7100)]
    for bad in ("h", "h:0", "h:70000", "h:x", "", ",", 5, [("h", "1")], [1.5]):
        with pytest.raises(ValueError):
            parse_addresses(bad)
    with pytest.raises(ValueError, match="deadline_s"):
        CellarClient("h:1", deadline_s=0)


async def test_typed_errors_and_strict_cas(make_cluster):
    cluster = make_cluster(3)
    cluster.start_all()
    await cluster.await_ready()
    text = ",".join(f"{h}:{p}" for h, p in cluster.client_addresses)
    async with CellarClient(text, timeout_s=2.0, deadline_s=30.0) as cellar:
        await committing(cellar)
        await cellar.put("k", "v1")
        assert await cellar.cas("k", "v1", "v2") is True
        assert await cellar.cas("k", "v1", "v3") is False
        with pytest.raises(CompareFailed):
            await cellar.cas("k", "v1", "v3", strict=True)
        assert await cellar.get("k") == "v2"
        r = await cellar.call({"op": "put", "key": "a", "value": "1"})
        assert r["ok"] and r["revision"] > 0
        await cellar.call({"op": "compact", "revision": r["revision"]})
        with pytest.raises(Compacted) as e:
            await cellar.call({"op": "range", "key": "a", "revision": 1})
        assert e.value.compact_revision == r["revision"]
        with pytest.raises(LeaseNotFound):
            await cellar.call({"op": "lease_keepalive", "id": 424242})
        with pytest.raises(InvalidRequest):
            await cellar.call({"op": "put", "key": 1.5, "value": "x"})
        with pytest.raises(TooLarge):
            await cellar.put("big", "x" * (3 << 20))
        assert await cellar.get("big") is None, "refused, so nothing applied"


async def test_sync_client_from_a_script(make_cluster):
    cluster = make_cluster(3)
    cluster.start_all()
    await cluster.await_ready()
    text = ",".join(f"{h}:{p}" for h, p in cluster.client_addresses)

    def script() -> tuple:
        with SyncClient(text, timeout_s=2.0, deadline_s=30.0) as cellar:
            cellar.put("s", "1")
            got = cellar.get("s")
            done = cellar.cas("s", "1", "2")
            status = cellar.status(0)
        return got, done, status

    got, done, status = await asyncio.wait_for(asyncio.to_thread(script), 60)
    assert got == "1" and done is True and "view" in status
