"""``cellar jepsen run|campaign``: fault-injection tests of real Cellar processes
(``jepsen_like.runner``). Exit status: 0 valid, 1 invalid, 2 unknown (or a usage
error). Partitions go through iptables (root) or, with ``--net proxy`` or where iptables
cannot be used, through fault proxies in the harness (``jepsen_like.proxy``)."""

from __future__ import annotations

import asyncio
import json
import sys

import click

from .runner import INVALID, PLANTED, UNKNOWN, VALID, RunSpec, run_test

EXIT = {VALID: 0, INVALID: 1, UNKNOWN: 2}


def _spec(*, nemesis: str, nodes: str, out: str, net: str | None, **options) -> RunSpec:
    """A ``RunSpec`` from the shared options (``_OPTIONS``) and ``--seed``; exit 2 if bad."""
    kinds = [k.strip() for k in nemesis.split(",") if k.strip() and k.strip() != "none"]
    options["planted"] = options.get("planted") or ""
    spec = RunSpec(nemesis=kinds, nodes=int(nodes), out_root=out, net=net or "", **options)
    try:
        spec.validate()
    except ValueError as e:
        _fail(str(e))
    return spec


def _fail(message: str) -> None:
    """One line on stderr, exit status 2 (bad arguments, or the cluster could not be run)."""
    click.echo(f"cellar jepsen: {message}", err=True)
    sys.exit(2)


def _run(spec: RunSpec, progress) -> dict:
    from .nemesis import NemesisError

    try:
        return asyncio.run(run_test(spec, progress=progress))
    except (RuntimeError, TimeoutError, OSError, NemesisError) as e:  # a node that would not start, ...
        _fail(f"{type(e).__name__}: {str(e)[:400]}")
        raise  # not reached


def _line(r: dict) -> str:
    c = r.get("checks", {})
    a = r.get("availability", {})
    what = "scheduler checks" if r["spec"].get("workload") == "scheduler" else "linearizable"
    return (f"{r.get('verdict', UNKNOWN):8} seed {r['spec']['seed']:<6} {what} {c.get('linearizable')}  "
            f"converged {c.get('converged')}  reads agree {c.get('final_reads_agree')}  "
            f"faults {len(r.get('faults', []))}{'' if c.get('disk_faults_handled', True) else ' (a disk fault mishandled)'}  longest stall {a.get('longest_stall_s')} s  {r.get('dir')}")


_OPTIONS = [
    click.option("--workload", type=click.Choice(["kv", "register", "scheduler"]), default="kv", show_default=True,
                 help="kv: compare-and-set registers on several keys; register: one key; scheduler: "
                      "affinity groups allocated and released through the scheduler service "
                      "(examples/hived-small.yaml), checked by its invariants on every replica, acknowledged "
                      "allocations surviving, no cell held twice."),
    click.option("--nemesis", default="partition,kill,pause", show_default=True,
                 help="Faults to mix, comma-separated (none for no faults): partition (iptables, or the fault proxy: --net), kill, "
                      "pause, delay (every link of one node, the sequencer or all nodes 20-200 ms slower each way; "
                      "the fault proxy only), clock (tick-rate skew within the lease's drift bound, through each node's "
                      "--clock-control file; reset on heal), disk (on a killed node: a torn write after its "
                      "WAL's end, or a flipped byte in a durable record, which must be refused; on a running "
                      "node's own tmpfs: a full disk, ENOSPC, which must stop it; root for the tmpfs)."),
    click.option("--nodes", type=click.Choice(["3", "5"]), default="3", show_default=True),
    click.option("--time", "seconds", type=click.FloatRange(5, 3600), default=60.0, show_default=True,
                 help="Seconds of workload (faults stop 3 s before the end)."),
    click.option("--sessions", type=click.IntRange(1, 1024), default=16, show_default=True),
    click.option("--keys", type=click.IntRange(1, 1000), default=5, show_default=True),
    click.option("--rate", type=click.FloatRange(0), default=0.0, show_default=True,
                 help="About this many operations per second in all (0: as fast as answered)."),
    click.option("--out", type=click.Path(file_okay=False), default="runs", show_default=True,
                 help="Results go to OUT/<test>/<timestamp>/ (and OUT/latest)."),
    click.option("--net", type=click.Choice(["iptables", "proxy"]), default=None,
                 help="How partitions are made: iptables (DROP rules between the nodes' addresses; root) or "
                      "proxy (every peer link through a fault proxy in the harness, jepsen_like/proxy.py). "
                      "Default: iptables when it can be used here, else the proxy; etcd: always the proxy."),
    click.option("--proxy-mode", type=click.Choice(["hold", "discard", "reset"]), default="hold", show_default=True,
                 help="What a cut does in the proxy: hold the bytes until the heal (iptables DROP), discard them "
                      "and reset the connection at the heal, or reset the pair's connections at once (REJECT)."),
    click.option("--target", type=click.Choice(["cellar", "etcd"]), default="cellar", show_default=True,
                 help="What to test: cellar serve replicas, or etcd members (the etcd on PATH; workloads kv "
                      "and register, nemeses partition, kill, pause, delay; partitions through the proxy)."),
    click.option("--base-ip", type=click.IntRange(2, 245), default=20, show_default=True,
                 help="Node i listens on 127.0.0.<BASE_IP + i>; runs side by side need bases 5 apart."),
    click.option("--planted", type=click.Choice(PLANTED[1:]), default=None,
                 help="A deliberately broken piece, to see the checkers catch it (the run must come out "
                      "invalid): a client (stale-reads, dropped-cas, info-as-fail), a faulty proxy in front "
                      "of every node's HTTP API (proxy-ack-dropped-writes, proxy-stale-replies, "
                      "proxy-swap-replies), or a broken state machine in every replica (machine-...: "
                      "jepsen_like/planted.py)."),
]


def _with_options(fn):
    for opt in reversed(_OPTIONS):
        fn = opt(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def jepsen() -> None:
    """Fault-injection tests of real Cellar processes: partitions, kills, pauses, clock skew, disk faults."""


@jepsen.command("run")
@_with_options
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print results.json's content instead of a summary.")
def run(as_json, **options):
    """One test; exit 0 valid, 1 invalid, 2 unknown."""
    spec = _spec(**options)
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    r = _run(spec, say)
    if as_json:
        click.echo(json.dumps(r, default=str))
    else:
        click.echo(_line(r))
        for f in r.get("availability", {}).get("faults", []):
            click.echo(f"  {f['start']:7.2f}-{f['end']:7.2f} s  {f['kind']:18} {f['ok_per_s']:8.1f} ok/s  "
                       f"stall {f['longest_stall_s']:.2f} s  ({f['detail']})")
        click.echo(f"  quiet: {r.get('availability', {}).get('quiet_ok_per_s')} ok/s; details in {r.get('dir')}/results.json")
        if r.get("plots"):
            click.echo(f"  {r['plots']}")
    sys.exit(EXIT[r.get("verdict", UNKNOWN)])


@jepsen.command("campaign")
@_with_options
@click.option("--seed", type=int, default=1, show_default=True, help="First seed.")
@click.option("--count", type=click.IntRange(1, 10000), default=5, show_default=True, help="Tests (seeds seed..seed+count-1).")
@click.option("--json", "as_json", is_flag=True)
def campaign(seed, count, as_json, **options):
    """COUNT tests on consecutive seeds; a table; exit 0 only if every one is valid."""
    rows = []
    for s in range(seed, seed + count):
        spec = _spec(seed=s, **options)
        r = _run(spec, (lambda m: click.echo(m, err=True)) if as_json else None)
        rows.append(r)
        if not as_json:
            click.echo(_line(r))
    verdicts = [r.get("verdict", UNKNOWN) for r in rows]
    if as_json:
        click.echo(json.dumps([{"seed": r["spec"]["seed"], "verdict": r.get("verdict"), "dir": r.get("dir"),
                                "checks": {k: v for k, v in r.get("checks", {}).items() if k != "final_reads"},
                                "availability": r.get("availability")} for r in rows], default=str))
    else:
        click.echo(f"{verdicts.count(VALID)} valid, {verdicts.count(INVALID)} invalid, {verdicts.count(UNKNOWN)} unknown")
    sys.exit(0 if all(v == VALID for v in verdicts) else (1 if INVALID in verdicts else 2))
