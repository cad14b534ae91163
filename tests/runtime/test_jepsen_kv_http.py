"""Issue 12, acceptance 3: a contended KV workload with CAS (a txn) through the HTTP API of three
real ``cellar serve --http`` replicas, recorded as a Jepsen history and checked linearizable per
key, across a SIGKILL of the sequencer and its restart (``jepsen_like/client.py``).

Timeline (every wait bounded; the nemesis waits for events, not for fixed times, except the
schedule itself): the load runs; after ``KILL_AT_S`` the sequencer (asked of the replicas'
``/readyz``) is SIGKILLed; once the survivors acknowledge a write or cas again, and ``DOWN_S``
later, it is restarted; once it answers a linearizable read again the load runs ``AFTER_S``
more and stops (``-m slow``: three such cycles, with a short client timeout). The
replicas then converge, every key is read on every replica, and the whole history is checked.
Last, a short history through a deliberately broken client (stale reads) on the same cluster
must be found not linearizable: the check can fail.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import store
from jepsen_like.client import HttpKV, Recorder, StaleReads, check_history, describe, final_reads, run_workload
from jepsen_like.history import FAIL, OK, write_jsonl
from store.client import CellarClient

from .conftest import converged

SESSIONS = 24
KEYS = 5
KILL_AT_S = 4.0  # load before the fault
DOWN_S = 2.0  # at least this long on two replicas, once they acknowledge writes again
AFTER_S = 2.5  # load after the restarted replica serves again
LOAD_MAX_S = 30.0  # the load's own deadline, should the nemesis never finish
FINAL = 50_000_000  # process numbers of the final reads


async def _first_commit(client: HttpKV, timeout_s: float = 20.0) -> None:
    """A put acknowledged through HTTP (the first view may still be settling)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = await client.write("/jepsen/probe", "ok", 0)
        if last.type == OK:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no write acknowledged within {timeout_s} s: {last}")


async def _agreed_sequencer(client: HttpKV, timeout_s: float = 20.0) -> int:
    """The sequencer, once every replica is ready and names the same one in the same view."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await client.readyz()
        views = {(b["view"], b["sequencer"]) for b in seen if b is not None and b.get("ready")}
        if len(views) == 1 and all(b is not None and b.get("ready") for b in seen):
            (_, seq), = views
            return seq
        assert time.monotonic() < deadline, f"the replicas do not agree on a sequencer: {seen}"
        await asyncio.sleep(0.1)


def _mutation_after(t: float):
    """A write or cas invoked after ``t`` and acknowledged."""
    return lambda inv, comp: comp.type == OK and comp.f in ("write", "cas") and inv.time > t


async def _run(cluster, tmp_path, *, cycles: int, sessions: int, timeout_s: float, seed: int) -> dict:
    """The load with ``cycles`` sequencer SIGKILL + restart cycles; the recorded history,
    the load's stats, each cycle's events, the final reads and statuses."""
    cluster.start_all()
    await cluster.await_ready()
    urls = [f"http://127.0.0.1:{p}" for p in cluster.http_ports]
    rec = Recorder()
    cycles_seen: list[dict] = []
    stop = asyncio.Event()
    async with HttpKV(urls, timeout_s=timeout_s) as client:
        await _first_commit(client)

        async def nemesis() -> None:
            try:
                for _ in range(cycles):
                    await asyncio.sleep(KILL_AT_S if not cycles_seen else 0.0)
                    seq = await _agreed_sequencer(client)
                    ev: dict = {"killed": seq}
                    cycles_seen.append(ev)
                    ev["kill"] = rec.nemesis("kill", seq)
                    cluster.kill(seq)  # SIGKILL
                    # The survivors choose a new sequencer and acknowledge new writes.
                    await rec.until(_mutation_after(ev["kill"]), 20.0)
                    ev["resumed"] = rec.now()
                    await asyncio.sleep(DOWN_S)
                    cluster.start(seq)
                    await cluster.await_ready(seq)
                    ev["restart"] = rec.nemesis("start", seq)
                    # The restarted replica serves a linearizable read again (it rejoined).
                    deadline = time.monotonic() + 20.0
                    while (await client.read("/jepsen/probe", seq)).type != OK:
                        assert time.monotonic() < deadline, "the restarted replica never served a read"
                        await asyncio.sleep(0.1)
                    ev["rejoined"] = rec.now()
                    await asyncio.sleep(AFTER_S)
            finally:
                stop.set()

        nem = asyncio.create_task(nemesis())
        stats = await run_workload(client, rec, sessions=sessions, keys=KEYS, values=5,
                                   seconds=LOAD_MAX_S * cycles, stop=stop, seed=seed)
        await nem
        async with CellarClient(cluster.client_addresses, timeout_s=2.0) as cellar:
            statuses = await converged(cellar, [0, 1, 2], timeout_s=20.0)
        seen = await final_reads(client, rec, KEYS, process=FINAL)
        new_seq = await client.sequencer()
    with open(tmp_path / "history.jsonl", "w") as fp:  # cellar check --model kv FILE --report out.html
        write_jsonl(rec.ops, fp)
    print(f"\n{stats.summary()}")
    print(f"cycles {cycles_seen}; sequencer now {new_seq}; errors {dict(stats.errors.most_common(4))}")
    t0 = time.monotonic()
    result = check_history(rec.ops, timeout_s=60.0)
    print(describe(result), f"(checked in {time.monotonic() - t0:.1f} s; history in {tmp_path / 'history.jsonl'})")
    return {"rec": rec, "stats": stats, "cycles": cycles_seen, "statuses": statuses, "seen": seen,
            "result": result, "urls": urls}


def _acknowledged(rec: Recorder, cycles: list[dict]) -> tuple[int, int]:
    """Writes and cas invoked after a kill and answered ok before the restart; and invoked
    after the last rejoin and answered ok."""
    invoked: dict = {}
    down = after = 0
    for op in rec.ops:
        if op.type == "invoke":
            invoked[op.process] = op.time
        elif op.type == OK and op.f in ("write", "cas") and op.process < FINAL:
            t = invoked[op.process]
            down += any(c["kill"] < t and op.time < c["restart"] for c in cycles)
            after += t > cycles[-1]["rejoined"]
    return down, after


def _assert_common(run: dict) -> None:
    result, stats, seen = run["result"], run["stats"], run["seen"]
    assert result.valid is True, describe(result)
    assert not stats.invalid, stats.invalid[:5]  # the harness never sent a request the server refused
    # Contention really happened: compare-and-set both won and lost.
    assert stats.n("cas", OK) > 0 and stats.n("cas", FAIL) > 0, stats.summary()
    assert stats.n("read", OK) > 0 and stats.n("write", OK) > 0, stats.summary()
    down, after = _acknowledged(run["rec"], run["cycles"])
    print(f"writes and cas acknowledged: {down} invoked and answered while a sequencer was down, "
          f"{after} after the last rejoin")
    assert down > 0, "nothing acknowledged while the sequencer was down"
    assert after > 0, "nothing acknowledged after the restart"
    # Every key read on every replica, and they agree (the checker also placed each read).
    assert all(len(seen.get(f"/jepsen/{i}", {})) == 3 for i in range(KEYS)), seen
    assert all(len(set(by_node.values())) == 1 for by_node in seen.values()), seen
    assert len({s["digest"] for s in run["statuses"]}) == 1


@pytest.mark.slow  # test_jepsen_run.py runs the same workload under kills in the default suite
async def test_contended_kv_through_http_is_linearizable_across_sequencer_kill(make_cluster, tmp_path):
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert os.path.dirname(os.path.abspath(store.__file__)) == os.path.join(here, "store")  # this tree's code
    run = await _run(make_cluster(3, http=True), tmp_path, cycles=1, sessions=SESSIONS, timeout_s=5.0, seed=12)
    _assert_common(run)
    # The same check finds a planted bug in a short history from the same cluster: a client
    # whose read cache is never invalidated (jepsen_like.client.StaleReads).
    rec2 = Recorder()
    async with HttpKV(run["urls"], timeout_s=5.0) as client:
        broken = StaleReads(client, every=2)
        await run_workload(broken, rec2, sessions=8, keys=2, values=5, seconds=1.5, seed=3)
    bad = check_history(rec2.ops, timeout_s=30.0)
    assert broken.lies > 0 and bad.valid is False, (broken.lies, describe(bad))


@pytest.mark.slow
async def test_three_sequencer_kills_with_short_client_timeouts(make_cluster, tmp_path):
    """Longer and harsher (``-m slow``): three SIGKILL + restart cycles, 32 sessions, a 1 s
    client timeout, so that many writes end indeterminate (``info``)."""
    run = await _run(make_cluster(3, http=True), tmp_path, cycles=3, sessions=32, timeout_s=1.0, seed=99)
    _assert_common(run)
    assert len(run["cycles"]) == 3
