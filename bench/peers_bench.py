"""``cellar bench peers``: Cellar's write throughput beside its peers, etcd and PySyncObj, at
several client counts in one run (issue 15, acceptance 2).

Starts, once, 3 Cellar replicas (``cellar serve --http``, ``--fsync`` batch by default), 3
etcd members (Debian ``etcd-server``, its JSON gateway) and 3 PySyncObj replicas
(``bench/pysyncobj_server.py``: PySyncObj's ``ReplDict`` behind a line-protocol TCP
endpoint), all on 127.0.0.1 with data dirs under one temp dir, through
``bench.kv_http_bench.Bench``. Then, for each client count of ``--clients`` (default 32 and
128), ``--rounds`` rounds: each round measures every target for ``--seconds`` (after
``--warmup`` s of unmeasured load) with N closed-loop clients, each putting 16-byte values
to its own keys, one request at a time, spread over the three members:

- ``cellar-binary``: Cellar's binary client (``store.loadgen.run_load``, N sessions);
- ``cellar-http``: ``POST /v3/kv/put`` on Cellar's gateway;
- ``etcd-http``: the same request on etcd's grpc-gateway;
- ``pysyncobj``: ``P key value`` on the replica's endpoint, acknowledged when PySyncObj's
  callback reports the command committed and applied; its journal synced before any Raft
  message leaves a replica (a shim of ours: PySyncObj 0.3.x never syncs, see
  ``bench/pysyncobj_server.py``), so with fsync on like Cellar and etcd;
- ``pysyncobj-nosync``: the same, PySyncObj's journal as shipped (never synced: page cache),
  for reference.

PySyncObj's settings (``--pysyncobj-*``, ``kv_http_bench.PYSYNCOBJ_SETTINGS`` says why):
batched AppendEntries every 5 ms, its thread ticking at least every 2 ms. Idle, that ticking
costs about 13 % of a core per cluster, so a PySyncObj cluster is paused (SIGSTOP) while
the other targets are measured, and resumed and ready again (a put acknowledged through each
replica) before its own warm-up; Cellar and etcd stay up between their measurements.

The targets' order is reversed every other round (and the alternation goes on across client
counts) so that drift in the machine's load hits all alike. Reported per client count:
per-target ops/s, p50, p99, errors, the load generator's CPU and the servers' CPU per
operation (medians over the rounds), and the throughput ratios Cellar-binary/etcd-HTTP,
Cellar-binary/PySyncObj (and /PySyncObj-nosync) and Cellar-HTTP/etcd-HTTP of each round with
their medians; plus
each system's durability in one line. Results: ``OUT/peers-<UTC>/`` (results.json,
summary.md, peers.png). Every load loop stops by itself; every process started here is
stopped by its PID at the end, also on an error, Ctrl-C or SIGTERM. Nothing asserts a time.

    cellar bench peers                                   # 32 and 128 clients, 3 rounds of 10 s
    cellar bench peers --clients 1,32,128,512 --json
    cellar bench peers --targets cellar-binary,pysyncobj --clients 8 --seconds 1   # no etcd
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import click

from bench import kv_http_bench as kh
from bench import paper_common as pc
from bench.paper_common import BenchError

DEFAULT_TARGETS = ("cellar-binary", "cellar-http", "etcd-http", "pysyncobj", "pysyncobj-nosync")
GOALS = {"cellar-binary/etcd-http": 10.0, "cellar-binary/pysyncobj": 8.0}  # issue 15's acceptance 2


def parse_clients(text: str) -> list[int]:
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        xs = []
    if not xs or any(not 1 <= x <= 4096 for x in xs) or len(set(xs)) != len(xs):
        raise click.BadParameter(f"{text!r}: distinct client counts in 1..4096, e.g. 32,128", param_hint="--clients")
    return xs


async def run_peers(frame: pc.Frame, *, targets: tuple[str, ...], clients: list[int], seconds: float, warmup: float,
                    rounds: int, value_bytes: int, fsync: str, etcd_binary: str | None, pysyncobj_version: str | None,
                    pysyncobj: dict, keep: bool) -> dict:
    root = tempfile.mkdtemp(prefix="cellar-bench-peers-")
    task = None

    def live(msg: str) -> None:
        if task is not None:
            frame.progress.update(task, description=msg.strip() or " ")

    bench = kh.Bench(targets=targets, sessions=clients[0], binary_sessions=clients[0], seconds=seconds,
                     warmup=warmup, rounds=rounds, value_bytes=value_bytes, fsync=fsync, etcd_binary=etcd_binary,
                     root=root, progress=frame.say, live=live, pysyncobj=pysyncobj,
                     pysyncobj_version=pysyncobj_version)
    result = pc.header("peers", targets=list(targets), clients=clients, seconds=seconds, warmup=warmup, rounds=rounds,
                       value_bytes=value_bytes, fsync=fsync, pysyncobj_settings=pysyncobj,
                       workload="closed loop, each client one put at a time of a value_bytes-byte value to its own "
                                "keys (1,000 per client), clients spread over the 3 members",
                       idle_clusters="Cellar and etcd stay up between their measurements; a PySyncObj cluster not "
                                     "measured is paused (SIGSTOP: its idle ticking costs about 13 % of a core), "
                                     "resumed and ready again (a put through each replica) before its warm-up")
    try:
        frame.say(f"data and logs in {root}")
        bench.start()
        result["server_pids"] = bench.server_pids()
        await bench.ready()
        result["etcd"] = kh.etcd_version(etcd_binary) if etcd_binary else None
        result["pysyncobj"] = pysyncobj_version
        result["pysyncobj_conf"] = next(iter(bench.pysyncobj.values())).settings() if bench.pysyncobj else None
        result["durability"] = bench.durability()
        task = frame.progress.add_task(" ", total=None)
        points = []
        for k, n in enumerate(clients):
            bench.sessions = bench.binary_sessions = n
            frame.say(f"--- {n} client(s)")
            measured = await bench.measure_rounds(first_round=k * rounds, label=f"{n:>4} clients ")
            points.append({"clients": n, **measured})
        result["points"] = points
    finally:
        if task is not None:
            frame.progress.remove_task(task)
        bench.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    if any(m["ops"] == 0 for p in result["points"] for ms in p["runs"].values() for m in ms):
        raise BenchError("a target acknowledged no put at all in some round: see the progress lines")
    return result


def format_table(result: dict) -> str:
    lines = [f"peers: 3 replicas/members each on 127.0.0.1, {result['value_bytes']}-byte puts, closed loop, "
             f"{result['seconds']:g} s per target per round ({result['warmup']:g} s warm-up), median of "
             f"{result['rounds']} round(s), order alternating; head {result.get('head_commit')}, "
             f"{pc.machine_text(result)}"]
    for p in result["points"]:
        lines += ["", f"{p['clients']} client(s):", *kh.target_table(p["median"], result["targets"]),
                  *kh.ratio_lines(p["ratios"], p["per_round_ratios"])]
    lines.append("")
    lines += kh.durability_lines(result["durability"])
    if result.get("pysyncobj_conf"):
        lines.append(f"PySyncObj settings: {result['pysyncobj_conf']}. Between measurements: "
                     f"{result['idle_clusters']}")
    goals = [f"{k} >= {g:g}x: " + ", ".join(f"{p['clients']} clients {p['ratios'].get(k) or '-'}x"
                                          for p in result["points"]) for k, g in GOALS.items()
             if any(k in p["ratios"] for p in result["points"])]
    if goals:
        lines.append("goals (issue 15): " + "; ".join(goals))
    return "\n".join(lines)


def summary_md(result: dict) -> str:
    return pc.summary_doc(
        f"peers: Cellar beside etcd and PySyncObj ({result['started_utc']})",
        "Write throughput and latency of Cellar (binary client and HTTP gateway), etcd's JSON gateway and "
        "PySyncObj at each client count, all in one run on one machine, the targets alternating order round by "
        "round; ratios per round and their medians. The durability of each system is stated below the tables. "
        "See `results.json` and `peers.png`.", format_table(result), command_line(result))


def command_line(result: dict) -> str:
    ps = result["pysyncobj_settings"]
    return (f"cellar bench peers --targets {','.join(result['targets'])} "
            f"--clients {','.join(str(c) for c in result['clients'])} --seconds {result['seconds']:g} "
            f"--warmup {result['warmup']:g} --rounds {result['rounds']} --value-bytes {result['value_bytes']} "
            f"--fsync {result['fsync']} "
            f"--pysyncobj-{'batch' if ps['batch'] else 'no-batch'} --pysyncobj-append-period {ps['append_period']:g} "
            f"--pysyncobj-tick-period {ps['tick_period']:g}")


def plot(result: dict, path: str) -> None:
    plt = pc.plt_module()
    fig, (ax, lx) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [p["clients"] for p in result["points"]]
    colors = {"cellar-binary": "#2b8a3e", "cellar-http": "#74b816", "etcd-http": "#1c7ed6", "pysyncobj": "#e8590c",
              "pysyncobj-nosync": "#fab005"}
    for t in result["targets"]:
        ax.plot(xs, [p["median"][t]["ops_per_s"] for p in result["points"]], marker="o", color=colors[t], label=t)
        lx.plot(xs, [p["median"][t]["p50_ms"] for p in result["points"]], marker="o", color=colors[t], label=f"{t} p50")
        lx.plot(xs, [p["median"][t]["p99_ms"] for p in result["points"]], marker=".", linestyle="--",
                color=colors[t], label=f"{t} p99")
    for a in (ax, lx):
        a.set_xscale("log", base=2)
        a.set_xlabel("closed-loop clients")
    ax.set_yscale("log")
    ax.set_ylabel("acknowledged puts/s (median of rounds)")
    lx.set_yscale("log")
    lx.set_ylabel("latency, ms")
    ax.legend(fontsize=8)
    lx.legend(fontsize=6, ncol=2)
    fig.suptitle(f"peers: Cellar fsync={result['fsync']}, etcd (WAL fsync), PySyncObj (pysyncobj: journal synced "
                 f"by our shim; -nosync: as shipped); load {pc.load_text(result['load_average_before'])}", fontsize=9)
    pc.save_figure(fig, path)


@click.command("peers")
@kh.load_options(DEFAULT_TARGETS, warmup=2.0, rounds=3)
@click.option("--clients", default="32,128", show_default=True,
              help="Closed-loop client counts, comma-separated (each target gets the same count).")
@click.option("--pysyncobj-batch/--pysyncobj-no-batch", default=kh.PYSYNCOBJ_SETTINGS["batch"], show_default=True,
              help="PySyncObj's appendEntriesUseBatch.")
@click.option("--pysyncobj-append-period", type=click.FloatRange(0.001, 0.1),
              default=kh.PYSYNCOBJ_SETTINGS["append_period"], show_default=True,
              help="PySyncObj's appendEntriesPeriod in s (its own default 0.1).")
@click.option("--pysyncobj-tick-period", type=click.FloatRange(0.001, 0.1),
              default=kh.PYSYNCOBJ_SETTINGS["tick_period"], show_default=True,
              help="PySyncObj's autoTickPeriod in s (its own default 0.05): how long its thread may wait in poll "
                   "before it looks at queued commands and sends batched AppendEntries.")
@click.option("--out", type=click.Path(file_okay=False), default=os.path.join("bench", "results"), show_default=True,
              help="Results go to OUT/peers-<UTC timestamp>/.")
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON only.")
def peers(targets: str, clients: str, seconds: float, warmup: float, rounds: int, value_bytes: int, fsync: str,
          pysyncobj_batch: bool, pysyncobj_append_period: float,
          pysyncobj_tick_period: float, etcd: str, out: str,
          keep: bool, quiet: bool, as_json: bool) -> None:
    """Cellar (binary client and HTTP) beside etcd's JSON gateway and PySyncObj: write
    throughput, p50/p99 and their ratios at each client count, same run, same machine."""
    chosen = kh.parse_targets(targets)
    counts = parse_clients(clients)
    try:
        etcd_binary, pysyncobj_version = kh.find_peers(chosen, etcd)
    except kh.BenchError as e:
        click.echo(f"cellar bench peers: {e}", err=True)
        raise SystemExit(2) from None
    settings = {"batch": pysyncobj_batch, "append_period": pysyncobj_append_period,
                "tick_period": pysyncobj_tick_period}

    def body(frame: pc.Frame) -> Any:
        return run_peers(frame, targets=chosen, clients=counts, seconds=seconds, warmup=warmup, rounds=rounds,
                         value_bytes=value_bytes, fsync=fsync, etcd_binary=etcd_binary,
                         pysyncobj_version=pysyncobj_version, pysyncobj=settings, keep=keep)

    pc.cli_main("peers", lambda: pc.run_experiment("peers", out, body, quiet=quiet, summary=summary_md, plot=plot),
                as_json, format_table)
