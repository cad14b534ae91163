"""``cellar bench``: write throughput and latency of a loopback cluster, SDPaxos and
Multi-Paxos side by side in one run.

Each round starts a fresh cluster per protocol (real ``cellar serve`` processes,
fsync=batch by default), runs the same closed-loop load (many sessions, 16-byte
values, blind writes) for the same time, and stops it. Protocols alternate order from
round to round so that drift in the machine's load hits both alike; the figure that
matters is the ratio, measured side by side. Nothing here asserts a time.

    cellar bench                                   # 3 replicas, 256 sessions, 5 s, 2 rounds
    cellar bench --sessions 1024 --seconds 10 --rounds 3 --json
    cellar bench --plot bench.png                  # throughput and latency bars (matplotlib)
    cellar bench --machine scheduler               # the replicated HiveD scheduler (bench/scheduler_bench.py)
    cellar bench --tls                             # SDPaxos plaintext vs TLS, side by side, and their ratio
    cellar bench --early-send                      # SDPaxos without and with early send (docs/early-send.md)
    cellar bench --fsync-thread                    # each turn's fsync in a thread (the old path) vs on the loop
    cellar bench --fsync-process                   # each turn's fsync on the loop vs in a child process

With ``--tls`` the pair compared is not two protocols but one (``--protocol``,
default sdpaxos) in plaintext and with TLS on every connection (peers mutually
authenticated, clients over TLS; certificates from ``cellar certs init`` in a
temporary folder), alternating order from round to round like the protocols. With
``--early-send`` the pair is SDPaxos with the command leader's early send off (every
accept waits for the leader's own fsync, the path before it) and on. With
``--fsync-thread`` it is one protocol with each loop turn's fsync in a worker thread (the
path before 2026-11-27) and on the loop (the default); with ``--fsync-process``, on the
loop and in a child process (``fsync_worker = "process"``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import click

from bench.proc import tree_cpu_s
from store.loadgen import run_load
from store.client import CellarClient
from store.server import LocalCluster, install_loop, tune_gc

PROTOCOLS = ("sdpaxos", "multipaxos")


async def measure(protocol: str, *, replicas: int, sessions: int, seconds: float, warmup: float,
                  value_bytes: int, fsync: str, tls_dir: str | None = None, extra_args: list[str] | None = None) -> dict:
    root = tempfile.mkdtemp(prefix=f"cellar-bench-{protocol}-")
    cluster = LocalCluster(root, replicas, protocol=protocol, fsync=fsync, cluster_id="bench", tls_dir=tls_dir,
                           extra_args=extra_args)
    cluster.start_all()
    try:
        await cluster.await_ready()
        tls = {"tls": os.path.join(tls_dir, "ca.pem")} if tls_dir else {}
        async with CellarClient(cluster.client_addresses, timeout_s=5.0, **tls) as cellar:
            # Wait until the cluster commits (peers connected, views settled).
            await asyncio.wait_for(cellar.session().put("warm", "up"), 20)
            if warmup:
                await run_load(cellar, sessions=sessions, seconds=warmup, value_bytes=value_bytes, seed=7)
            cpu0, client0 = _replicas_cpu_s(cluster), time.process_time()
            res = await run_load(cellar, sessions=sessions, seconds=seconds, value_bytes=value_bytes, seed=1)
            cpu1, client1 = _replicas_cpu_s(cluster), time.process_time()
            statuses = [await cellar.status(i) for i in range(replicas)]
        fsyncs = sum(s["wal"]["fsyncs"] for s in statuses)
        return {
            "protocol": protocol,
            "writes_per_s": round(res.throughput(), 1),
            "p50_ms": round(res.percentile(0.50), 2),
            "p99_ms": round(res.percentile(0.99), 2),
            "errors": res.errors,
            "ops": res.ops,
            "fsyncs_per_s_per_node": round(fsyncs / replicas / (seconds + warmup + 1), 1),
            # The replicas' CPU (all of them, user+system) per acknowledged write over the
            # measured seconds: steadier than throughput on a shared machine.
            "replica_cpu_us_per_write": (round((cpu1 - cpu0) / res.ops * 1e6, 1)
                                         if cpu0 is not None and cpu1 is not None and res.ops else None),
            # The load generator's own CPU (this process: the client library and the
            # sessions) per acknowledged write.
            "client_cpu_us_per_write": round((client1 - client0) / res.ops * 1e6, 1) if res.ops else None,
        }
    finally:
        cluster.stop_all()
        shutil.rmtree(root, ignore_errors=True)


def _replicas_cpu_s(cluster: LocalCluster) -> float | None:
    """CPU seconds (user+system) the replica processes and their children (the fsync
    process, snapshot forks) used so far (Linux /proc), or None."""
    total = 0.0
    for proc in cluster.procs.values():
        cpu = tree_cpu_s(proc.pid)
        if cpu is None:
            return None
        total += cpu
    return total


async def run_bench(replicas: int, sessions: int, seconds: float, warmup: float, rounds: int, value_bytes: int,
                    fsync: str, progress=print) -> dict:
    runs: dict[str, list[dict]] = {p: [] for p in PROTOCOLS}
    for r in range(rounds):
        order = PROTOCOLS if r % 2 == 0 else PROTOCOLS[::-1]
        for protocol in order:
            m = await measure(protocol, replicas=replicas, sessions=sessions, seconds=seconds, warmup=warmup,
                              value_bytes=value_bytes, fsync=fsync)
            progress(f"round {r + 1} {protocol:10s} {m['writes_per_s']:>9.0f} writes/s  p50 {m['p50_ms']:6.2f} ms  "
                     f"p99 {m['p99_ms']:6.2f} ms  CPU us/write replicas {m['replica_cpu_us_per_write']} "
                     f"client {m['client_cpu_us_per_write']}  errors {m['errors']}")
            runs[protocol].append(m)
    summary = {}
    for protocol, ms in runs.items():
        summary[protocol] = {
            "writes_per_s": round(statistics.median(m["writes_per_s"] for m in ms), 1),
            "p50_ms": round(statistics.median(m["p50_ms"] for m in ms), 2),
            "p99_ms": round(statistics.median(m["p99_ms"] for m in ms), 2),
        }
    ratios = [a["writes_per_s"] / b["writes_per_s"] for a, b in zip(runs["sdpaxos"], runs["multipaxos"]) if b["writes_per_s"]]
    return {
        "replicas": replicas, "sessions": sessions, "seconds": seconds, "rounds": rounds, "value_bytes": value_bytes,
        "fsync": fsync, "runs": runs, "median": summary,
        "throughput_ratio_sdpaxos_over_multipaxos": round(statistics.median(ratios), 3) if ratios else None,
        "per_round_ratios": [round(x, 3) for x in ratios],
    }


TLS_VARIANTS = ("plaintext", "tls")
EARLY_VARIANTS = ("waiting", "early")  # --early-send: off (the path before it), on
FSYNC_VARIANTS = ("thread", "loop")  # --fsync-thread: the path before 2026-11-27, the default
FSYNC_PROCESS_VARIANTS = ("loop", "process")  # --fsync-process: the default, the child process
EXEC_VARIANTS = ("apply-first", "send-first")  # --execute-after-send: the old path, the default
# The comparisons of two `cellar serve` flags: variants and flags, the old path first.
SERVE_FLAG_PAIRS = {
    "early": (EARLY_VARIANTS, ("--no-early-send", "--early-send")),
    "fsync_thread": (FSYNC_VARIANTS, ("--fsync-worker=thread", "--fsync-worker=loop")),
    "fsync_process": (FSYNC_PROCESS_VARIANTS, ("--fsync-worker=loop", "--fsync-worker=process")),
    "exec_after": (EXEC_VARIANTS, ("--execute-inline", "--execute-after-send")),
}


async def run_tls_bench(protocol: str, replicas: int, sessions: int, seconds: float, warmup: float, rounds: int,
                        value_bytes: int, fsync: str, progress=print) -> dict:
    """The same load in plaintext and with TLS, alternating, and their ratio."""
    from store.certs import init_certs

    certs = tempfile.mkdtemp(prefix="cellar-bench-certs-")
    try:
        init_certs(certs, replicas)
        return await run_pair_bench(TLS_VARIANTS, lambda v: {"tls_dir": certs if v == "tls" else None}, protocol,
                                    replicas, sessions, seconds, warmup, rounds, value_bytes, fsync, progress)
    finally:
        shutil.rmtree(certs, ignore_errors=True)


async def run_pair_bench(variants: tuple[str, str], settings, protocol: str, replicas: int, sessions: int,
                         seconds: float, warmup: float, rounds: int, value_bytes: int, fsync: str,
                         progress=print) -> dict:
    """The same load on two variants of one cluster (``settings(variant)``: ``measure``'s
    keyword arguments), alternating order round by round, and the second's ratio to the
    first (``--tls``: plaintext and TLS; ``--early-send``: early send off and on)."""
    base, other = variants
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in (variants if r % 2 == 0 else variants[::-1]):
            m = await measure(protocol, replicas=replicas, sessions=sessions, seconds=seconds, warmup=warmup,
                              value_bytes=value_bytes, fsync=fsync, **settings(variant))
            m["variant"] = variant
            progress(f"round {r + 1} {protocol} {variant:9s} {m['writes_per_s']:>9.0f} writes/s  "
                     f"p50 {m['p50_ms']:6.2f} ms  p99 {m['p99_ms']:6.2f} ms  "
                     f"replica CPU {m['replica_cpu_us_per_write']} us/write  "
                     f"client CPU {m['client_cpu_us_per_write']} us/write  errors {m['errors']}")
            runs[variant].append(m)

    def cpu(ms: list[dict], key: str = "replica_cpu_us_per_write") -> float | None:
        xs = [m[key] for m in ms if m.get(key) is not None]
        return round(statistics.median(xs), 1) if xs else None

    summary = {v: {"writes_per_s": round(statistics.median(m["writes_per_s"] for m in ms), 1),
                   "p50_ms": round(statistics.median(m["p50_ms"] for m in ms), 2),
                   "p99_ms": round(statistics.median(m["p99_ms"] for m in ms), 2),
                   "replica_cpu_us_per_write": cpu(ms),
                   "client_cpu_us_per_write": cpu(ms, "client_cpu_us_per_write")} for v, ms in runs.items()}
    cpu_ratios = [t["replica_cpu_us_per_write"] / p["replica_cpu_us_per_write"]
                  for t, p in zip(runs[other], runs[base])
                  if t.get("replica_cpu_us_per_write") and p.get("replica_cpu_us_per_write")]
    ratios = [t["writes_per_s"] / p["writes_per_s"] for t, p in zip(runs[other], runs[base]) if p["writes_per_s"]]
    return {
        "protocol": protocol, "replicas": replicas, "sessions": sessions, "seconds": seconds, "rounds": rounds,
        "value_bytes": value_bytes, "fsync": fsync, "runs": runs, "median": summary,
        f"throughput_ratio_{other}_over_{base}": round(statistics.median(ratios), 3) if ratios else None,
        "per_round_ratios": [round(x, 3) for x in ratios],
        f"cpu_per_write_ratio_{other}_over_{base}": round(statistics.median(cpu_ratios), 3) if cpu_ratios else None,
        "per_round_cpu_ratios": [round(x, 3) for x in cpu_ratios],
    }


def _print_pair_summary(result: dict) -> None:
    med = result["median"]
    base, other = list(result["runs"])
    click.echo("")
    click.echo(f"median of {result['rounds']} round(s), {result['protocol']}, {result['replicas']} replicas, "
               f"{result['sessions']} sessions, {result['value_bytes']}-byte values, fsync={result['fsync']}")
    for v in (base, other):
        click.echo(f"  {v:10s} {med[v]['writes_per_s']:>9.0f} writes/s  p50 {med[v]['p50_ms']:6.2f} ms  "
                   f"p99 {med[v]['p99_ms']:6.2f} ms  CPU us/write replicas {med[v]['replica_cpu_us_per_write']} "
                   f"client {med[v]['client_cpu_us_per_write']}")
    click.echo(f"  {other} / {base} throughput: {result[f'throughput_ratio_{other}_over_{base}']}x "
               f"(per round: {result['per_round_ratios']})")
    click.echo(f"  {other} / {base} replica CPU per write: {result[f'cpu_per_write_ratio_{other}_over_{base}']}x "
               f"(per round: {result['per_round_cpu_ratios']})")


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    names = list(PROTOCOLS)
    med = result["median"]
    axes[0].bar(names, [med[p]["writes_per_s"] for p in names], color=["#2b8a3e", "#868e96"])
    axes[0].set_ylabel("acknowledged writes/s")
    axes[0].set_title(f"throughput (ratio {result['throughput_ratio_sdpaxos_over_multipaxos']})")
    x = range(len(names))
    axes[1].bar([i - 0.2 for i in x], [med[p]["p50_ms"] for p in names], width=0.4, label="p50")
    axes[1].bar([i + 0.2 for i in x], [med[p]["p99_ms"] for p in names], width=0.4, label="p99")
    axes[1].set_xticks(list(x), names)
    axes[1].set_ylabel("ms")
    axes[1].set_title("write latency")
    axes[1].legend()
    fig.suptitle(f"{result['replicas']} replicas, loopback, {result['sessions']} sessions, fsync={result['fsync']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _print_summary(result: dict) -> None:
    med = result["median"]
    click.echo("")
    click.echo(f"median of {result['rounds']} round(s), {result['replicas']} replicas, {result['sessions']} sessions, {result['value_bytes']}-byte values, fsync={result['fsync']}")
    for p in PROTOCOLS:
        click.echo(f"  {p:10s} {med[p]['writes_per_s']:>9.0f} writes/s  p50 {med[p]['p50_ms']:6.2f} ms  p99 {med[p]['p99_ms']:6.2f} ms")
    click.echo(f"  SDPaxos / Multi-Paxos throughput: {result['throughput_ratio_sdpaxos_over_multipaxos']}x "
               f"(per round: {result['per_round_ratios']})")


@click.command("bench")
@click.option("--machine", type=click.Choice(["kv", "scheduler"]), default="kv", show_default=True,
              help="kv: SDPaxos vs Multi-Paxos writes. scheduler: allocations+releases through the replicated "
                   "HiveD scheduler (HTTP and embedded) vs the state machine alone (bench/scheduler_bench.py).")
@click.option("--replicas", type=click.Choice(["3", "5", "7"]), default="3", show_default=True, callback=lambda c, p, v: int(v))
@click.option("--sessions", "--clients", "sessions", type=click.IntRange(1, 100_000), default=None,
              help="Concurrent closed-loop clients [default: 256 kv, 64 scheduler].")
@click.option("--seconds", type=click.FloatRange(0.5, 3600), default=5.0, show_default=True,
              help="Measured seconds (per protocol and round; per mode with --machine scheduler).")
@click.option("--warmup", type=click.FloatRange(0, 60), default=1.0, show_default=True)
@click.option("--rounds", type=click.IntRange(1, 20), default=2, show_default=True, help="kv only.")
@click.option("--value-bytes", type=click.IntRange(8, 1 << 20), default=16, show_default=True, help="kv only.")
@click.option("--fsync", type=click.Choice(["always", "batch", "never"]), default="batch", show_default=True)
@click.option("--modes", default="machine,embedded,http", show_default=True,
              help="scheduler only: which of machine, embedded, http to run, in order.")
@click.option("--nodes", type=click.IntRange(16, 1 << 16), default=1024, show_default=True,
              help="scheduler only: 8-GPU nodes of the generated HiveD cluster (a multiple of 16).")
@click.option("--vcs", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="scheduler only: virtual clusters sharing it.")
@click.option("--machine-ops", type=click.IntRange(100, 10_000_000), default=20_000, show_default=True,
              help="scheduler only: commands applied by the state machine alone.")
@click.option("--seed", type=int, default=1, show_default=True, help="scheduler only: workload seed.")
@click.option("--quiet", is_flag=True, help="scheduler only: no progress lines on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON only.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG of the medians (kv).")
@click.option("--tls", "tls", is_flag=True,
              help="kv only: compare plaintext and TLS (same protocol, alternating rounds) instead of the protocols.")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default="sdpaxos", show_default=True,
              help="The protocol of --tls.")
@click.option("--early-send", "early", is_flag=True,
              help="kv only: compare SDPaxos with the command leader's early send off and on (alternating rounds).")
@click.option("--fsync-thread", "fsync_thread", is_flag=True,
              help="kv only: compare each loop turn's fsync in a worker thread (the path before 2026-11-27) "
                   "with the default, on the loop (same protocol, alternating rounds).")
@click.option("--fsync-process", "fsync_process", is_flag=True,
              help="kv only: compare each loop turn's fsync on the loop (the default) with a child "
                   "process's (--fsync-worker process; same protocol, alternating rounds).")
@click.option("--execute-after-send", "exec_after", is_flag=True,
              help="kv only: compare a replica applying a commit before sending it (the old path, "
                   "--execute-inline) with the default, after (same protocol, alternating rounds).")
def bench(machine, replicas, sessions, seconds, warmup, rounds, value_bytes, fsync, modes, nodes, vcs, machine_ops,
          seed, quiet, as_json, plot_path, tls, protocol, early, fsync_thread, fsync_process, exec_after) -> None:
    """Write throughput and latency, SDPaxos vs Multi-Paxos, same machine, same run;
    with --machine scheduler, allocations+releases per second through the replicated
    scheduler over HTTP and embedded, beside the state machine alone."""
    chosen_pairs = [name for name, on in (("early", early), ("fsync_thread", fsync_thread),
                                          ("fsync_process", fsync_process), ("exec_after", exec_after)) if on]
    if machine == "scheduler":
        if tls or chosen_pairs:
            raise click.BadParameter("--tls, --early-send, --fsync-thread, --fsync-process and --execute-after-send "
                                     "measure the kv machine",
                                     param_hint="--tls/--early-send/--fsync-thread/--fsync-process/--execute-after-send")
        from bench import scheduler_bench

        chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
        bad = [m for m in chosen if m not in scheduler_bench.MODES]
        if bad or not chosen:
            raise click.BadParameter(f"{','.join(bad) or modes!r}: choose from {', '.join(scheduler_bench.MODES)}",
                                     param_hint="--modes")
        if plot_path:
            raise click.BadParameter("--plot draws the kv benchmark only", param_hint="--plot")
        scheduler_bench.main(chosen, replicas, nodes, vcs, sessions or 64, seconds, warmup, fsync, seed, machine_ops,
                             as_json, quiet)
        return
    sessions = sessions or 256
    if plot_path:  # before the run, not after it
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise click.ClickException("--plot needs matplotlib: python3 -m pip install -e '.[bench]'")
    install_loop()
    tune_gc()
    say = (lambda *_: None) if as_json else (lambda m: click.echo(m, err=False))
    if tls + len(chosen_pairs) > 1:
        raise click.BadParameter("one comparison at a time: --tls, --early-send, --fsync-thread, --fsync-process or "
                                 "--execute-after-send", param_hint="--early-send")
    if (fsync_thread or fsync_process) and fsync != "batch":
        raise click.BadParameter("--fsync-thread and --fsync-process compare where fsync=batch's fsync runs",
                                 param_hint="--fsync")
    if tls or chosen_pairs:
        if plot_path:
            raise click.BadParameter("--plot draws the protocol comparison only", param_hint="--plot")
        if early and protocol != "sdpaxos":
            raise click.BadParameter("early send is SDPaxos's (--protocol sdpaxos)", param_hint="--protocol")
        if chosen_pairs:
            # Each variant is a `cellar serve` flag: the old path first, then the new.
            variants, flags = SERVE_FLAG_PAIRS[chosen_pairs[0]]
            result = asyncio.run(run_pair_bench(
                variants, lambda v: {"extra_args": [flags[variants.index(v)]]},
                protocol, replicas, sessions, seconds, warmup, rounds, value_bytes, fsync, say))
        else:
            result = asyncio.run(run_tls_bench(protocol, replicas, sessions, seconds, warmup, rounds, value_bytes,
                                               fsync, progress=say))
        click.echo(json.dumps(result)) if as_json else _print_pair_summary(result)
        return
    result = asyncio.run(run_bench(replicas, sessions, seconds, warmup, rounds, value_bytes, fsync, progress=say))
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_summary(result)
    if plot_path:
        try:
            plot(result, plot_path)
        except ImportError:
            click.echo("--plot needs matplotlib: python3 -m pip install -e '.[bench]'", err=True)
            sys.exit(2)
        click.echo(f"plot written to {plot_path}", err=as_json)
