"""Watch on 3 real ``cellar serve --http`` replicas: a watcher on a replica that is not
the sequencer sees every put, delete, txn, prefix delete and lease revoke made through
another replica, in revision order, with the revisions the writes were answered with;
history from a past revision then live, identical on every replica; ``cellar kv
watch`` as a subprocess (text, --json, --count, --timeout, a compacted revision as one
line and exit 1), resuming on another replica when its replica is killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import aiohttp
import pytest

from store.server import LocalCluster

WAIT_S = 20.0


# One worker for the whole module under xdist: the module-scoped cluster below then starts
# once (split across workers, each started its own).
pytestmark = pytest.mark.xdist_group("kv-watch-cluster")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("kvwatch")), 3, http=True)
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

    async def post(self, node: int, path: str, body: dict) -> tuple[int, dict]:
        async with self.session.post(self.urls[node] + path + "?encoding=text", json=body) as r:
            return r.status, await r.json()

    async def ok(self, node: int, path: str, body: dict) -> dict:
        for _ in range(100):  # the first write may wait for the first view to settle
            status, answer = await self.post(node, path, body)
            if status != 503:
                break
            await asyncio.sleep(0.1)
        assert status == 200, (path, body, status, answer)
        return answer

    async def sequencer(self) -> int:
        async with self.session.get(self.urls[0] + "/readyz") as r:
            return (await r.json())["sequencer"]

    async def watch(self, node: int, create: dict) -> "Stream":
        resp = await self.session.post(self.urls[node] + "/v3/watch?encoding=text", json={"create_request": create})
        assert resp.status == 200, await resp.text()
        s = Stream(resp)
        assert (await s.next())["created"] is True
        return s


class Stream:
    def __init__(self, resp) -> None:
        self.resp = resp

    async def next(self) -> dict:
        line = await asyncio.wait_for(self.resp.content.readline(), WAIT_S)
        assert line, "the stream ended"
        return json.loads(line)["result"]

    async def until(self, rev: int) -> list:
        """(revision, type, key, value) of every event up to revision ``rev``."""
        out = []
        last = 0
        while last < rev:
            msg = await self.next()
            assert not msg.get("canceled"), msg
            if "events" in msg:
                r = msg["header"]["revision"]
                assert r > last, (r, last)  # increasing, one message per revision
                last = r
                out += [(r, e["type"], e["kv"]["key"], e["kv"].get("value")) for e in msg["events"]]
        return out


@pytest.fixture
async def api(cluster):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        a = API(s, cluster)
        await a.ok(0, "/v3/kv/put", {"key": "probe", "value": "ok"})
        yield a


async def test_a_watcher_on_a_non_sequencer_sees_every_write_in_revision_order(api):
    seq = await api.sequencer()
    watcher_node = next(i for i in range(3) if i != seq)
    writer_node = next(i for i in range(3) if i not in (seq, watcher_node))  # the third replica
    live = await api.watch(watcher_node, {"key": "/w3/", "prefix": True, "prev_kv": True})
    expect = []

    async def write(path: str, body: dict, events: list) -> int:
        r = await api.ok(writer_node, path, body)
        rev = r["header"]["revision"]
        expect.extend((rev, *e) for e in events)
        return rev

    first = await write("/v3/kv/put", {"key": "/w3/a", "value": "1"}, [("PUT", "/w3/a", "1")])
    await write("/v3/kv/put", {"key": "/w3/b", "value": "2"}, [("PUT", "/w3/b", "2")])
    await api.ok(writer_node, "/v3/kv/put", {"key": "/other", "value": "x"})  # not in the prefix
    await write("/v3/kv/put", {"key": "/w3/a", "value": "3"}, [("PUT", "/w3/a", "3")])
    await write("/v3/kv/txn", {"compare": [{"key": "/w3/a", "target": "VALUE", "result": "EQUAL", "value": "3"}],
                               "success": [{"request_put": {"key": "/w3/c", "value": "4"}},
                                           {"request_delete_range": {"key": "/w3/b"}},
                                           {"request_put": {"key": "/w3/a", "value": "5"}}]},
                [("PUT", "/w3/a", "5"), ("DELETE", "/w3/b", None), ("PUT", "/w3/c", "4")])
    lease = (await api.ok(seq, "/v3/lease/grant", {"TTL": 60}))["ID"]
    await write("/v3/kv/put", {"key": "/w3/l", "value": "6", "lease": lease}, [("PUT", "/w3/l", "6")])
    await write("/v3/lease/revoke", {"ID": lease}, [("DELETE", "/w3/l", None)])
    last = await write("/v3/kv/deleterange", {"key": "/w3/", "prefix": True},
                       [("DELETE", "/w3/a", None), ("DELETE", "/w3/c", None)])
    got = await live.until(last)
    assert got == expect
    # from history on every replica (the sequencer too): the same events, then live ones
    for node in range(3):
        h = await api.watch(node, {"key": "/w3/", "prefix": True, "start_revision": first})
        assert await h.until(last) == expect
        h.resp.close()
    more = await write("/v3/kv/put", {"key": "/w3/z", "value": "7"}, [("PUT", "/w3/z", "7")])
    assert await live.until(more) == [expect[-1]]
    live.resp.close()


async def cli(*args: str, env_endpoints: str, timeout: float = 30.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "store.cli", "kv", "watch", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ, CELLAR_HTTP_ENDPOINTS=env_endpoints))
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, out.decode(), err.decode()


def http(cluster: LocalCluster, *nodes: int) -> str:
    return ",".join(f"127.0.0.1:{cluster.http_ports[i]}" for i in nodes)


async def test_cli_watch(api, cluster):
    seq = await api.sequencer()
    node = next(i for i in range(3) if i != seq)
    start = (await api.ok(seq, "/v3/kv/put", {"key": "/cli/a", "value": "1"}))["header"]["revision"]
    await api.ok(seq, "/v3/kv/put", {"key": "/cli/a", "value": "2"})
    await api.ok(seq, "/v3/kv/deleterange", {"key": "/cli/a"})
    # text, from history, with prev kv
    code, out, err = await cli("/cli/", "--prefix", "--rev", str(start), "--count", "3", "--prev-kv",
                               env_endpoints=http(cluster, node))
    assert code == 0 and err == "", err
    assert out.splitlines() == ["PUT", "/cli/a", "1", "PUT", "/cli/a", "1", "/cli/a", "2",
                                "DELETE", "/cli/a", "2", "/cli/a"]
    # --json, live: started before the writes (from the next revision, so nothing races)
    now = (await api.ok(seq, "/v3/kv/put", {"key": "/cli/x", "value": "0"}))["header"]["revision"]
    task = asyncio.ensure_future(cli("/cli/b", "--json", "--rev", str(now + 1), "--count", "2",
                                     env_endpoints=http(cluster, node)))
    r1 = (await api.ok(seq, "/v3/kv/put", {"key": "/cli/b", "value": "v1"}))["header"]["revision"]
    r2 = (await api.ok(seq, "/v3/kv/deleterange", {"key": "/cli/b"}))["header"]["revision"]
    code, out, err = await task
    assert code == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [(x["revision"], x["type"], x["kv"]["key"]) for x in lines] == [(r1, "PUT", "/cli/b"),
                                                                         (r2, "DELETE", "/cli/b")]
    assert lines[0]["kv"]["value"] == "v1"
    # --timeout with nothing to print: exit 0
    t0 = time.monotonic()
    code, out, err = await cli("/cli/nothing", "--timeout", "0.5", env_endpoints=http(cluster, node))
    assert (code, out, err) == (0, "", "") and time.monotonic() - t0 < 15
    # a compacted revision: one line, exit 1
    await api.ok(seq, "/v3/kv/compaction", {"revision": r1})
    code, out, err = await cli("/cli/", "--prefix", "--rev", str(start), env_endpoints=http(cluster, node))
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1 and "compacted" in err
    assert "Traceback" not in err


async def test_cli_watch_resumes_on_another_replica_when_its_replica_dies(api, cluster):
    seq = await api.sequencer()
    victim = next(i for i in range(3) if i != seq)
    other = next(i for i in range(3) if i not in (seq, victim))
    now = (await api.ok(seq, "/v3/kv/put", {"key": "/fo/0", "value": "0"}))["header"]["revision"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "store.cli", "kv", "watch", "/fo/", "--prefix", "--json", "--rev", str(now + 1),
        "--count", "10", "--endpoints", http(cluster, victim, other),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        revs, seen = [], []
        for i in range(5):
            revs.append((await api.ok(seq, "/v3/kv/put", {"key": f"/fo/{i}", "value": str(i)}))["header"]["revision"])
        for _ in range(5):  # printed from the victim's stream
            seen.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), WAIT_S))["revision"])
        os.kill(cluster.procs[victim].pid, signal.SIGKILL)
        cluster.procs[victim].wait(timeout=10)
        for i in range(5, 10):
            revs.append((await api.ok(seq, "/v3/kv/put", {"key": f"/fo/{i}", "value": str(i)}))["header"]["revision"])
        out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
        assert proc.returncode == 0, err
        seen += [json.loads(x)["revision"] for x in out.decode().splitlines()]
        assert seen == revs  # no gap, no duplicate across the move
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        cluster.start(victim)
        await cluster.await_ready(victim)


async def test_a_follower_watch_goes_on_across_a_sequencer_failover(api, cluster):
    """The sequencer is SIGKILLed under a watch on a follower: the watcher keeps its
    stream, gets every acknowledged write in revision order, and its stream equals the
    history another replica serves for the same revisions."""
    seq = await api.sequencer()
    watcher_node = next(i for i in range(3) if i != seq)
    writer_node = next(i for i in range(3) if i not in (seq, watcher_node))
    start = (await api.ok(writer_node, "/v3/kv/put", {"key": "/fa/start", "value": "s"}))["header"]["revision"]
    live = await api.watch(watcher_node, {"key": "/fa/", "prefix": True, "start_revision": start})
    acked = [start]
    for i in range(5):
        acked.append((await api.ok(writer_node, "/v3/kv/put", {"key": f"/fa/{i}", "value": str(i)}))["header"]["revision"])
    os.kill(cluster.procs[seq].pid, signal.SIGKILL)
    cluster.procs[seq].wait(timeout=10)
    try:
        for i in range(5, 10):  # api.ok retries while the new view forms (a retry may apply twice)
            acked.append((await api.ok(writer_node, "/v3/kv/put",
                                       {"key": f"/fa/{i}", "value": str(i)}))["header"]["revision"])
        got = await live.until(acked[-1])
        revs = [e[0] for e in got]
        assert revs == sorted(set(revs)) and set(acked) <= set(revs)
        again = await api.watch(writer_node, {"key": "/fa/", "prefix": True, "start_revision": start})
        assert await again.until(acked[-1]) == got
        again.resp.close()
        live.resp.close()
    finally:
        cluster.start(seq)
        await cluster.await_ready(seq)


async def test_a_watcher_on_a_replica_that_catches_up_by_snapshot_misses_nothing(tmp_path):
    """A follower with an open watch is paused (SIGSTOP) while the others write past
    several snapshots and drop their logs; resumed, it catches up (usually by
    installing a snapshot: its revision jumps) and the watcher still gets every
    revision once, in order."""
    from store.client import CellarClient

    c = LocalCluster(str(tmp_path / "snap"), 3, http=True, extra_args=["--snapshot-every", "40"])
    c.start_all()
    try:
        c.wait_ready()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            api = API(session, c)
            await api.ok(0, "/v3/kv/put", {"key": "probe", "value": "ok"})
            seq = await api.sequencer()
            lagger = next(i for i in range(3) if i != seq)
            writer = seq
            start = (await api.ok(writer, "/v3/kv/put", {"key": "/s/start", "value": "0"}))["header"]["revision"]
            s = await api.watch(lagger, {"key": "/s/", "prefix": True, "start_revision": start})
            assert [e[0] for e in await s.until(start)] == [start]
            async with CellarClient(c.client_addresses, timeout_s=2.0, deadline_s=20.0) as cellar:
                paused_at = (await cellar.status(lagger))["exec_slot"]
                os.kill(c.procs[lagger].pid, signal.SIGSTOP)
                try:
                    # Write until both others compacted past the lagger's point (snapshots are
                    # stored asynchronously: how many writes that takes depends on the load).
                    revs = [start]
                    i = 0
                    while i < 3000:  # bounded
                        for _ in range(100):
                            r = await api.ok(writer, "/v3/kv/put", {"key": f"/s/{i % 17}", "value": str(i)})
                            revs.append(r["header"]["revision"])
                            i += 1
                        floors = [(await cellar.status(j))["floor_slot"] for j in range(3) if j != lagger]
                        if i >= 400 and min(floors) > paused_at:
                            break
                    assert min(floors) > paused_at, f"the others did not compact past slot {paused_at}: {floors}"
                finally:
                    os.kill(c.procs[lagger].pid, signal.SIGCONT)
                got = await s.until(revs[-1])
                assert [e[0] for e in got] == revs[1:]  # every revision once, in order
                st = await cellar.status(lagger)
            s.resp.close()
        # Usually the resumed replica installs a peer's snapshot (its revision jumps).
        # It may instead find the whole backlog still in its sockets' kernel buffers
        # and catch up from those messages; either way the watcher saw every revision
        # once. The jump itself is covered deterministically at the hub level
        # (test_kv_watch.py: restore jumps, and the randomized check with a replica
        # that catches up by snapshot).
        assert st["stats"]["snapshots_installed"] >= 1 or st["exec_slot"] > paused_at, st["stats"]
    finally:
        c.stop_all()


async def test_cli_watch_usage_and_unreachable_endpoints():
    from store.server import free_ports

    code, out, err = await cli("--help", env_endpoints="127.0.0.1:1")
    assert code == 0 and "--count" in out and "--rev" in out and "--prev-kv" in out
    code, out, err = await cli("/k", "--prefix", "--range-end", "/l", env_endpoints="127.0.0.1:1")
    assert code == 2 and "not both" in err
    code, out, err = await cli("/k", "--endpoints", "nonsense", env_endpoints="127.0.0.1:1")
    assert code == 2 and "HOST:PORT" in err
    dead = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    code, out, err = await cli("/k", "--timeout", "20", env_endpoints=dead)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1 and "no replica serves the watch" in err
    assert "Traceback" not in err
