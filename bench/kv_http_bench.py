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

from bench.geo_bench import BenchError  # one class for every bench's one-line failure
from bench.proc import tree_cpu_s
from store.loadgen import LoadResult
from store.server import stop_processes

TARGETS = ("cellar-http", "etcd-http", "cellar-binary", "pysyncobj", "pysyncobj-nosync")
# PySyncObj targets and the durability of their replicas (bench/pysyncobj_server.py --durability)
PYSYNCOBJ_TARGETS = {"pysyncobj": "fsync", "pysyncobj-nosync": "journal"}
KV_HTTP_DEFAULT = TARGETS[:3]
REQUEST_TIMEOUT_S = 5.0
START_TIMEOUT_S = 30.0


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


_TAKEN: set[int] = set()  # ports handed to a server of this process


def fresh_ports(count: int, tries: int = 50) -> list[int]:
    """``store.server.free_ports``, none of them handed out here before: the kernel may hand
    out a port again once its probe socket is closed, before the server it was meant for
    binds it, and several clusters start here at once."""
    from store.server import free_ports

    for _ in range(tries):
        ports = free_ports(count)
        if not _TAKEN & set(ports):
            _TAKEN.update(ports)
            return ports
    raise BenchError(f"no {count} fresh ports on 127.0.0.1 in {tries} tries")


class ProcGroup:
    """Server processes started here, one log file each under ``root``, stopped by PID
    (SIGTERM, SIGKILL past the timeout). Subclasses give ``command(i)``."""

    name = "server"
    log_name = "member"

    def __init__(self, root: str, members: int) -> None:
        self.root = root
        self.n = members
        self.procs: dict[int, subprocess.Popen] = {}

    def command(self, i: int) -> list[str]:
        raise NotImplementedError

    def log_path(self, i: int) -> str:
        return os.path.join(self.root, f"{self.log_name}{i}.log")

    def start_all(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        for i in range(self.n):
            with open(self.log_path(i), "ab") as log:
                self.procs[i] = subprocess.Popen(self.command(i), stdout=log, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, start_new_session=True)

    def log_tail(self, i: int) -> str:
        try:
            with open(self.log_path(i), errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-3:])[-400:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        for i, p in self.procs.items():
            if p.poll() is not None:
                raise BenchError(f"{self.name} member {i} exited with status {p.returncode}: "
                                 f"{self.log_tail(i) or 'nothing logged'}")

    def pause(self, paused: bool) -> None:
        """SIGSTOP (True) or SIGCONT (False) every member still running."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        stop_processes(self.procs.values(), timeout_s)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]


class EtcdCluster(ProcGroup):
    """``members`` etcd processes on 127.0.0.1 (client and peer ports free now), data dirs
    under ``root``; stopped by PID."""

    name = "etcd"
    log_name = "etcd"

    def __init__(self, binary: str, root: str, members: int = 3) -> None:
        super().__init__(root, members)
        self.binary = binary
        ports = fresh_ports(2 * members)
        self.client_ports, self.peer_ports = ports[:members], ports[members:]
        self.token = f"cellar-bench-{os.getpid()}-{time.time_ns() & 0xFFFFFF:x}"

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.client_ports]

    def command(self, i: int) -> list[str]:
        from jepsen_like.etcd_db import etcd_command  # one command line for etcd members (the Jepsen harness's too)

        return etcd_command(self.binary, i, os.path.join(self.root, f"etcd{i}"), self.client_ports[i],
                            self.peer_ports[i], {j: ("127.0.0.1", p) for j, p in enumerate(self.peer_ports)},
                            self.token)


# --- PySyncObj ---------------------------------------------------------------------------

PYSYNCOBJ_DURABILITY = {
    "fsync": "PySyncObj {v}: Raft log in its file journal (written through mmap), fdatasync'ed before any Raft "
             "message leaves a replica, meta and dump fsync'ed before their renames (a shim in "
             "bench/pysyncobj_server.py: PySyncObj itself never syncs), so an acknowledged put is on the disk of a "
             "majority",
    "journal": "PySyncObj {v}: Raft log in its file journal written through mmap, never msync'ed or fsync'ed "
               "(PySyncObj as shipped; 0.3.x has no flushJournal option): an acknowledged put is in the page "
               "cache of a majority, lost on a power loss",
}


# SyncObjConf settings of the PySyncObj targets (its defaults: batch on, 0.1 s, 0.05 s). With
# batching (appendEntriesUseBatch) the leader sends AppendEntries every appendEntriesPeriod,
# from its ticking thread, which wakes on a socket event or after autoTickPeriod; commands
# queued by the endpoint's thread do not wake it. At the defaults a closed-loop put waits
# 100-250 ms (smoke runs: about 140-450/s at 32 and 128 clients with the journal synced);
# with 5 ms / 2 ms it waits a few ticks. Without batching every command sends its own
# AppendEntries at once, which with a synced journal means one sync per command on the
# ticking thread (slower still, 270-560/s). So: batching, 5 ms, 2 ms.
PYSYNCOBJ_SETTINGS = {"batch": True, "append_period": 0.005, "tick_period": 0.002}


def pysyncobj_version(python: str = sys.executable) -> str:
    """The installed PySyncObj's version, as the servers' interpreter imports it; a
    ``BenchError`` saying how to install it when it does not."""
    try:
        out = subprocess.run([python, "-c", "import pysyncobj.batteries, pysyncobj.version as v; print(v.VERSION)"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        out = None
        why = str(e)
    if out is None or out.returncode != 0:
        why = (out.stderr.strip().splitlines() or ["no error text"])[-1] if out is not None else why
        raise BenchError(f"pysyncobj not found ({why}); install it (python3 -m pip install -e '.[bench]', or "
                         "pip install pysyncobj) or leave the pysyncobj targets out")
    return out.stdout.strip()


def find_peers(targets: tuple[str, ...], etcd: str) -> tuple[str | None, str | None]:
    """The etcd binary and PySyncObj's version for the targets that need them (None
    otherwise); a ``BenchError`` naming what is missing ("not found": exit 2)."""
    etcd_binary = find_etcd(etcd) if "etcd-http" in targets else None
    return etcd_binary, pysyncobj_version() if set(PYSYNCOBJ_TARGETS) & set(targets) else None


class PySyncObjCluster(ProcGroup):
    """``members`` replicas of ``bench/pysyncobj_server.py`` on 127.0.0.1 (a Raft port and a
    put endpoint each), journals under ``root``; stopped by PID."""

    name = "pysyncobj"
    log_name = "pysyncobj"

    def __init__(self, root: str, members: int = 3, *, durability: str = "fsync",
                 batch: bool = PYSYNCOBJ_SETTINGS["batch"], append_period: float = PYSYNCOBJ_SETTINGS["append_period"],
                 tick_period: float = PYSYNCOBJ_SETTINGS["tick_period"]) -> None:
        super().__init__(root, members)
        ports = fresh_ports(2 * members)
        self.raft_ports, self.client_ports = ports[:members], ports[members:]
        self.durability = durability
        self.batch = batch
        self.append_period = append_period
        self.tick_period = tick_period

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", p) for p in self.client_ports]

    def command(self, i: int) -> list[str]:
        raft = [f"127.0.0.1:{p}" for p in self.raft_ports]
        return [sys.executable, "-m", "bench.pysyncobj_server", "--self", raft[i],
                "--partners", ",".join(a for j, a in enumerate(raft) if j != i),
                "--client", f"127.0.0.1:{self.client_ports[i]}", "--data-dir", os.path.join(self.root, f"node{i}"),
                "--durability", self.durability, "--append-period", str(self.append_period),
                "--tick-period", str(self.tick_period),
                "--exit-with-parent", str(os.getpid()), *([] if self.batch else ["--no-batch"])]

    def settings(self) -> str:
        return (f"appendEntriesUseBatch={self.batch}, appendEntriesPeriod={self.append_period:g} s, "
                f"autoTickPeriod={self.tick_period:g} s, "
                "journalFile and fullDumpFile set, other SyncObjConf defaults")

    async def ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every replica knows the leader and a put through each is acknowledged; bounded."""
        deadline = time.monotonic() + timeout_s
        last = ""
        for i, addr in enumerate(self.addresses):
            while True:
                self.check_alive()
                if time.monotonic() > deadline:
                    raise BenchError(f"pysyncobj not ready within {timeout_s:g} s (replica {i}: "
                                     f"{last or 'no answer'}): {self.log_tail(i)}")
                try:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(*addr), 2.0)
                    try:
                        writer.write(b"P warm up\n")
                        last = (await asyncio.wait_for(reader.readline(), 2.0)).decode().strip()
                    finally:
                        writer.close()
                except (OSError, asyncio.TimeoutError) as e:
                    last = type(e).__name__
                if last == "OK":
                    break
                await asyncio.sleep(0.1)


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


async def closed_loop(sessions: int, seconds: float, request: Callable[[int, int], Any],
                      on_progress: Callable[[LoadResult], None] | None = None,
                      cleanup: Callable[[], Any] | None = None) -> LoadResult:
    """``sessions`` closed-loop sessions for ``seconds``: session ``idx`` awaits
    ``request(idx, n)`` (True: acknowledged) for n = 0, 1, ... until the deadline, one at a
    time; latencies of the acknowledged ones recorded. Bounded: each session stops at the
    deadline, its last request at ``REQUEST_TIMEOUT_S``; ``cleanup`` (a coroutine
    function) runs at the end whatever happens."""
    result = LoadResult()
    stop_at = time.monotonic() + seconds
    lat = result.latencies_ms

    async def one(idx: int) -> None:
        n = 0
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            try:
                ok = await asyncio.wait_for(request(idx, n), REQUEST_TIMEOUT_S)
            except (asyncio.TimeoutError, OSError, ConnectionError, EOFError):
                ok = False
            n += 1
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
        await asyncio.wait(tasks, timeout=seconds + REQUEST_TIMEOUT_S + 5)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if cleanup is not None:
            await cleanup()
    result.seconds = time.monotonic() - t_start
    return result


async def http_put_load(urls: list[str], *, sessions: int, seconds: float, value_bytes: int = 16,
                        prefix: str = "b", on_progress: Callable[[LoadResult], None] | None = None) -> LoadResult:
    """``sessions`` closed-loop sessions putting ``value_bytes``-byte values through
    ``POST /v3/kv/put`` (etcd's JSON shape) for ``seconds``; session i uses ``urls[i % n]``
    and keys of its own (1,000 per session, as ``store.loadgen``)."""
    import aiohttp

    pad = "x" * max(0, value_bytes - 8)
    headers = {"Content-Type": "application/json"}
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=sessions + 8),
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))

    async def put(idx: int, n: int) -> bool:
        body = json.dumps({"key": _b64(f"{prefix}/s{idx}k{n % 1000}"), "value": _b64(f"{n:08d}{pad}")}).encode()
        try:
            async with http.post(urls[idx % len(urls)] + "/v3/kv/put", data=body, headers=headers) as r:
                await r.read()
                return r.status == 200
        except aiohttp.ClientError:
            return False

    return await closed_loop(sessions, seconds, put, on_progress, http.close)


async def line_put_load(addresses: list[tuple[str, int]], *, sessions: int, seconds: float, value_bytes: int = 16,
                        prefix: str = "b", on_progress: Callable[[LoadResult], None] | None = None) -> LoadResult:
    """The same load through ``bench/pysyncobj_server.py``'s line protocol (``P key
    value`` -> ``OK``): one connection per session, to ``addresses[i % n]``."""
    pad = "x" * max(0, value_bytes - 8)
    conns: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def put(idx: int, n: int) -> bool:
        if idx not in conns:
            conns[idx] = await asyncio.open_connection(*addresses[idx % len(addresses)])
        reader, writer = conns[idx]
        try:
            writer.write(f"P {prefix}/s{idx}k{n % 1000} {n:08d}{pad}\n".encode())
            line = await reader.readline()
        except BaseException:
            conns.pop(idx, None)  # a request cut off leaves the stream mid-answer: a new one
            writer.close()
            raise
        if not line:
            conns.pop(idx, None)
            writer.close()
        return line == b"OK\n"

    async def close_all() -> None:
        for _reader, writer in conns.values():
            writer.close()

    return await closed_loop(sessions, seconds, put, on_progress, close_all)


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and their children so far (0 for
    one that is gone)."""
    return sum(tree_cpu_s(pid) or 0.0 for pid in pids)


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --- the benchmark ---------------------------------------------------------------------


CELLAR_DURABILITY = {
    "batch": "Cellar fsync=batch: group-committed fdatasync of the WAL before a replica acknowledges, on a majority",
    "always": "Cellar fsync=always: an fsync of the WAL per append before a replica acknowledges, on a majority",
    "never": "Cellar fsync=never: the WAL in the page cache only (no fsync): lost on a power loss",
}
ETCD_DURABILITY = "{v}: fsyncs its WAL before acknowledging, on a majority (etcd has no switch for it)"
# Throughput ratios reported (numerator, denominator), when both targets ran.
RATIOS = (("cellar-binary", "etcd-http"), ("cellar-binary", "pysyncobj"), ("cellar-http", "etcd-http"),
          ("cellar-binary", "pysyncobj-nosync"))


def ratio_key(a: str, b: str) -> str:
    return f"{a}/{b}"


class Bench:
    """The servers of the chosen targets (started once, stopped by PID) and the measurement
    of one target, one round; ``rounds`` measures every target ``rounds`` times in
    alternating order. ``cellar bench kv-http`` and ``cellar bench peers`` both drive it."""

    def __init__(self, *, targets: tuple[str, ...], sessions: int, binary_sessions: int, seconds: float,
                 warmup: float, rounds: int, value_bytes: int, fsync: str, etcd_binary: str | None,
                 root: str, progress: Callable[[str], None], live: Callable[[str], None],
                 pysyncobj: dict | None = None, pysyncobj_version: str | None = None) -> None:
        self.targets = targets
        self.sessions = sessions
        self.binary_sessions = binary_sessions
        self.seconds = seconds
        self.warmup = warmup
        self.rounds = rounds
        self.value_bytes = value_bytes
        self.fsync = fsync
        self.etcd_binary = etcd_binary
        self.pysyncobj_options = pysyncobj or {}
        self.pysyncobj_version = pysyncobj_version
        self.root = root
        self.say = progress
        self.live = live
        self.cellar: Any = None
        self.etcd: EtcdCluster | None = None
        self.pysyncobj: dict[str, PySyncObjCluster] = {}  # by target

    # processes (synchronous: started and stopped outside the event loop)

    def start(self) -> None:
        from store.server import LocalCluster

        if any(t.startswith("cellar") for t in self.targets):
            self.cellar = LocalCluster(os.path.join(self.root, "cellar"), 3, fsync=self.fsync, cluster_id="bench",
                                       http=True)
            _TAKEN.update(self.cellar.peer_ports + self.cellar.client_ports + self.cellar.http_ports)
            self.cellar.start_all()
        if "etcd-http" in self.targets:
            assert self.etcd_binary is not None
            self.etcd = EtcdCluster(self.etcd_binary, os.path.join(self.root, "etcd"), 3)
            self.etcd.start_all()
        for target, durability in PYSYNCOBJ_TARGETS.items():
            if target in self.targets:
                self.pysyncobj[target] = PySyncObjCluster(os.path.join(self.root, target), 3, durability=durability,
                                                          **self.pysyncobj_options)
                self.pysyncobj[target].start_all()

    def stop(self) -> None:
        for group in (self.cellar, self.etcd, *self.pysyncobj.values()):
            if group is not None:
                group.stop_all()

    def server_pids(self) -> list[int]:
        """Every server process started (each once)."""
        return sorted({pid for t in self.targets for pid in self._server_pids(t)})

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
        for target, group in self.pysyncobj.items():
            await group.ready()
            self.say(f"{target}: PySyncObj {self.pysyncobj_version}, 3 replicas, durability={group.durability}, "
                     f"{group.settings()}, tcp {', '.join(f'{h}:{p}' for h, p in group.addresses)}")

    def durability(self) -> dict[str, str]:
        """One line per system measured: what an acknowledgement means on disk."""
        out = {}
        if self.cellar is not None:
            out["cellar"] = CELLAR_DURABILITY[self.fsync]
        if self.etcd is not None:
            out["etcd"] = ETCD_DURABILITY.format(v=etcd_version(self.etcd.binary))
        for target, group in self.pysyncobj.items():
            out[target] = PYSYNCOBJ_DURABILITY[group.durability].format(v=self.pysyncobj_version)
        return out

    def _urls(self, target: str) -> list[str]:
        if target == "etcd-http":
            return self.etcd.urls  # type: ignore[union-attr]
        return [f"http://127.0.0.1:{p}" for p in self.cellar.http_ports]

    def _server_pids(self, target: str) -> list[int]:
        if target == "etcd-http":
            return self.etcd.pids()  # type: ignore[union-attr]
        if target in self.pysyncobj:
            return self.pysyncobj[target].pids()
        return [p.pid for p in self.cellar.procs.values()]

    def sessions_of(self, target: str) -> int:
        return self.binary_sessions if target == "cellar-binary" else self.sessions

    async def _load(self, target: str, seconds: float, seed: int, show: bool) -> LoadResult:
        t0 = time.monotonic()
        last = [0, t0]

        def tick(res: LoadResult) -> None:
            if not show:
                return
            now = time.monotonic()
            rate = (res.ops - last[0]) / max(1e-6, now - last[1])
            last[0], last[1] = res.ops, now
            self.live(f"  {target:<16} t={now - t0:4.1f}s  ops {res.ops:>8}  now {rate:>7.0f} ops/s  "
                      f"errors {res.errors}")

        if target == "cellar-binary":
            from store.loadgen import run_load
            from store.client import CellarClient

            async with CellarClient(self.cellar.client_addresses, timeout_s=REQUEST_TIMEOUT_S) as cellar:
                return await run_load(cellar, sessions=self.binary_sessions, seconds=seconds,
                                      value_bytes=self.value_bytes, seed=seed, on_progress=tick)
        if target in self.pysyncobj:
            return await line_put_load(self.pysyncobj[target].addresses, sessions=self.sessions, seconds=seconds,
                                       value_bytes=self.value_bytes, prefix=f"bench{seed}", on_progress=tick)
        return await http_put_load(self._urls(target), sessions=self.sessions, seconds=seconds,
                                   value_bytes=self.value_bytes, prefix=f"bench{seed}", on_progress=tick)

    async def only_pysyncobj(self, target: str) -> None:
        """PySyncObj's ticking thread wakes every autoTickPeriod even when idle (2 ms: about
        13 % of a core per 3-replica cluster here), so the PySyncObj clusters not measured
        now are paused (SIGSTOP) and the one measured resumed, then ready again (a leader,
        a put acknowledged through each replica) before its warm-up."""
        for t, group in self.pysyncobj.items():
            group.pause(t != target)
        if target in self.pysyncobj:
            await self.pysyncobj[target].ready()

    async def cellar_views(self) -> list[dict]:
        """Each Cellar replica's view, sequencer, phase and longest event-loop pause so far
        (status without the digest; ``error`` for one that does not answer within 2 s)."""
        from store.client import CellarClient

        async with CellarClient(self.cellar.client_addresses, timeout_s=2.0) as admin:
            sts = await admin.statuses(digest=False)
        return [{"error": st["error"]} if "error" in st else
                {"view": st.get("view"), "sequencer": st.get("sequencer", st.get("leader")), "phase": st.get("phase"),
                 "loop_lag_max_ms": (st.get("loop") or {}).get("lag_max_ms")} for st in sts]

    async def measure(self, target: str, round_: int) -> dict:
        await self.only_pysyncobj(target)
        if self.warmup:
            await self._load(target, self.warmup, 1000 + round_, False)
        pids = self._server_pids(target)
        before = await self.cellar_views() if target.startswith("cellar") else None
        cpu0, self0 = _cpu_s(pids), _self_cpu_s()
        res = await self._load(target, self.seconds, round_ + 1, True)
        cpu1, self1 = _cpu_s(pids), _self_cpu_s()
        self.live("")
        ops = res.ops
        extra = {}
        if before is not None:
            after = await self.cellar_views()
            extra = {"cellar_before": before, "cellar_after": after}
            if [v.get("view") for v in before] != [v.get("view") for v in after] or any("error" in v for v in after):
                self.say(f"  {target}: Cellar's replicas changed view or did not answer during the measurement: "
                         f"{before} -> {after}")
        return {
            "target": target,
            "round": round_ + 1,
            "sessions": self.sessions_of(target),
            "ops_per_s": round(res.throughput(), 1),
            "p50_ms": round(res.percentile(0.50), 2) if ops else None,
            "p99_ms": round(res.percentile(0.99), 2) if ops else None,
            "ops": ops,
            "errors": res.errors,
            "seconds": round(res.seconds, 2),
            "client_cpu_pct": round(100 * (self1 - self0) / max(1e-6, res.seconds), 1),
            "server_cpu_ms_per_op": round(1000 * (cpu1 - cpu0) / ops, 3) if ops else None,
            **extra,
        }

    async def measure_rounds(self, first_round: int = 0, label: str = "") -> dict:
        """Every target ``rounds`` times, the order reversed every other round (counting from
        ``first_round``, so that consecutive calls go on alternating); per-target medians
        and the throughput ratios of each round (``RATIOS``) with their medians."""
        runs: dict[str, list[dict]] = {t: [] for t in self.targets}
        for r in range(self.rounds):
            k = first_round + r
            order = self.targets if k % 2 == 0 else self.targets[::-1]
            for target in order:
                m = await self.measure(target, r)
                runs[target].append(m)
                self.say(f"{label}round {r + 1} {target:<16} {m['ops_per_s']:>8.0f} ops/s  p50 {_ms(m['p50_ms'])}  "
                         f"p99 {_ms(m['p99_ms'])}  errors {m['errors']}  client CPU {m['client_cpu_pct']:.0f} %")
        median = {}
        for t, ms in runs.items():
            median[t] = {k: _median([m[k] for m in ms]) for k in
                         ("ops_per_s", "p50_ms", "p99_ms", "client_cpu_pct", "server_cpu_ms_per_op")}
            median[t]["errors"] = sum(m["errors"] for m in ms)
            median[t]["sessions"] = ms[0]["sessions"]
        per_round = {}
        for a, b in RATIOS:
            if a in runs and b in runs:
                per_round[ratio_key(a, b)] = [round(x["ops_per_s"] / y["ops_per_s"], 3)
                                              for x, y in zip(runs[a], runs[b]) if y["ops_per_s"]]
        return {"runs": runs, "median": median, "per_round_ratios": per_round,
                "ratios": {k: _median(v) if v else None for k, v in per_round.items()}}

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
        measured = await self.measure_rounds()
        key = ratio_key("cellar-http", "etcd-http")
        return {
            "targets": list(self.targets), "sessions": self.sessions, "binary_sessions": self.binary_sessions,
            "seconds": self.seconds, "warmup": self.warmup, "rounds": self.rounds, "value_bytes": self.value_bytes,
            "fsync": self.fsync, "etcd": etcd_version(self.etcd.binary) if self.etcd else None,
            "pysyncobj": self.pysyncobj_version, "durability": self.durability(),
            "runs": measured["runs"], "median": measured["median"],
            "ratio_cellar_http_over_etcd_http": measured["ratios"].get(key),
            "per_round_ratios": measured["per_round_ratios"].get(key, []),
            "ratios": measured["ratios"], "per_round_ratios_all": measured["per_round_ratios"],
        }


def _median(xs: list) -> Any:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def _ms(x: float | None) -> str:
    return f"{x:7.2f} ms" if x is not None else "      - ms"


def target_table(median: dict, targets: list[str]) -> list[str]:
    lines = [f"{'target':<17} {'sessions':>8} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} "
             f"{'client CPU':>10} {'server CPU/op':>13}"]
    for t in targets:
        m = median[t]
        p50 = f"{m['p50_ms']:.2f}" if m["p50_ms"] is not None else "-"
        p99 = f"{m['p99_ms']:.2f}" if m["p99_ms"] is not None else "-"
        cpu = f"{m['server_cpu_ms_per_op']:.3f} ms" if m["server_cpu_ms_per_op"] is not None else "-"
        lines.append(f"{t:<17} {m['sessions']:>8} {m['ops_per_s']:>9.0f} {p50:>8} {p99:>8} {m['errors']:>7} "
                     f"{m['client_cpu_pct']:>9.0f}% {cpu:>13}")
    return lines


def ratio_lines(ratios: dict, per_round: dict) -> list[str]:
    return [f"{k} throughput: {v:.2f}x (per round: {per_round[k]})" if v is not None else f"{k}: -"
            for k, v in ratios.items()]


def durability_lines(durability: dict[str, str]) -> list[str]:
    return [f"durability, {k}: {d}" for k, d in durability.items()]


def format_table(result: dict) -> str:
    lines = [f"median of {result['rounds']} round(s) of {result['seconds']:g} s, 3 replicas each, loopback, "
             f"{result['value_bytes']}-byte values, closed loop; Cellar fsync={result['fsync']}"
             + (f"; {result['etcd']}" if result.get("etcd") else "")
             + (f"; PySyncObj {result['pysyncobj']}" if result.get("pysyncobj") else ""),
             *target_table(result["median"], result["targets"]),
             *ratio_lines(result["ratios"], result["per_round_ratios_all"])]
    lines += durability_lines(result["durability"])
    return "\n".join(lines)


def parse_targets(text: str) -> tuple[str, ...]:
    chosen = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in chosen if t not in TARGETS]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        raise click.BadParameter(f"{text!r}: choose some of {', '.join(TARGETS)}, each once", param_hint="--targets")
    return chosen


def run(targets: tuple[str, ...], sessions: int, binary_sessions: int, seconds: float, warmup: float, rounds: int,
        value_bytes: int, fsync: str, etcd: str, keep: bool, as_json: bool, quiet: bool) -> dict:
    """The whole benchmark; processes are stopped (by PID) whatever happens."""
    from store.server import install_loop, tune_gc

    etcd_binary, pysyncobj = find_peers(targets, etcd)
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
                  root=root, progress=say, live=live, pysyncobj_version=pysyncobj)
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


def load_options(targets: tuple[str, ...], warmup: float, rounds: int) -> Callable:
    """``--targets --seconds --warmup --rounds --value-bytes --fsync --etcd --keep``, as
    ``cellar bench kv-http`` and ``cellar bench peers`` take them."""
    def deco(f: Callable) -> Callable:
        for opt in reversed([
            click.option("--targets", default=",".join(targets), show_default=True,
                         help=f"Which of {', '.join(TARGETS)} to measure, comma-separated."),
            click.option("--seconds", type=click.FloatRange(0.5, 3600), default=10.0, show_default=True,
                         help="Measured seconds per target and round (and client count)."),
            click.option("--warmup", type=click.FloatRange(0, 60), default=warmup, show_default=True,
                         help="Unmeasured load before each measurement."),
            click.option("--rounds", type=click.IntRange(1, 20), default=rounds, show_default=True),
            click.option("--value-bytes", type=click.IntRange(8, 1 << 16), default=16, show_default=True),
            click.option("--fsync", type=click.Choice(["always", "batch", "never"]), default="batch",
                         show_default=True,
                         help="Cellar's WAL fsync policy (etcd always syncs its WAL before acknowledging)."),
            click.option("--etcd", "etcd", default="etcd", show_default=True, metavar="PATH", help="The etcd binary."),
            click.option("--keep", is_flag=True, help="Keep the data dirs and logs."),
        ]):
            f = opt(f)
        return f
    return deco


@click.command("kv-http")
@load_options(KV_HTTP_DEFAULT, warmup=1.0, rounds=2)
@click.option("--sessions", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Concurrent closed-loop HTTP sessions (cellar-http and etcd-http).")
@click.option("--binary-sessions", type=click.IntRange(1, 100_000), default=256, show_default=True,
              help="Sessions of the binary client (cellar bench's default).")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON only (progress on stderr).")
def kv_http(targets, sessions, binary_sessions, seconds, warmup, rounds, value_bytes, fsync, etcd, keep, quiet,
            as_json) -> None:
    """Write throughput through Cellar's HTTP API beside etcd's JSON gateway (3 members each on
    127.0.0.1, same closed-loop put load, same run), and through Cellar's binary client."""
    chosen = parse_targets(targets)
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
    """``cellar bench`` as before (its options, no subcommand), plus ``cellar bench kv-http``,
    ``geo``, ``peers`` and the paper's figures."""


def _bench_group() -> click.Group:
    from bench.cluster_bench import bench as cluster
    from bench.failover_bench import failover
    from bench.geo_bench import geo
    from bench.load_bench import load
    from bench.peers_bench import peers
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
                       "one-round-trip bound (see `cellar bench geo --help`).\n\n`cellar bench peers`: Cellar "
                       "beside etcd and PySyncObj at several client counts (see `cellar bench peers --help`)."
                       "\n\n`cellar bench failover`, `reads`, "
                       "`straggler`: the SDPaxos paper's Figs. 14, 11 and 9 on real processes.\n\n`cellar bench "
                       "load`: write latency against offered load, open and closed loop (see `cellar bench load "
                       "--help`).",
                       short_help=cluster.short_help)
    group.add_command(kv_http)
    group.add_command(geo)
    group.add_command(failover)
    group.add_command(reads)
    group.add_command(straggler)
    group.add_command(load)
    group.add_command(peers)
    return group


bench = _bench_group()

if __name__ == "__main__":
    kv_http()
