"""``cellar bench reads``: throughput against the proportion of reads, SDPaxos and
Multi-Paxos side by side (SDPaxos paper, Fig. 11).

Both clusters (real ``cellar serve`` processes on loopback, ``bench.paper_common.Run``,
sequencer/leader 0, ``--fsync`` batch by default) are started once and stay up; the
load goes to one at a time. For each read proportion (``--read-fractions``, default
0, 25, 50, 75 and 95 %) each protocol gets ``--seconds`` of closed-loop load
(``store.loadgen.run_load``: ``--sessions`` sessions spread over every replica, each
group through a client that talks to its own replica only, or with ``--clients-at
sequencer`` all at the sequencer/leader; a write is a 16-byte blind
put of the session's own keys, a read a ``get`` of a random key). The protocols'
order alternates from point to point (and round to round, ``--rounds``: each point is
the median over the rounds, the ratio the median of each round's) so that drift in
the machine's load hits both.

Reads take the client's linearizable read path (``Session.get``, ``clientwire.READ``):

- SDPaxos (``consensus/core/sdpaxos.py`` ``read``, paper §3.5): the sequencer, holding
  a lease from a majority, answers a read with the slot its last write of that key
  took; another replica asks it (``RRequest``/``RReply``: two messages), executes up
  to that slot and reads locally. No log entry, no fsync. Without a lease: the log.
- Multi-Paxos: no read path of its own here; a read is a command through the log
  (forwarded to the leader, accepted by a majority, fsynced like a write).

Reported per point: ops/s (reads and writes), p50/p99, SDPaxos over Multi-Paxos, and
each protocol against its own all-writes figure. Results: ``OUT/reads-<UTC>/``
(results.json, reads.png, summary.md). Nothing here asserts a time.

    cellar bench reads                                # 3 replicas, 5 points, 4 s each per protocol
    cellar bench reads --read-fractions 0,0.5,0.95 --seconds 3 --json
"""

from __future__ import annotations

import statistics
import tempfile
import time

import click

from bench import paper_common as pc
from bench.paper_common import BenchError

DEFAULT_FRACTIONS = "0,0.25,0.5,0.75,0.95"


def parse_fractions(text: str) -> list[float]:
    try:
        xs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated numbers in [0, 1)", param_hint="--read-fractions") from None
    if not xs or any(not 0 <= x < 1 for x in xs) or len(set(xs)) != len(xs):
        raise click.BadParameter(f"{text!r}: distinct numbers in [0, 1), e.g. {DEFAULT_FRACTIONS}",
                                 param_hint="--read-fractions")
    return xs


def point(groups: dict, seconds: float) -> dict:
    ops = sum(r.ops for r in groups.values())
    reads = sum(r.reads for r in groups.values())
    lat = sorted(x for r in groups.values() for x in r.latencies_ms)
    secs = max((r.seconds for r in groups.values()), default=seconds) or seconds

    def q(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None

    return {"ops_per_s": round(ops / secs, 1), "reads_per_s": round(reads / secs, 1),
            "writes_per_s": round((ops - reads) / secs, 1), "p50_ms": q(0.5), "p99_ms": q(0.99),
            "ops": ops, "reads": reads, "errors": sum(r.errors for r in groups.values()), "seconds": round(secs, 2)}


async def run_reads(frame: pc.Frame, *, replicas: int, sessions: int, seconds: float, warmup: float,
                    fractions: list[float], fsync: str, seed: int, clients_at: str = "every", rounds: int = 1) -> dict:
    result = pc.header("reads", replicas=replicas, sessions=sessions, seconds=seconds, warmup=warmup, rounds=rounds,
                       read_fractions=fractions, fsync=fsync, seed=seed, value_bytes=16, clients_at=clients_at,
                       clients=("spread over every replica, each group through its own replica" if clients_at == "every"
                                else "all at the sequencer/leader"),
                       read_path={"sdpaxos": "sequencer lease (RRequest to the sequencer, executed to its slot, "
                                             "read locally; the log without a lease)",
                                  "multipaxos": "through the log (a command like a write)"})
    roots = {p: tempfile.mkdtemp(prefix=f"cellar-bench-reads-{p}-") for p in pc.PROTOCOLS}
    runs = {p: pc.Run(p, replicas, fsync, roots[p]) for p in pc.PROTOCOLS}
    measured: dict[str, list[list[dict]]] = {p: [[] for _ in fractions] for p in pc.PROTOCOLS}
    try:
        for p, run in runs.items():
            frame.say(f"{p}: starting {replicas} replicas")
            await run.start()
        at: dict[str, list[int]] = {}
        lease = {}
        for p, run in runs.items():
            orderer = await run.orderer()
            at[p] = list(range(replicas)) if clients_at == "every" else [orderer if orderer is not None else 0]
            every = at[p]
            if warmup:
                task = frame.progress.add_task(f"{p}: warm-up", total=None)
                try:
                    await pc.per_replica_load(run, every, sessions, warmup, read_fraction=0.5, seed=seed + 99)
                finally:
                    frame.progress.remove_task(task)
            st = await run.status(orderer if orderer is not None else 0)
            lease[p] = st.get("lease") if st else None
        result["sequencer_lease_at_start"] = lease
        result["clients_at_replicas"] = at
        for r in range(rounds):
            for k, f in enumerate(fractions):
                for p in pc.alternate(pc.PROTOCOLS, r + k):
                    views_before = await views(runs[p])
                    name = f"round {r + 1} {p} reads {f:.0%}"
                    task = frame.progress.add_task(name, total=seconds)
                    t0 = time.monotonic()

                    def tick(ops: int, task=task, t0=t0, name=name) -> None:
                        frame.progress.update(task, completed=min(seconds, time.monotonic() - t0),
                                              description=f"{name}: {ops} ops")

                    try:
                        groups = await pc.per_replica_load(runs[p], at[p], sessions, seconds, read_fraction=f,
                                                           seed=seed + 10 * r + k, on_progress=tick)
                    finally:
                        frame.progress.remove_task(task)
                    m = {"read_fraction": f, **point(groups, seconds), "views_before": views_before,
                         "views_after": await views(runs[p])}
                    if m["views_after"] != views_before:
                        frame.say(f"{name}: the view changed during the point: {views_before} -> "
                                  f"{m['views_after']}")
                    measured[p][k].append(m)
                    frame.say(f"{name}: {m['ops_per_s']:>8.0f} ops/s ({m['reads_per_s']:.0f} reads, "
                              f"{m['writes_per_s']:.0f} writes)  p50 {m['p50_ms']} ms  p99 {m['p99_ms']} ms  "
                              f"errors {m['errors']}")
        result.update(await pc.end_state(runs, replicas))
    finally:
        await pc.stop_runs(runs, roots)
    if any(m["ops"] == 0 for per in measured.values() for ms in per for m in ms):
        raise BenchError("a point acknowledged no operation at all: see the progress lines")
    points = {p: [combine(ms) for ms in per] for p, per in measured.items()}
    ratios = []
    for a, b in zip(measured["sdpaxos"], measured["multipaxos"]):
        paired = [x["ops_per_s"] / y["ops_per_s"] for x, y in zip(a, b) if y["ops_per_s"]]
        ratios.append(round(statistics.median(paired), 3) if paired else None)
    result.update({
        "points": points,
        "ratio_sdpaxos_over_multipaxos": ratios,
        "over_own_all_writes": {p: [pc.ratio(m["ops_per_s"], ms[0]["ops_per_s"]) for m in ms]
                                for p, ms in points.items()} if fractions[0] == 0 else None,
    })
    return result


def combine(ms: list[dict]) -> dict:
    """One point over the rounds: medians of the rates and percentiles, sums of the counts."""
    def med(k: str) -> float | None:
        xs = [m[k] for m in ms if m[k] is not None]
        return round(statistics.median(xs), 2) if xs else None

    return {"read_fraction": ms[0]["read_fraction"], **{k: med(k) for k in
            ("ops_per_s", "reads_per_s", "writes_per_s", "p50_ms", "p99_ms")},
            **{k: sum(m[k] for m in ms) for k in ("ops", "reads", "errors")},
            "views_changed": [m["views_before"] != m["views_after"] for m in ms],
            "per_round_ops_per_s": [m["ops_per_s"] for m in ms], "rounds": ms}


async def views(run: pc.Run) -> list:
    return [st.get("view") if st else None for st in [await run.status(i) for i in range(run.n)]]


def format_table(result: dict) -> str:
    lines = [f"reads: {result['replicas']} replicas, {result['sessions']} sessions {_where(result)}, "
             f"{result['seconds']:g} s per point per protocol, median of {result['rounds']} round(s), "
             f"fsync={result['fsync']} (writes; SDPaxos lease reads "
             f"touch no log), core {result['core_commit']}, {result['cpus']} CPUs, load average "
             f"{pc.load_text(result['load_average_before'])} before, {pc.load_text(result.get('load_average_after'))} "
             f"after", "",
             f"{'reads':>5}  {'sdpaxos ops/s':>13} {'p50':>6} {'p99':>6}  {'multipaxos ops/s':>16} {'p50':>6} {'p99':>6}"
             f"  {'SD/MP':>6}  {'SD/SD@0':>7} {'MP/MP@0':>7}"]
    own = result.get("over_own_all_writes") or {"sdpaxos": [None] * 99, "multipaxos": [None] * 99}
    for k, f in enumerate(result["read_fractions"]):
        a, b = result["points"]["sdpaxos"][k], result["points"]["multipaxos"][k]
        lines.append(f"{f:>5.0%}  {a['ops_per_s']:>13.0f} {_n(a['p50_ms'])} {_n(a['p99_ms'])}  "
                     f"{b['ops_per_s']:>16.0f} {_n(b['p50_ms'])} {_n(b['p99_ms'])}  "
                     f"{_r(result['ratio_sdpaxos_over_multipaxos'][k])}  {_r(own['sdpaxos'][k], 7)} "
                     f"{_r(own['multipaxos'][k], 7)}")
    changed = [f"{p} at {m['read_fraction']:.0%} reads, round {j + 1} ({x['views_before']} -> {x['views_after']})"
               for p, ms in result["points"].items() for m in ms for j, x in enumerate(m["rounds"])
               if x["views_after"] != x["views_before"]]
    lines.append("")
    lines.append("views changed during: " + ("; ".join(changed) if changed else "none") +
                 f". Longest event-loop pause per replica (ms): {result.get('loop_lag_max_ms')}")
    lines.append("read path: SDPaxos " + result["read_path"]["sdpaxos"] + "; Multi-Paxos " +
                 result["read_path"]["multipaxos"] + f". Sequencer lease at start: "
                 f"{result.get('sequencer_lease_at_start')}")
    return "\n".join(lines)


def _where(result: dict) -> str:
    return "over every replica" if result.get("clients_at", "every") == "every" else "at the sequencer/leader"


def _n(x: float | None) -> str:
    return f"{x:6.2f}" if x is not None else "     -"


def _r(x: float | None, w: int = 6) -> str:
    return f"{x:>{w}.2f}" if x is not None else " " * (w - 1) + "-"


def summary_md(result: dict) -> str:
    fr = ",".join(f"{f:g}" for f in result["read_fractions"])
    return "\n".join([
        f"# reads: throughput against the read proportion ({result['started_utc']})", "",
        "SDPaxos paper, Fig. 11, on real `cellar serve` processes on loopback: closed-loop sessions spread over "
        "every replica, 16-byte blind writes of their own keys and linearizable reads (`get`) of random keys. "
        "Both clusters stay up and the load alternates between them point by point. The durability stated: "
        f"`--fsync {result['fsync']}` for the writes (and Multi-Paxos reads, which go through the log); "
        "SDPaxos reads under the sequencer lease write nothing. See `results.json` and `reads.png`.", "",
        "```", *format_table(result).splitlines(), "```", "",
        f"Command: `cellar bench reads --replicas {result['replicas']} --seconds {result['seconds']:g} "
        f"--sessions {result['sessions']} --read-fractions {fr} --warmup {result['warmup']:g} "
        f"--clients-at {result['clients_at']} --rounds {result['rounds']} "
        f"--fsync {result['fsync']} --seed {result['seed']}`", ""])


def plot(result: dict, path: str) -> None:
    plt = pc.plt_module()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [100 * f for f in result["read_fractions"]]
    for p in pc.PROTOCOLS:
        pts = result["points"][p]
        ax.plot(xs, [m["ops_per_s"] for m in pts], marker="o", color=pc.COLORS[p], label=f"{p}: all operations")
        ax.plot(xs, [m["writes_per_s"] for m in pts], marker=".", linestyle="--", color=pc.COLORS[p],
                label=f"{p}: writes")
        if result.get("rounds", 1) > 1:  # each round's figure beside the median
            ax.scatter([x for x, m in zip(xs, pts) for _ in m["per_round_ops_per_s"]],
                       [v for m in pts for v in m["per_round_ops_per_s"]], s=8, color=pc.COLORS[p], alpha=0.5)
    ax.set_xlabel("reads, % of operations")
    ax.set_ylabel("acknowledged operations/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"reads, {result['replicas']} replicas, {result['sessions']} sessions {_where(result)}, "
                 f"fsync={result['fsync']}, "
                 f"load {pc.load_text(result['load_average_before'])}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command("reads")
@pc.common_options(seconds=4.0, sessions=128)
@click.option("--read-fractions", default=DEFAULT_FRACTIONS, show_default=True,
              help="The read proportions measured, comma-separated, each in [0, 1).")
@click.option("--warmup", type=click.FloatRange(0, 60), default=1.0, show_default=True,
              help="Unmeasured load on each cluster first.")
@click.option("--clients-at", type=click.Choice(["every", "sequencer"]), default="every", show_default=True,
              help="every: sessions spread over every replica (the paper's setting); sequencer: all at the "
                   "sequencer/leader, where an SDPaxos lease read needs no message at all.")
@click.option("--rounds", type=click.IntRange(1, 10), default=1, show_default=True,
              help="Sweeps; each point is the median over them, and the protocols' order alternates.")
@click.option("--seed", type=int, default=1, show_default=True)
def reads(replicas, seconds, sessions, fsync, out, quiet, as_json, read_fractions, warmup, clients_at, rounds,
          seed) -> None:
    """Throughput against the proportion of reads (lease reads at the SDPaxos sequencer,
    the log for Multi-Paxos), both protocols alternating (the paper's Fig. 11)."""
    fractions = parse_fractions(read_fractions)

    def call() -> dict:
        async def body(frame: pc.Frame) -> dict:
            return await run_reads(frame, replicas=replicas, sessions=sessions, seconds=seconds, warmup=warmup,
                                   fractions=fractions, fsync=fsync, seed=seed, clients_at=clients_at,
                                   rounds=rounds)

        return pc.run_experiment("reads", out, body, quiet=quiet, summary=summary_md, plot=plot)

    pc.cli_main("reads", call, as_json, format_table)


if __name__ == "__main__":
    reads()
