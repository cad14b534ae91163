"""``cellar bench --machine scheduler``: allocations and releases per second through the
replicated scheduler, over HTTP and embedded, beside the state machine alone.

One run measures, on the same generated HiveD cluster (``--nodes`` 8-GPU nodes, 16 to a
rack, shared by ``--vcs`` VCs: ``scheduler_state.bench.generate_config``; 1,024 nodes =
8,192 GPUs by default; the config is generated in code and written to the run's temp
folder, nothing large ships in the repo):

1. **machine**: ``SchedulerStateMachine.apply`` alone in this process
   (``scheduler_state.bench.run``, the figures of ``cellar scheduler bench``);
2. **embedded**: replica 0 runs inside this process (``store.embed.EmbeddedScheduler``,
   the sequencer), replicas 1 and 2 are ``cellar serve --machine scheduler``
   processes; ``--clients`` concurrent callers in this event loop call ``allocate`` /
   ``release`` on the embedded replica, as a scheduler front-end would;
3. **http**: ``--replicas`` ``cellar serve --machine scheduler --http`` processes;
   ``--clients`` concurrent HTTP/1.1 keep-alive connections from this process, spread
   round-robin over the replicas, ``POST /v1/groups`` / ``DELETE /v1/groups/{name}``.

The workload is the state-machine benchmark's: group sizes of 1..64 GPUs (up to 8 GPUs
one pod, larger ones gangs of 8-GPU pods), 10% opportunistic, priorities 0..9 (so
preemption happens), ``"wait": false`` (a group that does not fit is answered 409, not
queued); a client allocates a new group while fewer than the live target (60% of the
GPUs) are placed, else releases a random placed one. Each operation is one command
through the log, answered once applied and durable (``--fsync``, default batch).

Figures per mode: operations (allocate + release commands answered) per second, of
which allocations placed per second, p50 / p99 / max latency of one operation as its
caller sees it, errors; and the throughput ratio of each replicated mode to the machine
alone (the replication cost). On a shared 2-core machine every process competes for
the same cores (the load generator included), so absolute figures move with the
machine's load, which is reported (``load_avg``).

Only processes this command started are stopped, by their PIDs (SIGTERM, then SIGKILL
after 10 s). A failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import quote

from bench.proc import self_cpu_s, tree_cpu_s

GPUS_PER_NODE = 8
SIZES_GPU = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
READY_TIMEOUT_S = 60.0
OP_TIMEOUT_S = 10.0
MODES = ("machine", "embedded", "http", "http-batch")
HTTP_BATCH = 8  # operations per request in the http-batch mode (POST /v1/batch)


class BenchError(Exception):
    """The benchmark cannot go on; the message is one line."""


# --- the workload ----------------------------------------------------------------------


class Workload:
    """The shared, seeded command stream of every client of one mode."""

    def __init__(self, nodes: int, vcs: int, seed: int, utilization: float = 0.6, prefix: str = "g") -> None:
        self.rng = random.Random(seed)
        self.vcs = vcs
        mean = sum(SIZES_GPU) / len(SIZES_GPU)
        self.live_target = max(1, int(nodes * GPUS_PER_NODE * utilization / mean))
        self.live: list[str] = []
        self.pos: dict[str, int] = {}
        self.prefix = prefix
        self.counter = 0

    def next_op(self) -> tuple[str, Any]:
        rng = self.rng
        if not self.live or (len(self.live) < self.live_target and rng.random() < 0.55):
            self.counter += 1
            name = f"{self.prefix}{self.counter}"
            gpus = rng.choice(SIZES_GPU)
            members = [{"podNumber": 1, "leafCellNumber": gpus}] if gpus <= GPUS_PER_NODE else \
                [{"podNumber": gpus // GPUS_PER_NODE, "leafCellNumber": GPUS_PER_NODE}]
            return "allocate", {"virtualCluster": f"vc{rng.randrange(self.vcs)}",
                                "priority": -1 if rng.random() < 0.1 else rng.randrange(10),
                                "leafCellType": "GPU", "affinityGroup": {"name": name, "members": members}}
        name = self.live[rng.randrange(len(self.live))]
        self.remove(name)  # no other client releases it meanwhile
        return "release", name

    def add(self, name: str) -> None:
        self.pos[name] = len(self.live)
        self.live.append(name)

    def remove(self, name: str) -> None:
        i = self.pos.pop(name, None)
        if i is None:
            return
        last = self.live.pop()
        if i < len(self.live):
            self.live[i] = last
            self.pos[last] = i


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    ops: int = 0
    allocations: int = 0  # allocate commands answered
    placed: int = 0
    not_placed: int = 0  # 409: did not fit now (wait false)
    releases: int = 0
    gone: int = 0  # release of a group preempted meanwhile (404)
    preempted: int = 0
    errors: int = 0
    last_error: str = ""


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    return round(sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))], 2)


def _figures(t: Tally, seconds: float, clients: int) -> dict[str, Any]:
    lat = sorted(t.latencies_ms)
    return {
        "ops_per_s": round(t.ops / seconds, 1) if seconds else 0.0,
        "allocations_per_s": round(t.allocations / seconds, 1) if seconds else 0.0,
        "placed_per_s": round(t.placed / seconds, 1) if seconds else 0.0,
        "releases_per_s": round(t.releases / seconds, 1) if seconds else 0.0,
        "p50_ms": _percentile(lat, 0.50), "p99_ms": _percentile(lat, 0.99),
        "max_ms": round(lat[-1], 2) if lat else 0.0,
        "ops": t.ops, "allocations": t.allocations, "placed": t.placed, "not_placed": t.not_placed,
        "releases": t.releases, "gone": t.gone, "preempted": t.preempted, "errors": t.errors,
        "last_error": t.last_error, "seconds": round(seconds, 2), "clients": clients,
    }


def cpu_sampler(pids: dict[str, int | None]) -> Callable[[], dict[str, float | None]]:
    """``pids``: name -> PID (None: this process); the sampler returns CPU seconds of
    each process and its children (bench/proc.py), this process's without the others."""
    others = frozenset(pid for pid in pids.values() if pid is not None)
    return lambda: {name: (self_cpu_s(others) if pid is None else tree_cpu_s(pid)) for name, pid in pids.items()}


async def drive(one_op: Callable[[str, Any], Any], w: Workload, *, clients: int, seconds: float,
                warmup: float, progress: Callable[[str], None] | None, label: str,
                cpu: Callable[[], dict[str, float | None]] | None = None, batch: int = 1) -> dict[str, Any]:
    """``clients`` closed-loop callers of ``one_op(kind, arg)`` for ``warmup`` then
    ``seconds`` (only the latter counted). ``one_op`` returns ``(status, body)``: 201
    placed, 409 not placed, 200 released, 404 gone; anything else is an error. With
    ``batch`` > 1 each caller sends ``batch`` operations at a time,
    ``one_op("batch", [(kind, arg), ...])`` answering a list of ``(status, body)``; each
    operation's latency is its request's."""
    tally = Tally()
    counting = False
    stop_at = time.monotonic() + warmup + seconds

    async def client() -> None:
        while time.monotonic() < stop_at:
            if batch == 1:
                kind, arg = w.next_op()
                t0 = time.perf_counter()
                try:  # one_op bounds its own time (no wait_for: one Task less per operation)
                    status, body = await one_op(kind, arg)
                except Exception as e:  # counted; a run full of errors says so in its figures
                    status, body = -1, f"{type(e).__name__}: {e}"
                tally_op(kind, arg, status, body, (time.perf_counter() - t0) * 1000)
                continue
            ops = [w.next_op() for _ in range(batch)]
            t0 = time.perf_counter()
            try:
                answers = await one_op("batch", ops)
            except Exception as e:
                answers = [(-1, f"{type(e).__name__}: {e}")] * len(ops)
            dt = (time.perf_counter() - t0) * 1000  # each operation waited for its request
            for (kind, arg), (status, body) in zip(ops, answers):
                tally_op(kind, arg, status, body, dt)

    def tally_op(kind: str, arg: Any, status: int, body: Any, dt: float) -> None:
        if kind == "allocate":
            name = arg["affinityGroup"]["name"]
            if status == 201:
                w.add(name)
                for victim in body.get("preempted") or ():
                    w.remove(victim)
            ok = status in (201, 409)
        else:
            ok = status in (200, 404)
        if not counting:
            return
        if not ok:
            tally.errors += 1
            tally.last_error = f"{kind}: {status} {str(body)[:200]}"
            return
        tally.ops += 1
        tally.latencies_ms.append(dt)
        if kind == "allocate":
            tally.allocations += 1
            if status == 201:
                tally.placed += 1
                tally.preempted += len(body.get("preempted") or ())
            else:
                tally.not_placed += 1
        else:
            tally.releases += 1
            if status == 404:
                tally.gone += 1

    async def show() -> None:
        nonlocal counting
        t_start = time.monotonic()
        await asyncio.sleep(warmup)
        counting = True
        t_count = time.monotonic()
        cpu_start.update(cpu() if cpu else {})
        last_ops, last_t = 0, t_count
        while time.monotonic() < stop_at:
            await asyncio.sleep(min(1.0, max(0.05, stop_at - time.monotonic())))
            now = time.monotonic()
            if progress is not None:
                rate = (tally.ops - last_ops) / (now - last_t) if now > last_t else 0.0
                recent = sorted(tally.latencies_ms[last_ops:])
                progress(f"  {label:8s} {now - t_start:5.1f}s  {rate:8.0f} ops/s  "
                         f"p50 {_percentile(recent, 0.5):6.2f} ms  p99 {_percentile(recent, 0.99):6.2f} ms  "
                         f"live groups {len(w.live)}  errors {tally.errors}")
            last_ops, last_t = tally.ops, now
        return t_count

    cpu_start: dict[str, float | None] = {}
    shower = asyncio.create_task(show())
    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), warmup + seconds + OP_TIMEOUT_S + 5)
    finally:
        for t in tasks:
            t.cancel()
    t_count = await shower
    elapsed = time.monotonic() - t_count
    cpu_end = cpu() if cpu else {}
    out = _figures(tally, min(elapsed, seconds) if elapsed > 0 else seconds, clients)
    # CPU seconds each process spent while the operations were counted: on a shared
    # machine, CPU per operation moves much less with the other work than ops/s does
    used = {k: round(cpu_end[k] - v, 3) for k, v in cpu_start.items()
            if v is not None and cpu_end.get(k) is not None}
    if used:
        out["cpu_s"] = used
        out["cpu_ms_per_op"] = round(1000 * sum(used.values()) / tally.ops, 3) if tally.ops else None
        out["cpu_cores_used"] = round(sum(used.values()) / elapsed, 2) if elapsed > 0 else None
    return out


# --- HTTP: a small keep-alive HTTP/1.1 client ------------------------------------------------


class HTTPConn:
    """One keep-alive HTTP/1.1 connection, one request at a time (the server is
    aiohttp's; this is the load generator's side, kept small so that the two cores go
    to the replicas rather than to the client)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body if body is not None else head.encode() + b"\r\n")
        try:
            # the whole head at once, then the body: two reads per response, not one per line
            raw_head = await self.reader.readuntil(b"\r\n\r\n")
            lines = raw_head.split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            length = 0
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                lname = name.strip().lower()
                if lname == b"content-length":
                    length = int(value.strip())
                elif lname == b"connection" and value.strip().lower() == b"close":
                    close = True
            raw = await self.reader.readexactly(length) if length else b""
        except asyncio.IncompleteReadError as e:
            self.close()
            if not e.partial:
                raise ConnectionError("the server closed the connection") from None
            raise
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, (json.loads(raw) if raw else None)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def http_get_json(host: str, port: int, path: str) -> tuple[int, Any]:
    conn = HTTPConn(host, port)
    try:
        return await conn.request("GET", path)
    finally:
        conn.close()


async def wait_http_ready(endpoints: list[tuple[str, int]], cluster: Any, timeout_s: float) -> None:
    """Every endpoint's ``/readyz`` answers 200 (bounded)."""
    deadline = time.monotonic() + timeout_s
    for host, port in endpoints:
        while True:
            try:
                status, _ = await http_get_json(host, port, "/readyz")
                if status == 200:
                    break
            except (OSError, ValueError, asyncio.IncompleteReadError):
                pass
            _check_alive(cluster)
            if time.monotonic() > deadline:
                raise BenchError(f"replica {host}:{port} not ready within {timeout_s:g} s")
            await asyncio.sleep(0.1)


def _check_alive(cluster: Any) -> None:
    for i, proc in cluster.procs.items():
        if proc.poll() is not None:
            raise BenchError(f"replica {i} exited with status {proc.returncode}: {cluster.log_tail(i, 2)}")


# --- the modes ------------------------------------------------------------------------------


def bench_machine(nodes: int, vcs: int, ops: int, seed: int) -> dict[str, Any]:
    from scheduler_state.bench import run

    r = run(nodes=nodes, vcs=vcs, ops=ops, seed=seed, warmup=min(2000, ops))
    c, wall = r["counts"], r["wall"]
    return {
        "ops_per_s": wall["ops_per_s"],
        "allocations_per_s": round(c["allocate"] / wall["total_s"], 1) if wall["total_s"] else 0.0,
        "p50_ms": round(wall["p50_us"] / 1000, 3), "p99_ms": round(wall["p99_us"] / 1000, 3),
        "max_ms": round(wall["max_us"] / 1000, 3), "ops": r["ops"], "allocations": c["allocate"],
        "placed": c["allocated"], "releases": c["release"], "preempted": c["preempted"],
        "errors": c["errors"], "cpu_ops_per_s": r["cpu"]["ops_per_s"],
        "cpu_ms_per_op": round(1000 / r["cpu"]["ops_per_s"], 3) if r["cpu"]["ops_per_s"] else None,
    }


def _cluster(root: str, replicas: int, config_path: str, fsync: str, http: bool,
             node_options: dict[str, Any] | None = None) -> Any:
    from store.server import LocalCluster

    extra = ["--machine", "scheduler", "--hived-config", config_path]
    if node_options:  # settings without a flag of their own go through a TOML file
        os.makedirs(root, exist_ok=True)
        toml = os.path.join(root, "node-options.toml")
        with open(toml, "w") as f:
            f.writelines(f"{k} = {json.dumps(v)}\n" for k, v in node_options.items())
        extra += ["--config", toml]
    return LocalCluster(root, replicas, fsync=fsync, cluster_id="bench-scheduler", http=http, extra_args=extra)


async def bench_http(root: str, config_path: str, *, replicas: int, nodes: int, vcs: int, clients: int,
                     seconds: float, warmup: float, fsync: str, seed: int,
                     progress: Callable[[str], None] | None,
                     node_options: dict[str, Any] | None = None, batch: int = 1) -> dict[str, Any]:
    cluster = _cluster(os.path.join(root, "http" if batch == 1 else "http-batch"), replicas, config_path, fsync,
                       http=True, node_options=node_options)
    cluster.start_all()
    try:
        await cluster.await_ready(timeout_s=READY_TIMEOUT_S)
        endpoints = [("127.0.0.1", p) for p in cluster.http_ports]
        await wait_http_ready(endpoints, cluster, READY_TIMEOUT_S)
        # with batch > 1: as many operations in flight as with one per request
        clients = max(1, clients // batch)
        conns = [HTTPConn(*endpoints[i % len(endpoints)]) for i in range(clients)]
        free = list(conns)

        async def one_op(kind: str, arg: Any) -> Any:
            conn = free.pop()
            try:
                async with asyncio.timeout(OP_TIMEOUT_S):
                    if kind == "batch":  # POST /v1/batch: several operations, one answer each
                        reqs = [{"op": "allocate", "group": a, "wait": False} if k == "allocate" else
                                {"op": "release", "group": a} for k, a in arg]
                        status, body = await conn.request(
                            "POST", "/v1/batch", json.dumps({"requests": reqs}, separators=(",", ":")).encode())
                        if status != 200:
                            return [(status, body)] * len(arg)
                        return [(r["status"], r["body"]) for r in body["results"]]
                    if kind == "allocate":
                        body = json.dumps({"group": arg, "wait": False}, separators=(",", ":")).encode()
                        return await conn.request("POST", "/v1/groups", body)
                    return await conn.request("DELETE", "/v1/groups/" + quote(arg, safe=""))
            finally:
                free.append(conn)

        w = Workload(nodes, vcs, seed, prefix="h")
        try:
            pids: dict[str, int | None] = {"load generator": None}
            pids.update({f"replica {i}": p.pid for i, p in cluster.procs.items()})
            out = await drive(one_op, w, clients=clients, seconds=seconds, warmup=warmup, progress=progress,
                              label="http" if batch == 1 else "http-batch", cpu=cpu_sampler(pids), batch=batch)
            out["ops_per_request"] = batch
        finally:
            for c in conns:
                c.close()
        _check_alive(cluster)
        out["replicas"] = replicas
        out["digests"] = await _digests(endpoints)
        return out
    finally:
        cluster.stop_all()


async def _digests(endpoints: list[tuple[str, int]], timeout_s: float = 20.0) -> dict[str, Any]:
    """Every replica's executed position and digest, once they agree (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = {}
        for host, port in endpoints:
            try:
                status, body = await http_get_json(host, port, "/v1/status")
                seen[f"{host}:{port}"] = (body.get("applied"), body.get("digest")) if status == 200 else \
                    (None, f"status {status}: {str(body)[:200]}")
            except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                seen[f"{host}:{port}"] = (None, f"{type(e).__name__}: {e}")
        values = set(seen.values())
        equal = len(values) == 1 and None not in {v[0] for v in values}
        if equal or time.monotonic() > deadline:
            return {"equal": equal, "replicas": {k: v[1] for k, v in seen.items()}}
        await asyncio.sleep(0.2)


def node_config_options(node_options: dict[str, Any] | None) -> dict[str, Any]:
    """``node_options`` (the TOML file's keys, as the served replicas take them) as
    ``NodeConfig`` fields for the replica in this process (``sequencer`` is
    ``initial_sequencer`` there)."""
    from store.server import TOML_SETTINGS

    attr = {key: a for key, a, _ in TOML_SETTINGS}
    return {attr.get(k, k): v for k, v in (node_options or {}).items()}


async def bench_embedded(root: str, config_path: str, *, replicas: int, nodes: int, vcs: int, clients: int,
                         seconds: float, warmup: float, fsync: str, seed: int,
                         progress: Callable[[str], None] | None,
                         node_options: dict[str, Any] | None = None) -> dict[str, Any]:
    from pathlib import Path

    from store.embed import EmbeddedScheduler, SchedulerError

    cluster = _cluster(os.path.join(root, "embedded"), replicas, config_path, fsync, http=True,
                       node_options=node_options)
    for i in range(1, replicas):  # replica 0 is ours, in this process
        cluster.start(i)
    peers = {i: ("127.0.0.1", p) for i, p in enumerate(cluster.peer_ports)}
    sched = EmbeddedScheduler(0, peers, cluster.data_dir(0), Path(config_path),
                              client=("127.0.0.1", cluster.client_ports[0]), fsync=fsync,
                              cluster_id=cluster.cluster_id, **node_config_options(node_options))
    try:
        for i in range(1, replicas):
            await cluster.await_ready(i, timeout_s=READY_TIMEOUT_S)
        await sched.start(ready_timeout_s=READY_TIMEOUT_S)
        others = [("127.0.0.1", cluster.http_ports[i]) for i in range(1, replicas)]
        await wait_http_ready(others, cluster, READY_TIMEOUT_S)

        async def one_op(kind: str, arg: Any) -> tuple[int, Any]:
            try:
                if kind == "allocate":
                    r = await sched.allocate(arg, wait=False)
                    return (201 if r.get("ok") else 409), r
                return 200, await sched.release(arg)
            except SchedulerError as e:
                if kind == "release" and "does not exist" in str(e):
                    return 404, str(e)
                return 400, str(e)

        w = Workload(nodes, vcs, seed, prefix="e")
        pids: dict[str, int | None] = {"replica 0 + load generator": None}
        pids.update({f"replica {i}": p.pid for i, p in cluster.procs.items()})
        out = await drive(one_op, w, clients=clients, seconds=seconds, warmup=warmup, progress=progress,
                          label="embedded", cpu=cpu_sampler(pids))
        _check_alive(cluster)
        out["replicas"] = replicas
        out["is_sequencer"] = sched.is_sequencer
        stats = sched.service.stats if sched.service is not None else {}
        out["batches"] = {"log_entries": stats.get("batches", 0), "commands": stats.get("batched_commands", 0)}
        out["digests"] = await _digests_embedded(sched, others)
        return out
    finally:
        await sched.stop()
        cluster.stop_all()


async def _digests_embedded(sched: Any, others: list[tuple[str, int]], timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        mine = sched.status()
        remote = await _digests(others, timeout_s=0)
        digests = {"embedded": mine.get("digest"), **remote["replicas"]}
        equal = len(set(digests.values())) == 1 and None not in digests.values()
        if equal or time.monotonic() > deadline:
            return {"equal": equal, "replicas": digests}
        await asyncio.sleep(0.2)


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


async def run_bench(*, modes: tuple[str, ...] = MODES, replicas: int = 3, nodes: int = 1024, vcs: int = 8,
                    clients: int = 64, seconds: float = 10.0, warmup: float = 2.0, fsync: str = "batch",
                    seed: int = 1, machine_ops: int = 20_000, node_options: dict[str, Any] | None = None,
                    progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run the chosen modes on one generated cluster; the figures (module docstring)."""
    import scheduler_state
    from scheduler_state.bench import generate_config
    from scheduler_state.config import ConfigError, load_config

    say = progress or (lambda _m: None)
    try:
        config = generate_config(nodes, vcs)
        load_config(config)  # refuses a bad generated config before starting anything
    except (ValueError, ConfigError) as e:
        raise BenchError(f"cannot generate a {nodes}-node cluster for {vcs} VCs: {e}") from None
    root = tempfile.mkdtemp(prefix="cellar-bench-scheduler-")
    config_path = os.path.join(root, "hived-generated.yaml")
    with open(config_path, "w") as f:  # JSON is YAML: the replicas read it as any --hived-config
        json.dump(config, f)
    result: dict[str, Any] = {
        "nodes": nodes, "gpus": nodes * GPUS_PER_NODE, "vcs": vcs, "replicas": replicas, "clients": clients,
        "seconds": seconds, "warmup": warmup, "fsync": fsync, "seed": seed, "cpus": os.cpu_count(),
        "node_options": node_options or {}, "load_avg_before": load_average(), "modes": {},
        # the scheduler's hot modules compiled (mypyc) here, so in the replicas started (same install and env)
        "compiled": scheduler_state.COMPILED,
    }
    common = dict(replicas=replicas, nodes=nodes, vcs=vcs, clients=clients, seconds=seconds, warmup=warmup,
                  fsync=fsync, seed=seed, progress=progress, node_options=node_options)
    try:
        for mode in modes:
            say(f"{mode}: {_describe_mode(mode, replicas, clients, nodes, machine_ops)}")
            if mode == "machine":
                m = bench_machine(nodes, vcs, machine_ops, seed)
            elif mode == "embedded":
                m = await bench_embedded(root, config_path, **common)
            elif mode == "http":
                m = await bench_http(root, config_path, **common)
            elif mode == "http-batch":
                m = await bench_http(root, config_path, **common, batch=HTTP_BATCH)
            else:
                raise BenchError(f"unknown mode {mode!r} ({', '.join(MODES)})")
            result["modes"][mode] = m
            say(f"{mode}: {m['ops_per_s']:.0f} ops/s ({m['allocations_per_s']:.0f} allocations/s)  "
                f"p50 {m['p50_ms']:.2f} ms  p99 {m['p99_ms']:.2f} ms  errors {m['errors']}")
            if m.get("digests") and not m["digests"]["equal"]:
                raise BenchError(f"{mode}: the replicas' digests differ after the run: {m['digests']['replicas']}")
            if mode != "machine" and not m["ops"]:
                raise BenchError(f"{mode}: no operation succeeded ({m['errors']} errors; last: {m['last_error']})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = result["modes"].get("machine")
    if base and base["ops_per_s"]:
        result["ratio_to_machine"] = {mode: round(m["ops_per_s"] / base["ops_per_s"], 3)
                                      for mode, m in result["modes"].items() if mode != "machine"}
    result["load_avg_after"] = load_average()
    return result


def _describe_mode(mode: str, replicas: int, clients: int, nodes: int, machine_ops: int) -> str:
    if mode == "machine":
        return f"SchedulerStateMachine.apply alone, {machine_ops} commands, {nodes} nodes"
    if mode == "embedded":
        return (f"replica 0 in this process + {replicas - 1} cellar serve processes, "
                f"{clients} concurrent callers of EmbeddedScheduler")
    if mode == "http-batch":
        return (f"{replicas} cellar serve --http processes, {clients} keep-alive HTTP connections, "
                f"{HTTP_BATCH} operations per POST /v1/batch")
    return f"{replicas} cellar serve --http processes, {clients} keep-alive HTTP connections"


def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['nodes']} nodes / {result['gpus']} GPUs, {result['vcs']} VCs, {result['replicas']} replicas, "
             f"{result['clients']} clients, {result['seconds']:g} s per mode, fsync={result['fsync']}, "
             f"{result['cpus']} CPUs, load average {result['load_avg_before']} -> {result['load_avg_after']}, "
             f"scheduler {'compiled (mypyc)' if result.get('compiled') else 'pure Python'}",
             f"  {'mode':10s} {'ops/s':>9s} {'allocs/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} "
             f"{'errors':>7s} {'vs machine':>10s} {'CPU ms/op':>10s} {'cores':>6s}"]
    ratios = result.get("ratio_to_machine", {})
    for mode, m in result["modes"].items():
        ratio = f"{ratios[mode]:.3f}x" if mode in ratios else "1x"
        lines.append(f"  {mode:10s} {m['ops_per_s']:>9.0f} {m['allocations_per_s']:>9.0f} {m['p50_ms']:>8.2f} "
                     f"{m['p99_ms']:>8.2f} {m['max_ms']:>8.2f} {m['errors']:>7d} {ratio:>10s} "
                     f"{_num(m.get('cpu_ms_per_op')):>10s} {_num(m.get('cpu_cores_used')):>6s}")
    return lines


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(modes: tuple[str, ...], replicas: int, nodes: int, vcs: int, clients: int, seconds: float, warmup: float,
         fsync: str, seed: int, machine_ops: int, as_json: bool, quiet: bool) -> None:
    """The ``cellar bench --machine scheduler`` entry point (``bench.cluster_bench``)."""
    import click

    from store.server import install_loop, tune_gc

    install_loop()
    tune_gc()
    progress = None if quiet else (lambda m: click.echo(m, err=True))
    try:
        result = asyncio.run(run_bench(modes=modes, replicas=replicas, nodes=nodes, vcs=vcs, clients=clients,
                                       seconds=seconds, warmup=warmup, fsync=fsync, seed=seed,
                                       machine_ops=machine_ops, progress=progress))
    except BenchError as e:
        click.echo(f"cellar bench --machine scheduler: {e}", err=True)
        sys.exit(1)
    except (OSError, RuntimeError, TimeoutError) as e:
        click.echo(f"cellar bench --machine scheduler: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                   err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("cellar bench --machine scheduler: interrupted", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(result))
    else:
        for line in summary_lines(result):
            click.echo(line)
