"""``cellar bench kv-http``: write throughput through Cellar's HTTP API beside etcd's JSON
gateway, measured in the same run, and through Cellar's binary client.

Starts 3 Cellar replicas (``cellar serve --http``) and 3 etcd members, all on 127.0.0.1
with their own data dirs under one temp dir, and drives the same closed-loop load at each
target in turn: N sessions, each putting 16-byte values to its own keys, one request at a
time, for a fixed time, sessions spread over the three members (a follower forwards to the
leader / sequencer in both systems). Targets:

- ``cellar-http``: ``POST /v3/kv/put`` with base64 key and value on Cellar's gateway;
- ``etcd-http``: the same request on etcd's grpc-gateway (same client code, same bodies);
- ``cellar-binary``: ``Session.put`` of the binary client (``store.loadgen.run_load``, what
  ``cellar bench`` drives; 256 sessions by default, as there).

Targets alternate order from round to round so that drift in the machine's load hits them
alike; the figure that matters is the ratio Cellar-HTTP / etcd-HTTP of each round. Also
reported per target: the load generator's own CPU (near 100 % means the client, not the
server, is the limit) and the servers' CPU per operation (from /proc). Every load loop
stops by itself (a deadline, a per-request timeout); every process started here is stopped
by its PID at the end, also on an error or Ctrl-C. Nothing here asserts a time.

    cellar bench kv-http                                  # 64 HTTP sessions, 10 s per target, 2 rounds
    cellar bench kv-http --sessions 128 --seconds 10 --rounds 3 --json
    cellar bench kv-http --targets cellar-http,cellar-binary --seconds 2   # no etcd needed
    python3 -m bench.kv_http_bench --help
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import click

from store.loadgen import LoadResult

TARGETS = ("cellar-http", "etcd-http", "cellar-binary")
REQUEST_TIMEOUT_S = 5.0
START_TIMEOUT_S = 30.0


class BenchError(Exception):
    """One line on stderr and a nonzero exit."""


# --- etcd ------------------------------------------------------------------------------


def find_etcd(path: str) -> str:
    found = shutil.which(path)
    if found is None:
        raise BenchError(f"etcd not found ({path!r} is not an executable on PATH); install it (Debian: "
                         "apt-get install etcd-server) or leave it out: --targets cellar-http,cellar-binary")
    return found


def etcd_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BenchError(f"cannot run {binary} --version: {e}") from None
    first = out.strip().splitlines()[0] if out.strip() else "unknown version"
    return first.replace("etcd Version:", "etcd").strip()


class EtcdCluster:
    """``members`` etcd processes on 127.0.0.1 (client and peer ports free now), data dirs
    under ``root``; stopped by PID."""

    def __init__(self, binary: str, root: str, members: int = 3) -> None:
        from store.server import free_ports

        self.binary = binary
        self.root = root
        self.n = members
        ports = free_ports(2 * members)
        self.client_ports, self.peer_ports = ports[:members], ports[members:]
        self.procs: dict[int, subprocess.Popen] = {}
        self.token = f"cellar-bench-{os.getpid()}-{time.time_ns() & 0xFFFFFF:x}"

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.client_ports]

    def command(self, i: int) -> list[str]:
        cluster = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        client, peer = f"http://127.0.0.1:{self.client_ports[i]}", f"http://127.0.0.1:{self.peer_ports[i]}"
        return [self.binary, "--name", f"m{i}", "--data-dir", os.path.join(self.root, f"etcd{i}"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", cluster, "--initial-cluster-token", self.token,
                "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn"]

    def start_all(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        for i in range(self.n):
            with open(os.path.join(self.root, f"etcd{i}.log"), "ab") as log:
                self.procs[i] = subprocess.Popen(self.command(i), stdout=log, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, start_new_session=True)

    def log_tail(self, i: int) -> str:
        try:
            with open(os.path.join(self.root, f"etcd{i}.log"), errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-3:])[-400:]
        except OSError:
            return ""

    def stop_all(self, timeout_s: float = 10.0) -> None:
        live = [p for p in self.procs.values() if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]


# --- load ------------------------------------------------------------------------------


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


async def wait_http_ready(name: str, urls: list[str], health_path: str, procs: dict[int, subprocess.Popen],
                          log_tail: Callable[[int], str], timeout_s: float = START_TIMEOUT_S) -> None:
    """Until a put is acknowledged through the first URL (the cluster has a leader /
    sequencer and commits) and every member answers ``health_path`` with 200; bounded."""
    import aiohttp

    deadline = time.monotonic() + timeout_s
    last = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as s:
        pending = list(range(len(urls)))
        while pending or last != "committed":
            for i, p in procs.items():
                if p.poll() is not None:
                    raise BenchError(f"{name} member {i} exited with status {p.returncode}: "
                                 f"{log_tail(i) or 'nothing logged'}")
            if time.monotonic() > deadline:
                raise BenchError(f"{name} not ready within {timeout_s:g} s ({last or 'no answer'}): {log_tail(0)}")
            for i in list(pending):
                try:
                    async with s.get(urls[i] + health_path) as r:
                        if r.status == 200:
                            pending.remove(i)
                        else:
                            last = f"{urls[i]}{health_path}: {r.status}"
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    last = f"{urls[i]}{health_path}: {type(e).__name__}"
            if not pending and last != "committed":
                try:
                    async with s.post(urls[0] + "/v3/kv/put", json={"key": _b64("warm"), "value": _b64("up")}) as r:
                        if r.status == 200:
                            last = "committed"
                        else:
                            last = f"put: {r.status} {(await r.text())[:100]}"
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    last = f"put: {type(e).__name__}"
            if pending or last != "committed":
                await asyncio.sleep(0.1)


async def http_put_load(urls: list[str], *, sessions: int, seconds: float, value_bytes: int = 16,
                        prefix: str = "b", on_progress: Callable[[LoadResult], None] | None = None) -> LoadResult:
    """``sessions`` closed-loop sessions putting ``value_bytes``-byte values through
    ``POST /v3/kv/put`` (etcd's JSON shape) for ``seconds``; session i uses ``urls[i % n]``
    and keys of its own (1,000 per session, as ``store.loadgen``)."""
    import aiohttp

    result = LoadResult()
    pad = "x" * max(0, value_bytes - 8)
    stop_at = time.monotonic() + seconds
    lat = result.latencies_ms
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=sessions + 8)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as http:

        async def one(idx: int) -> None:
            url = urls[idx % len(urls)] + "/v3/kv/put"
            n = 0
            while time.monotonic() < stop_at:
                body = json.dumps({"key": _b64(f"{prefix}/s{idx}k{n % 1000}"),
                                   "value": _b64(f"{n:08d}{pad}")}).encode()
                n += 1
                t0 = time.perf_counter()
                try:
                    async with http.post(url, data=body, headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    ok = False
                if not ok:
                    result.errors += 1
                    await asyncio.sleep(0.01)  # an error answered at once must not spin
                    continue
                lat.append((time.perf_counter() - t0) * 1000)
                result.ops += 1

        async def progress() -> None:
            while time.monotonic() < stop_at:
                await asyncio.sleep(0.5)
                on_progress(result)  # type: ignore[misc]

        t_start = time.monotonic()
        tasks = [asyncio.ensure_future(one(i)) for i in range(sessions)]
        if on_progress is not None:
            tasks.append(asyncio.ensure_future(progress()))
        try:
            # Each session stops at the deadline; its last request at the request timeout.
            await asyncio.wait(tasks, timeout=seconds + REQUEST_TIMEOUT_S + 5)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        result.seconds = time.monotonic() - t_start
    return result


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (0 for one that is gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --- the benchmark ---------------------------------------------------------------------


class Bench:
    def __init__(self, *, targets: tuple[str, ...], sessions: int, binary_sessions: int, seconds: float,
                 warmup: float, rounds: int, value_bytes: int, fsync: str, etcd_binary: str | None,
                 root: str, progress: Callable[[str], None], live: Callable[[str], None]) -> None:
        self.targets = targets
        self.sessions = sessions
        self.binary_sessions = binary_sessions
        self.seconds = seconds
        self.warmup = warmup
        self.rounds = rounds
        self.value_bytes = value_bytes
        self.fsync = fsync
        self.etcd_binary = etcd_binary
        self.root = root
        self.say = progress
        self.live = live
        self.cellar: Any = None
        self.etcd: EtcdCluster | None = None

    # processes (synchronous: started and stopped outside the event loop)

    def start(self) -> None:
        from store.server import LocalCluster

        if any(t.startswith("cellar") for t in self.targets):
            self.cellar = LocalCluster(os.path.join(self.root, "cellar"), 3, fsync=self.fsync, cluster_id="bench",
                                       http=True)
            self.cellar.start_all()
        if "etcd-http" in self.targets:
            assert self.etcd_binary is not None
            self.etcd = EtcdCluster(self.etcd_binary, os.path.join(self.root, "etcd"), 3)
            self.etcd.start_all()

    def stop(self) -> None:
        if self.cellar is not None:
            self.cellar.stop_all()
        if self.etcd is not None:
            self.etcd.stop_all()

    async def ready(self) -> None:
        if self.cellar is not None:
            try:
                await self.cellar.await_ready(timeout_s=START_TIMEOUT_S)
            except (RuntimeError, TimeoutError) as e:
                raise BenchError(f"cellar: {e}") from None
            await wait_http_ready("cellar", self._urls("cellar-http"), "/readyz", self.cellar.procs,
                                  self.cellar.log_tail)
            self.say(f"cellar: 3 replicas, fsync={self.fsync}, http {', '.join(self._urls('cellar-http'))}")
        if self.etcd is not None:
            await wait_http_ready("etcd", self.etcd.urls, "/health", self.etcd.procs, self.etcd.log_tail)
            self.say(f"{etcd_version(self.etcd.binary)}: 3 members, http {', '.join(self.etcd.urls)}")

    def _urls(self, target: str) -> list[str]:
        if target == "etcd-http":
            return self.etcd.urls  # type: ignore[union-attr]
        return [f"http://127.0.0.1:{p}" for p in self.cellar.http_ports]

    def _server_pids(self, target: str) -> list[int]:
        if target == "etcd-http":
            return self.etcd.pids()  # type: ignore[union-attr]
        return [p.pid for p in self.cellar.procs.values()]

    async def _load(self, target: str, seconds: float, seed: int, show: bool) -> LoadResult:
        t0 = time.monotonic()
        last = [0, t0]

        def tick(res: LoadResult) -> None:
            if not show:
                return
            now = time.monotonic()
            rate = (res.ops - last[0]) / max(1e-6, now - last[1])
            last[0], last[1] = res.ops, now
            self.live(f"  {target:<13} t={now - t0:4.1f}s  ops {res.ops:>8}  now {rate:>7.0f} ops/s  "
                      f"errors {res.errors}")

        if target == "cellar-binary":
            from store.loadgen import run_load
            from store.client import CellarClient

            async with CellarClient(self.cellar.client_addresses, timeout_s=REQUEST_TIMEOUT_S) as cellar:
                return await run_load(cellar, sessions=self.binary_sessions, seconds=seconds,
                                      value_bytes=self.value_bytes, seed=seed, on_progress=tick)
        return await http_put_load(self._urls(target), sessions=self.sessions, seconds=seconds,
                                   value_bytes=self.value_bytes, prefix=f"bench{seed}", on_progress=tick)

    async def measure(self, target: str, round_: int) -> dict:
        if self.warmup:
            await self._load(target, self.warmup, 1000 + round_, False)
        pids = self._server_pids(target)
        cpu0, self0 = _cpu_s(pids), _self_cpu_s()
        res = await self._load(target, self.seconds, round_ + 1, True)
        cpu1, self1 = _cpu_s(pids), _self_cpu_s()
        self.live("")
        ops = res.ops
        return {
            "target": target,
            "round": round_ + 1,
            "sessions": self.binary_sessions if target == "cellar-binary" else self.sessions,
            "ops_per_s": round(res.throughput(), 1),
            "p50_ms": round(res.percentile(0.50), 2) if ops else None,
            "p99_ms": round(res.percentile(0.99), 2) if ops else None,
            "ops": ops,
            "errors": res.errors,
            "seconds": round(res.seconds, 2),
            "client_cpu_pct": round(100 * (self1 - self0) / max(1e-6, res.seconds), 1),
            "server_cpu_ms_per_op": round(1000 * (cpu1 - cpu0) / ops, 3) if ops else None,
        }

    async def run(self) -> dict:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C / SIGTERM: cancel, then stop every server
            loop.add_signal_handler(sig, task.cancel)

        def quiet_cancel(loop: asyncio.AbstractEventLoop, context: dict) -> None:
            if not isinstance(context.get("exception"), asyncio.CancelledError):
                loop.default_exception_handler(context)

        loop.set_exception_handler(quiet_cancel)
        await self.ready()
        runs: dict[str, list[dict]] = {t: [] for t in self.targets}
        for r in range(self.rounds):
            order = self.targets if r % 2 == 0 else self.targets[::-1]
            for target in order:
                m = await self.measure(target, r)
                runs[target].append(m)
                self.say(f"round {r + 1} {target:<13} {m['ops_per_s']:>8.0f} ops/s  p50 {_ms(m['p50_ms'])}  "
                         f"p99 {_ms(m['p99_ms'])}  errors {m['errors']}  client CPU {m['client_cpu_pct']:.0f} %")
        median = {}
        for t, ms in runs.items():
            median[t] = {k: _median([m[k] for m in ms]) for k in
                         ("ops_per_s", "p50_ms", "p99_ms", "client_cpu_pct", "server_cpu_ms_per_op")}
            median[t]["errors"] = sum(m["errors"] for m in ms)
            median[t]["sessions"] = ms[0]["sessions"]
        ratios = []
        if "cellar-http" in runs and "etcd-http" in runs:
            ratios = [round(a["ops_per_s"] / b["ops_per_s"], 3) for a, b in zip(runs["cellar-http"], runs["etcd-http"])
                      if b["ops_per_s"]]
        return {
            "targets": list(self.targets), "sessions": self.sessions, "binary_sessions": self.binary_sessions,
            "seconds": self.seconds, "warmup": self.warmup, "rounds": self.rounds, "value_bytes": self.value_bytes,
            "fsync": self.fsync, "etcd": etcd_version(self.etcd.binary) if self.etcd else None,
            "runs": runs, "median": median,
            "ratio_cellar_http_over_etcd_http": _median(ratios) if ratios else None,
            "per_round_ratios": ratios,
        }


def _median(xs: list) -> Any:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def _ms(x: float | None) -> str:
    return f"{x:7.2f} ms" if x is not None else "      - ms"


def format_table(result: dict) -> str:
    lines = [f"median of {result['rounds']} round(s) of {result['seconds']:g} s, 3 replicas each, loopback, "
             f"{result['value_bytes']}-byte values, closed loop; Cellar fsync={result['fsync']}"
             + (f"; {result['etcd']}" if result.get("etcd") else ""),
             f"{'target':<14} {'sessions':>8} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} "
             f"{'client CPU':>10} {'server CPU/op':>13}"]
    for t in result["targets"]:
        m = result["median"][t]
        p50 = f"{m['p50_ms']:.2f}" if m["p50_ms"] is not None else "-"
        p99 = f"{m['p99_ms']:.2f}" if m["p99_ms"] is not None else "-"
        cpu = f"{m['server_cpu_ms_per_op']:.3f} ms" if m["server_cpu_ms_per_op"] is not None else "-"
        lines.append(f"{t:<14} {m['sessions']:>8} {m['ops_per_s']:>9.0f} {p50:>8} {p99:>8} {m['errors']:>7} "
                     f"{m['client_cpu_pct']:>9.0f}% {cpu:>13}")
    if result["ratio_cellar_http_over_etcd_http"] is not None:
        lines.append(f"Cellar-HTTP / etcd-HTTP throughput: {result['ratio_cellar_http_over_etcd_http']:.2f}x "
                     f"(per round: {result['per_round_ratios']})")
    return "\n".join(lines)


def run(targets: tuple[str, ...], sessions: int, binary_sessions: int, seconds: float, warmup: float, rounds: int,
        value_bytes: int, fsync: str, etcd: str, keep: bool, as_json: bool, quiet: bool) -> dict:
    """The whole benchmark; processes are stopped (by PID) whatever happens."""
    from store.server import install_loop, tune_gc

    etcd_binary = find_etcd(etcd) if "etcd-http" in targets else None
    root = tempfile.mkdtemp(prefix="cellar-bench-kv-http-")
    out = sys.stderr if as_json else sys.stdout
    tty = out.isatty() and not quiet

    def say(msg: str) -> None:
        if not quiet:
            out.write(("\r\033[K" if tty else "") + msg + "\n")
            out.flush()

    def live(msg: str) -> None:
        if tty:
            out.write("\r\033[K" + msg)
            out.flush()

    bench = Bench(targets=targets, sessions=sessions, binary_sessions=binary_sessions, seconds=seconds,
                  warmup=warmup, rounds=rounds, value_bytes=value_bytes, fsync=fsync, etcd_binary=etcd_binary,
                  root=root, progress=say, live=live)
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # Outside the event loop (starting and stopping servers) SIGTERM and Ctrl-C raise
    # KeyboardInterrupt, even when SIGINT was ignored by whoever started us; inside it,
    # they cancel the run (Bench.run). Either way the servers are stopped.
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        say(f"data and logs in {root}")
        bench.start()
        install_loop()
        tune_gc()
        return asyncio.run(bench.run())
    finally:
        bench.stop()
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@click.command("kv-http")
@click.option("--targets", default=",".join(TARGETS), show_default=True,
              help="Which of cellar-http, etcd-http, cellar-binary to measure, comma-separated.")
@click.option("--sessions", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Concurrent closed-loop HTTP sessions (cellar-http and etcd-http).")
@click.option("--binary-sessions", type=click.IntRange(1, 100_000), default=256, show_default=True,
              help="Sessions of the binary client (cellar bench's default).")
@click.option("--seconds", type=click.FloatRange(0.5, 3600), default=10.0, show_default=True,
              help="Measured seconds per target and round.")
@click.option("--warmup", type=click.FloatRange(0, 60), default=1.0, show_default=True,
              help="Unmeasured load before each measurement.")
@click.option("--rounds", type=click.IntRange(1, 20), default=2, show_default=True)
@click.option("--value-bytes", type=click.IntRange(8, 1 << 16), default=16, show_default=True)
@click.option("--fsync", type=click.Choice(["always", "batch", "never"]), default="batch", show_default=True,
              help="Cellar's WAL fsync policy (etcd always syncs its WAL before acknowledging).")
@click.option("--etcd", "etcd", default="etcd", show_default=True, metavar="PATH", help="The etcd binary.")
@click.option("--keep", is_flag=True, help="Keep the data dirs and logs.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON only (progress on stderr).")
def kv_http(targets, sessions, binary_sessions, seconds, warmup, rounds, value_bytes, fsync, etcd, keep, quiet,
            as_json) -> None:
    """Write throughput through Cellar's HTTP API beside etcd's JSON gateway (3 members each on
    127.0.0.1, same closed-loop put load, same run), and through Cellar's binary client."""
    chosen = tuple(t.strip() for t in targets.split(",") if t.strip())
    bad = [t for t in chosen if t not in TARGETS]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        raise click.BadParameter(f"{targets!r}: choose some of {', '.join(TARGETS)}, each once",
                                 param_hint="--targets")
    try:
        result = run(chosen, sessions, binary_sessions, seconds, warmup, rounds, value_bytes, fsync, etcd, keep,
                     as_json, quiet)
    except BenchError as e:
        click.echo(f"cellar bench kv-http: {e}", err=True)
        sys.exit(2 if "not found" in str(e) else 1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("cellar bench kv-http: interrupted; every server stopped", err=True)
        sys.exit(130)
    except (OSError, RuntimeError, asyncio.TimeoutError) as e:
        click.echo(f"cellar bench kv-http: {type(e).__name__}: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo("")
        click.echo(format_table(result))


class BenchGroup(click.Group):
    """``cellar bench`` as before (its options, no subcommand), plus ``cellar bench kv-http`` and
    ``cellar bench geo``."""


def _bench_group() -> click.Group:
    from bench.cluster_bench import bench as cluster
    from bench.failover_bench import failover
    from bench.geo_bench import geo
    from bench.reads_bench import reads
    from bench.straggler_bench import straggler

    @click.pass_context
    def callback(ctx: click.Context, **kwargs: Any) -> None:
        if ctx.invoked_subcommand is None:
            ctx.invoke(cluster, **kwargs)

    group = BenchGroup("bench", params=list(cluster.params), callback=callback, invoke_without_command=True,
                       help=inspect.cleandoc(cluster.help or "") + "\n\n`cellar bench kv-http`: HTTP writes "
                       "beside etcd's JSON gateway (see `cellar bench kv-http --help`).\n\n`cellar bench geo`: "
                       "per-site commit latency behind wide-area delays, beside the simulator and the "
                       "one-round-trip bound (see `cellar bench geo --help`).\n\n`cellar bench failover`, `reads`, "
                       "`straggler`: the SDPaxos paper's Figs. 14, 11 and 9 on real processes.",
                       short_help=cluster.short_help)
    group.add_command(kv_http)
    group.add_command(geo)
    group.add_command(failover)
    group.add_command(reads)
    group.add_command(straggler)
    return group


bench = _bench_group()

if __name__ == "__main__":
    kv_http()
