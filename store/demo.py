"""``cellar demo``: a local cluster, a live workload, the sequencer killed and restarted.

1. start ``--replicas`` ``cellar serve`` processes on 127.0.0.1 (fsync=batch);
2. run closed-loop sessions (writes and reads) with a live progress line;
3. a third of the way in, SIGKILL the sequencer; restart it a few seconds later;
4. stop the load, wait until every replica has executed the same log, and print the
   throughput, latency percentiles, the failover stall (longest time without any
   completed operation after the kill), each replica's state digest, and whether
   every acknowledged write is readable with its acknowledged value.

Exit status 0 only if the digests agree and no acknowledged write is missing.

``--machine scheduler`` runs ``store.scheduler_demo`` instead (HiveD's scheduler under
a job stream, with the same kill and restart).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import time

import click

from store.client import CellarClient
from store.loadgen import run_load
from store.server import LocalCluster, install_loop, tune_gc


async def converge(cellar: CellarClient, nodes: list[int], timeout_s: float) -> list[dict]:
    """Statuses once every node reports the same executed slot and digest (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    statuses: list[dict] = []
    while True:
        statuses = []
        for i in nodes:
            try:
                statuses.append(await cellar.status(i))
            except Exception as e:  # a node still restarting
                statuses.append({"id": i, "error": str(e)})
        ok = all("digest" in s for s in statuses)
        if ok and len({(s["exec_slot"], s["digest"]) for s in statuses}) == 1:
            return statuses
        if time.monotonic() > deadline:
            return statuses
        await asyncio.sleep(0.2)


async def run_demo(replicas: int, seconds: float, sessions: int, protocol: str, keep: bool, echo,
                   as_json: bool = False) -> int:
    root = tempfile.mkdtemp(prefix="cellar-demo-")
    cluster = LocalCluster(root, replicas, protocol=protocol, fsync="batch", cluster_id="demo")
    echo(f"Starting {replicas} replicas ({protocol}, fsync=batch) on 127.0.0.1; data and logs in {root}")
    cluster.start_all()
    try:
        await cluster.await_ready()
        for i in range(replicas):
            echo(f"  node {i}: pid {cluster.procs[i].pid}, clients 127.0.0.1:{cluster.client_ports[i]}")
        async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=30.0) as cellar:
            await asyncio.wait_for(cellar.session().put("hello", "cellar"), 20)
            seq = (await cellar.status(0))["sequencer" if protocol == "sdpaxos" else "leader"]
            kill_at = seconds / 3
            restart_after = min(3.0, seconds / 4)
            events: dict[str, float] = {}

            async def chaos() -> None:
                await asyncio.sleep(kill_at)
                events["kill"] = time.monotonic()
                cluster.kill(seq, signal.SIGKILL)
                echo(f"\n  !! SIGKILL node {seq} (the {'sequencer' if protocol == 'sdpaxos' else 'leader'}) "
                     f"at t={kill_at:.1f}s")
                await asyncio.sleep(restart_after)
                cluster.start(seq)
                await cluster.await_ready(seq)
                events["restart"] = time.monotonic()
                echo(f"\n  .. node {seq} restarted at t={kill_at + restart_after:.1f}s (recovering from its WAL)")

            t0 = time.monotonic()
            last = [0, t0]

            out = sys.stderr if as_json else sys.stdout  # --json: stdout holds the figures only
            tty = out.isatty()

            def progress(res) -> None:
                now = time.monotonic()
                if not tty and now - last[1] < 1.0:
                    return  # a log, not a terminal: one line a second
                rate = (res.ops - last[0]) / max(1e-6, now - last[1])
                last[0], last[1] = res.ops, now
                line = f"  t={now - t0:5.1f}s  ops {res.ops:>8}  now {rate:>8.0f} ops/s  errors {res.errors}"
                out.write(f"\r{line}   " if tty else f"{line}\n")
                out.flush()

            chaos_task = asyncio.create_task(chaos())
            res = await run_load(cellar, sessions=sessions, seconds=seconds, read_fraction=0.2, keys=50,
                                 record_completions=True, on_progress=progress)
            await chaos_task
            echo("")
            stall = res.longest_gap_ms(events["kill"], events.get("restart", events["kill"]) + 1.0)
            echo("verifying: waiting for every replica to reach the same state, then reading back "
                 f"{len(res.acked_writes):,} acknowledged writes ...")
            statuses = await converge(cellar, list(range(replicas)), 60)
            # Every acknowledged write must be readable with its acknowledged value.
            reader = cellar.session()
            missing = 0
            for key, value in sorted(res.acked_writes.items()):
                if await reader.get(key) != value:
                    missing += 1
            new_seq = statuses[0].get("sequencer", statuses[0].get("leader"))
        echo("")
        echo(f"throughput   {res.throughput():,.0f} ops/s over {res.seconds:.1f} s ({res.ops:,} ops, "
             f"{res.reads:,} reads, {res.errors} errors)")
        echo(f"latency      p50 {res.percentile(0.5):.1f} ms   p99 {res.percentile(0.99):.1f} ms   "
             f"max {max(res.latencies_ms):.0f} ms")
        echo(f"failover     node {seq} killed; sequencer now node {new_seq}; "
             f"longest stall after the kill {stall:.0f} ms")
        digests = {s.get("digest") for s in statuses}
        for s in statuses:
            echo(f"  node {s.get('id')}: executed slot {s.get('exec_slot')}  digest {s.get('digest')}  "
                 f"view {s.get('view')}" + (f"  ({s['error']})" if "error" in s else ""))
        same = len(digests) == 1 and None not in digests
        echo(f"replicas     {'identical state (digests match)' if same else 'DIGESTS DIFFER'}")
        echo(f"acked writes {len(res.acked_writes):,} keys checked, {missing} missing or stale")
        ok = same and missing == 0
        if as_json:
            import json

            click.echo(json.dumps({
                "ok": ok, "replicas": replicas, "protocol": protocol, "seconds": round(res.seconds, 3),
                "ops": res.ops, "reads": res.reads, "errors": res.errors,
                "throughput_ops_s": round(res.throughput(), 1),
                "latency_ms": {"p50": round(res.percentile(0.5), 3), "p99": round(res.percentile(0.99), 3),
                               "max": round(max(res.latencies_ms), 3)},
                "killed": seq, "sequencer_after": new_seq, "longest_stall_ms": round(stall, 1),
                "digests_match": same, "acked_keys_checked": len(res.acked_writes), "acked_missing": missing,
                "nodes": [{"id": st.get("id"), "exec_slot": st.get("exec_slot"), "digest": st.get("digest"),
                           "view": st.get("view")} for st in statuses],
            }, sort_keys=True))
        return 0 if ok else 1
    finally:
        cluster.stop_all()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@click.command("demo")
@click.option("--machine", type=click.Choice(["kv", "scheduler"]), default="kv", show_default=True,
              help="kv: the key-value store; scheduler: HiveD's scheduler under a job stream.")
@click.option("--replicas", type=click.Choice(["3", "5", "7"]), default="3", show_default=True, callback=lambda c, p, v: int(v))
@click.option("--seconds", type=click.FloatRange(3, 600), default=12.0, show_default=True)
@click.option("--sessions", type=click.IntRange(1, 10_000), default=None,
              help="Concurrent clients [kv: 64, scheduler: 8].")
@click.option("--protocol", type=click.Choice(["sdpaxos", "multipaxos"]), default="sdpaxos", show_default=True,
              help="kv only (the scheduler demo runs SDPaxos).")
@click.option("--hived-config", type=click.Path(dir_okay=False, exists=True),
              help="scheduler: the HiveD config [default: examples/hived-demo.yaml].")
@click.option("--seed", type=int, default=1, show_default=True, help="scheduler: the job stream's seed.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures and verdicts as one JSON object (progress on stderr).")
@click.option("--keep", is_flag=True, help="Keep the data dirs and logs.")
def demo(machine, replicas, seconds, sessions, protocol, hived_config, seed, as_json, keep) -> None:
    """A local cluster under load; the sequencer is SIGKILLed and restarted.

    With --machine scheduler: 3 scheduler replicas, a stream of jobs (gangs, priorities,
    preemption, releases, a bad node); exit 0 only if every replica ends with the same
    state, the invariants hold on each, and no acknowledged allocation is lost or
    doubled."""
    install_loop()
    tune_gc()
    if machine == "scheduler":
        from store.scheduler_demo import EXAMPLE, run_scheduler_demo

        code = asyncio.run(run_scheduler_demo(replicas, seconds, sessions or 8, seed, hived_config or str(EXAMPLE),
                                              keep, as_json, click.echo))
    else:
        if hived_config:
            raise click.UsageError("--hived-config goes with --machine scheduler")
        echo = (lambda line="": click.echo(line, err=True)) if as_json else click.echo
        code = asyncio.run(run_demo(replicas, seconds, sessions or 64, protocol, keep, echo, as_json))
    sys.exit(code)
