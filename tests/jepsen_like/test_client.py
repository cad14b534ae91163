"""The Jepsen-style KV client role (jepsen_like/client.py) without a cluster: how answers are
classified, histories of a linearizable in-memory store checked valid, and planted bugs
(deliberately broken client wrappers) found invalid. The real cluster run is
tests/runtime/test_jepsen_kv_http.py."""

from __future__ import annotations

import asyncio
import io

import pytest

from jepsen_like.client import (
    DroppedCas,
    HttpKV,
    InfoAsFail,
    MemoryKV,
    Recorder,
    StaleReads,
    check_history,
    classify,
    describe,
    final_reads,
    run_workload,
)
from jepsen_like.history import FAIL, INFO, OK, pair, parse_jsonl, write_jsonl


@pytest.mark.parametrize(
    "f, status, body, want",
    [
        ("read", 200, {"kvs": []}, OK),
        ("write", 200, {"header": {}}, OK),
        ("cas", 200, {"succeeded": True}, OK),
        ("cas", 200, {"succeeded": False}, FAIL),  # compare failed: a definite no
        ("cas", 200, {"header": {}}, INFO),  # no verdict in the answer: unknown
        ("read", None, None, FAIL),  # no answer: a read changed nothing
        ("write", None, None, INFO),  # no answer: it may have happened
        ("cas", None, None, INFO),
        ("write", 503, {"reason": "Unavailable", "definite": True}, FAIL),  # refused before proposing
        ("write", 503, {"reason": "Unavailable", "definite": False}, INFO),  # timed out inside the node
        ("cas", 503, {"reason": "Unavailable"}, INFO),
        ("read", 503, {"reason": "Unavailable", "definite": False}, FAIL),
        ("write", 500, {"reason": "Internal"}, INFO),
        ("write", 400, {"reason": "InvalidRequest"}, FAIL),
        ("cas", 413, {"reason": "TooLarge"}, FAIL),
    ],
)
def test_classify(f, status, body, want):
    out = classify(f, status, body, "boom" if status is None else None)
    assert out.type == want
    assert out.invalid == (status is not None and 400 <= status < 500)
    assert out.move == (status is None or status >= 500 or want == INFO)


async def _history(client, *, seed: int = 1, sessions: int = 16, ops: int = 120):
    rec = Recorder()
    stats = await run_workload(client, rec, sessions=sessions, keys=4, values=5, seconds=30,
                               ops_per_session=ops, seed=seed)
    await final_reads(client, rec, 4, process=1000)
    return rec, stats


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("lost_rate", [0.0, 0.05])
async def test_linearizable_store_gives_a_valid_history(seed, lost_rate):
    store = MemoryKV(seed=seed, lost_rate=lost_rate, delay_s=0.001)
    rec, stats = await _history(store, seed=seed)
    assert stats.n("cas", OK) > 0 and stats.n("cas", FAIL) > 0  # contended
    assert (stats.n(None, INFO) > 0) == (lost_rate > 0)
    result = check_history(rec.ops)
    assert result.valid is True, describe(result)
    assert result.partitions == 4


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    "wrap, lost_rate",
    [
        (lambda c: StaleReads(c, every=3), 0.0),  # reports a stale read
        (lambda c: DroppedCas(c, every=4), 0.0),  # acknowledges a cas it never sent
        (InfoAsFail, 0.05),  # calls a lost answer (of an op that took effect) a definite failure
    ],
    ids=["stale-reads", "dropped-cas", "info-as-fail"],
)
async def test_planted_client_bug_is_found(seed, wrap, lost_rate):
    broken = wrap(MemoryKV(seed=seed, lost_rate=lost_rate, lost_applied=1.0, delay_s=0.001))
    rec, _ = await _history(broken, seed=seed)
    assert broken.lies > 0
    result = check_history(rec.ops)
    assert result.valid is False, describe(result)
    assert result.violation is not None and str(result.violation.key).startswith("/jepsen/")


async def test_a_single_dropped_cas_is_found():
    """One lie in a quiet history: a cas acknowledged but never applied, then read back."""
    store = MemoryKV(seed=0, delay_s=0)
    broken = DroppedCas(store, every=1)
    rec = Recorder()
    rec.invoke(0, "write", ("/jepsen/0", "1"))
    rec.complete(0, (await store.write("/jepsen/0", "1", 0)).type, "write", ("/jepsen/0", "1"))
    rec.invoke(0, "cas", ("/jepsen/0", ("1", "2")))
    rec.complete(0, (await broken.cas("/jepsen/0", "1", "2", 0)).type, "cas", ("/jepsen/0", ("1", "2")))
    await final_reads(store, rec, 1, process=5)
    assert broken.lies == 1
    assert check_history(rec.ops).valid is False


async def test_history_round_trips_through_jsonl_and_nemesis_events_are_skipped():
    rec, _ = await _history(MemoryKV(seed=4, lost_rate=0.05, delay_s=0.001), sessions=6, ops=40)
    rec.nemesis("kill", 0)
    buf = io.StringIO()
    write_jsonl(rec.ops, buf)
    again = parse_jsonl(buf.getvalue().splitlines())
    assert len(pair(again)) == len(pair(rec.ops))
    assert check_history(again).valid is True


async def test_recorder_until_sees_invocation_and_completion():
    rec = Recorder()
    waiter = asyncio.ensure_future(rec.until(lambda inv, comp: comp.type == OK and inv.f == "write", 5.0))
    await asyncio.sleep(0)
    rec.invoke(1, "write", ("k", "1"))
    rec.complete(1, INFO, "write", ("k", "1"))
    rec.invoke(2, "write", ("k", "2"))
    rec.complete(2, OK, "write", ("k", "2"))
    assert (await waiter).process == 2
    with pytest.raises(asyncio.TimeoutError):
        await rec.until(lambda inv, comp: True, 0.01)


async def test_http_requests_are_what_the_gateway_accepts(monkeypatch):
    """The bodies HttpKV sends parse with the server's own decoders (store/kv_http.py)."""
    from store import kv_http

    sent: list[tuple[str, dict]] = []

    async def fake_post(self, f, node, path, body):
        sent.append((path, body))
        answer = {"kvs": [{"value": "Mw=="}]} if path == "/v3/kv/range" else {"succeeded": True}
        return classify(f, 200, answer), answer

    monkeypatch.setattr(HttpKV, "_post", fake_post)
    client = HttpKV(["http://127.0.0.1:1/"])
    assert (await client.read("/jepsen/0", 0)).value == "3"
    await client.write("/jepsen/0", "4", 0)
    await client.cas("/jepsen/0", "4", "1", 0)
    await client.cas("/jepsen/0", None, "1", 0)
    c = kv_http.Codec(text=False)
    (_, rng), (_, put), (_, cas), (_, create) = sent
    assert kv_http.range_op(rng, c)[0] == {"op": "range", "key": "/jepsen/0"}
    assert kv_http.put_op(put, c) == {"op": "put", "key": "/jepsen/0", "value": "4"}
    txn = kv_http.txn_op(cas, c)
    assert txn["compare"] == [{"key": "/jepsen/0", "target": "value", "result": "=", "value": "4"}]
    assert txn["success"] == [{"op": "put", "key": "/jepsen/0", "value": "1"}] and txn["failure"] == []
    assert kv_http.txn_op(create, c)["compare"] == [{"key": "/jepsen/0", "target": "version", "result": "=",
                                                     "version": 0}]
