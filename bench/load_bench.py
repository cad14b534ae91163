"""``cellar bench load``: write latency against offered load, SDPaxos and Multi-Paxos
side by side (issue 15: open loop as well as closed loop, 16 B and 1 KiB values,
uniform and Zipf keys).

Both clusters (real ``cellar serve`` processes on loopback, ``bench.paper_common.Run``,
sequencer/leader 0, ``--fsync`` batch by default) are started once and stay up; the
load goes to one at a time, spread over every replica (each group through a client
that talks to its own replica only). For each value size (``--value-bytes``), key
distribution (``--key-dist``) and mode (``--modes``), a series of points:

- **open loop** (``store.loadgen.run_open_loop``): blind writes arriving as a Poisson
  process at each of ``--rates`` writes/s in all (each replica's clients a Poisson
  process of their share), each sent at its scheduled time whatever the earlier ones
  are doing. At most ``--max-inflight`` writes are outstanding in all; an arrival that
  finds them all out is dropped and counted as *shed*. Latency runs from the scheduled
  send time (no coordinated omission), and the sender's own lateness is reported
  (``send_lag_p99_ms``): past the machine's capacity the bench process itself falls
  behind, and that shows in the latency, as it should.
- **closed loop** (``store.loadgen.run_load``): ``--sessions`` sessions, each sending
  its next write when the last is answered; latency from the send.

Keys: ``--keys`` shared keys ``k<rank>``, each write's rank drawn uniformly or from a
Zipf distribution of exponent ``--zipf-s`` (``store.loadgen.ZipfKeys``: a precomputed
CDF and a bisection; seeded). A value is ``--value-bytes`` bytes.

Reported per point: offered writes/s (open loop), achieved writes/s (acknowledged
within the measured ``--seconds``), p50/p99/p99.9, shed, errors, and whether a view
changed; per series, SDPaxos over Multi-Paxos for p50, p99 and achieved writes/s at
each point; per value size and key distribution, each protocol's peak achieved
writes/s (over both modes) and the highest offered rate it sustained (nothing shed,
achieved at least 90 % of offered), with their ratios. The protocols' order alternates
from point to point (and round to round, ``--rounds``: each point is the median over
the rounds) so that drift in the machine's load hits both. A point where nothing was
acknowledged (a cluster that collapsed under the load) stays in the report, named at
its end with any replica that exited and the first line of its crash.log. Results:
``OUT/load-<UTC>/`` (results.json, load.png, summary.md). Nothing here asserts a time.

    cellar bench load                                  # both modes, 16 B and 1 KiB, uniform and Zipf
    cellar bench load --modes open --rates 1000,4000,16000 --value-bytes 16 --key-dist zipf --json
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from typing import Any, Callable, Sequence

import click

from bench import paper_common as pc

MODES = ("open", "closed")
KEY_DISTS = ("uniform", "zipf")
DEFAULT_RATES = "500,1000,2000,4000,8000,16000"
DEFAULT_SESSIONS = "1,4,16,64,256"
DEFAULT_VALUE_BYTES = "16,1024"
SUSTAINED_FRACTION = 0.9  # achieved at least this share of offered, nothing shed
DRAIN_S = 5.0  # beyond the client's deadline, for the writes outstanding at a point's end


# --- pure helpers -------------------------------------------------------------------------


def parse_list(text: str, option: str, kind: Callable[[str], Any], lo: float, hi: float) -> list:
    """Distinct comma-separated values of ``kind`` in [lo, hi], in the order given."""
    try:
        xs = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated numbers", param_hint=option) from None
    if not xs or any(not lo <= x <= hi for x in xs) or len(set(xs)) != len(xs):
        raise click.BadParameter(f"{text!r}: distinct numbers in [{lo:g}, {hi:g}]", param_hint=option)
    return xs


def parse_choices(text: str, option: str, choices: Sequence[str]) -> list[str]:
    xs = [x.strip() for x in text.split(",") if x.strip()]
    if not xs or any(x not in choices for x in xs) or len(set(xs)) != len(xs):
        raise click.BadParameter(f"{text!r}: choose some of {', '.join(choices)}, each once", param_hint=option)
    return xs


def percentile(data: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of sorted ``data`` (as the other benches take it)."""
    return data[min(len(data) - 1, int(q * len(data)))] if data else None


def point(groups: dict, seconds: float, t0: float, mode: str) -> dict:
    """One point from the per-replica ``LoadResult``s of a load started at ``t0``
    (monotonic): achieved = acknowledged writes completed within [t0, t0 + seconds)."""
    lat = sorted(x for r in groups.values() for x in r.latencies_ms)
    comps = [c for r in groups.values() for c in r.completions]
    offered = sum(r.offered for r in groups.values())
    lag = sorted(x for r in groups.values() for x in r.send_lag_ms)

    def q(p: float) -> float | None:
        v = percentile(lat, p)
        return round(v, 2) if v is not None else None

    return {"mode": mode, "achieved_per_s": round(pc.rate(comps, t0, t0 + seconds), 1),
            "offered_per_s": round(offered / seconds, 1) if mode == "open" else None,
            "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999),
            "ops": sum(r.ops for r in groups.values()), "offered": offered if mode == "open" else None,
            "shed": sum(r.shed for r in groups.values()), "errors": sum(r.errors for r in groups.values()),
            "send_lag_p99_ms": round(percentile(lag, 0.99) or 0.0, 2) if mode == "open" else None,
            "seconds": seconds}


def sustained_rate(levels: Sequence[float], points: Sequence[dict], fraction: float = SUSTAINED_FRACTION) -> float | None:
    """The highest offered rate (open loop, the level asked) at which nothing was shed
    and the achieved rate was at least ``fraction`` of what the Poisson schedule
    actually offered (None: not even the lowest)."""
    ok = [lv for lv, m in zip(levels, points)
          if m["shed"] == 0 and m["achieved_per_s"] is not None
          and m["achieved_per_s"] >= fraction * (m.get("offered_per_s") or lv)]
    return max(ok) if ok else None


def peak(points: Sequence[dict]) -> float | None:
    xs = [m["achieved_per_s"] for m in points if m["achieved_per_s"] is not None]
    return max(xs) if xs else None


def combine(ms: list[dict]) -> dict:
    """One point over the rounds: medians of rates and percentiles, sums of the counts."""
    def med(k: str) -> float | None:
        xs = [m[k] for m in ms if m.get(k) is not None]
        return round(statistics.median(xs), 2) if xs else None

    out = {"mode": ms[0]["mode"], "level": ms[0]["level"],
           **{k: med(k) for k in ("offered_per_s", "achieved_per_s", "p50_ms", "p99_ms", "p999_ms",
                                  "send_lag_p99_ms")},
           **{k: sum(m[k] for m in ms) for k in ("ops", "shed", "errors")},
           "views_changed": [m["views_before"] != m["views_after"] for m in ms], "rounds": ms}
    return out


def paired_ratios(a: Sequence[dict], b: Sequence[dict], key: str) -> list[float | None]:
    """Per point, the median over the rounds of a's ``key`` over b's (SDPaxos over Multi-Paxos)."""
    out: list[float | None] = []
    for x, y in zip(a, b):
        rs = [u[key] / v[key] for u, v in zip(x["rounds"], y["rounds"]) if u[key] is not None and v[key]]
        out.append(round(statistics.median(rs), 3) if rs else None)
    return out


def plan(combos: Sequence[tuple], levels: dict[str, list], rounds: int) -> list[tuple]:
    """``(round, combo, level index, protocols in order)`` for every point: the order
    alternates from one point to the next, and each round starts the other way round
    (so each point sees both orders over two rounds)."""
    out = []
    for r in range(rounds):
        n = r
        for c in combos:
            for k in range(len(levels[c[2]])):
                out.append((r, c, k, pc.alternate(pc.PROTOCOLS, n)))
                n += 1
    return out


def series_name(value_bytes: int, key_dist: str, mode: str) -> str:
    return f"{value_bytes} B, {key_dist}, {mode} loop"


# --- the load ------------------------------------------------------------------------------


def shares(total: float, at: Sequence[int], integral: bool) -> dict[int, Any]:
    """``total`` split over the replicas ``at`` (whole numbers: the remainder to the first ones)."""
    if not integral:
        return {i: total / len(at) for i in at}
    n = int(total)
    return {i: n // len(at) + (1 if k < n % len(at) else 0) for k, i in enumerate(at)}


async def per_replica_open_loop(run: pc.Run, at: Sequence[int], rate: float, max_inflight: int, seconds: float, *,
                                key_chooser: Any, value_bytes: int, seed: int,
                                on_progress: Callable[[int], None] | None = None) -> dict[int, Any]:
    """An open-loop share of ``rate`` (and of ``max_inflight``) at each replica of ``at``,
    through the client that talks to that replica only."""
    from store.loadgen import run_open_loop

    rates = shares(rate, at, integral=False)
    caps = shares(max(max_inflight, len(at)), at, integral=True)
    tick = pc.progress_by_replica(on_progress)
    results = await asyncio.gather(*[
        run_open_loop(run.clients[i], rate=rates[i], seconds=seconds, max_inflight=caps[i], key_chooser=key_chooser,
                      value_bytes=value_bytes, seed=seed * 100 + i, on_progress=tick(i)) for i in at])
    return dict(zip(at, results))


async def views(run: pc.Run) -> list:
    return [st.get("view") if st else None for st in [await run.status(i) for i in range(run.n)]]


async def measure(frame: pc.Frame, run: pc.Run, *, mode: str, level: float, seconds: float, max_inflight: int,
                  key_chooser: Any, value_bytes: int, seed: int, name: str) -> dict:
    every = list(range(run.n))
    views_before = await views(run)
    task = frame.progress.add_task(name, total=seconds)
    t0 = time.monotonic()

    def tick(ops: int) -> None:
        frame.progress.update(task, completed=min(seconds, time.monotonic() - t0), description=f"{name}: {ops} writes")

    try:
        if mode == "open":
            groups = await per_replica_open_loop(run, every, level, max_inflight, seconds, key_chooser=key_chooser,
                                                 value_bytes=value_bytes, seed=seed, on_progress=tick)
        else:
            groups = await pc.per_replica_load(run, every, int(level), seconds, seed=seed, on_progress=tick,
                                               value_bytes=value_bytes, key_chooser=key_chooser)
    finally:
        frame.progress.remove_task(task)
    m = {"level": level, **point(groups, seconds, t0, mode), "views_before": views_before,
         "views_after": await views(run)}
    if m["views_after"] != views_before:
        frame.say(f"{name}: the view changed during the point: {views_before} -> {m['views_after']}")
    frame.say(f"{name}: {m['achieved_per_s']:>8.0f} writes/s"
              + (f" of {m['offered_per_s']:.0f} offered" if mode == "open" else "")
              + f"  p50 {m['p50_ms']} ms  p99 {m['p99_ms']} ms  p99.9 {m['p999_ms']} ms  shed {m['shed']}  "
              f"errors {m['errors']}" + (f"  send lag p99 {m['send_lag_p99_ms']} ms" if mode == "open" else ""))
    return m


async def run_load_bench(frame: pc.Frame, *, replicas: int, seconds: float, modes: list[str], rates: list[float],
                         sessions: list[int], max_inflight: int, value_sizes: list[int], keys: int,
                         key_dists: list[str], zipf_s: float, warmup: float, rounds: int, fsync: str,
                         seed: int) -> dict:
    from store.loadgen import UniformKeys, ZipfKeys

    choosers = {"uniform": UniformKeys(keys), "zipf": ZipfKeys(keys, zipf_s)}
    result = pc.header("load", replicas=replicas, seconds=seconds, modes=modes, rates=rates, sessions=sessions,
                       max_inflight=max_inflight, value_sizes=value_sizes, keys=keys, key_dists=key_dists,
                       zipf_s=zipf_s, warmup=warmup, rounds=rounds, fsync=fsync, seed=seed,
                       clients="spread over every replica, each group through its own replica",
                       key_distributions={d: choosers[d].describe() for d in key_dists},
                       sustained_fraction=SUSTAINED_FRACTION)
    combos = [(vb, kd, mode) for vb in value_sizes for kd in key_dists for mode in modes]
    levels = {"open": list(rates), "closed": list(sessions)}
    roots = {p: tempfile.mkdtemp(prefix=f"cellar-bench-load-{p}-") for p in pc.PROTOCOLS}
    runs = {p: pc.Run(p, replicas, fsync, roots[p]) for p in pc.PROTOCOLS}
    measured: dict[tuple, dict[str, list[list[dict]]]] = {
        c: {p: [[] for _ in levels[c[2]]] for p in pc.PROTOCOLS} for c in combos}
    try:
        for p, run in runs.items():
            frame.say(f"{p}: starting {replicas} replicas")
            await run.start()
        if warmup:
            for p, run in runs.items():
                task = frame.progress.add_task(f"{p}: warm-up", total=None)
                try:
                    await pc.per_replica_load(run, list(range(replicas)), 16, warmup, seed=seed + 99,
                                              key_chooser=choosers[key_dists[0]])
                finally:
                    frame.progress.remove_task(task)
        broken: set[str] = set()  # a replica exited and a point got no answer: the rest is skipped
        for r, c, k, order in plan(combos, levels, rounds):
            vb, kd, mode = c
            level = levels[mode][k]
            what = f"{level:g}/s offered" if mode == "open" else f"{level} sessions"
            for p in order:  # both protocols get the same seed: the same arrivals and keys
                if p in broken:
                    measured[c][p][k].append(skipped(mode, level, seconds))
                    continue
                m = await measure(frame, runs[p], mode=mode, level=level, seconds=seconds, max_inflight=max_inflight,
                                  key_chooser=choosers[kd], value_bytes=vb, seed=seed + 1000 * r + k,
                                  name=f"round {r + 1} {p} {vb} B {kd} {what}")
                measured[c][p][k].append(m)
                if m["ops"] == 0 and exited(runs[p]):
                    broken.add(p)
                    frame.say(f"{p}: a replica exited and this point got no answer at all: its remaining points "
                              "are skipped (see the end of the report)")
        result["replicas_exited"] = {p: exited(run) for p, run in runs.items()}
        result.update(await pc.end_state(runs, replicas))
    finally:
        await pc.stop_runs(runs, roots)
    series = []
    for c in combos:
        vb, kd, mode = c
        pts = {p: [combine(x) for x in measured[c][p]] for p in pc.PROTOCOLS}
        sd, mp = pts["sdpaxos"], pts["multipaxos"]
        series.append({"name": series_name(vb, kd, mode), "value_bytes": vb, "key_dist": kd, "mode": mode,
                       "levels": levels[mode], "points": pts,
                       "ratio_sdpaxos_over_multipaxos": {k: paired_ratios(sd, mp, k)
                                                         for k in ("p50_ms", "p99_ms", "achieved_per_s")}})
    saturation = []
    for vb in value_sizes:
        for kd in key_dists:
            mine = [s for s in series if s["value_bytes"] == vb and s["key_dist"] == kd]
            peaks = {p: peak([m for s in mine for m in s["points"][p]]) for p in pc.PROTOCOLS}
            opened = [s for s in mine if s["mode"] == "open"]
            sus = {p: sustained_rate(opened[0]["levels"], opened[0]["points"][p]) if opened else None
                   for p in pc.PROTOCOLS}
            saturation.append({"value_bytes": vb, "key_dist": kd, "peak_achieved_per_s": peaks,
                               "peak_ratio_sdpaxos_over_multipaxos": pc.ratio(peaks["sdpaxos"], peaks["multipaxos"]),
                               "sustained_offered_per_s": sus,
                               "sustained_ratio_sdpaxos_over_multipaxos": pc.ratio(sus["sdpaxos"],
                                                                                   sus["multipaxos"])})
    # A point with no acknowledged write stays in the report (a cluster that collapsed
    # under load is a finding, not a failed run); the table names them.
    def where(pred: Callable[[dict], bool]) -> list[str]:
        return [f"{s['name']} {p} at {m['level']:g}, round {j + 1}" for s in series for p in pc.PROTOCOLS
                for m in s["points"][p] for j, x in enumerate(m["rounds"]) if pred(x)]

    result.update({"series": series, "saturation": saturation,
                   "points_without_acks": where(lambda x: x["ops"] == 0 and not x.get("skipped")),
                   "points_skipped": where(lambda x: bool(x.get("skipped")))})
    for line in warnings(result):
        frame.say(line)
    return result


def skipped(mode: str, level: float, seconds: float) -> dict:
    """A point not measured: its protocol's cluster had lost a replica and answered nothing."""
    return {"level": level, "mode": mode, "achieved_per_s": None, "offered_per_s": None, "p50_ms": None,
            "p99_ms": None, "p999_ms": None, "ops": 0, "offered": None, "shed": 0, "errors": 0,
            "send_lag_p99_ms": None, "seconds": seconds, "views_before": None, "views_after": None, "skipped": True}


def exited(run: pc.Run) -> dict[str, dict]:
    """The replicas of ``run`` whose process is gone, with its exit status and the first
    line of its crash.log (``cellar serve`` writes one on an internal error)."""
    out: dict[str, dict] = {}
    for i, proc in sorted(run.cluster.procs.items()):
        code = proc.poll()
        if code is None:
            continue
        crash = None
        try:
            with open(os.path.join(run.cluster.data_dir(i), "crash.log"), errors="replace") as f:
                crash = next((ln.strip(" -") for ln in f if ln.strip()), None)
        except OSError:
            pass
        out[str(i)] = {"exit_code": code, "crash": crash, "log_tail": run.cluster.log_tail(i, 2)[-600:]}
    return out


def warnings(result: dict) -> list[str]:
    lines = []
    if result.get("points_skipped"):
        lines.append(f"not measured, the cluster having collapsed before: {len(result['points_skipped'])} point(s), "
                     f"from {result['points_skipped'][0]}")
    if result.get("points_without_acks"):
        lines.append(f"no write acknowledged at {len(result['points_without_acks'])} point(s): "
                     + "; ".join(result["points_without_acks"][:6])
                     + (" ..." if len(result["points_without_acks"]) > 6 else ""))
    for p, gone in (result.get("replicas_exited") or {}).items():
        for i, e in gone.items():
            how = (f"killed by signal {-e['exit_code']}" if e["exit_code"] < 0 else f"status {e['exit_code']}")
            lines.append(f"{p} replica {i} exited ({how}) during the run: {e['crash'] or e['log_tail']}")
    return lines


# --- the report ----------------------------------------------------------------------------


def _n(x: float | None, w: int = 7, d: int = 2) -> str:
    return f"{x:>{w}.{d}f}" if x is not None else " " * (w - 1) + "-"


def format_table(result: dict) -> str:
    lines = [f"load: {result['replicas']} replicas, writes spread over every replica, {result['seconds']:g} s per "
             f"point per protocol, median of {result['rounds']} round(s), open loop at most "
             f"{result['max_inflight']} in flight, fsync={result['fsync']}, core {result['core_commit']}, "
             f"{pc.machine_text(result)}"]
    for s in result["series"]:
        opened = s["mode"] == "open"
        head = "offered/s" if opened else " sessions"
        lag = f" {'lag99':>6}" if opened else ""
        lines += ["", f"{s['name']} ({result['key_distributions'][s['key_dist']]})",
                  f"{head}  {'SD ach/s':>8} {'p50':>7} {'p99':>7} {'p99.9':>7} {'shed':>6} {'err':>4}{lag}  "
                  f"{'MP ach/s':>8} {'p50':>7} {'p99':>7} {'p99.9':>7} {'shed':>6} {'err':>4}{lag}  "
                  f"{'SD/MP p50':>9} {'p99':>5} {'ach/s':>5}"]
        rat = s["ratio_sdpaxos_over_multipaxos"]
        for k, level in enumerate(s["levels"]):
            row = [f"{level:>9g}"]
            for p in pc.PROTOCOLS:
                m = s["points"][p][k]
                row.append(f"{_n(m['achieved_per_s'], 8, 0)} {_n(m['p50_ms'])} {_n(m['p99_ms'])} "
                           f"{_n(m['p999_ms'])} {m['shed']:>6} {m['errors']:>4}"
                           + (f" {_n(m['send_lag_p99_ms'], 6, 1)}" if opened else ""))
            row.append(f"{_n(rat['p50_ms'][k], 9)} {_n(rat['p99_ms'][k], 5)} {_n(rat['achieved_per_s'][k], 5)}")
            lines.append("  ".join(row))
    lines += ["", "saturation (peak: the most writes/s achieved at any point of either mode; sustained: the highest "
              f"offered rate with nothing shed and at least {result['sustained_fraction']:.0%} achieved)"]
    for sat in result["saturation"]:
        pk, su = sat["peak_achieved_per_s"], sat["sustained_offered_per_s"]
        lines.append(f"  {sat['value_bytes']:>5} B {sat['key_dist']:<7}  peak SDPaxos {_n(pk['sdpaxos'], 0, 0)}, "
                     f"Multi-Paxos {_n(pk['multipaxos'], 0, 0)} writes/s, SD/MP "
                     f"{_n(sat['peak_ratio_sdpaxos_over_multipaxos'], 0)}"
                     + (f"; sustained SDPaxos {_n(su['sdpaxos'], 0, 0)}, Multi-Paxos {_n(su['multipaxos'], 0, 0)}/s, "
                        f"SD/MP {_n(sat['sustained_ratio_sdpaxos_over_multipaxos'], 0)}"
                        if "open" in result["modes"] else ""))
    changed = [f"{s['name']} {p} at {m['level']:g}, round {j + 1}" for s in result["series"] for p in pc.PROTOCOLS
               for m in s["points"][p] for j, x in enumerate(m["rounds"]) if x["views_before"] != x["views_after"]]
    lines += ["", "views changed during: " + ("; ".join(changed) if changed else "none") +
              f". Longest event-loop pause per replica (ms): {result.get('loop_lag_max_ms')}"]
    lines += warnings(result)
    if "open" in result["modes"]:
        lines.append("lag99 (open loop): p99 of how late the bench sent a write after its scheduled time, in ms; "
                     "it is inside the latency (measured from the schedule), and a large one means the bench "
                     "process itself, not the cluster, fell behind")
    return "\n".join(lines)


def command_line(result: dict) -> str:
    def join(xs: Sequence) -> str:
        return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in xs)

    return (f"cellar bench load --replicas {result['replicas']} --seconds {result['seconds']:g} "
            f"--modes {join(result['modes'])} "
            + (f"--rates {join(result['rates'])} --max-inflight {result['max_inflight']} " if result["rates"] else "")
            + (f"--sessions {join(result['sessions'])} " if result["sessions"] else "")
            + f"--value-bytes {join(result['value_sizes'])} "
            f"--keys {result['keys']} --key-dist {join(result['key_dists'])} --zipf-s {result['zipf_s']:g} "
            f"--warmup {result['warmup']:g} --rounds {result['rounds']} --fsync {result['fsync']} "
            f"--seed {result['seed']}")


def summary_md(result: dict) -> str:
    return "\n".join([
        f"# load: write latency against offered load ({result['started_utc']})", "",
        "Real `cellar serve` processes on loopback, SDPaxos and Multi-Paxos both up, the load alternating between "
        "them point by point, blind writes spread over every replica. Open loop: Poisson arrivals at each offered "
        "rate, each write sent at its scheduled time, latency from that time (no coordinated omission), at most "
        f"{result['max_inflight']} outstanding (the rest *shed*). Closed loop: that many sessions, each waiting "
        "for its answer. `ach/s`: writes acknowledged within the measured seconds; `SD/MP`: SDPaxos over "
        f"Multi-Paxos at that point, same run. The durability stated: `--fsync {result['fsync']}`. Figures on a "
        "shared machine move with its load (the load average is recorded). See `results.json` and `load.png`.", "",
        "```", *format_table(result).splitlines(), "```", "",
        f"Command: `{command_line(result)}`", ""])


def plot(result: dict, path: str) -> None:
    plt = pc.plt_module()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 20, 50, 100 ms rather than 2 x 10^1
    rows = [(vb, kd) for vb in result["value_sizes"] for kd in result["key_dists"]]
    modes = result["modes"]
    fig, axes = plt.subplots(len(rows), len(modes), figsize=(5.2 * len(modes), 3.0 * len(rows)), squeeze=False)
    for i, (vb, kd) in enumerate(rows):
        for j, mode in enumerate(modes):
            ax = axes[i, j]
            (s,) = [s for s in result["series"] if (s["value_bytes"], s["key_dist"], s["mode"]) == (vb, kd, mode)]
            for p in pc.PROTOCOLS:
                pts = s["points"][p]
                xs = [m["achieved_per_s"] if m["achieved_per_s"] is not None else float("nan") for m in pts]
                for key, style, label in (("p50_ms", "-", "p50"), ("p99_ms", "--", "p99")):
                    ys = [m[key] if m[key] is not None else float("nan") for m in pts]  # no acks: no point
                    ax.plot(xs, ys, linestyle=style, marker="o" if key == "p50_ms" else ".", color=pc.COLORS[p],
                            label=f"{p} {label}")
                if mode == "open":  # each point's offered rate, where the achieved one falls short
                    for x, m in zip(xs, pts):
                        if m["shed"] and m["p99_ms"]:
                            ax.annotate(f"{m['level']:g}", (x, m["p99_ms"]), fontsize=6, color=pc.COLORS[p],
                                        xytext=(2, 2), textcoords="offset points")
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("achieved writes/s")
            ax.set_ylabel("latency (ms)")
            ax.set_title(s["name"], fontsize=9)
            ax.grid(True, which="both", alpha=0.2)
            ax.legend(fontsize=7)
    fig.suptitle(f"load, {result['replicas']} replicas, fsync={result['fsync']}, open loop at most "
                 f"{result['max_inflight']} in flight (labels: offered/s where some was shed), load "
                 f"{pc.load_text(result['load_average_before'])}", fontsize=9)
    pc.save_figure(fig, path, dpi=110)


@click.command("load")
@pc.common_options(seconds=2.0, sessions=None)
@click.option("--modes", default=",".join(MODES), show_default=True,
              help="open: Poisson arrivals at each of --rates; closed: each of --sessions waiting for its answers.")
@click.option("--rates", default=DEFAULT_RATES, show_default=True,
              help="Open loop: offered writes/s in all, comma-separated.")
@click.option("--sessions", default=DEFAULT_SESSIONS, show_default=True,
              help="Closed loop: sessions in all, comma-separated.")
@click.option("--max-inflight", type=click.IntRange(1, 100_000), default=1024, show_default=True,
              help="Open loop: writes outstanding at most, in all; an arrival beyond is shed (counted).")
@click.option("--value-bytes", default=DEFAULT_VALUE_BYTES, show_default=True,
              help="Value sizes in bytes, comma-separated, each in [8, 65536].")
@click.option("--keys", type=click.IntRange(1, 1_000_000), default=10_000, show_default=True,
              help="Distinct keys, shared by every session.")
@click.option("--key-dist", default=",".join(KEY_DISTS), show_default=True,
              help="Key distributions, comma-separated: uniform, zipf.")
@click.option("--zipf-s", type=click.FloatRange(0, 10), default=0.99, show_default=True,
              help="The Zipf exponent: P(rank k) proportional to 1/(k+1)^s.")
@click.option("--warmup", type=click.FloatRange(0, 60), default=1.0, show_default=True,
              help="Unmeasured closed-loop load on each cluster first (16 sessions).")
@click.option("--rounds", type=click.IntRange(1, 10), default=1, show_default=True,
              help="Rounds; each point is the median over them.")
@click.option("--seed", type=int, default=1, show_default=True)
def load(replicas, seconds, fsync, out, quiet, as_json, modes, rates, sessions, max_inflight, value_bytes, keys,
         key_dist, zipf_s, warmup, rounds, seed) -> None:
    """Write latency (p50/p99/p99.9) against offered load, open loop (Poisson arrivals,
    latency from the scheduled send, shed counted) and closed loop; 16 B and 1 KiB
    values, uniform and Zipf keys; SDPaxos and Multi-Paxos alternating point by point,
    with their ratios."""
    chosen_modes = parse_choices(modes, "--modes", MODES)
    chosen_dists = parse_choices(key_dist, "--key-dist", KEY_DISTS)
    rate_list = parse_list(rates, "--rates", float, 1, 1_000_000) if "open" in chosen_modes else []
    session_list = parse_list(sessions, "--sessions", int, 1, 4096) if "closed" in chosen_modes else []
    sizes = parse_list(value_bytes, "--value-bytes", int, 8, 65536)

    def call() -> dict:
        async def body(frame: pc.Frame) -> dict:
            return await run_load_bench(frame, replicas=replicas, seconds=seconds, modes=chosen_modes,
                                        rates=rate_list, sessions=session_list, max_inflight=max_inflight,
                                        value_sizes=sizes, keys=keys, key_dists=chosen_dists, zipf_s=zipf_s,
                                        warmup=warmup, rounds=rounds, fsync=fsync, seed=seed)

        return pc.run_experiment("load", out, body, quiet=quiet, summary=summary_md, plot=plot)

    pc.cli_main("load", call, as_json, format_table)


if __name__ == "__main__":
    load()
