"""``POST /v3/watch`` (store/kv_http.py) in process, over a stand-in node that applies
each command at once to a real KV machine: the stream's shape (created, events,
progress, canceled with compact_revision), base64 and ?encoding=text, bad requests as
JSON errors before streaming, the watcher limit (429), a client that reads nothing
(canceled, the node never waits), a client that goes away, and stop()."""

from __future__ import annotations

import asyncio
import base64
import json
import types

import aiohttp
import pytest

from store.kv_machine import KVStateMachine
from consensus.runtime import clientwire
from store.kv_http import KVAPI
from store.server import free_ports

WAIT_S = 10.0


class FakeNode:
    """What KVAPI uses of consensus.runtime.node.Node, applying commands at once."""

    def __init__(self) -> None:
        self.machine = KVStateMachine()
        self.cfg = types.SimpleNamespace(cluster_id="test", node_id=0, peers={0: None})
        self.replica = types.SimpleNamespace(view=1, status=lambda: {"view": 1})
        self._down = False
        self.quorum = 1
        self._waiters: dict = {}
        self._clients: set = set()

    def peers_reachable(self) -> int:
        return 1

    def submit(self, kind, client, seq, op):
        fut = asyncio.get_running_loop().create_future()
        fut.set_result((clientwire.OK, self.machine.apply(op)))
        return fut

    def forget(self, client, seq) -> None:
        pass

    def local_query(self, op):
        return self.machine.query(op)


def b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


@pytest.fixture
async def server():
    node = FakeNode()
    api = KVAPI(node, progress_interval_s=0.2, write_stall_s=1.0, watchers_max=4, queue_events_max=50)
    port = free_ports(1)[0]
    await api.start("127.0.0.1", port)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield types.SimpleNamespace(node=node, api=api, url=f"http://127.0.0.1:{port}", session=s)
    await api.stop()


async def put(srv, key: str, value: str) -> int:
    async with srv.session.post(srv.url + "/v3/kv/put?encoding=text", json={"key": key, "value": value}) as r:
        assert r.status == 200
        return (await r.json())["header"]["revision"]


class Stream:
    """One watch stream: its messages, one JSON object per line."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self) -> dict:
        line = await asyncio.wait_for(self.resp.content.readline(), WAIT_S)
        assert line.endswith(b"\n"), line
        return json.loads(line)["result"]


async def open_watch(srv, create: dict, query: str = "?encoding=text") -> Stream:
    resp = await srv.session.post(srv.url + "/v3/watch" + query, json={"create_request": create})
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("application/json")
    return Stream(resp)


async def test_stream_created_events_progress(server):
    srv = server
    r1 = await put(srv, "/w/a", "1")
    s = await open_watch(srv, {"key": "/w/", "prefix": True, "prev_kv": True, "progress_notify": True,
                               "start_revision": r1})
    created = await s.next()
    assert created["created"] is True and created["header"]["revision"] == r1 and created["watch_id"] >= 1
    wid = created["watch_id"]
    first = await s.next()  # history: the put at r1
    assert first["watch_id"] == wid and first["header"]["revision"] == r1
    assert first["events"] == [{"type": "PUT", "kv": {"key": "/w/a", "create_revision": r1, "mod_revision": r1,
                                                      "version": 1, "lease": 0, "value": "1"}}]
    r2 = await put(srv, "/w/a", "2")
    msg = await s.next()
    assert msg["header"]["revision"] == r2 and msg["events"][0]["prev_kv"]["value"] == "1"
    # a txn: its events in one message
    async with srv.session.post(srv.url + "/v3/kv/txn?encoding=text", json={"success": [
            {"request_put": {"key": "/w/b", "value": "x"}},
            {"request_delete_range": {"key": "/w/a"}}]}) as r:
        r3 = (await r.json())["header"]["revision"]
    msg = await s.next()
    assert msg["header"]["revision"] == r3 and [(e["type"], e["kv"]["key"]) for e in msg["events"]] == [
        ("DELETE", "/w/a"), ("PUT", "/w/b")]
    assert msg["events"][0]["kv"]["mod_revision"] == r3 and "value" not in msg["events"][0]["kv"]
    # idle: a header-only progress notification with the current revision
    msg = await s.next()
    assert msg == {"header": msg["header"], "watch_id": wid} and msg["header"]["revision"] == r3
    s.resp.close()


async def test_base64_and_filters(server):
    srv = server
    s = await open_watch(srv, {"key": b64("/k"), "range_end": b64("/l"), "filters": ["NOPUT"]}, query="")
    await s.next()
    await put(srv, "/k1", "v")
    async with srv.session.post(srv.url + "/v3/kv/deleterange", json={"key": b64("/k1")}) as r:
        rev = (await r.json())["header"]["revision"]
    msg = await s.next()
    assert msg["header"]["revision"] == rev and msg["events"][0]["type"] == "DELETE"
    assert base64.b64decode(msg["events"][0]["kv"]["key"]) == b"/k1"
    s.resp.close()


async def test_compacted_start_is_canceled_with_compact_revision(server):
    srv = server
    for i in range(5):
        rev = await put(srv, "/c", str(i))
    async with srv.session.post(srv.url + "/v3/kv/compaction", json={"revision": rev - 1}) as r:
        assert r.status == 200
    s = await open_watch(srv, {"key": "/c", "start_revision": 2})
    assert (await s.next())["created"] is True
    msg = await s.next()
    assert msg["canceled"] is True and msg["compact_revision"] == rev - 1 and "compacted" in msg["cancel_reason"]
    assert await asyncio.wait_for(s.resp.content.read(), WAIT_S) == b""  # the stream ends
    assert srv.api.hub.watchers == {}


@pytest.mark.parametrize("body, status, needle", [
    (b"{", 400, "not valid JSON"),
    ({"create_request": {"key": "/k", "bogus": 1}}, 400, "unknown field"),
    ({"create_request": {"key": 5}}, 400, "must be a string"),
    ({"create_request": {"key": ""}}, 400, "key is required"),
    ({"create_request": {"key": "/k", "start_revision": 1.5}}, 400, "integer"),
    ({"create_request": {"key": "/k", "filters": ["NOPE"]}}, 400, "NOPUT"),
    ({"create_request": {"key": "/k", "prefix": True, "range_end": "/z"}}, 400, "not both"),
    ({"cancel_request": {"watch_id": 1}}, 400, "only create_request"),
    ({}, 400, "create_request is required"),
    ({"create_request": {"key": "k" * 5000}}, 413, "exceeds"),
])
async def test_bad_requests_get_json_errors(server, body, status, needle):
    srv = server
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with srv.session.post(srv.url + "/v3/watch?encoding=text", data=data) as r:
        assert r.status == status
        err = await r.json()
        assert needle in err["error"] and err["code"] and err["reason"]
    assert srv.api.hub.watchers == {}


async def test_watcher_limit_and_client_going_away(server):
    srv = server
    streams = [await open_watch(srv, {"key": f"/lim/{i}"}) for i in range(4)]
    for s in streams:
        await s.next()
    async with srv.session.post(srv.url + "/v3/watch?encoding=text", json={"create_request": {"key": "/x"}}) as r:
        assert r.status == 429 and r.headers["Retry-After"] == "1"
        assert (await r.json())["reason"] == "TooManyWatchers"
    for s in streams:
        s.resp.close()  # the server notices within its tick and frees the watchers

    async def freed():
        while srv.api.hub.watchers:
            await asyncio.sleep(0.05)
    await asyncio.wait_for(freed(), WAIT_S)
    s = await open_watch(srv, {"key": "/x"})
    assert (await s.next())["created"] is True
    s.resp.close()


async def test_a_client_that_reads_nothing_is_canceled_and_never_blocks(server):
    srv = server
    host, port = srv.url[7:].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"create_request": {"key": "/big/", "prefix": True}}).encode()
    writer.write(b"POST /v3/watch?encoding=text HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()

    async def created():
        while not srv.api.hub.watchers:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(created(), WAIT_S)
    value = "v" * 200_000
    for i in range(60):  # ~12 MB of events to a client that reads nothing: puts are never held up
        await asyncio.wait_for(put(srv, f"/big/{i % 5}", value), 2.0)

    async def gone():
        while srv.api.hub.watchers:
            await asyncio.sleep(0.05)
    await asyncio.wait_for(gone(), WAIT_S)
    assert srv.api.stats["watch_stalled"] == 1
    writer.close()


async def test_stop_ends_every_stream(server):
    srv = server
    s = await open_watch(srv, {"key": "/stop"})
    await s.next()
    await srv.api.stop()
    msg = await s.next()
    assert msg["canceled"] is True and "stopping" in msg["cancel_reason"]


async def test_a_long_history_of_large_values_streams_in_pieces_in_order(server):
    srv = server
    value = "x" * 100_000
    revs = [await put(srv, f"/h/{i % 3}", value + str(i)) for i in range(12)]  # ~1.2 MB of history
    s = await open_watch(srv, {"key": "/h/", "prefix": True, "start_revision": revs[0]})
    await s.next()
    got = [await s.next() for _ in revs]
    assert [m["header"]["revision"] for m in got] == revs
    assert [m["events"][0]["kv"]["value"][-2:].lstrip("x") for m in got] == [str(i) for i in range(12)]
    s.resp.close()
