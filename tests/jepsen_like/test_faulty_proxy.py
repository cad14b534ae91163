"""Planted bugs on the wire (issue 14, acceptance 3): a faulty HTTP proxy
(jepsen_like/faulty_proxy.py) between the workload and a linearizable in-process KV
server speaking etcd's JSON shape. Through the plain forwarding proxy the history is
linearizable; through a proxy that acknowledges writes it dropped, one that answers
reads with stale replies, or one that swaps read replies between connections, the
checker calls it not linearizable."""

from __future__ import annotations

import pytest
from aiohttp import web

from jepsen_like.client import HttpKV, Recorder, check_history, run_workload
from jepsen_like.faulty_proxy import FaultyHttpProxy
from jepsen_like.proxy import DelayProxy


def _app() -> web.Application:
    data: dict[str, str] = {}

    async def range_(req: web.Request) -> web.Response:
        body = await req.json()
        v = data.get(body["key"])
        return web.json_response({"header": {}, **({"kvs": [{"key": body["key"], "value": v}]} if v is not None else {})})

    async def put(req: web.Request) -> web.Response:
        body = await req.json()
        data[body["key"]] = body["value"]
        return web.json_response({"header": {}})

    async def txn(req: web.Request) -> web.Response:
        body = await req.json()
        c = body["compare"][0]
        cur = data.get(c["key"])
        hit = cur is None if c["target"] == "VERSION" else cur == c["value"]
        if hit:
            p = body["success"][0]["request_put"]
            data[p["key"]] = p["value"]
        return web.json_response({"header": {}, "succeeded": hit})

    app = web.Application()
    app.add_routes([web.post("/v3/kv/range", range_), web.post("/v3/kv/put", put), web.post("/v3/kv/txn", txn)])
    return app


async def _run_through(make_proxy) -> tuple[bool | None, int]:
    runner = web.AppRunner(_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    proxy = make_proxy(("127.0.0.1", port))
    host, pport = await proxy.start()
    try:
        rec = Recorder()
        async with HttpKV([f"http://{host}:{pport}"] * 2, timeout_s=5.0) as kv:
            await run_workload(kv, rec, sessions=8, keys=2, seconds=1.5, seed=5)
        lies = getattr(proxy, "lies", 0)
        return check_history(rec.ops, timeout_s=20.0).valid, lies
    finally:
        await proxy.close()
        await runner.cleanup()


async def test_through_the_plain_proxy_the_history_is_linearizable():
    valid, _ = await _run_through(lambda up: DelayProxy(up))
    assert valid is True


@pytest.mark.parametrize("bug", ["ack-dropped-writes", "stale-replies", "swap-replies"])
async def test_a_faulty_proxy_is_caught(bug):
    valid, lies = await _run_through(lambda up: FaultyHttpProxy(up, bug))
    assert lies > 0, "the planted bug never fired"
    assert valid is False, f"{bug}: {lies} lies, and the checker found the history linearizable"


def test_unknown_bug_is_refused():
    with pytest.raises(ValueError):
        FaultyHttpProxy(("127.0.0.1", 1), "gremlins")
