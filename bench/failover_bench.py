"""``cellar bench failover``: throughput per 100 ms around a SIGKILL of the sequencer
(Multi-Paxos: the leader), SDPaxos and Multi-Paxos side by side (SDPaxos paper, Fig. 14).

Each round starts, per protocol, a fresh cluster of real ``cellar serve`` processes on
loopback (``bench.paper_common.Run``, sequencer/leader 0, ``--fsync`` batch by
default). As in Fig. 14 the closed-loop writers (``store.loadgen.run_load``, 16-byte
blind puts, ``--sessions`` in all) sit at the replicas that survive, each group through
a client that talks to its own replica only. At ``--kill-at`` seconds into the
``--seconds`` of load the bench SIGKILLs, by its PID, the replica that the others'
status (polled every 50 ms) last named sequencer/leader, and keeps the load running. Protocols alternate order from round
to round so that drift in the machine's load hits both.

Reported per run (times from the kill):

- ``before_per_s``: acknowledged writes/s from 0.5 s into the load to the kill;
  ``after_per_s``: over the last third of the time after the kill;
- ``first_ack_s`` per surviving replica: the first acknowledged write *invoked after the
  kill* at that replica's clients (an ack in flight at the kill does not count);
- ``recovered_50_s``: to the end of the first 100 ms bucket back at >= 50 % of the
  pre-kill rate (all survivors together); ``longest_gap_s``: the longest time without
  any acknowledgement from the kill on;
- ``view_change_s`` per survivor: when its status first showed a new sequencer/leader
  in phase ``normal`` (polled every 50 ms); ``elected`` is that new one.

The simulator's figure for the same failover is about 0.7-1.1 s (README, heartbeats
and leases at 500 ms). Results: ``OUT/failover-<UTC>/`` (results.json, failover.png,
summary.md); ``--json`` prints the JSON. Nothing here asserts a time.

    cellar bench failover                                  # 3 replicas, 6 s, kill at 2 s, 2 rounds
    cellar bench failover --replicas 5 --seconds 8 --kill-at 3 --json
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import statistics
import tempfile
import time
from typing import Any

import click

from bench import paper_common as pc
from bench.paper_common import BenchError

WARM_S = 0.5  # the first half second of load is ramp-up, outside "before"


def analyse(groups: dict[int, Any], t0: float, t_end: float, t_kill: float) -> dict:
    """The timeline figures of one run (module docstring) from its per-replica loads."""
    from jepsen_like.plots import longest_gap

    allc = sorted(c for res in groups.values() for c in res.completions)
    before = pc.rate(allc, min(t0 + WARM_S, t_kill), t_kill)
    after = pc.rate(allc, t_kill + (t_end - t_kill) * 2 / 3, t_end)
    counts = pc.bucket_counts(allc, t0, t_end)
    per_bucket_before = before * pc.BUCKET_S
    rec = pc.recovery_time(counts, pc.BUCKET_S, t_kill - t0, 0.5 * per_bucket_before)
    first = {}
    for i, res in groups.items():
        fa = pc.first_ack_after(pc.invokes_of(res.completions, res.latencies_ms), res.completions, t_kill)
        first[str(i)] = round(fa - t_kill, 3) if fa is not None else None
    return {
        "before_per_s": round(before, 1), "after_per_s": round(after, 1),
        "after_over_before": pc.ratio(after, before),
        "first_ack_s": first,
        "first_ack_s_max": max((v for v in first.values() if v is not None), default=None),
        "recovered_50_s": rec,
        "longest_gap_s": round(longest_gap(allc, t_kill, t_end), 3),
        "ops": sum(r.ops for r in groups.values()), "errors": sum(r.errors for r in groups.values()),
        "per_replica_ops_per_100ms": {str(i): pc.bucket_counts(res.completions, t0, t_end)
                                      for i, res in groups.items()},
        "ops_per_100ms": counts,
        "kill_at_s": round(t_kill - t0, 3),
    }


async def one_run(protocol: str, *, replicas: int, sessions: int, seconds: float, kill_at: float, fsync: str,
                  seed: int, frame: pc.Frame, label: str) -> dict:
    root = tempfile.mkdtemp(prefix=f"cellar-bench-failover-{protocol}-")
    run = pc.Run(protocol, replicas, fsync, root)
    watcher: pc.StatusWatcher | None = None
    task = frame.progress.add_task(f"{label}: starting", total=seconds)
    try:
        await run.start()
        orderer = await run.orderer()
        if orderer is None:
            raise BenchError(f"{protocol}: no replica reports a sequencer/leader in phase normal")
        at = [i for i in range(replicas) if i != orderer]
        watcher = pc.StatusWatcher(run, at, every=0.05, limit_s=seconds + 30)
        watcher.start()
        events: dict[str, Any] = {}
        t0 = time.monotonic()

        async def chaos() -> None:
            await asyncio.sleep(kill_at)
            # Who orders now, as the watcher last saw it (no status round trips at the kill:
            # a loaded replica may take long to answer); the first one if nobody says.
            victim = watcher.current_orderer()
            if victim is None:
                victim = orderer
            events["victim"] = victim
            events["victim_pid"] = run.pid(victim)
            events["t_kill"] = time.monotonic()
            run.cluster.kill(victim, signal.SIGKILL)  # by its PID (Popen), then reaped
            frame.say(f"{label}: SIGKILL replica {victim} (pid {events['victim_pid']}) at "
                      f"t={events['t_kill'] - t0:.2f} s")

        def tick(ops: int) -> None:
            frame.progress.update(task, completed=min(seconds, time.monotonic() - t0),
                                  description=f"{label}: {ops} writes")

        killer = asyncio.create_task(chaos())
        try:
            groups = await pc.per_replica_load(run, at, sessions, seconds, seed=seed, on_progress=tick)
        finally:
            if not killer.done():
                killer.cancel()
        await asyncio.gather(killer, return_exceptions=True)
        t_end = time.monotonic()
        t_end = min(t_end, t0 + seconds)
        if "t_kill" not in events:
            raise BenchError(f"{protocol}: the kill did not happen")
        await watcher.stop()
        victim, t_kill = events["victim"], events["t_kill"]
        if victim in groups:  # the sequencer moved to a replica with clients before the kill
            groups.pop(victim)
        res = analyse(groups, t0, t_end, t_kill)
        new_view: dict[str, Any] = {}
        elected = None
        for i in at:
            if i == victim:
                continue
            e = watcher.first(t_kill, lambda e, i=i: e["replica"] == i and e["phase"] == "normal"
                              and e["orderer"] is not None and e["orderer"] != victim)
            new_view[str(i)] = round(e["t"] - t_kill, 3) if e else None
            if e:
                elected = e["orderer"]
        res.update({
            "protocol": protocol, "orderer_at_start": orderer, "killed": victim, "killed_pid": events["victim_pid"],
            "elected": elected,
            "clients_at": sorted(groups), "view_change_s": new_view,
            "view_change_s_max": max((v for v in new_view.values() if v is not None), default=None),
            "recovered": all(v is not None for v in res["first_ack_s"].values()) and bool(res["first_ack_s"]),
            "status_events": watcher.relative(t_kill),
        })
        frame.say(f"{label}: before {res['before_per_s']:.0f}/s, after {res['after_per_s']:.0f}/s, first ack "
                  f"{res['first_ack_s']} s, back to 50 % {res['recovered_50_s']} s, new "
                  f"{'sequencer' if protocol == 'sdpaxos' else 'leader'} {elected} seen at {new_view} s")
        return res
    finally:
        frame.progress.remove_task(task)
        if watcher is not None:
            await watcher.stop()
        await run.stop()
        shutil.rmtree(root, ignore_errors=True)


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


async def run_failover(frame: pc.Frame, *, replicas: int, sessions: int, seconds: float, kill_at: float, rounds: int,
                       fsync: str, seed: int) -> dict:
    result = pc.header("failover", replicas=replicas, sessions=sessions, seconds=seconds, kill_at=kill_at,
                       rounds=rounds, fsync=fsync, seed=seed, value_bytes=16, bucket_s=pc.BUCKET_S,
                       clients="at the replicas other than the sequencer/leader, each group through its own replica")
    runs: dict[str, list[dict]] = {p: [] for p in pc.PROTOCOLS}
    for r in range(rounds):
        for protocol in pc.alternate(pc.PROTOCOLS, r):
            runs[protocol].append(await one_run(protocol, replicas=replicas, sessions=sessions, seconds=seconds,
                                                kill_at=kill_at, fsync=fsync, seed=seed + r, frame=frame,
                                                label=f"round {r + 1} {protocol}"))
    med = {}
    for p, ms in runs.items():
        med[p] = {k: _median([m[k] for m in ms]) for k in
                  ("before_per_s", "after_per_s", "first_ack_s_max", "recovered_50_s", "longest_gap_s",
                   "view_change_s_max")}
    sd, mp = med["sdpaxos"], med["multipaxos"]
    result.update({
        "runs": runs, "median": med,
        "ratios_sdpaxos_over_multipaxos": {k: pc.ratio(sd[k], mp[k]) for k in sd},
        "all_recovered": all(m["recovered"] for ms in runs.values() for m in ms),
    })
    return result


def format_table(result: dict) -> str:
    lines = [f"failover: {result['replicas']} replicas, {result['sessions']} sessions at the survivors, "
             f"{result['seconds']:g} s per run, SIGKILL of the sequencer/leader at {result['kill_at']:g} s, "
             f"{result['rounds']} round(s), fsync={result['fsync']}, core {result['core_commit']}, "
             f"{result['cpus']} CPUs, load average {pc.load_text(result['load_average_before'])} before, "
             f"{pc.load_text(result.get('load_average_after'))} after", "",
             f"{'run':<22} {'before/s':>9} {'after/s':>8} {'first ack s':>16} {'50% s':>6} {'gap s':>6} "
             f"{'new view s':>16} {'killed':>6} {'elected':>7}"]
    for k in range(result["rounds"]):
        for p in pc.alternate(pc.PROTOCOLS, k):
            m = result["runs"][p][k]
            fa = "/".join(_s(v) for v in m["first_ack_s"].values())
            vc = "/".join(_s(v) for v in m["view_change_s"].values())
            lines.append(f"{'round ' + str(k + 1) + ' ' + p:<22} {m['before_per_s']:>9.0f} {m['after_per_s']:>8.0f} "
                         f"{fa:>16} {_s(m['recovered_50_s']):>6} {m['longest_gap_s']:>6.2f} {vc:>16} "
                         f"{m['killed']:>6} {str(m['elected']):>7}")
    lines.append("")
    lines.append("median          before/s  after/s  first ack (slowest survivor)  back to 50 %  gap  new view")
    for p in pc.PROTOCOLS:
        d = result["median"][p]
        lines.append(f"  {p:<12} {_n(d['before_per_s'], 0):>9} {_n(d['after_per_s'], 0):>8} "
                     f"{_s(d['first_ack_s_max']):>14} s {_s(d['recovered_50_s']):>12} s "
                     f"{_s(d['longest_gap_s']):>5} s {_s(d['view_change_s_max']):>6} s")
    r = result["ratios_sdpaxos_over_multipaxos"]
    lines.append(f"  SDPaxos / Multi-Paxos: before {_x(r['before_per_s'])}, after {_x(r['after_per_s'])}, first ack "
                 f"{_x(r['first_ack_s_max'])}, back to 50 % {_x(r['recovered_50_s'])}, new view "
                 f"{_x(r['view_change_s_max'])}")
    lines.append(f"  every survivor acknowledged writes after the kill: {result['all_recovered']}")
    return "\n".join(lines)


def _s(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "-"


def _x(x: float | None) -> str:
    return f"{x}x" if x is not None else "-"


def _n(x: float | None, d: int = 1) -> str:
    return f"{x:.{d}f}" if x is not None else "-"


def summary_md(result: dict) -> str:
    return "\n".join([
        f"# failover: throughput around a sequencer/leader SIGKILL ({result['started_utc']})", "",
        "SDPaxos paper, Fig. 14, on real `cellar serve` processes on loopback (no wide-area delays): closed-loop "
        "16-byte writers at the surviving replicas, the sequencer (Multi-Paxos: the leader) SIGKILLed by PID. "
        "`first ack`: the first acknowledged write invoked after the kill, per survivor; `50%`: until a 100 ms "
        "bucket is back at half the pre-kill rate; `gap`: the longest time without any acknowledgement; "
        "`new view`: when each survivor's status showed the new sequencer/leader in phase normal. Heartbeats "
        "100 ms, election timeout and lease 500 ms (the runtime's defaults). See `results.json` and `failover.png`.",
        "", "```", *format_table(result).splitlines(), "```", "",
        f"Command: `cellar bench failover --replicas {result['replicas']} --seconds {result['seconds']:g} "
        f"--kill-at {result['kill_at']:g} --sessions {result['sessions']} --rounds {result['rounds']} "
        f"--fsync {result['fsync']} --seed {result['seed']}`", ""])


def plot(result: dict, path: str) -> None:
    plt = pc.plt_module()
    fig, ax = plt.subplots(figsize=(9, 4))
    styles = ["-", "--", ":", "-."]
    for p in pc.PROTOCOLS:
        for k, m in enumerate(result["runs"][p]):
            counts = m["ops_per_100ms"]
            xs = [j * pc.BUCKET_S - m["kill_at_s"] for j in range(len(counts))]
            ax.step(xs, counts, where="post", color=pc.COLORS[p], linestyle=styles[k % len(styles)],
                    label=f"{p} round {k + 1}")
            vc = m["view_change_s_max"]
            if vc is not None:
                ax.axvline(vc, color=pc.COLORS[p], linestyle=styles[k % len(styles)], alpha=0.4)
    ax.axvline(0, color="#c92a2a", linewidth=2, label="SIGKILL of the sequencer/leader")
    ax.set_xlabel("time from the kill (s); faint lines: new view seen by every survivor")
    ax.set_ylabel("acknowledged writes per 100 ms")
    ax.set_title(f"failover, {result['replicas']} replicas, {result['sessions']} sessions at the survivors, "
                 f"fsync={result['fsync']}, load {pc.load_text(result['load_average_before'])}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command("failover")
@pc.common_options(seconds=6.0, sessions=64)
@click.option("--kill-at", type=click.FloatRange(0.5, 600), default=None,
              help="Seconds into the load when the sequencer/leader is killed [default: a third of --seconds].")
@click.option("--rounds", type=click.IntRange(1, 10), default=2, show_default=True,
              help="Rounds; the protocols' order alternates from round to round.")
@click.option("--seed", type=int, default=1, show_default=True)
def failover(replicas, seconds, sessions, fsync, out, quiet, as_json, kill_at, rounds, seed) -> None:
    """Throughput per 100 ms around a SIGKILL of the sequencer (Multi-Paxos: the leader),
    SDPaxos and Multi-Paxos alternating (the paper's Fig. 14)."""
    kill_at = kill_at if kill_at is not None else round(seconds / 3, 3)
    if kill_at >= seconds - 0.5:
        raise click.BadParameter(f"{kill_at:g} s: the kill must come at least 0.5 s before the end of --seconds "
                                 f"({seconds:g})", param_hint="--kill-at")

    def call() -> dict:
        async def body(frame: pc.Frame) -> dict:
            return await run_failover(frame, replicas=replicas, sessions=sessions, seconds=seconds, kill_at=kill_at,
                                      rounds=rounds, fsync=fsync, seed=seed)

        return pc.run_experiment("failover", out, body, quiet=quiet, summary=summary_md, plot=plot)

    pc.cli_main("failover", call, as_json, format_table)


if __name__ == "__main__":
    failover()
