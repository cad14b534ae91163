"""The KV machine's HTTP API (store/kv_http.py) on real ``cellar serve --http``
replicas: every endpoint, the bad inputs of issue 12 (each a 4xx that changes nothing),
health, metrics, and 503 + Retry-After without a majority."""

from __future__ import annotations

import base64
import json

import aiohttp
import pytest

from store.server import LocalCluster


def b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def unb64(s: str) -> str:
    return base64.b64decode(s).decode()


# One worker for the whole module under xdist: the module-scoped cluster below then starts
# once (split across workers, each started its own).
pytestmark = pytest.mark.xdist_group("kv-http-cluster")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("kvhttp")), 3, http=True)
    c.start_all()
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop_all()


class API:
    def __init__(self, session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
        self.session = session
        self.urls = [f"http://127.0.0.1:{p}" for p in cluster.http_ports]

    async def post(self, path: str, body=None, node: int = 0, raw: bytes | None = None, **kw):
        data = raw if raw is not None else json.dumps({} if body is None else body).encode()
        async with self.session.post(self.urls[node] + path, data=data,
                                     headers={"Content-Type": "application/json"}, **kw) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None), r.headers

    async def ok(self, path: str, body=None, node: int = 0) -> dict:
        status, answer, _ = await self.post(path, body, node)
        assert status == 200, (path, body, status, answer)
        return answer

    async def revision(self, node: int = 0) -> int:
        return (await self.ok("/v3/kv/range", {"key": b64("\0"), "range_end": b64("\0"), "count_only": True},
                              node))["header"]["revision"]


@pytest.fixture
async def api(cluster):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        a = API(s, cluster)
        # the first write may wait for the first view to settle
        for _ in range(50):
            status, _, _ = await a.post("/v3/kv/put", {"key": b64("probe"), "value": b64("ok")})
            if status == 200:
                break
        yield a


async def test_kv_endpoints(api):
    r = await api.ok("/v3/kv/put", {"key": b64("/t/a"), "value": b64("1")})
    rev = r["header"]["revision"]
    assert set(r["header"]) == {"cluster_id", "member_id", "revision", "raft_term"}
    r = await api.ok("/v3/kv/put", {"key": b64("/t/a"), "value": b64("2"), "prev_kv": True})
    assert r["header"]["revision"] == rev + 1
    assert unb64(r["prev_kv"]["value"]) == "1" and r["prev_kv"]["version"] == 1
    await api.ok("/v3/kv/put?encoding=text", {"key": "/t/b", "value": "héllo"})
    await api.ok("/v3/kv/put", {"key": b64("/t/c"), "value": b64(b"\xff\x00")})  # not UTF-8: stored as bytes
    # range: one key, base64 and text, linearizable on every replica and serializable
    for node in range(3):
        r = await api.ok("/v3/kv/range", {"key": b64("/t/a")}, node)
        assert r["count"] == 1 and unb64(r["kvs"][0]["value"]) == "2" and r["kvs"][0]["version"] == 2
    r = await api.ok("/v3/kv/range?encoding=text", {"key": "/t/b", "serializable": True})
    assert r["kvs"][0]["value"] == "héllo"
    r = await api.ok("/v3/kv/range?encoding=text", {"key": "/t/c"})
    assert r["kvs"][0]["value_encoding"] == "base64" and base64.b64decode(r["kvs"][0]["value"]) == b"\xff\x00"
    # prefix, range_end, limit, keys_only, count_only, a past revision
    r = await api.ok("/v3/kv/range?encoding=text", {"key": "/t/", "prefix": True})
    assert [kv["key"] for kv in r["kvs"]] == ["/t/a", "/t/b", "/t/c"] and r["count"] == 3
    r = await api.ok("/v3/kv/range", {"key": b64("/t/a"), "range_end": b64("/t/c")})
    assert [unb64(kv["key"]) for kv in r["kvs"]] == ["/t/a", "/t/b"]
    r = await api.ok("/v3/kv/range", {"key": b64("/t/"), "range_end": b64("/t0"), "limit": "1", "keys_only": True})
    assert r["more"] is True and r["count"] == 3 and "value" not in r["kvs"][0]
    r = await api.ok("/v3/kv/range", {"key": b64("/t/"), "prefix": True, "count_only": True})
    assert r["count"] == 3 and r["kvs"] == []
    r = await api.ok("/v3/kv/range", {"key": b64("/t/a"), "revision": rev})
    assert unb64(r["kvs"][0]["value"]) == "1"
    # txn: compare and swap; the failure branch; a read-only txn
    cas = {"compare": [{"key": b64("/t/a"), "target": "VALUE", "result": "EQUAL", "value": b64("2")}],
           "success": [{"request_put": {"key": b64("/t/a"), "value": b64("3")}},
                       {"request_range": {"key": b64("/t/a")}}],
           "failure": [{"request_range": {"key": b64("/t/b")}}]}
    r = await api.ok("/v3/kv/txn", cas)
    assert r["succeeded"] is True and "response_put" in r["responses"][0]
    assert unb64(r["responses"][1]["response_range"]["kvs"][0]["value"]) == "3"
    r = await api.ok("/v3/kv/txn", cas)
    assert r["succeeded"] is False and unb64(r["responses"][0]["response_range"]["kvs"][0]["value"]) == "héllo"
    r = await api.ok("/v3/kv/txn", {"compare": [{"key": b64("/t/zz"), "target": "CREATE", "result": "EQUAL"}],
                                    "success": [{"request_range": {"key": b64("/t/a")}}]}, node=2)
    assert r["succeeded"] is True  # create_revision omitted: 0 (protobuf), the key is absent
    # deleterange with prev_kv; then a compaction and a read below it
    r = await api.ok("/v3/kv/deleterange?encoding=text", {"key": "/t/", "prefix": True, "prev_kv": True})
    assert r["deleted"] == 3 and sorted(kv["key"] for kv in r["prev_kvs"])[:2] == ["/t/a", "/t/b"]
    now = r["header"]["revision"]
    r = await api.ok("/v3/kv/compaction", {"revision": now - 1, "physical": True})
    assert r["compact_revision"] == now - 1
    status, body, _ = await api.post("/v3/kv/range", {"key": b64("/t/a"), "revision": rev})
    assert status == 400 and body["reason"] == "Compacted" and body["code"] == 11
    assert body["compact_revision"] == now - 1


async def test_lease_endpoints(api):
    r = await api.ok("/v3/lease/grant", {"TTL": 30})
    lease = r["ID"]
    assert lease > 0 and r["TTL"] == 30
    await api.ok("/v3/kv/put", {"key": b64("/l/a"), "value": b64("x"), "lease": str(lease)})
    r = await api.ok("/v3/lease/timetolive?encoding=text", {"ID": lease, "keys": True}, node=1)
    assert r["grantedTTL"] == 30 and 0 < r["TTL"] <= 30 and r["keys"] == ["/l/a"]
    assert {"ID": lease} in (await api.ok("/v3/lease/leases", {}, node=2))["leases"]
    assert {"ID": lease} in (await api.ok("/v3/kv/lease/leases"))["leases"]
    r = await api.ok("/v3/lease/keepalive", {"ID": lease})
    assert r["result"]["ID"] == lease and r["result"]["TTL"] == 30
    r = await api.ok("/v3/lease/revoke", {"ID": lease})
    assert r["deleted"] == 1
    assert (await api.ok("/v3/kv/range", {"key": b64("/l/a")}))["count"] == 0
    for path in ("/v3/lease/keepalive", "/v3/lease/revoke", "/v3/lease/timetolive"):
        status, body, _ = await api.post(path, {"ID": lease})
        assert status == 404 and body["reason"] == "LeaseNotFound" and body["code"] == 5, (path, body)
    status, body, _ = await api.post("/v3/kv/put", {"key": b64("/l/b"), "value": b64("x"), "lease": lease})
    assert status == 404 and body["reason"] == "LeaseNotFound"


BAD = [
    ("/v3/kv/put", {"key": 1.5, "value": b64("x")}, 400, "key must be a base64 string"),
    ("/v3/kv/put?encoding=text", {"key": 1.5, "value": "x"}, 400, "key must be a string"),
    ("/v3/kv/put?encoding=text", {"key": "k", "value": 7}, 400, "value must be a string"),
    ("/v3/kv/put", {"key": b64("k"), "value": b64("x"), "colour": "red"}, 400, "unknown field(s) colour"),
    ("/v3/kv/put", {"key": b64("k"), "value": b64("x"), "lease": "abc"}, 400, "lease must be an integer"),
    ("/v3/kv/put", {"key": b64("k"), "value": b64("x"), "prev_kv": "yes"}, 400, "prev_kv must be true or false"),
    ("/v3/kv/put", {"key": "!!!not base64", "value": b64("x")}, 400, "not valid base64"),
    ("/v3/kv/put", {"key": "", "value": b64("x")}, 400, "key is empty"),
    ("/v3/kv/put", {"key": b64("k" * 5000), "value": b64("x")}, 413, "exceeds the limit"),
    ("/v3/kv/put", {"key": b64("k"), "value": b64("v" * (1100 * 1024))}, 413, "exceeds the limit"),
    ("/v3/kv/put", [1, 2], 400, "must be a JSON object"),
    ("/v3/kv/range", {"key": b64("k"), "revision": 1.5}, 400, "revision must be an integer"),
    ("/v3/kv/range", {"key": b64("k"), "sort_order": "DESCEND"}, 400, "not supported"),
    ("/v3/kv/range", {"key": b64("k"), "min_mod_revision": 3}, 400, "unknown field(s) min_mod_revision"),
    ("/v3/kv/range", {"key": b64("k"), "revision": 10 ** 9}, 400, "future revision"),
    ("/v3/kv/deleterange", {"key": b64("k"), "prefix": True, "range_end": b64("l")}, 400, "not both"),
    ("/v3/kv/txn", {"success": [{"request_txn": {}}]}, 400, "nested txn"),
    ("/v3/kv/txn", {"success": [{"request_put": {"key": b64("d"), "value": b64("1")}},
                                {"request_put": {"key": b64("d"), "value": b64("2")}}]}, 400, "duplicate key"),
    ("/v3/kv/txn", {"compare": [{"key": b64("d"), "target": "COLOUR"}]}, 400, "target must be one of"),
    ("/v3/kv/txn", {"success": {"request_put": {}}}, 400, "success must be a list"),
    ("/v3/kv/compaction", {"revision": 10 ** 9}, 400, "future revision"),
    ("/v3/kv/compaction", {}, 400, "revision is required"),
    ("/v3/lease/grant", {"TTL": 0}, 400, "TTL must be in"),
    ("/v3/lease/grant", {"TTL": 2.5}, 400, "TTL must be an integer"),
    ("/v3/lease/revoke", {}, 400, "ID is required"),
    ("/v3/lease/leases", {"ID": 1}, 400, "unknown field(s) ID"),
]


async def test_bad_inputs_are_4xx_and_change_nothing(api, cluster):
    before = await api.revision()
    for path, body, want, text in BAD:
        status, answer, _ = await api.post(path, body)
        assert status == want and text in answer["error"], (path, body, status, answer)
        assert set(answer) >= {"error", "code", "message", "reason"} and answer["code"] == 3
    status, answer, _ = await api.post("/v3/kv/put", raw=b'{"key": "azE=", "value": ')  # malformed JSON
    assert status == 400 and "not valid JSON" in answer["error"]
    status, answer, _ = await api.post("/v3/kv/put", raw=b"\xff\xfe")
    assert status == 400 and "not valid JSON" in answer["error"]
    status, answer, _ = await api.post("/v3/kv/put", raw=b"[" * 5000 + b"]" * 5000)  # was a bare 500
    assert status == 400 and "nested too deep" in answer["error"]
    big = json.dumps({"key": b64("k"), "value": "A" * (3 << 20)}).encode()  # over the body limit
    status, answer, _ = await api.post("/v3/kv/put", raw=big)
    assert status == 413 and answer["reason"] == "TooLarge"
    status, answer, _ = await api.post("/v3/kv/nothing", {})
    assert status == 404 and answer["reason"] == "NotFound"
    async with api.session.get(api.urls[0] + "/v3/kv/put") as r:
        assert r.status == 405 and (await r.json())["reason"] == "MethodNotAllowed"
    async with api.session.post(api.urls[0] + "/v3/kv/put", json={"key": b64("k"), "value": b64("x")},
                                headers={"X-Huge": "h" * 20000}) as r:  # a header over aiohttp's 8 KiB
        assert 400 <= r.status < 500
    status, answer, _ = await api.post("/v3/kv/range?encoding=rot13", {"key": b64("k")})
    assert status == 400 and "encoding" in answer["error"]
    assert await api.revision() == before
    assert (await api.ok("/v3/kv/range", {"key": b64("k")}))["count"] == 0
    # the binary client's view: nothing was stored either
    from consensus.runtime import clientwire
    from store.client import CellarClient

    async with CellarClient(cluster.client_addresses) as cellar:
        r = await cellar.session().request(clientwire.READ, {"op": "range", "key": "k"})
        assert r["count"] == 0 and r["revision"] == before


async def test_health_readiness_and_metrics(api):
    for node in range(3):
        async with api.session.get(api.urls[node] + "/healthz") as r:
            assert r.status == 200 and (await r.json())["health"] == "true"
        async with api.session.get(api.urls[node] + "/readyz") as r:
            body = await r.json()
            assert r.status == 200 and body["ready"] and body["reachable"] == 3
    async with api.session.get(api.urls[0] + "/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    for name in ("cellar_applied_commands_total", "cellar_view", "cellar_is_sequencer", "cellar_wal_fsyncs_total",
                 "cellar_loop_lag_max_seconds", "cellar_proposals_pending", "cellar_requests_waiting",
                 "cellar_kv_revision", 'cellar_http_requests_total{method="POST",path="/v3/kv/put",status="200"}',
                 'cellar_http_request_seconds_bucket{le="0.001",path="/v3/kv/put"}'):
        assert name in text, name


async def test_no_majority_is_503_with_retry_after(make_cluster):
    cluster = make_cluster(3, http=True)
    cluster.start(0)  # alone: one of three
    await cluster.await_ready(0)
    url = f"http://127.0.0.1:{cluster.http_ports[0]}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        async with s.get(url + "/readyz") as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1" and not (await r.json())["ready"]
        async with s.get(url + "/healthz") as r:
            assert r.status == 200
        for path, body in (("/v3/kv/put", {"key": b64("k"), "value": b64("v")}), ("/v3/kv/range", {"key": b64("k")}),
                           ("/v3/lease/grant", {"TTL": 5})):
            async with s.post(url + path, json=body) as r:
                answer = await r.json()
                assert r.status == 503 and r.headers["Retry-After"] == "1", (path, answer)
                assert answer["reason"] == "Unavailable" and answer["code"] == 14 and answer["definite"] is True
        # bad input is still a 400 (checked before the majority)
        async with s.post(url + "/v3/kv/put", json={"key": 1.5, "value": b64("v")}) as r:
            assert r.status == 400
        # serializable reads are served from this replica's state
        async with s.post(url + "/v3/kv/range", json={"key": b64("k"), "serializable": True}) as r:
            assert r.status == 200 and (await r.json())["count"] == 0
