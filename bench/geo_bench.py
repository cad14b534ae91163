"""``cellar bench geo``: per-site commit latency of real replicas behind wide-area delays,
beside the simulator's figure and the one-round-trip bound (SDPaxos paper, Fig. 12).

One replica per site (3 replicas: CA, OR, OH; 5: CA, OR, OH, IRE, SEL), the sequencer
(Multi-Paxos: the leader) at CA as in the paper. The round-trip times are Table 1 of
the paper, the one copy the simulator uses (``consensus.sim.geo``), or ``--rtt-file``;
``--rtt-scale`` multiplies them all (a quick run at 0.1 keeps the shape).

For each protocol (fresh processes each) the replicas are real ``cellar serve``
processes (``store.server.LocalCluster``) with loopback addresses, and every byte
between them passes a delaying proxy (``bench.geo_proxy``, in this process):

- one per directed pair i->j: replica i's ``--peers`` entry for j is that proxy, which
  forwards to j's real peer port, delaying each direction by half the RTT. The
  transport keeps one connection per pair, dialed by the lower id
  (``consensus.transport.tcp``), so only the proxies i->j with i < j carry traffic
  (both directions of it); the others stay idle (``proxies.links`` in the results);
- one per site between its clients and its replica, delaying by half the site's local
  RTT (the table's diagonal), as the simulator does.

Each site runs ``--clients-per-site`` closed-loop writers (``store.loadgen.run_load``,
16-byte blind puts, keys of their own) through its own proxy only; a write's latency
is from the call to the acknowledgement. After ``--warmup`` unmeasured seconds, all
sites write at once for ``--seconds``. The simulator runs in this process first,
before any replica starts (``consensus.sim.simulator``, as ``cellar sim --rtt geo``:
same sites, table, jitter and clients per site; as many seconds, up to ~10 s of Table 1
round trips, ``sim_seconds``). The bench sets no peer order, for the replicas or the
simulator: each orders its peers as it does by itself.

The proxies and the writers share this process's event loop, on ``select()``
(``precise_loop``: microsecond timeouts where epoll and libuv round to milliseconds);
each result reports how late the proxies wrote (``lateness_ms_*``), the fsync policy
(the simulator's disk is instant) and the machine's load average.

Bounds, per site s (local = the table's diagonal, the client's own round trip):

- SDPaxos: local(s) + the RTT from s to its nearest majority (the f nearest others):
  one round trip. ``via_sequencer``: local(s) + max(that, RTT(s, sequencer)), what
  the protocol can reach when the sequencer is not in s's nearest majority (the
  paper's IRE at 5 replicas: 140 ms against the ideal 125).
- Multi-Paxos: local(s) + RTT(s, leader) (0 at the leader) + the leader's RTT to its
  nearest majority.

Results: ``OUT/geo-<UTC timestamp>/`` with ``results.json``, ``geo.png`` (real, sim
and bound per site per protocol) and ``summary.md``; ``--json`` prints the JSON.
Nothing here asserts a time. Every process started here is stopped by its PID;
every wait is bounded.

    cellar bench geo --replicas 3
    cellar bench geo --replicas 5 --protocol sdpaxos --seconds 30 --json
    cellar bench geo --replicas 3 --rtt-scale 0.1 --seconds 2 --out /tmp/geo
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import click

PROTOCOLS = ("sdpaxos", "multipaxos")
REQUEST_TIMEOUT_S = 5.0
START_TIMEOUT_S = 30.0
SEQUENCER = 0  # the first site (CA in Table 1), as in the paper


class BenchError(Exception):
    """One line on stderr and a nonzero exit."""


# --- the setting: sites, RTTs, bounds --------------------------------------------------


def geo_setting(replicas: int, rtt_file: str | None, rtt_scale: float) -> tuple[list[str], list[list[float]], str]:
    """Site names, the scaled RTT matrix (ms) and where the numbers come from."""
    from consensus.sim.geo import GEO_SITES, load_rtt_file, sites_for

    try:
        regions = load_rtt_file(rtt_file)[0] if rtt_file else GEO_SITES
        if len(regions) < replicas:  # sites_for would put two replicas in one region
            raise ValueError(f"{rtt_file}: {len(regions)} regions, {replicas} replicas need one each")
        names, matrix = sites_for(replicas, "geo", rtt_file)
    except ValueError as e:
        raise BenchError(str(e)) from None
    source = rtt_file or "SDPaxos paper (extended), Table 1 (consensus/sim/geo.py GEO_RTT_MS)"
    return names, [[v * rtt_scale for v in row] for row in matrix], source


def _majority_rtt(matrix: list[list[float]], s: int) -> float:
    """RTT from s to the farthest of its f nearest other replicas (s plus them: a majority)."""
    n = len(matrix)
    others = sorted(matrix[s][j] for j in range(n) if j != s)
    return others[n // 2 - 1]


def bounds(matrix: list[list[float]], protocol: str, leader: int = SEQUENCER) -> list[dict]:
    """Per site: the one-round-trip bound in ms (module docstring), with its parts."""
    out = []
    for s in range(len(matrix)):
        local = matrix[s][s]
        if protocol == "sdpaxos":
            maj = _majority_rtt(matrix, s)
            to_seq = matrix[s][leader] if s != leader else 0.0
            out.append({"bound_ms": round(local + maj, 3), "via_sequencer_ms": round(local + max(maj, to_seq), 3),
                        "local_ms": local, "majority_ms": maj})
        else:
            to_leader = matrix[s][leader] if s != leader else 0.0
            maj = _majority_rtt(matrix, leader)
            out.append({"bound_ms": round(local + to_leader + maj, 3), "local_ms": local, "to_leader_ms": to_leader,
                        "leader_majority_ms": maj})
    return out


def write_rtt_table(path: str, names: list[str], matrix: list[list[float]], source: str, scale: float) -> None:
    doc = {"source": source, "scale": scale, "regions": names,
           "rtt_ms": {a: {b: round(matrix[i][j], 6) for j, b in enumerate(names)} for i, a in enumerate(names)}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def simulate(protocol: str, replicas: int, rtt_file: str, clients_per_site: int, seconds: float, jitter: float,
             seed: int) -> dict:
    """The simulator's figure for the same setting (what ``cellar sim --rtt geo`` runs)."""
    from consensus.sim.simulator import SimConfig, Simulation
    from store.machines import install_in_simulator

    install_in_simulator()  # SimConfig.machine resolves through store.machines
    cfg = SimConfig(protocol=protocol, replicas=replicas, rtt="geo", rtt_file=rtt_file, sequencer=SEQUENCER,
                    clients_per_site=clients_per_site, seconds=seconds, seed=seed, jitter=jitter)
    try:
        return Simulation(cfg).run().summary()
    except ValueError as e:
        raise BenchError(f"simulator: {e}") from None


# --- real processes behind the proxies -------------------------------------------------


def _local_cluster_class() -> type:
    from store.server import LocalCluster

    class GeoCluster(LocalCluster):
        """A ``LocalCluster`` whose node i dials peer j at ``dial[i][j]`` (a proxy)."""

        dial: dict[int, dict[int, tuple[str, int]]]  # set before start_all

        def peers_spec_for(self, i: int) -> str:
            return ",".join(f"{j}={h}:{p}" for j, (h, p) in sorted(self.dial[i].items()))

    return GeoCluster


class GeoRun:
    """One protocol: replicas, proxies, per-site load; stopped by PID whatever happens."""

    def __init__(self, protocol: str, names: list[str], matrix: list[list[float]], *, clients_per_site: int,
                 seconds: float, warmup: float, jitter: float, seed: int, fsync: str, root: str,
                 say: Callable[[str], None], progress: Any) -> None:
        self.protocol = protocol
        self.names = names
        self.matrix = matrix
        self.n = len(names)
        self.clients_per_site = clients_per_site
        self.seconds = seconds
        self.warmup = warmup
        self.jitter = jitter
        self.seed = seed
        self.fsync = fsync
        self.root = root
        self.say = say
        self.progress = progress
        self.cluster: Any = None
        self.peer_proxies: dict[tuple[int, int], Any] = {}
        self.client_proxies: dict[int, Any] = {}

    async def start(self) -> None:
        from bench.geo_proxy import DelayProxy

        cls = _local_cluster_class()
        self.cluster = cls(self.root, self.n, protocol=self.protocol, fsync=self.fsync, cluster_id="geo",
                           extra_args=["--sequencer", str(SEQUENCER)])
        c = self.cluster
        m = self.matrix
        dial: dict[int, dict[int, tuple[str, int]]] = {}
        for i in range(self.n):
            dial[i] = {i: ("127.0.0.1", c.peer_ports[i])}
            for j in range(self.n):
                if i == j:
                    continue
                proxy = DelayProxy(("127.0.0.1", c.peer_ports[j]), m[i][j] / 2, m[j][i] / 2, jitter=self.jitter,
                                   seed=self.seed, name=f"{self.names[i]}->{self.names[j]}")
                self.peer_proxies[(i, j)] = proxy
                dial[i][j] = await proxy.start()
            cp = DelayProxy(c.client_addresses[i], m[i][i] / 2, jitter=self.jitter, seed=self.seed,
                            name=f"clients@{self.names[i]}")
            self.client_proxies[i] = cp
            await cp.start()
        c.dial = dial
        c.start_all()
        try:
            await c.await_ready(timeout_s=START_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as e:
            raise BenchError(f"{self.protocol}: {e}") from None

    async def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop_all()
        for p in [*self.peer_proxies.values(), *self.client_proxies.values()]:
            await p.close()

    async def measure(self) -> dict:
        from store.loadgen import LoadResult, run_load
        from store.client import CellarClient, CellarError

        clients = [CellarClient([self.client_proxies[i].address], timeout_s=REQUEST_TIMEOUT_S, deadline_s=15.0)
                   for i in range(self.n)]
        try:
            # Every site commits once (peers connected through the proxies, view settled).
            deadline = time.monotonic() + START_TIMEOUT_S
            for i, cl in enumerate(clients):
                while True:  # bounded by the deadline
                    try:
                        await asyncio.wait_for(cl.session().put(f"{self.names[i]}/warm", "up"),
                                               max(0.1, deadline - time.monotonic()))
                        break
                    except (CellarError, ConnectionError, OSError, asyncio.TimeoutError) as e:
                        if time.monotonic() > deadline:
                            raise BenchError(f"{self.protocol}: site {self.names[i]} did not commit within "
                                             f"{START_TIMEOUT_S:g} s ({type(e).__name__}: {e}); "
                                             f"{self.cluster.log_tail(i, 2)}") from None
                        await asyncio.sleep(0.2)
            results: list[LoadResult] = []

            async def load(phase: str, seconds: float, seed: int) -> list[LoadResult]:
                task = self.progress.add_task(f"{self.protocol} {phase}", total=seconds)
                t0 = time.monotonic()
                live: dict[int, LoadResult] = {}

                def tick(i: int) -> Callable[[LoadResult], None]:
                    def on(res: LoadResult) -> None:
                        live[i] = res
                        ops = " ".join(f"{self.names[k]} {live[k].ops}" for k in sorted(live))
                        self.progress.update(task, completed=min(seconds, time.monotonic() - t0),
                                             description=f"{self.protocol} {phase}: {ops}")
                    return on

                try:
                    return list(await asyncio.gather(*[
                        run_load(cl, sessions=self.clients_per_site, seconds=seconds, seed=seed * 100 + i,
                                 key_prefix=f"{self.names[i]}/", on_progress=tick(i))
                        for i, cl in enumerate(clients)]))
                finally:
                    self.progress.remove_task(task)

            if self.warmup:
                await load("warm-up", self.warmup, 2)
            for p in [*self.peer_proxies.values(), *self.client_proxies.values()]:
                p.stats.reset()  # the measured seconds only
            results = await load("measuring", self.seconds, 1)
        finally:
            for cl in clients:
                await cl.close()
        sites = {}
        for i, res in enumerate(results):
            ok = res.ops > 0
            sites[self.names[i]] = {
                "p50_ms": round(res.percentile(0.50), 2) if ok else None,
                "p99_ms": round(res.percentile(0.99), 2) if ok else None,
                "mean_ms": round(sum(res.latencies_ms) / res.ops, 2) if ok else None,
                "ops": res.ops, "errors": res.errors, "seconds": round(res.seconds, 2),
            }
        return {"sites": sites, "proxies": self.proxy_summary()}

    def proxy_summary(self) -> dict:
        peer = [p.stats.as_dict() for p in self.peer_proxies.values()]
        client = [p.stats.as_dict() for p in self.client_proxies.values()]
        every = peer + client
        proxies = [*self.peer_proxies.values(), *self.client_proxies.values()]
        chunks = sum(p.stats.chunks for p in proxies)
        return {
            "links": {p.name: {"connections": p.stats.connections, "bytes": p.stats.bytes_forward + p.stats.bytes_back}
                      for p in self.peer_proxies.values()},
            "lateness_ms_mean": round(sum(p.stats.lateness_ms_total for p in proxies) / chunks, 3) if chunks else 0.0,
            "lateness_ms_max": max((s["lateness_ms_max"] for s in every), default=0.0),
            "lateness_ms_p99_worst": max((s["lateness_ms_p99"] for s in every), default=0.0),
            "backpressure_waits": sum(s["backpressure_waits"] for s in every),
            "client_connections": sum(s["connections"] for s in client),
        }


# --- the whole benchmark ---------------------------------------------------------------


def git_commits() -> dict[str, str | None]:
    """``head``: the commit this code runs from; ``core``: the last commit that changed
    consensus/ (the protocols and the runtime), ``+dirty`` with local changes there."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    head = git("rev-parse", "--short=12", "HEAD")
    core = git("log", "-1", "--format=%h", "--abbrev=12", "--", "consensus")
    if core and git("status", "--porcelain", "--", "consensus"):
        core += "+dirty"
    return {"head": head, "core": core}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def sim_seconds(seconds: float, rtt_scale: float, clients_per_site: int) -> float:
    """Simulated seconds: as long as the measurement, but at most about 10 s of Table 1
    round trips for 4 writers per site (the simulator's cost grows with the commits, so
    with smaller RTTs and more writers; its latencies settle within a few round trips)."""
    return round(min(seconds, max(0.5, 10.0 * rtt_scale * min(1.0, 4 / clients_per_site))), 3)


def prepare(*, replicas: int, protocols: tuple[str, ...], seconds: float, warmup: float, clients_per_site: int,
            rtt_scale: float, rtt_file: str | None, jitter: float, seed: int, fsync: str, out_dir: str,
            say: Callable[[str], None]) -> tuple[dict, dict]:
    """The result's header, the RTT table in ``out_dir`` and the simulator's figures
    (before any process starts, outside the event loop: Ctrl-C interrupts it at once)."""
    names, matrix, source = geo_setting(replicas, rtt_file, rtt_scale)
    table_path = os.path.join(out_dir, "rtt-table.json")
    write_rtt_table(table_path, names, matrix, source, rtt_scale)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    simulated = sim_seconds(seconds, rtt_scale, clients_per_site)
    result: dict[str, Any] = {
        "experiment": "geo", "started_utc": started, **{f"{k}_commit": v for k, v in git_commits().items()},
        "replicas": replicas, "sites": names, "sequencer": names[SEQUENCER], "protocols": list(protocols),
        "seconds": seconds, "warmup": warmup, "clients_per_site": clients_per_site, "rtt_scale": rtt_scale,
        "rtt_source": source, "rtt_ms": {a: {b: round(matrix[i][j], 6) for j, b in enumerate(names)}
                                         for i, a in enumerate(names)},
        "jitter": jitter, "seed": seed, "fsync": fsync, "value_bytes": 16, "peer_order": "not set (the runtime's own)",
        "sim_seconds": simulated, "results": {}, "cpus": os.cpu_count(),
    }
    sims = {}
    for protocol in protocols:
        say(f"simulating {protocol}, {replicas} replicas, {simulated:g} s")
        sims[protocol] = simulate(protocol, replicas, table_path, clients_per_site, simulated, jitter, seed)
    return result, sims


async def run_geo(result: dict, sims: dict, *, keep: bool, say: Callable[[str], None], progress: Any) -> dict:
    """Each protocol on real processes; fills ``result["results"]``."""
    names, replicas, protocols = result["sites"], result["replicas"], result["protocols"]
    matrix = [[result["rtt_ms"][a][b] for b in names] for a in names]
    seconds, warmup, clients_per_site = result["seconds"], result["warmup"], result["clients_per_site"]
    jitter, seed, fsync = result["jitter"], result["seed"], result["fsync"]
    result["load_average_before"] = _loadavg()
    for protocol in protocols:
        root = tempfile.mkdtemp(prefix=f"cellar-bench-geo-{protocol}-")
        run = GeoRun(protocol, names, matrix, clients_per_site=clients_per_site, seconds=seconds, warmup=warmup,
                     jitter=jitter, seed=seed, fsync=fsync, root=root, say=say, progress=progress)
        try:
            say(f"{protocol}: starting {replicas} replicas behind {replicas * (replicas - 1)} peer proxies and "
                f"{replicas} client proxies (data and logs in {root})")
            await run.start()
            real = await run.measure()
        finally:
            await run.stop()
            if not keep:
                shutil.rmtree(root, ignore_errors=True)
        sim = sims[protocol]
        per_site = {}
        for s, name in enumerate(names):
            r = real["sites"][name]
            sm = sim["sites"][name]
            b = bounds(matrix, protocol)[s]
            per_site[name] = {
                "real": r,
                "sim": {"p50_ms": sm["p50_ms"], "p99_ms": sm["p99_ms"], "mean_ms": sm["mean_ms"],
                        "commits": sm["commits"]},
                "bound": b,
                "real_over_sim_p50": _ratio(r["p50_ms"], sm["p50_ms"]),
                "real_over_bound_p50": _ratio(r["p50_ms"], b["bound_ms"]),
            }
            say(f"{protocol:10s} {name:4s} real p50 {_f(r['p50_ms'])}  sim p50 {_f(sm['p50_ms'])}  "
                f"bound {_f(b['bound_ms'])}  ops {r['ops']}  errors {r['errors']}")
        result["results"][protocol] = {
            "sites": per_site, "proxies": real["proxies"],
            "sim_checks": {k: sim[k] for k in ("consistent", "agreement", "lost_acked", "duplicated", "trace_hash")},
        }
    result["load_average_after"] = _loadavg()
    return result


def _loadavg() -> list[float] | None:
    """The machine's 1/5/15-minute load averages: other work shares the CPUs, and
    latency on real processes moves with it."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _f(x: float | None) -> str:
    return f"{x:7.1f} ms" if x is not None else "      - ms"


def format_table(result: dict) -> str:
    jitter = f", jitter {result['jitter']:g}" if result["jitter"] else ""
    lines = [f"{result['replicas']} replicas ({', '.join(result['sites'])}), sequencer/leader {result['sequencer']}, "
             f"{result['clients_per_site']} closed-loop writers per site, {result['seconds']:g} s measured "
             f"({result['sim_seconds']:g} s simulated), "
             f"RTT x{result['rtt_scale']:g}{jitter}, fsync={result['fsync']}, core {result['core_commit']}, "
             f"{result.get('cpus')} CPUs, load average {_load(result.get('load_average_before'))} before, "
             f"{_load(result.get('load_average_after'))} after"]
    for protocol, res in result["results"].items():
        lines.append("")
        lines.append(f"{protocol}  (ms)")
        head = f"{'site':<5} {'real p50':>9} {'real p99':>9} {'sim p50':>8} {'sim p99':>8} {'bound':>7}"
        if protocol == "sdpaxos":
            head += f" {'via seq':>8}"
        head += f" {'real/sim':>9} {'real/bound':>10} {'ops':>7} {'errors':>6}"
        lines.append(head)
        for site, row in res["sites"].items():
            r, sm, b = row["real"], row["sim"], row["bound"]
            line = (f"{site:<5} {_n(r['p50_ms']):>9} {_n(r['p99_ms']):>9} {_n(sm['p50_ms']):>8} {_n(sm['p99_ms']):>8} "
                    f"{_n(b['bound_ms']):>7}")
            if protocol == "sdpaxos":
                line += f" {_n(b['via_sequencer_ms']):>8}"
            line += (f" {_n(row['real_over_sim_p50'], 2):>9} {_n(row['real_over_bound_p50'], 2):>10} {r['ops']:>7} "
                     f"{r['errors']:>6}")
            lines.append(line)
        px = res["proxies"]
        lines.append(f"proxies: a chunk left {px['lateness_ms_mean']:.2f} ms after its due time on average, "
                     f"p99 {px['lateness_ms_p99_worst']:.2f} ms and max {px['lateness_ms_max']:.2f} ms at the worst "
                     f"proxy; backpressure waits {px['backpressure_waits']}")
    return "\n".join(lines)


def _load(avg: list[float] | None) -> str:
    return f"{avg[0]:.1f}" if avg else "?"


def _n(x: float | None, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if x is not None else "-"


def summary_md(result: dict) -> str:
    body = format_table(result).splitlines()
    return "\n".join([
        f"# geo: per-site commit latency on real processes ({result['started_utc']})", "",
        "Real `cellar serve` processes behind delaying proxies (`bench/geo_proxy.py`), the simulator "
        "(`consensus/sim`) for the same setting, and the one-round-trip bound (SDPaxos paper, Fig. 12). "
        f"RTTs: {result['rtt_source']}, scaled x{result['rtt_scale']:g}. See `results.json` and `geo.png`.", "",
        "```", *body, "```", "",
        "Bound: SDPaxos, the site's local RTT plus its RTT to its nearest majority; `via seq`, the same with the "
        "sequencer in the quorum (max with the RTT to the sequencer). Multi-Paxos: local RTT, plus the RTT to the "
        "leader, plus the leader's RTT to its nearest majority. Peer order: not set (each replica's own).", "",
        f"Command: `cellar bench geo --replicas {result['replicas']} --protocol {','.join(result['protocols'])} "
        f"--seconds {result['seconds']:g} --warmup {result['warmup']:g} --clients-per-site "
        f"{result['clients_per_site']} --rtt-scale {result['rtt_scale']:g} --jitter {result['jitter']:g} "
        f"--seed {result['seed']} --fsync {result['fsync']}`", ""])


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protocols = list(result["results"])
    fig, axes = plt.subplots(1, len(protocols), figsize=(4.5 * len(protocols) + 1, 3.8), squeeze=False)
    for ax, protocol in zip(axes[0], protocols):
        sites = list(result["results"][protocol]["sites"])
        rows = result["results"][protocol]["sites"]
        x = range(len(sites))
        series = [("real p50", [rows[s]["real"]["p50_ms"] or 0 for s in sites], "#2b8a3e"),
                  ("sim p50", [rows[s]["sim"]["p50_ms"] for s in sites], "#1c7ed6"),
                  ("bound", [rows[s]["bound"]["bound_ms"] for s in sites], "#868e96")]
        w = 0.27
        for k, (label, values, color) in enumerate(series):
            ax.bar([i + (k - 1) * w for i in x], values, width=w, label=label, color=color)
        p99 = [rows[s]["real"]["p99_ms"] or 0 for s in sites]
        ax.scatter([i - w for i in x], p99, marker="_", s=200, color="black", label="real p99", zorder=3)
        ax.set_xticks(list(x), sites)
        ax.set_ylabel("commit latency, ms")
        ax.set_title(protocol)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['replicas']} replicas, sequencer/leader {result['sequencer']}, RTT x{result['rtt_scale']:g}"
                 f", {result['clients_per_site']} writers/site, core {result['core_commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(result: dict, out_dir: str, say: Callable[[str], None]) -> None:
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(summary_md(result))
    try:
        plot(result, os.path.join(out_dir, "geo.png"))
    except ImportError:
        say("no geo.png: the plot needs matplotlib (python3 -m pip install -e '.[bench]')")


def precise_loop() -> asyncio.AbstractEventLoop:
    """asyncio on select(), whose timeout is in microseconds: the proxies' writers wake on
    timers, and epoll (asyncio's default) and libuv (uvloop, ``store.server.install_loop``)
    wait in whole milliseconds. Measured here (3 replicas, Multi-Paxos, Table 1): a chunk
    left its proxy 0.11-0.13 ms after its due time on average on select() against
    0.55-0.56 ms on epoll, and commits were 2-3 ms (4-10 %) faster. select() takes at
    most FD_SETSIZE (1024) descriptors: here two per proxied connection (clients share
    one connection per replica) plus one per proxy."""
    import selectors

    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def main(*, replicas: int, protocols: tuple[str, ...], seconds: float, warmup: float, clients_per_site: int,
         rtt_scale: float, rtt_file: str | None, jitter: float, seed: int, fsync: str, out: str, keep: bool,
         as_json: bool, quiet: bool) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from store.server import tune_gc

    geo_setting(replicas, rtt_file, rtt_scale)  # a bad table: one line, before anything is written
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for k in range(100):  # two runs within a second get their own folders
        out_dir = os.path.join(out, f"geo-{stamp}" + (f"-{k}" if k else ""))
        try:
            os.makedirs(out_dir, exist_ok=False)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise BenchError(f"cannot create {out_dir}: {e.strerror or e}") from None
    else:
        raise BenchError(f"cannot create a new folder geo-{stamp}-N under {out}")
    console = Console(stderr=True, quiet=quiet, soft_wrap=True)

    def say(msg: str) -> None:
        console.print(msg, markup=False, highlight=False)

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), console=console,
                        transient=True, disable=quiet)

    async def body() -> dict:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):  # cancel; GeoRun.stop then stops every server
            loop.add_signal_handler(sig, task.cancel)

        def quiet_cancel(loop: asyncio.AbstractEventLoop, context: dict) -> None:
            # The load's inner gathers, cancelled with the run, are nobody's error.
            if not isinstance(context.get("exception"), asyncio.CancelledError):
                loop.default_exception_handler(context)

        loop.set_exception_handler(quiet_cancel)
        with progress:
            return await run_geo(result, sims, keep=keep, say=say, progress=progress)

    tune_gc()
    try:
        result, sims = prepare(replicas=replicas, protocols=protocols, seconds=seconds, warmup=warmup,
                               clients_per_site=clients_per_site, rtt_scale=rtt_scale, rtt_file=rtt_file,
                               jitter=jitter, seed=seed, fsync=fsync, out_dir=out_dir, say=say)
        with asyncio.Runner(loop_factory=precise_loop) as runner:
            result = runner.run(body())
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)  # a run that did not finish leaves no folder
        raise
    result["out_dir"] = out_dir
    write_results(result, out_dir, say)
    say(f"results in {out_dir}")
    return result


@click.command("geo")
@click.option("--replicas", type=click.Choice(["3", "5"]), default="3", show_default=True,
              help="3: CA, OR, OH; 5: CA, OR, OH, IRE, SEL (one replica per site).")
@click.option("--protocol", "protocols", default=",".join(PROTOCOLS), show_default=True,
              help="Which of sdpaxos, multipaxos to measure, comma-separated.")
@click.option("--seconds", type=click.FloatRange(0.5, 3600), default=20.0, show_default=True,
              help="Measured seconds per protocol (simulated: as long, at most ~10 s of Table 1 round trips).")
@click.option("--warmup", type=click.FloatRange(0, 600), default=3.0, show_default=True,
              help="Unmeasured load first (connections, views and RTT estimates settle).")
@click.option("--clients-per-site", type=click.IntRange(1, 1000), default=4, show_default=True,
              help="Closed-loop writers at each site, through the site's proxy to its replica.")
@click.option("--rtt-scale", type=click.FloatRange(0.001, 100), default=1.0, show_default=True,
              help="Multiply every RTT (0.1: ten times faster, same shape).")
@click.option("--rtt-file", type=click.Path(exists=True, dir_okay=False),
              help="RTT table JSON {regions, rtt_ms} (default: the paper's Table 1).")
@click.option("--jitter", type=click.FloatRange(0, 10), default=0.0, show_default=True,
              help="Extra delay per chunk, uniform up to this fraction of the one-way (seeded; order kept).")
@click.option("--seed", type=int, default=1, show_default=True, help="Jitter and simulator seed.")
@click.option("--fsync", type=click.Choice(["always", "batch", "never"]), default="batch", show_default=True,
              help="The replicas' WAL fsync policy. The simulator's disk is instant: 'never' compares like with "
                   "like, 'batch' adds this machine's fsync time to every commit.")
@click.option("--out", type=click.Path(file_okay=False), default=os.path.join("bench", "results"), show_default=True,
              help="Results go to OUT/geo-<UTC timestamp>/.")
@click.option("--keep", is_flag=True, help="Keep the replicas' data dirs and logs.")
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON only.")
def geo(replicas, protocols, seconds, warmup, clients_per_site, rtt_scale, rtt_file, jitter, seed, fsync, out, keep,
        quiet, as_json) -> None:
    """Per-site commit latency of real replicas behind delaying proxies (the paper's
    Table 1 RTTs, sequencer at CA), beside the simulator and the one-round-trip bound."""
    chosen = tuple(p.strip() for p in protocols.split(",") if p.strip())
    if not chosen or any(p not in PROTOCOLS for p in chosen) or len(set(chosen)) != len(chosen):
        raise click.BadParameter(f"{protocols!r}: choose some of {', '.join(PROTOCOLS)}, each once",
                                 param_hint="--protocol")
    try:
        result = main(replicas=int(replicas), protocols=chosen, seconds=seconds, warmup=warmup,
                      clients_per_site=clients_per_site, rtt_scale=rtt_scale, rtt_file=rtt_file, jitter=jitter,
                      seed=seed, fsync=fsync, out=out, keep=keep, as_json=as_json, quiet=quiet)
    except BenchError as e:
        click.echo(f"cellar bench geo: {e}", err=True)
        sys.exit(1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("cellar bench geo: interrupted; every server stopped", err=True)
        sys.exit(130)
    except (OSError, RuntimeError, asyncio.TimeoutError) as e:
        click.echo(f"cellar bench geo: {type(e).__name__}: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(format_table(result))


if __name__ == "__main__":
    geo()
