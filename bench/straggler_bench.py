"""``cellar bench straggler``: throughput per 100 ms with one replica slowed, and the
timeline of its detection and replacement (SDPaxos paper, Fig. 9).

Three cases, each on a fresh cluster of real ``cellar serve`` processes on loopback
(``bench.paper_common.Run``, sequencer/leader 0, ``--fsync`` batch by default):

- ``sdpaxos-sequencer``: the SDPaxos sequencer is slowed. SDPaxos judges its sequencer
  by how well it serves each replica's instances (``consensus/core/sdpaxos.py``
  ``_straggler_window``: 500 ms windows, 3 bad ones, a majority agreeing) and replaces
  it by a view change; the slowed replica then stays an ordinary slow replica;
- ``sdpaxos-replica``: an ordinary SDPaxos replica is slowed (the others leave it out
  of their quorums);
- ``multipaxos-leader``: the Multi-Paxos leader is slowed. It has no straggler
  detection: the leader stays, slow.

How a replica is slowed: a SIGSTOP/SIGCONT duty cycle sent from this process (a
thread: stopped ``--stop-ms`` of every ``--period-ms``, 40 of 60 by default, so the
replica runs at most a third of the time, as the paper's straggler, which got "roughly
one third of CPU time"). Measured here: 30 of 50 ms (running 40 %) cut SDPaxos's
throughput by about half and was not judged a straggler within 6 s; 40 of 60 and 40 of
50 were, after 1-2 s. The machine has cgroup v1 mounted, not v2, so ``cpu.max`` is not available;
the duty cycle is what is used, and it is stopped, and the process SIGCONTed, in a
``finally`` whatever happens. The slowdown starts at ``--slow-at`` s into the
``--seconds`` of load and lasts to its end.

The load: ``--sessions`` closed-loop sessions (16-byte blind writes of their own keys)
spread over every replica, each group through a client that talks to its own replica
only (``store.loadgen.run_load``). The cases' order alternates from round to round.

Reported per case: writes/s before the slowdown and while it lasts (and, for the
sequencer case, until and after the replacement), the reduction (Fig. 9a's percentage),
and from the other replicas' status (polled every 50 ms): when a view change started
(a phase other than ``normal``) and when the new sequencer served (phase ``normal``,
another sequencer). Results: ``OUT/straggler-<UTC>/`` (results.json, straggler.png,
summary.md). Nothing here asserts a time.

    cellar bench straggler                             # 3 replicas, 10 s per case, slowed from 2.5 s
    cellar bench straggler --cases sdpaxos-sequencer --seconds 8 --json
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any

import click

from bench import paper_common as pc
from bench.paper_common import BenchError

CASES = ("sdpaxos-sequencer", "sdpaxos-replica", "multipaxos-leader")
WARM_S = 0.5


class DutyCycle:
    """SIGSTOP ``stop_s`` of every ``period_s`` to one process (by its Popen), on a
    thread, until ``stop()`` or ``limit_s``; ``stop()`` always leaves it SIGCONTed."""

    def __init__(self, proc: subprocess.Popen, stop_s: float, period_s: float, limit_s: float) -> None:
        if not 0 < stop_s < period_s:
            raise ValueError("the stopped time must be within the period")
        self.proc = proc
        self.stop_s = stop_s
        self.period_s = period_s
        self.limit_s = limit_s
        self.cycles = 0
        self.stopped_s = 0.0
        self.started: float | None = None
        self.ended: float | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duty-cycle", daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def _signal(self, sig: int) -> bool:
        if self.proc.poll() is not None:  # never signal a PID that is no longer our child
            return False
        self.proc.send_signal(sig)
        return True

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        try:
            while not self._halt.is_set() and time.monotonic() < deadline:
                t = time.monotonic()
                if not self._signal(signal.SIGSTOP):
                    return
                try:
                    self._halt.wait(self.stop_s)
                finally:
                    self._signal(signal.SIGCONT)
                self.stopped_s += time.monotonic() - t
                self.cycles += 1
                self._halt.wait(max(0.0, self.period_s - self.stop_s))
        finally:
            self._signal(signal.SIGCONT)

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)
        self._signal(signal.SIGCONT)  # whatever the thread did
        if self.ended is None:
            self.ended = time.monotonic()

    def stopped_fraction(self) -> float | None:
        if self.started is None or self.ended is None or self.ended <= self.started:
            return None
        return round(self.stopped_s / (self.ended - self.started), 3)


def protocol_of(case: str) -> str:
    return case.split("-")[0]


async def one_case(case: str, *, replicas: int, sessions: int, seconds: float, slow_at: float, stop_ms: float,
                   period_ms: float, fsync: str, seed: int, frame: pc.Frame, label: str) -> dict:
    protocol = protocol_of(case)
    root = tempfile.mkdtemp(prefix=f"cellar-bench-straggler-{case}-")
    run = pc.Run(protocol, replicas, fsync, root)
    watcher: pc.StatusWatcher | None = None
    duty: DutyCycle | None = None
    task = frame.progress.add_task(f"{label}: starting", total=seconds)
    try:
        await run.start()
        orderer = await run.orderer()
        if orderer is None:
            raise BenchError(f"{case}: no replica reports a sequencer/leader in phase normal")
        target = orderer if case != "sdpaxos-replica" else (orderer + 1) % replicas
        others = [i for i in range(replicas) if i != target]
        # Every replica is watched (the slowed one answers late); the view-change
        # figures read the others' events only.
        watcher = pc.StatusWatcher(run, range(replicas), every=0.05, limit_s=seconds + 30)
        watcher.start()
        every = list(range(replicas))
        t0 = time.monotonic()
        info: dict[str, Any] = {}

        async def slow() -> None:
            await asyncio.sleep(slow_at)
            nonlocal duty
            proc = run.cluster.procs[target]
            duty = DutyCycle(proc, stop_ms / 1000, period_ms / 1000, limit_s=seconds + 10)
            info["t_slow"] = time.monotonic()
            duty.start()
            frame.say(f"{label}: replica {target} (pid {proc.pid}) slowed from t={info['t_slow'] - t0:.2f} s: "
                      f"SIGSTOP {stop_ms:g} ms of every {period_ms:g} ms")

        def tick(ops: int) -> None:
            frame.progress.update(task, completed=min(seconds, time.monotonic() - t0),
                                  description=f"{label}: {ops} writes")

        slower = asyncio.create_task(slow())
        try:
            groups = await pc.per_replica_load(run, every, sessions, seconds, seed=seed, on_progress=tick)
        finally:
            if not slower.done():
                slower.cancel()
            await asyncio.gather(slower, return_exceptions=True)
            if duty is not None:
                duty.stop()
        t_end = min(time.monotonic(), t0 + seconds)
        await watcher.stop()
        if "t_slow" not in info:
            raise BenchError(f"{case}: the slowdown did not start")
        t_slow = info["t_slow"]
        allc = sorted(c for r in groups.values() for c in r.completions)
        before = pc.rate(allc, min(t0 + WARM_S, t_slow), t_slow)
        slowed = pc.rate(allc, t_slow, t_end)
        started = watcher.first(t_slow, lambda e: e["replica"] in others and (e["phase"] != "normal" or e["orderer"] != orderer))
        replaced = watcher.first(t_slow, lambda e: e["replica"] in others and e["phase"] == "normal"
                                 and e["orderer"] not in (None, orderer))
        res: dict[str, Any] = {
            "case": case, "protocol": protocol, "slowed": target, "slowed_pid": run.pid(target),
            "orderer_before": orderer, "slow_at_s": round(t_slow - t0, 3),
            "duty_cycle": {"stop_ms": stop_ms, "period_ms": period_ms, "cycles": duty.cycles if duty else 0,
                           "stopped_fraction": duty.stopped_fraction() if duty else None},
            "before_per_s": round(before, 1), "slowed_per_s": round(slowed, 1),
            "slowed_over_before": pc.ratio(slowed, before),
            "reduction": round(1 - slowed / before, 3) if before else None,
            "view_change_started_s": round(started["t"] - t_slow, 3) if started else None,
            "replaced_s": round(replaced["t"] - t_slow, 3) if replaced else None,
            "orderer_after": replaced["orderer"] if replaced else orderer,
            "ops_per_100ms": pc.bucket_counts(allc, t0, t_end),
            "per_replica_ops_per_100ms": {str(i): pc.bucket_counts(r.completions, t0, t_end) for i, r in groups.items()},
            "ops": sum(r.ops for r in groups.values()), "errors": sum(r.errors for r in groups.values()),
            "status_events": watcher.relative(t_slow),
        }
        if replaced:
            t_r = replaced["t"]
            until = pc.rate(allc, t_slow, t_r)
            after = pc.rate(allc, min(t_r + WARM_S, t_end), t_end) if t_r + WARM_S < t_end else None
            res.update({"until_replacement_per_s": round(until, 1),
                        "after_replacement_per_s": round(after, 1) if after is not None else None,
                        "reduction_until_replacement": round(1 - until / before, 3) if before else None,
                        "reduction_after_replacement": round(1 - after / before, 3) if before and after else None})
        frame.say(f"{label}: before {res['before_per_s']:.0f}/s, slowed {res['slowed_per_s']:.0f}/s "
                  f"(reduction {res['reduction']}), view change started {res['view_change_started_s']} s, "
                  f"replaced {res['replaced_s']} s (now {res['orderer_after']})")
        return res
    finally:
        if duty is not None:
            duty.stop()
        frame.progress.remove_task(task)
        if watcher is not None:
            await watcher.stop()
        await run.stop()
        shutil.rmtree(root, ignore_errors=True)


async def run_straggler(frame: pc.Frame, *, replicas: int, sessions: int, seconds: float, slow_at: float,
                        stop_ms: float, period_ms: float, cases: list[str], rounds: int, fsync: str,
                        seed: int) -> dict:
    result = pc.header("straggler", replicas=replicas, sessions=sessions, seconds=seconds, slow_at=slow_at,
                       cases=cases, rounds=rounds, fsync=fsync, seed=seed, value_bytes=16, bucket_s=pc.BUCKET_S,
                       slowdown=f"SIGSTOP/SIGCONT duty cycle from the bench: stopped {stop_ms:g} ms of every "
                                f"{period_ms:g} ms (cgroup v1 here: no cpu.max)",
                       clients="spread over every replica, each group through its own replica")
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    for r in range(rounds):
        for case in pc.alternate(cases, r):
            runs[case].append(await one_case(case, replicas=replicas, sessions=sessions, seconds=seconds,
                                             slow_at=slow_at, stop_ms=stop_ms, period_ms=period_ms, fsync=fsync,
                                             seed=seed + r, frame=frame, label=f"round {r + 1} {case}"))

    def med(c: str, k: str) -> float | None:
        xs = [m.get(k) for m in runs[c] if m.get(k) is not None]
        return round(statistics.median(xs), 3) if xs else None

    keys = ("before_per_s", "slowed_per_s", "reduction", "view_change_started_s", "replaced_s",
            "until_replacement_per_s", "after_replacement_per_s", "reduction_until_replacement",
            "reduction_after_replacement")
    median = {c: {k: med(c, k) for k in keys} for c in cases}
    ratios: dict[str, Any] = {}
    if "sdpaxos-replica" in cases and "multipaxos-leader" in cases:
        ratios["sdpaxos_replica_over_multipaxos_leader_slowed"] = pc.ratio(
            median["sdpaxos-replica"]["slowed_per_s"], median["multipaxos-leader"]["slowed_per_s"])
    if "sdpaxos-sequencer" in cases and "multipaxos-leader" in cases:
        ratios["sdpaxos_sequencer_after_replacement_over_multipaxos_leader_slowed"] = pc.ratio(
            median["sdpaxos-sequencer"]["after_replacement_per_s"], median["multipaxos-leader"]["slowed_per_s"])
    if "sdpaxos-sequencer" in cases and "sdpaxos-replica" in cases:
        ratios["sdpaxos_sequencer_after_replacement_over_replica_slowed"] = pc.ratio(
            median["sdpaxos-sequencer"]["after_replacement_per_s"], median["sdpaxos-replica"]["slowed_per_s"])
    result.update({"runs": runs, "median": median, "ratios": ratios})
    return result


def _s(x: float | None, d: int = 2) -> str:
    return f"{x:.{d}f}" if x is not None else "-"


def format_table(result: dict) -> str:
    lines = [f"straggler: {result['replicas']} replicas, {result['sessions']} sessions over every replica, "
             f"{result['seconds']:g} s per case, slowed from {result['slow_at']:g} s ({result['slowdown']}), "
             f"{result['rounds']} round(s), fsync={result['fsync']}, core {result['core_commit']}, "
             f"{result['cpus']} CPUs, load average {pc.load_text(result['load_average_before'])} before, "
             f"{pc.load_text(result.get('load_average_after'))} after", "",
             f"{'case':<28} {'before/s':>8} {'slowed/s':>8} {'reduct.':>7} {'vc start s':>10} {'replaced s':>10} "
             f"{'until/s':>8} {'after/s':>8} {'stopped':>7}"]
    for k in range(result["rounds"]):
        for c in pc.alternate(result["cases"], k):
            m = result["runs"][c][k]
            lines.append(f"{'round ' + str(k + 1) + ' ' + c:<28} {m['before_per_s']:>8.0f} {m['slowed_per_s']:>8.0f} "
                         f"{_s(m['reduction']):>7} {_s(m['view_change_started_s']):>10} {_s(m['replaced_s']):>10} "
                         f"{_s(m.get('until_replacement_per_s'), 0):>8} {_s(m.get('after_replacement_per_s'), 0):>8} "
                         f"{_s(m['duty_cycle']['stopped_fraction']):>7}")
    lines.append("")
    for name, v in result["ratios"].items():
        lines.append(f"  {name.replace('_', ' ')}: {v}x" if v is not None else f"  {name.replace('_', ' ')}: -")
    return "\n".join(lines)


def summary_md(result: dict) -> str:
    return "\n".join([
        f"# straggler: one replica slowed ({result['started_utc']})", "",
        "SDPaxos paper, Fig. 9, on real `cellar serve` processes on loopback: the SDPaxos sequencer, an ordinary "
        "SDPaxos replica, or the Multi-Paxos leader slowed by a SIGSTOP/SIGCONT duty cycle (cgroup v1 on this "
        "machine, no `cpu.max`). `reduct.`: 1 - slowed/before (Fig. 9a's percentage); `vc start`/`replaced`: "
        "seconds from the slowdown to a view change starting / the new sequencer serving, from the other "
        "replicas' status; `until`/`after`: writes/s until and from 0.5 s after the replacement (Fig. 9b). "
        "See `results.json` and `straggler.png`.", "",
        "```", *format_table(result).splitlines(), "```", "",
        f"Command: `cellar bench straggler --replicas {result['replicas']} --seconds {result['seconds']:g} "
        f"--slow-at {result['slow_at']:g} --sessions {result['sessions']} --cases {','.join(result['cases'])} "
        f"--rounds {result['rounds']} --fsync {result['fsync']} --seed {result['seed']}`", ""])


def plot(result: dict, path: str) -> None:
    plt = pc.plt_module()
    cases = result["cases"]
    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 2.6 * len(cases)), sharex=True, squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, c in zip(axes[:, 0], cases):
        color = pc.COLORS[protocol_of(c)]
        for k, m in enumerate(result["runs"][c]):
            counts = m["ops_per_100ms"]
            xs = [j * pc.BUCKET_S for j in range(len(counts))]
            ax.step(xs, counts, where="post", color=color, linestyle=styles[k % 4], label=f"round {k + 1}")
            s = m["slow_at_s"]
            if k == 0:
                ax.axvspan(s, len(counts) * pc.BUCKET_S, color="#ffe8cc", alpha=0.6, label="replica slowed")
            if m["view_change_started_s"] is not None:
                ax.axvline(s + m["view_change_started_s"], color="#e8590c", linestyle=styles[k % 4],
                           label="view change starts" if k == 0 else None)
            if m["replaced_s"] is not None:
                ax.axvline(s + m["replaced_s"], color="#1c7ed6", linestyle=styles[k % 4],
                           label="new sequencer serves" if k == 0 else None)
                ax.annotate(f" {m['orderer_before']} -> {m['orderer_after']}", (s + m["replaced_s"], 0),
                            xytext=(2, 4), textcoords="offset points", fontsize=7, color="#1c7ed6")
        ax.annotate(f"slowed: replica {result['runs'][c][0]['slowed']}", (1, 1), xycoords="axes fraction",
                    xytext=(-4, -4), textcoords="offset points", ha="right", va="top", fontsize=7)
        ax.set_ylabel("writes / 100 ms")
        ax.set_ylim(bottom=0)
        ax.set_title(c, fontsize=9)
        ax.legend(fontsize=7, loc="lower left")
    axes[-1, 0].set_xlabel("time from the start of the load (s)")
    fig.suptitle(f"straggler, {result['replicas']} replicas, {result['sessions']} sessions, fsync={result['fsync']}, "
                 f"load {pc.load_text(result['load_average_before'])}\n{result['slowdown']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command("straggler")
@pc.common_options(seconds=10.0, sessions=64)
@click.option("--slow-at", type=click.FloatRange(0.5, 600), default=None,
              help="Seconds into the load when the slowdown starts [default: a quarter of --seconds].")
@click.option("--stop-ms", type=click.FloatRange(1, 10_000), default=40.0, show_default=True,
              help="The replica is SIGSTOPped this long ...")
@click.option("--period-ms", type=click.FloatRange(2, 20_000), default=60.0, show_default=True,
              help="... of every this long.")
@click.option("--cases", default=",".join(CASES), show_default=True, help="Which cases, comma-separated.")
@click.option("--rounds", type=click.IntRange(1, 10), default=1, show_default=True,
              help="Rounds; the cases' order alternates from round to round.")
@click.option("--seed", type=int, default=1, show_default=True)
def straggler(replicas, seconds, sessions, fsync, out, quiet, as_json, slow_at, stop_ms, period_ms, cases, rounds,
              seed) -> None:
    """Throughput per 100 ms with the SDPaxos sequencer, an SDPaxos replica or the
    Multi-Paxos leader slowed (SIGSTOP/SIGCONT duty cycle), with SDPaxos's detection and
    replacement timeline (the paper's Fig. 9)."""
    chosen = [c.strip() for c in cases.split(",") if c.strip()]
    if not chosen or any(c not in CASES for c in chosen) or len(set(chosen)) != len(chosen):
        raise click.BadParameter(f"{cases!r}: choose some of {', '.join(CASES)}, each once", param_hint="--cases")
    if stop_ms >= period_ms:
        raise click.BadParameter(f"{stop_ms:g} ms stopped of every {period_ms:g} ms: must be less than the period",
                                 param_hint="--stop-ms")
    slow_at = slow_at if slow_at is not None else round(seconds / 4, 3)
    if slow_at >= seconds - 0.5:
        raise click.BadParameter(f"{slow_at:g} s: the slowdown must start at least 0.5 s before the end of "
                                 f"--seconds ({seconds:g})", param_hint="--slow-at")

    def call() -> dict:
        async def body(frame: pc.Frame) -> dict:
            return await run_straggler(frame, replicas=replicas, sessions=sessions, seconds=seconds, slow_at=slow_at,
                                       stop_ms=stop_ms, period_ms=period_ms, cases=chosen, rounds=rounds,
                                       fsync=fsync, seed=seed)

        return pc.run_experiment("straggler", out, body, quiet=quiet, summary=summary_md, plot=plot)

    pc.cli_main("straggler", call, as_json, format_table)


if __name__ == "__main__":
    straggler()
