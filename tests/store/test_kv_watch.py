"""The KV machine's change feed and the watch hub (store/kv_watch.py), in process:
the feed leaves the replicated state byte-identical; watchers get history then live
events in revision order with no gap and no duplicate, one batch per revision;
prefix / range / single key; prev_kv and filters; compaction, snapshot-restore jumps
and slow consumers (bounded queues, never blocking the machine)."""

from __future__ import annotations

import asyncio
import random

import pytest

from store.kv_machine import KVStateMachine
from store.kv_watch import NODELETE, NOPUT, TooManyWatchers, WatchCanceled, WatchHub

WAIT_S = 5.0


def put(k, v, **kw):
    return {"op": "put", "key": k, "value": v, **kw}


def workload(seed: int, n: int = 300) -> list:
    """A mixed log: puts, deletes, prefix deletes, txns, leases, legacy ops, compaction."""
    rng = random.Random(seed)
    keys = [f"/a/{i}" for i in range(6)] + [f"/b/{i}" for i in range(4)] + ["/a", "/c"]
    ops: list = [{"op": "lease_grant", "id": 7, "ttl_ms": 1000, "now_ms": 0}]
    for i in range(n):
        k = rng.choice(keys)
        r = rng.random()
        if r < 0.45:
            ops.append(put(k, f"v{i}", **({"lease": 7} if rng.random() < 0.1 else {})))
        elif r < 0.55:
            ops.append({"op": "delete_range", "key": k})
        elif r < 0.6:
            ops.append({"op": "delete_range", "key": "/b/", "prefix": True})
        elif r < 0.75:
            k2 = rng.choice([x for x in keys if x != k])
            ops.append({"op": "txn", "compare": [{"key": k, "target": "version", "result": ">", "version": 0}],
                        "success": [put(k, f"t{i}"), put(k2, f"u{i}")],
                        "failure": [{"op": "delete_range", "key": k2}]})
        elif r < 0.8:
            ops.append(["put", k, f"l{i}"])
        elif r < 0.83:
            ops.append(["delete", k])
        elif r < 0.86:
            ops.append(["append", k, "+"])
        elif r < 0.88:
            ops.append({"op": "lease_grant", "id": 7, "ttl_ms": 1000, "now_ms": i})
        elif r < 0.9:
            ops.append({"op": "lease_expire", "now_ms": 10_000 * i})
        else:
            ops.append({"op": "range", "key": k})
    return ops


class Recorder:
    def __init__(self) -> None:
        self.calls: list = []

    def kv_events(self, revision, events):
        self.calls.append((revision, list(events)))

    def kv_restored(self, revision, compact_revision):
        self.calls.append(("restored", revision, compact_revision))


def test_change_feed_leaves_the_state_byte_identical():
    plain, fed = KVStateMachine(), KVStateMachine()
    rec = Recorder()
    fed.listener = rec
    for i, op in enumerate(workload(1, 500)):
        a, b = plain.apply(op), fed.apply(op)
        assert a == b, op
        if i % 97 == 0:
            assert plain.snapshot() == fed.snapshot() and plain.digest() == fed.digest()
        if i == 250:
            plain.apply({"op": "compact", "revision": plain.rev - 20})
            fed.apply({"op": "compact", "revision": fed.rev - 20})
    assert plain.snapshot() == fed.snapshot() and plain.digest() == fed.digest()
    # one report per revision that changed keys, in order, each revision once
    revs = [c[0] for c in rec.calls]
    assert revs == sorted(set(revs)) and revs[-1] == fed.rev
    # restore keeps the listener, reports the jump, and stays byte-identical
    snap = plain.snapshot()
    fed.restore(snap)
    plain.restore(snap)
    assert fed.listener is rec and rec.calls[-1] == ("restored", fed.rev, fed.compact_rev)
    assert plain.snapshot() == fed.snapshot() == snap
    for op in workload(2, 100):
        assert plain.apply(op) == fed.apply(op)
    assert plain.digest() == fed.digest()


def test_a_listener_that_raises_is_detached_and_changes_nothing():
    class Broken:
        def kv_events(self, revision, events):
            raise RuntimeError("boom")

    plain, fed = KVStateMachine(), KVStateMachine()
    fed.listener = Broken()
    for op in workload(3, 50):
        assert plain.apply(op) == fed.apply(op)
    assert fed.listener is None and plain.snapshot() == fed.snapshot()


async def drain(w, until_rev: int) -> list:
    """Every batch up to ``until_rev``: until the watcher has seen that revision (bounded)."""
    out = []

    async def go():
        while (w.progress_revision() or 0) < until_rev:
            out.extend(await w.next(0.05))

    await asyncio.wait_for(go(), WAIT_S)
    return out


def flat(batches) -> list:
    return [(b.revision, e.kind, e.key, e.kv.get("value"), e.kv["mod_revision"], e.kv["create_revision"],
             e.kv["version"], e.kv["lease"], None if e.prev_kv is None else (e.prev_kv["value"],
                                                                            e.prev_kv["mod_revision"]))
            for b in batches for e in b.events]


async def test_history_then_live_without_gap_or_duplicate_in_revision_order():
    m = KVStateMachine()
    hub = WatchHub(m, catchup_revisions=7)  # small windows: many history reads
    ops = workload(4, 400)
    for op in ops[:200]:
        m.apply(op)
    mid = m.rev
    # a live-only watcher (start 0) and history watchers from revision 2 and from mid - 30
    live = hub.watch("/a", prefix=True, prev_kv=True)
    full = hub.watch("/a", prefix=True, start_revision=2, prev_kv=True)
    part = hub.watch("/a", prefix=True, start_revision=mid - 30, prev_kv=True)
    assert not full.synced and live.synced
    got_full = await full.next()  # some history now, the rest interleaved with live applies
    for i, op in enumerate(ops[200:]):
        m.apply(op)
        if i % 50 == 0:
            got_full += await full.next()
    end = m.rev
    got_full += await drain(full, end)
    got_live = await drain(live, end)
    got_part = await drain(part, end)
    # the reference: a recorder that saw every apply of the same log
    ref_m, ref = KVStateMachine(), Recorder()
    ref_m.listener = ref
    for op in ops:
        ref_m.apply(op)
    expect = []
    for rev, events in ref.calls:
        for kind, key, rec, prev in sorted(events, key=lambda e: e[1]):
            if key.startswith("/a"):
                expect.append((rev, kind, key, rec[3], rec[0], rec[1], rec[2], rec[4],
                               None if prev is None or not prev[1] else (prev[3], prev[0])))
    assert flat(got_full) == expect
    assert flat(got_part) == [e for e in expect if e[0] >= mid - 30]
    assert flat(got_live) == [e for e in expect if e[0] > mid]
    for got in (got_full, got_part, got_live):
        revs = [b.revision for b in got]
        assert revs == sorted(set(revs))  # one batch per revision, increasing


async def test_single_key_range_and_filters():
    m = KVStateMachine()
    hub = WatchHub(m)
    one = hub.watch("/k")
    rng = hub.watch("/k", "/m")  # [/k, /m)
    everything = hub.watch("\0", "\0")
    noput = hub.watch("/k", prefix=True, filters=(NOPUT,))
    nodel = hub.watch("/k", prefix=True, filters=(NODELETE,))
    m.apply(put("/k", "1"))
    m.apply(put("/k2", "2"))
    m.apply(put("/m", "3"))
    m.apply({"op": "txn", "success": [put("/l", "4"), {"op": "delete_range", "key": "/k"}]})
    m.apply({"op": "delete_range", "key": "/k2"})
    end = m.rev
    assert [(b.revision, [(e.kind, e.key) for e in b.events]) for b in await drain(one, 5)] == [
        (2, [("PUT", "/k")]), (5, [("DELETE", "/k")])]
    got = await drain(rng, end)
    assert [(b.revision, [(e.kind, e.key) for e in b.events]) for b in got] == [
        (2, [("PUT", "/k")]), (3, [("PUT", "/k2")]), (5, [("DELETE", "/k"), ("PUT", "/l")]),
        (6, [("DELETE", "/k2")])]
    delete = got[2].events[0]
    assert delete.kv == {"key": "/k", "create_revision": 0, "mod_revision": 5, "version": 0, "lease": 0}
    assert [b.revision for b in await drain(everything, end)] == [2, 3, 4, 5, 6]
    assert {e.kind for b in await drain(noput, end) for e in b.events} == {"DELETE"}
    assert {e.kind for b in await drain(nodel, 3) for e in b.events} == {"PUT"}
    # the same from history
    h = hub.watch("/k", prefix=True, start_revision=1, filters=(NOPUT,))
    assert [(b.revision, [e.key for e in b.events]) for b in await drain(h, end)] == [(5, ["/k"]), (6, ["/k2"])]


async def test_compacted_start_and_compaction_overtaking_an_unsynced_watcher():
    m = KVStateMachine()
    hub = WatchHub(m, catchup_revisions=2)
    for i in range(10):
        m.apply(put("/x", str(i)))
    m.apply({"op": "compact", "revision": 6})
    # at or below the compaction point: canceled at once, compact_revision carried
    for start in (3, 6):
        w = hub.watch("/x", start_revision=start)
        with pytest.raises(WatchCanceled) as e:
            await w.next()
        assert e.value.compact_revision == 6 and "compacted" in e.value.reason and "watch from 7" in e.value.reason
    w = hub.watch("/x", start_revision=7)
    assert [b.revision for b in await w.next()] == [7, 8]
    m.apply({"op": "compact", "revision": 10})  # overtakes the rest of its history
    with pytest.raises(WatchCanceled) as e:
        await asyncio.wait_for(w.next(), WAIT_S)
    assert e.value.compact_revision == 10
    assert w.id not in hub.watchers and hub.stats["compacted"] == 3


async def test_future_start_revision_waits():
    m = KVStateMachine()
    hub = WatchHub(m)
    w = hub.watch("/f", start_revision=4)
    assert w.progress_revision() == 1
    for i in range(4):
        m.apply(put("/f", str(i)))
    assert [b.revision for b in await drain(w, 5)] == [4, 5]


async def test_a_slow_consumer_falls_back_to_the_history_and_misses_nothing():
    m = KVStateMachine()
    hub = WatchHub(m, queue_events_max=10)
    slow = hub.watch("/s", prefix=True, prev_kv=True)
    fast = hub.watch("/s", prefix=True, prev_kv=True)
    got_fast = []
    for i in range(100):
        m.apply(put(f"/s/{i % 7}", str(i)))  # the machine never waits for a watcher
        got_fast += await fast.next()
    assert hub.stats["fallbacks"] >= 1 and len(slow.queue) <= 10
    got_slow = await drain(slow, m.rev)
    assert flat(got_slow) == flat(got_fast) and len(got_fast) == 100


async def test_snapshot_restore_jump_replays_the_gap_or_cancels():
    leader = KVStateMachine()
    for i in range(5):
        leader.apply(put("/r", str(i)))
    lagging = KVStateMachine()
    lagging.restore(leader.snapshot())
    hub = WatchHub(lagging)
    w = hub.watch("/r", prefix=True)
    w_old = hub.watch("/r", prefix=True, start_revision=lagging.rev - 1)
    base = lagging.rev
    for i in range(5, 25):
        leader.apply(put(f"/r/{i}", str(i)))
    lagging.restore(leader.snapshot())  # catch-up by snapshot: the revision jumps by 20
    got = await drain(w, leader.rev)
    assert [b.revision for b in got] == list(range(base + 1, leader.rev + 1))
    assert [b.revision for b in await drain(w_old, leader.rev)] == list(range(base - 1, leader.rev + 1))
    # a jump over compacted revisions cancels with the reason and compact_revision
    for i in range(25, 35):
        leader.apply(put(f"/r/{i}", str(i)))
    leader.apply({"op": "compact", "revision": leader.rev - 2})
    lagging.restore(leader.snapshot())
    with pytest.raises(WatchCanceled) as e:
        await asyncio.wait_for(w.next(), WAIT_S)
    assert "snapshot restore" in e.value.reason and e.value.compact_revision == leader.rev - 2
    # a store that goes back cancels everything
    w2 = hub.watch("/r", prefix=True)
    lagging.restore(KVStateMachine().snapshot())
    with pytest.raises(WatchCanceled, match="went back"):
        await asyncio.wait_for(w2.next(), WAIT_S)
    assert hub.watchers == {}


async def test_progress_cancel_limit_and_close():
    m = KVStateMachine()
    hub = WatchHub(m, watchers_max=2)
    a = hub.watch("/p")
    assert await a.next(0.01) == [] and a.progress_revision() == m.rev
    b = hub.watch("/p", start_revision=1)
    with pytest.raises(TooManyWatchers):
        hub.watch("/p")
    assert b.progress_revision() is None  # behind: no progress claimed
    b.cancel()
    with pytest.raises(WatchCanceled, match="canceled by the client"):
        await b.next()
    c = hub.watch("/p")
    waiter = asyncio.ensure_future(c.next())
    await asyncio.sleep(0)
    hub.close("stopping")
    with pytest.raises(WatchCanceled, match="stopping"):
        await asyncio.wait_for(waiter, WAIT_S)
    assert hub.watchers == {} and m.listener is None
    with pytest.raises(WatchCanceled):
        hub.watch("/p")


@pytest.mark.parametrize("seed", range(6))
async def test_random_watchers_match_the_reference_stream(seed):
    """Random spans, start revisions, filters and consumption points, tiny queue bounds
    (many fallbacks to the history) and catch-up windows, snapshot restores that jump
    the revision: each watcher's stream is the reference stream cut to its span and
    start, unless it is canceled as compacted (and only then)."""
    rng = random.Random(seed)
    ops = workload(100 + seed, 600)
    ref_m, ref = KVStateMachine(), Recorder()
    ref_m.listener = ref
    leader = KVStateMachine()
    m = KVStateMachine()
    hub = WatchHub(m, queue_events_max=rng.choice([1, 3, 20]), catchup_revisions=rng.choice([1, 5, 50]))
    spans = [("/a", None, True), ("/a/1", None, False), ("/b/", None, True), ("/a/2", "/b/2", False),
             ("", None, True), ("\0", "\0", False)]
    watchers: list = []  # (watcher, span, start, filters, got)
    lag = 0  # commands m still misses; it then catches up by snapshot
    restores = 0
    for i, op in enumerate(ops):
        log = [op]
        if rng.random() < 0.01 and ref_m.rev > 250:
            at = ref_m.rev - rng.randrange(20, 250)
            if at > ref_m.compact_rev:
                log.insert(0, {"op": "compact", "revision": at})
        for cmd in log:
            ref_m.apply(cmd)
            leader.apply(cmd)
            if lag:
                lag -= 1
                if not lag:
                    m.restore(leader.snapshot())
                    restores += 1
            elif rng.random() < 0.02:
                lag = rng.randrange(1, 30)
            else:
                m.apply(cmd)
        if rng.random() < 0.05 and len(watchers) < 12:
            key, end, prefix = rng.choice(spans)
            start = rng.choice([0, rng.randrange(1, m.rev + 3)])
            filters = rng.choice([(), (), (NOPUT,), (NODELETE,)])
            w = hub.watch(key, end, prefix=prefix, start_revision=start, prev_kv=True, filters=filters)
            watchers.append((w, (key, end, prefix), start or m.rev + 1, filters, [], rng.choice([0.01, 0.5, 1])))
        for w, _, _, _, got, rate in watchers:
            if rng.random() < rate:
                try:
                    got.extend(await w.next(0))
                except WatchCanceled:
                    pass
    if lag:
        m.restore(leader.snapshot())
    assert m.digest() == leader.digest() and restores
    checked = canceled = 0
    for w, (key, end, prefix), start, filters, got, _ in watchers:
        cut = None  # the compaction point it was canceled at
        try:
            got.extend(await drain(w, m.rev))
            checked += 1
        except WatchCanceled as e:
            assert e.compact_revision > 0 and "compacted" in e.reason, e.reason
            canceled += 1
            cut = e.compact_revision
        lo = key.encode()
        hi = None if prefix else (end.encode() if end else None)

        def inside(k: str) -> bool:
            kb = k.encode()
            if prefix:
                return kb.startswith(lo)
            if end is None:
                return kb == lo
            return kb >= lo and (hi == b"\0" or kb < hi)

        expect = []
        for rev, events in ref.calls:
            if rev < start:
                continue
            for kind, k, rec, prev in sorted(events, key=lambda e: e[1]):
                if inside(k) and not (kind == "PUT" and NOPUT in filters) and not (
                        kind == "DELETE" and NODELETE in filters):
                    expect.append((rev, kind, k, rec[3], rec[0], rec[1], rec[2], rec[4],
                                   None if prev is None or not prev[1] else (prev[3], prev[0])))
        if cut is None:
            assert flat(got) == expect, (key, end, prefix, start, filters)
        else:  # canceled (its history was compacted): what it got before is right
            f = flat(got)
            assert f == expect[:len(f)]
    print(f"seed {seed}: {checked} complete, {canceled} compacted of {len(watchers)} watchers, {restores} restores, "
          f"hub {hub.stats}")
    assert checked >= len(watchers) // 3
