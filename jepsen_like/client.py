"""A Jepsen-style client role for the KV store's HTTP API, and the contended workload it runs.

What Jepsen's etcd test does, against Cellar's etcd-shaped JSON gateway (``store/kv_http.py``):
many concurrent sessions (logical processes) each run one operation at a time on a few keys,
drawn at random, with small values so that compare-and-set operations collide:

- ``read``: ``POST /v3/kv/range {key}`` (linearizable; never ``serializable``);
- ``write``: ``POST /v3/kv/put {key, value}``;
- ``cas``: ``POST /v3/kv/txn`` comparing the key's value with ``old`` (``old`` None: the key's
  version is 0, it does not exist), then putting ``new``. ``succeeded: false`` is a definite no:
  the op completes ``fail``.

Every invocation and completion is recorded as it happens (one asyncio loop, so the list order
is real-time order) in ``jepsen_like.history`` events with the ``KV`` model's conventions: the
value is ``(key, v)`` (``v`` is ``None`` on a read's invocation, what it read on completion,
``(old, new)`` for a cas). How an outcome is classified (``classify``):

============================================  =========================  ==================
what came back                                read                       write / cas
============================================  =========================  ==================
200                                           ``ok`` (the value read)    ``ok`` (cas: ``fail``
                                                                         when not succeeded)
503 with ``"definite": true`` (refused)       ``fail``                   ``fail``
503 ``definite: false``, other 5xx            ``fail``                   ``info``
a 4xx (the request was refused as invalid)    ``fail`` (counted apart)   ``fail`` (counted apart)
timeout, refused or lost connection           ``fail``                   ``info``
============================================  =========================  ==================

A read that fails changes nothing, so it is ``fail`` whatever happened. An ``info`` op may take
effect at any later time; as in Jepsen, its process is retired and the session goes on under a
new process number (``process + sessions``). A session whose node failed it (a connection error,
a timeout, a 503) moves to the next node for its next op.

Public interface:

- ``Outcome``; ``KVClient`` (what the workload drives: ``nodes``, ``read``, ``write``, ``cas``);
- ``HttpKV(urls, timeout_s=...)``: the HTTP client (an async context manager); ``readyz()``
  and ``sequencer()`` ask every replica's ``/readyz`` (view, sequencer, majority reachable);
- ``MemoryKV``: a linearizable in-memory stand-in (for tests of the harness itself), which
  can lose answers (``lost_rate``: the op is answered ``info``, applied or not, as chosen
  by ``lost_applied``);
  ``StaleReads``, ``DroppedCas`` and ``InfoAsFail``: deliberately broken wrappers, planted bugs the checker must
  find;
- ``Recorder``: the history being built; ``run_workload(client, recorder, ...)``,
  ``final_reads(client, recorder, keys)``, ``check_history(ops)`` (the ``KV`` model, per key);
- ``python -m jepsen_like.client --urls http://127.0.0.1:7200,... --seconds 10 --out h.jsonl``
  runs the workload against a running cluster (``cellar up`` prints the HTTP addresses) and
  checks it; ``cellar check --model kv h.jsonl`` checks the file again.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .history import FAIL, INFO, INVOKE, OK, Op

__all__ = [
    "DroppedCas",
    "HttpKV",
    "InfoAsFail",
    "KVClient",
    "MemoryKV",
    "Outcome",
    "Recorder",
    "StaleReads",
    "WorkloadStats",
    "check_history",
    "classify",
    "final_reads",
    "run_workload",
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one operation ended: ``type`` is ok, fail or info; ``value`` what a read returned."""

    type: str
    value: Any = None
    error: str | None = None
    move: bool = False  # the node failed us: try another one next time
    invalid: bool = False  # a 4xx: the client sent something the server refused (a harness bug)


def classify(f: str, status: int | None, body: Any, error: str | None = None) -> Outcome:
    """An HTTP answer (or ``status`` None: no answer, ``error`` says why) as an ``Outcome``.
    ``body`` is the decoded JSON answer (a dict) or None."""
    read = f == "read"
    if status is None:
        return Outcome(FAIL if read else INFO, error=error or "no answer", move=True)
    b = body if isinstance(body, dict) else {}
    if status == 200:
        if f == "cas":
            succeeded = b.get("succeeded")
            if succeeded is False:
                return Outcome(FAIL, error="compare failed")
            if succeeded is not True:  # an answer we cannot read: it may have happened
                return Outcome(INFO, error=f"200 without succeeded: {str(body)[:100]}", move=True)
        return Outcome(OK)
    reason = b.get("reason") or f"HTTP {status}"
    message = f"{status} {reason}: {str(b.get('message', ''))[:200]}"
    if status == 503:
        definite = b.get("definite") is True
        return Outcome(FAIL if (read or definite) else INFO, error=message, move=True)
    if 400 <= status < 500:
        return Outcome(FAIL, error=message, invalid=True)
    return Outcome(FAIL if read else INFO, error=message, move=True)


class KVClient:
    """What the workload drives. ``node`` picks the replica (``0 <= node < nodes``)."""

    nodes = 1

    async def read(self, key: str, node: int) -> Outcome:
        raise NotImplementedError

    async def write(self, key: str, value: str, node: int) -> Outcome:
        raise NotImplementedError

    async def cas(self, key: str, old: str | None, new: str, node: int) -> Outcome:
        raise NotImplementedError


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


class HttpKV(KVClient):
    """The etcd-shaped JSON gateway of every replica in ``urls`` (``http://host:port``)."""

    def __init__(self, urls: list[str], *, timeout_s: float = 5.0, connections: int = 256) -> None:
        if not urls:
            raise ValueError("HttpKV needs at least one URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.nodes = len(self.urls)
        self.timeout_s = timeout_s
        self.connections = connections
        self._session: Any = None

    async def __aenter__(self) -> HttpKV:
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.connections, force_close=False),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, f: str, node: int, path: str, body: dict) -> tuple[Outcome, dict | None]:
        import aiohttp

        try:
            async with self._session.post(self.urls[node] + path, data=json.dumps(body),
                                          headers={"Content-Type": "application/json"}) as r:
                text = await r.text()
                status = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OSError) as e:
            return classify(f, None, None, f"{type(e).__name__}: {e}"[:200]), None
        try:
            answer = json.loads(text) if text else None
        except ValueError:
            answer = None
        if status == 200 and not isinstance(answer, dict):
            # A 200 that is not the JSON we expect: we cannot tell what happened.
            return Outcome(FAIL if f == "read" else INFO, error=f"200 with a body that is not JSON: {text[:100]!r}",
                           move=True), None
        return classify(f, status, answer), answer

    async def read(self, key: str, node: int) -> Outcome:
        out, answer = await self._post("read", node, "/v3/kv/range", {"key": _b64(key)})
        if out.type != OK or answer is None:
            return out
        kvs = answer.get("kvs") or []
        if not kvs:
            return Outcome(OK, None)
        raw = kvs[0].get("value")
        return Outcome(OK, base64.b64decode(raw).decode() if raw else "")

    async def write(self, key: str, value: str, node: int) -> Outcome:
        out, _ = await self._post("write", node, "/v3/kv/put", {"key": _b64(key), "value": _b64(value)})
        return out

    async def cas(self, key: str, old: str | None, new: str, node: int) -> Outcome:
        if old is None:  # absent: its version is 0 (a VALUE compare on a missing key is false)
            compare = {"key": _b64(key), "target": "VERSION", "result": "EQUAL", "version": 0}
        else:
            compare = {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(old)}
        body = {"compare": [compare], "success": [{"request_put": {"key": _b64(key), "value": _b64(new)}}]}
        out, _ = await self._post("cas", node, "/v3/kv/txn", body)
        return out

    async def readyz(self) -> list[dict | None]:
        """Each replica's ``/readyz`` answer (``ready``, ``view``, ``sequencer``, ...; its HTTP
        status as ``status``), None for a replica that does not answer."""
        import aiohttp

        out: list[dict | None] = []
        for url in self.urls:
            try:
                async with self._session.get(url + "/readyz",
                                             timeout=aiohttp.ClientTimeout(total=min(2.0, self.timeout_s))) as r:
                    body = await r.json(content_type=None)
                    out.append({**body, "status": r.status} if isinstance(body, dict) else None)
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OSError, ValueError):
                out.append(None)
        return out

    async def sequencer(self) -> int | None:
        """The sequencer the replicas report on ``/readyz`` (the one seen in the highest view);
        None when no replica answers."""
        best: tuple[int, int] | None = None
        for body in await self.readyz():
            if body is None:
                continue
            view, seq = body.get("view"), body.get("sequencer")
            if isinstance(view, int) and isinstance(seq, int) and (best is None or view > best[0]):
                best = (view, seq)
        return None if best is None else best[1]


class MemoryKV(KVClient):
    """A linearizable in-memory store: each op takes effect at one instant between a random
    delay before and after (``delay_s`` at most each), so operations overlap like real ones."""

    def __init__(self, nodes: int = 3, delay_s: float = 0.002, seed: int = 0, lost_rate: float = 0.0,
                 lost_applied: float = 0.5) -> None:
        self.nodes = nodes
        self.delay_s = delay_s
        self.lost_rate = lost_rate  # writes and cas answered info ...
        self.lost_applied = lost_applied  # ... of which this fraction took effect anyway
        self.data: dict[str, str] = {}
        self.rng = random.Random(seed)
        self.lost = 0

    def _lost(self) -> bool | None:
        """None: answer normally; True/False: the answer is lost, and the op did/did not apply."""
        if self.lost_rate and self.rng.random() < self.lost_rate:
            self.lost += 1
            return self.rng.random() < self.lost_applied
        return None

    async def _pause(self) -> None:
        await asyncio.sleep(self.rng.random() * self.delay_s)

    async def read(self, key: str, node: int) -> Outcome:
        await self._pause()
        value = self.data.get(key)
        await self._pause()
        return Outcome(OK, value)

    async def write(self, key: str, value: str, node: int) -> Outcome:
        await self._pause()
        lost = self._lost()
        if lost is not False:
            self.data[key] = value
        await self._pause()
        return Outcome(OK) if lost is None else Outcome(INFO, error="timeout", move=True)

    async def cas(self, key: str, old: str | None, new: str, node: int) -> Outcome:
        await self._pause()
        lost = self._lost()
        hit = self.data.get(key) == old and lost is not False
        if hit:
            self.data[key] = new
        await self._pause()
        if lost is not None:
            return Outcome(INFO, error="timeout", move=True)
        return Outcome(OK) if hit else Outcome(FAIL, error="compare failed")


class _Wrapper(KVClient):
    def __init__(self, inner: KVClient) -> None:
        self.inner = inner
        self.nodes = inner.nodes
        self.lies = 0

    async def read(self, key: str, node: int) -> Outcome:
        return await self.inner.read(key, node)

    async def write(self, key: str, value: str, node: int) -> Outcome:
        return await self.inner.write(key, value, node)

    async def cas(self, key: str, old: str | None, new: str, node: int) -> Outcome:
        return await self.inner.cas(key, old, new, node)


class StaleReads(_Wrapper):
    """Planted bug: a read cache that is never invalidated. The first value read of a key is
    remembered, and every ``every``-th read after that answers it instead of the store's."""

    def __init__(self, inner: KVClient, every: int = 3) -> None:
        super().__init__(inner)
        self.every = every
        self.cache: dict[str, Any] = {}
        self.reads = 0

    async def read(self, key: str, node: int) -> Outcome:
        out = await self.inner.read(key, node)
        if out.type != OK:
            return out
        self.reads += 1
        if key not in self.cache:
            self.cache[key] = out.value
        elif self.reads % self.every == 0 and self.cache[key] != out.value:
            self.lies += 1
            return Outcome(OK, self.cache[key])
        return out


class DroppedCas(_Wrapper):
    """Planted bug: every ``every``-th cas is acknowledged (ok) without being sent."""

    def __init__(self, inner: KVClient, every: int = 4) -> None:
        super().__init__(inner)
        self.every = every
        self.calls = 0

    async def cas(self, key: str, old: str | None, new: str, node: int) -> Outcome:
        self.calls += 1
        if self.calls % self.every == 0:
            self.lies += 1
            await asyncio.sleep(0)
            return Outcome(OK)
        return await self.inner.cas(key, old, new, node)


class InfoAsFail(_Wrapper):
    """Planted bug: an indeterminate write or cas (a timeout, a lost connection) reported as a
    definite failure, as if it could not have taken effect."""

    async def write(self, key: str, value: str, node: int) -> Outcome:
        return self._definite(await self.inner.write(key, value, node))

    async def cas(self, key: str, old: str | None, new: str, node: int) -> Outcome:
        return self._definite(await self.inner.cas(key, old, new, node))

    def _definite(self, out: Outcome) -> Outcome:
        if out.type == INFO:
            self.lies += 1
            return Outcome(FAIL, error=out.error, move=out.move)
        return out


class Recorder:
    """The history, built as events happen. ``time`` is seconds since the recorder started."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t0 = time.monotonic()
        self._waiting: list[tuple[Any, asyncio.Future]] = []
        self._pending: dict[Any, Op] = {}  # process -> its invocation not yet completed

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    def invoke(self, process: int, f: str, value: Any) -> None:
        op = Op(len(self.ops), self.now(), process, INVOKE, f, value)
        self.ops.append(op)
        self._pending[process] = op

    def complete(self, process: int, type_: str, f: str, value: Any, error: str | None = None) -> None:
        op = Op(len(self.ops), self.now(), process, type_, f, value, error)
        self.ops.append(op)
        invoked = self._pending.pop(process, None)
        if self._waiting and invoked is not None:
            for entry in list(self._waiting):
                pred, fut = entry
                if not fut.done() and pred(invoked, op):
                    fut.set_result(op)
                    self._waiting.remove(entry)

    async def until(self, pred: Any, timeout_s: float) -> Op:
        """The next completion with ``pred(invocation, completion)`` true
        (``asyncio.TimeoutError`` after ``timeout_s``)."""
        fut = asyncio.get_running_loop().create_future()
        entry = (pred, fut)
        self._waiting.append(entry)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            if entry in self._waiting:
                self._waiting.remove(entry)

    def nemesis(self, f: str, value: Any = None) -> float:
        """A fault event (``process "nemesis"``, type info); the checker skips it. Its time."""
        t = self.now()
        self.ops.append(Op(len(self.ops), t, "nemesis", INFO, f, value))
        return t


@dataclass
class WorkloadStats:
    counts: Counter = field(default_factory=Counter)  # (f, type) -> n
    invalid: list[str] = field(default_factory=list)  # 4xx answers: the harness sent a bad request
    errors: Counter = field(default_factory=Counter)  # error text (first 60 chars) -> n
    seconds: float = 0.0
    processes: int = 0

    def n(self, f: str | None = None, type_: str | None = None) -> int:
        return sum(v for (ff, tt), v in self.counts.items()
                   if (f is None or ff == f) and (type_ is None or tt == type_))

    def summary(self) -> str:
        parts = []
        other = sorted({f for f, _t in self.counts} - {"read", "write", "cas"})  # the scheduler's
        for f in (["read", "write", "cas"] if not other else [f for f in ("read",) if self.n(f)] + other):
            c = {t: self.counts.get((f, t), 0) for t in (OK, FAIL, INFO)}
            parts.append(f"{f} {c[OK]} ok / {c[FAIL]} fail / {c[INFO]} info")
        return f"{self.n()} ops in {self.seconds:.1f} s ({', '.join(parts)})"


KEY_PREFIX = "/jepsen/"


def key_name(i: int) -> str:
    return f"{KEY_PREFIX}{i}"


async def run_workload(client: KVClient, recorder: Recorder, *, sessions: int = 16, keys: int = 5,
                       values: int = 5, seconds: float = 10.0, ops_per_session: int | None = None,
                       mix: tuple[float, float, float] = (0.4, 0.2, 0.4), seed: int = 1,
                       stop: asyncio.Event | None = None, pause_s: float = 0.0) -> WorkloadStats:
    """``sessions`` closed-loop sessions for ``seconds`` (or ``ops_per_session`` ops each, or until
    ``stop`` is set, whichever comes first), each op on a random one of ``keys`` keys: read,
    write or cas in proportions ``mix``, values drawn from ``0 .. values-1`` (as strings).
    ``pause_s``: a random pause up to this long between a session's ops (Jepsen's stagger).
    Every loop ends by itself: an op takes at most the client's own timeout."""
    stats = WorkloadStats(processes=sessions)
    deadline = time.monotonic() + seconds
    t_start = time.monotonic()
    counter = [0]

    async def session(idx: int) -> None:
        rng = random.Random(seed * 1_000_003 + idx)
        process = idx
        node = idx % client.nodes
        done = 0
        while time.monotonic() < deadline and (stop is None or not stop.is_set()):
            if ops_per_session is not None and done >= ops_per_session:
                break
            done += 1
            key = key_name(rng.randrange(keys))
            r = rng.random()
            f = "read" if r < mix[0] else "write" if r < mix[0] + mix[1] else "cas"
            if f == "read":
                recorder.invoke(process, f, (key, None))
                out = await client.read(key, node)
                value = (key, out.value if out.type == OK else None)
            elif f == "write":
                v = str(rng.randrange(values))
                value = (key, v)
                recorder.invoke(process, f, value)
                out = await client.write(key, v, node)
            else:
                old, new = str(rng.randrange(values)), str(rng.randrange(values))
                value = (key, (old, new))
                recorder.invoke(process, f, value)
                out = await client.cas(key, old, new, node)
            recorder.complete(process, out.type, f, value, out.error)
            stats.counts[(f, out.type)] += 1
            counter[0] += 1
            if out.invalid:
                stats.invalid.append(f"{f} {value}: {out.error}")
            if out.error and out.error != "compare failed":
                stats.errors[out.error[:60]] += 1
            if out.type == INFO:
                process += sessions  # retired: its op may still take effect
                stats.processes += 1
            if out.move:
                node = (node + 1) % client.nodes
            if pause_s:
                await asyncio.sleep(rng.random() * pause_s)
            elif counter[0] % 64 == 0:
                await asyncio.sleep(0)  # a client that never waits (in-memory) still lets others run

    await asyncio.gather(*(session(i) for i in range(sessions)))
    stats.seconds = time.monotonic() - t_start
    return stats


async def final_reads(client: KVClient, recorder: Recorder, keys: int, *, process: int,
                      attempts: int = 20, retry_s: float = 0.25) -> dict[str, dict[int, Any]]:
    """Read every key on every node (one process per node, so the reads are sequential per node
    and in the history); a failed read is retried, bounded. Returns key -> node -> value."""
    seen: dict[str, dict[int, Any]] = {}

    async def on(node: int) -> None:
        p = process + node
        for i in range(keys):
            key = key_name(i)
            for _ in range(attempts):
                recorder.invoke(p, "read", (key, None))
                out = await client.read(key, node)
                recorder.complete(p, out.type, "read", (key, out.value if out.type == OK else None), out.error)
                if out.type == OK:
                    seen.setdefault(key, {})[node] = out.value
                    break
                await asyncio.sleep(retry_s)

    await asyncio.gather(*(on(n) for n in range(client.nodes)))
    return seen


def check_history(ops: list[Op], *, timeout_s: float = 60.0) -> Any:
    """The history checked against the ``KV`` model, each key on its own (``CheckResult``)."""
    from .checker import check
    from .models import KV

    return check(ops, KV(), timeout_s=timeout_s)


def describe(result: Any) -> str:
    """One paragraph: the verdict, and the violation's operations if there is one."""
    from .models import KV

    verdict = {True: "linearizable", False: "NOT linearizable"}.get(result.valid, "unknown")
    lines = [f"{verdict}: {result.ops} operations, {result.partitions} key(s), {result.seconds:.2f} s"]
    v = result.violation
    if v is not None:
        model = KV().for_partition(v.key)
        lines.append(f"violation on key {v.key!r}: {v.reason or ''}")
        for o in v.involved:
            lines.append(f"  {model.describe_op(o)}  [{o.type}, process {o.process}, index {o.invoke.index}]")
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .history import write_jsonl

    p = argparse.ArgumentParser(prog="python -m jepsen_like.client",
                                description="Run the contended KV workload against running replicas' HTTP API "
                                            "and check the history for linearizability.")
    p.add_argument("--urls", required=True, help="http://HOST:PORT,... (the replicas' --http addresses)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--keys", type=int, default=5)
    p.add_argument("--values", type=int, default=5)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP request")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the history here (JSON Lines; cellar check --model kv FILE)")
    a = p.parse_args(argv)
    urls = [u if u.startswith("http") else f"http://{u}" for u in a.urls.split(",") if u.strip()]

    async def go() -> tuple[Recorder, WorkloadStats]:
        rec = Recorder()
        async with HttpKV(urls, timeout_s=a.timeout) as client:
            stats = await run_workload(client, rec, sessions=a.sessions, keys=a.keys, values=a.values,
                                       seconds=a.seconds, seed=a.seed)
            await final_reads(client, rec, a.keys, process=10_000_000)
        return rec, stats

    rec, stats = asyncio.run(go())
    print(stats.summary())
    if a.out:
        with open(a.out, "w") as fp:
            write_jsonl(rec.ops, fp)
        print(f"history written to {a.out}")
    result = check_history(rec.ops)
    print(describe(result))
    return {True: 0, False: 1}.get(result.valid, 2)


if __name__ == "__main__":
    sys.exit(main())
