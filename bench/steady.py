"""``cellar steady``: a steady load on a local cluster with snapshots on, watched for
stalls (issue 16: "no pause that costs a view change").

Starts ``--replicas`` ``cellar serve`` processes on 127.0.0.1 (snapshots every
``--snapshot-every`` executed slots, taken in a forked child unless
``--snapshot-on-loop``), runs the closed-loop write load of ``cellar bench``
(``--sessions`` clients, each writing ``--keys`` keys of its own, so the state grows
to sessions x keys entries) for ``--seconds``, samples every replica's status each
second, and reports: view changes, the longest event-loop pause and the pauses of 50
ms or more per replica (the node's own lag monitor), snapshots taken, writes/s,
p50/p99/p99.9/max latency and the longest time without a completed write.

    cellar steady --seconds 600                      # the 10-minute run of issue 16
    cellar steady --seconds 600 --rate 4000          # the same, paced below saturation
    cellar steady --seconds 30 --snapshot-on-loop    # the old path, for comparison

Unpaced, the sessions saturate the machine (3 replicas and the load generator on 2
cores: every replica waits for a core, and those waits are loop pauses too);
``--rate`` paces the load, so the pauses left are the replicas' own.
``--check`` exits 1 unless there was no view change, no pause of 50 ms or more and
p99.9 <= 30 ms. Every loop stops by itself; the cluster is stopped by PID.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import click

from store.loadgen import run_load
from store.client import CellarClient
from store.server import LocalCluster, install_loop, tune_gc


async def _statuses(cellar: CellarClient) -> list[dict | None]:
    # No digest: computing it is a pass over the whole state on the node's loop.
    return [None if "error" in st else st for st in await cellar.statuses(digest=False)]


async def run_steady(*, replicas: int, sessions: int, seconds: float, snapshot_every: int, keys: int,
                     value_bytes: int, fsync: str, fork: bool, progress=None, rate: float = 0.0) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="cellar-steady-")
    conf = os.path.join(root, "node.toml")
    with open(conf, "w") as f:
        f.write(f"snapshot_fork = {'true' if fork else 'false'}\n")
    cluster = LocalCluster(root, replicas, fsync=fsync,
                           extra_args=["--config", conf, "--snapshot-every", str(snapshot_every)])
    cluster.start_all()
    try:
        await cluster.await_ready(timeout_s=30.0)
        async with CellarClient(cluster.client_addresses, timeout_s=5.0, deadline_s=30.0) as cellar:
            await asyncio.wait_for(cellar.session().put("steady-probe", "ok"), 20.0)
            first = await _statuses(cellar)
            views: set[int] = {s["view"] for s in first if s}
            worst_1s = [0.0] * replicas  # the longest loop pause seen in any sampled second
            stop = time.monotonic() + seconds + 1.0

            async def sample() -> None:
                while time.monotonic() < stop:
                    await asyncio.sleep(1.0)
                    for i, st in enumerate(await _statuses(cellar)):
                        if st:
                            views.add(st["view"])
                            worst_1s[i] = max(worst_1s[i], st["loop"]["lag_max_ms_1s"])

            def show(r) -> None:
                if progress is not None:
                    progress(r)

            sampler = asyncio.create_task(sample())
            t_load = time.monotonic()
            load = await run_load(cellar, sessions=sessions, seconds=seconds, value_bytes=value_bytes, keys=keys,
                                  record_completions=True, on_progress=show, rate=rate)
            await asyncio.wait_for(sampler, 10.0)
            last = await _statuses(cellar)
    finally:
        cluster.stop_all()
        shutil.rmtree(root, ignore_errors=True)  # the replicas' data: nothing to keep once stopped
    nodes = []
    for i in range(replicas):
        a, b = first[i] or {}, last[i] or {}
        sa, sb = a.get("stats", {}), b.get("stats", {})
        la, lb = a.get("loop", {}), b.get("loop", {})  # pauses_50ms counts since start: take the difference
        nodes.append({
            "id": i,
            "reachable": bool(last[i]),
            "snapshots_taken": sb.get("snapshots_taken", 0) - sa.get("snapshots_taken", 0),
            "snapshot_forks": sb.get("snapshot_forks", 0) - sa.get("snapshot_forks", 0),
            "pauses_50ms": lb.get("pauses_50ms", 0) - la.get("pauses_50ms", 0),
            "longest_pause_ms": round(worst_1s[i], 1),
            # CPU ms of the loop thread in each snapshot step, the longest (status()).
            "snapshot_loop_ms": b.get("snapshot_loop_ms", {}),
        })
    return {
        "replicas": replicas, "sessions": sessions, "rate": rate or None, "seconds": round(load.seconds, 1),
        "fsync": fsync,
        "snapshot_every": snapshot_every, "snapshots": "fork" if fork else "loop",
        "writes_per_s": round(load.throughput(), 1), "errors": load.errors,
        "p50_ms": round(load.percentile(0.5), 2), "p99_ms": round(load.percentile(0.99), 2),
        "p999_ms": round(load.percentile(0.999), 2), "max_ms": round(max(load.latencies_ms, default=0.0), 2),
        "longest_gap_ms": round(load.longest_gap_ms(t_load + 0.5, t_load + seconds), 1),
        "view_changes": max(0, len(views) - 1), "nodes": nodes,
    }


def verdict(result: dict[str, Any]) -> list[str]:
    """What fails issue 16's bounds (empty: all hold)."""
    bad = []
    if result["view_changes"]:
        bad.append(f"{result['view_changes']} view change(s)")
    for n in result["nodes"]:
        if n["pauses_50ms"]:
            bad.append(f"replica {n['id']}: {n['pauses_50ms']} loop pause(s) >= 50 ms (longest {n['longest_pause_ms']} ms)")
    if result["p999_ms"] > 30:
        bad.append(f"p99.9 {result['p999_ms']} ms > 30 ms")
    return bad


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--replicas", type=click.Choice(["3", "5"]), default="3", show_default=True)
@click.option("--sessions", type=click.IntRange(1, 4096), default=64, show_default=True, help="Closed-loop clients.")
@click.option("--rate", type=click.FloatRange(0, 1_000_000), default=0.0, show_default=True,
              help="Writes/s in all, paced (0: as fast as the sessions go, which saturates the machine).")
@click.option("--seconds", type=click.FloatRange(1, 7200), default=60.0, show_default=True, help="Measured seconds.")
@click.option("--snapshot-every", type=click.IntRange(1, 10_000_000), default=5000, show_default=True,
              help="Executed slots between snapshots.")
@click.option("--keys", type=click.IntRange(1, 10_000_000), default=1000, show_default=True,
              help="Keys each session writes (the state holds sessions x keys entries).")
@click.option("--value-bytes", type=click.IntRange(8, 1 << 20), default=16, show_default=True)
@click.option("--fsync", type=click.Choice(["always", "batch", "never"]), default="batch", show_default=True)
@click.option("--snapshot-on-loop", is_flag=True, help="Take snapshots on the event loop (the old path), not in a child.")
@click.option("--check", is_flag=True, help="Exit 1 unless: no view change, no pause >= 50 ms, p99.9 <= 30 ms.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON only.")
def steady(replicas, sessions, rate, seconds, snapshot_every, keys, value_bytes, fsync, snapshot_on_loop, check,
           as_json):
    """A steady write load with snapshots on: view changes, loop pauses per replica, p99.9."""
    install_loop()
    tune_gc()
    t0 = time.monotonic()

    def progress(r) -> None:
        if not as_json:
            done = time.monotonic() - t0
            sys.stderr.write(f"\r{done:6.0f} s  {r.ops:>9,} writes  {r.errors} errors ")
            sys.stderr.flush()

    try:
        result = asyncio.run(run_steady(replicas=int(replicas), sessions=sessions, seconds=seconds,
                                        snapshot_every=snapshot_every, keys=keys, value_bytes=value_bytes,
                                        fsync=fsync, fork=not snapshot_on_loop, progress=progress, rate=rate))
    except (OSError, TimeoutError, asyncio.TimeoutError) as e:
        raise click.ClickException(f"the steady run failed: {e or type(e).__name__}") from None
    bad = verdict(result)
    result["verdict"] = bad
    if as_json:
        click.echo(json.dumps(result))
    else:
        sys.stderr.write("\n")
        paced = f" paced to {rate:g} writes/s" if rate else ""
        click.echo(f"{result['replicas']} replicas, {result['sessions']} sessions{paced}, {result['seconds']} s, "
                   f"snapshots every {result['snapshot_every']} slots ({result['snapshots']}), fsync {result['fsync']}")
        click.echo(f"writes/s {result['writes_per_s']:,}  errors {result['errors']}  p50 {result['p50_ms']} ms  "
                   f"p99 {result['p99_ms']} ms  p99.9 {result['p999_ms']} ms  max {result['max_ms']} ms  "
                   f"longest gap {result['longest_gap_ms']} ms  view changes {result['view_changes']}")
        click.echo(f"{'replica':>7} {'snapshots':>9} {'pauses>=50ms':>12} {'longest pause ms':>16}")
        for n in result["nodes"]:
            click.echo(f"{n['id']:>7} {n['snapshots_taken']:>9} {n['pauses_50ms']:>12} {n['longest_pause_ms']:>16}")
        click.echo("bounds hold" if not bad else "bounds broken: " + "; ".join(bad))
    if check and bad:
        sys.exit(1)
