"""``cellar sim``: run one seeded simulation and print a table (or JSON).

``cellar sim search``: the swarm fault search (``consensus.sim.search``) over a range
of seeds, or ``--replay SEED`` one of them.
"""

from __future__ import annotations

import json
import sys

import click

from .geo import sites_for
from .scenarios import SCENARIOS, schedule
from .simulator import PROTOCOLS, SimConfig, Simulation


def _resolve_sequencer(site: str | None, replicas: int, rtt: str, rtt_file: str | None) -> int:
    names, _ = sites_for(replicas, rtt, rtt_file)
    if site is None:
        return 0
    for i, name in enumerate(names):
        if name.lower() == site.lower() or site == str(i):
            return i
    raise click.BadParameter(f"{site!r} is not one of the sites {', '.join(names)}", param_hint="--sequencer")


@click.group("sim", invoke_without_command=True)
@click.option("--protocol", type=click.Choice(sorted(PROTOCOLS)), default="sdpaxos", show_default=True)
@click.option("--replicas", type=click.Choice(["3", "5", "7"]), default="3", show_default=True)
@click.option("--rtt", type=click.Choice(["geo", "lan"]), default="geo", show_default=True, help="Delay model.")
@click.option("--rtt-file", type=click.Path(exists=True, dir_okay=False), help="RTT table JSON (default: paper Table 1).")
@click.option("--sequencer", "sequencer_site", metavar="SITE", help="Site of the sequencer (Multi-Paxos: leader). Default: first site.")
@click.option("--clients-per-site", type=click.IntRange(0, 10_000), default=4, show_default=True)
@click.option("--seconds", type=click.FloatRange(0.01, 3600), default=10.0, show_default=True, help="Simulated seconds of load.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--batch", type=click.IntRange(1, 100_000), default=256, show_default=True, help="Max commands per instance.")
@click.option("--inflight", type=click.IntRange(1, 100_000), default=32, show_default=True, help="Max unanswered instances per replica.")
@click.option("--tick-ms", type=click.FloatRange(0.1, 1000), default=10.0, show_default=True)
@click.option("--jitter", type=click.FloatRange(0, 10), default=0.0, show_default=True, help="Extra delay, fraction of one-way.")
@click.option("--loss", type=click.FloatRange(0, 0.9), default=0.0, show_default=True)
@click.option("--dup", type=click.FloatRange(0, 0.9), default=0.0, show_default=True)
@click.option("--reads", "read_fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True, help="Fraction of gets (through the sequencer lease when there is one).")
@click.option("--cas", "cas_fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True, help="Fraction of compare-and-sets on the same keys.")
@click.option("--keys", type=click.IntRange(1, 1_000_000), default=8, show_default=True, help="Keys the clients work on.")
@click.option("--disk-sync-ms", type=click.FloatRange(0, 10_000), default=0.0, show_default=True, help="SimDisk: a sync takes this long; answers wait for it (0: instant durability).")
@click.option("--disk-sync-jitter-ms", type=click.FloatRange(0, 10_000), default=0.0, show_default=True, help="SimDisk: up to this much more per sync.")
@click.option("--scenario", type=click.Choice(SCENARIOS), default="none", show_default=True, help="Fault schedule.")
@click.option("--faults-seed", type=int, default=1, show_default=True, help="Seed of the random scenario.")
@click.option("--heartbeat-ms", type=click.FloatRange(1, 60_000), default=500.0, show_default=True, help="Failure-detection timeout.")
@click.option("--lease-ms", type=click.FloatRange(1, 60_000), default=500.0, show_default=True, help="Sequencer lease.")
@click.option("--client-timeout-ms", type=click.FloatRange(0, 600_000), default=2000.0, show_default=True, help="Clients resend elsewhere after this (0: never).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def sim(
    ctx: click.Context,
    protocol: str,
    replicas: str,
    rtt: str,
    rtt_file: str | None,
    sequencer_site: str | None,
    clients_per_site: int,
    seconds: float,
    seed: int,
    batch: int,
    inflight: int,
    tick_ms: float,
    jitter: float,
    loss: float,
    dup: float,
    read_fraction: float,
    cas_fraction: float,
    keys: int,
    disk_sync_ms: float,
    disk_sync_jitter_ms: float,
    scenario: str,
    faults_seed: int,
    heartbeat_ms: float,
    lease_ms: float,
    client_timeout_ms: float,
    as_json: bool,
) -> None:
    """Run one seeded simulation of SDPaxos or Multi-Paxos and report latencies.

    Same seed, same trace: the printed trace_hash identifies the run.
    ``cellar sim search --help``: the swarm fault search.
    """
    if ctx.invoked_subcommand is not None:
        return
    n = int(replicas)
    try:
        sequencer = _resolve_sequencer(sequencer_site, n, rtt, rtt_file)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    cfg = SimConfig(
        protocol=protocol,
        replicas=n,
        rtt=rtt,
        rtt_file=rtt_file,
        sequencer=sequencer,
        clients_per_site=clients_per_site,
        seconds=seconds,
        seed=seed,
        batch=batch,
        inflight=inflight,
        tick_ms=tick_ms,
        jitter=jitter,
        loss=loss,
        dup=dup,
        read_fraction=read_fraction,
        cas_fraction=cas_fraction,
        keys=keys,
        disk_sync_ms=disk_sync_ms,
        disk_sync_jitter_ms=disk_sync_jitter_ms,
        heartbeat_ms=heartbeat_ms,
        lease_ms=lease_ms,
        client_timeout_ms=client_timeout_ms,
        faults=schedule(scenario, n, sequencer, seconds, faults_seed),
    )
    try:
        simulation = Simulation(cfg).run()
        result = simulation.summary()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if scenario != "none":
        result["scenario"] = scenario
        result["faults"] = [list(f) for f in cfg.faults]
        result["linearizable"] = simulation.linearizable()
        result["stall_ms_by_site"] = simulation.stall_ms_by_site()
        if scenario == "straggler-sequencer":
            result["throughput"] = straggler_figures(simulation)
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_table(result)
    if not result["consistent"] or not result["agreement"] or result["lost_acked"] or result["duplicated"] or result["wrong_results"]:
        sys.exit(1)
    if result.get("linearizable") is False:
        sys.exit(1)


def straggler_figures(simulation: Simulation) -> dict:
    """Commits/s before the sequencer slowed, while it was slow, and after it was replaced."""
    fault = simulation.first_fault_us or 0
    changes = [t for t in simulation.view_change_times if t > fault]
    replaced = changes[0] if changes else None
    end = simulation.stop_us
    return {
        "before_per_s": simulation.throughput(max(0, fault - 2_000_000), fault),
        "slow_per_s": simulation.throughput(fault, replaced if replaced else end),
        "after_per_s": simulation.throughput(replaced + 500_000, end) if replaced else 0.0,
        "replaced_after_ms": round((replaced - fault) / 1000, 1) if replaced else None,
    }


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"{result['protocol']} · {result['replicas']} replicas · sequencer {result['sequencer']} · seed {result['seed']}"
    table = Table(title=title)
    for col in ("site", "commits", "p50 ms", "mean ms", "p99 ms", "exec p50 ms"):
        table.add_column(col, justify="right" if col != "site" else "left")
    for site, row in result["sites"].items():
        table.add_row(site, str(row["commits"]), f"{row['p50_ms']:.1f}", f"{row['mean_ms']:.1f}", f"{row['p99_ms']:.1f}", f"{row['exec_p50_ms']:.1f}")
    console = Console()
    console.print(table)
    ok = "yes" if result["consistent"] else "NO"
    console.print(
        f"committed {result['committed']} in {result['sim_seconds']} simulated s · consistent: {ok} · "
        f"lost acked: {result['lost_acked']} · duplicated: {result['duplicated']} · trace {result['trace_hash']}"
    )
    if "scenario" in result:
        lin = {True: "yes", False: "NO", None: "unknown"}[result["linearizable"]]
        console.print(
            f"scenario {result['scenario']}: stall {result['stall_ms']} ms · view changes {result['view_changes']} · "
            f"linearizable: {lin}"
        )
        if result.get("stall_ms_by_site"):
            console.print("  longest stall per site: " + ", ".join(f"{k} {v} ms" for k, v in result["stall_ms_by_site"].items()))
        for t, *action in result["faults"][:12]:
            console.print(f"  {t:>9} ms  {' '.join(str(a) for a in action)}")
    if "throughput" in result:
        tp = result["throughput"]
        console.print(
            f"throughput: {tp['before_per_s']}/s before · {tp['slow_per_s']}/s with the slow sequencer · "
            f"{tp['after_per_s']}/s after it was replaced ({tp['replaced_after_ms']} ms after it slowed)"
        )


@sim.command("search")
@click.option("--examples", type=click.IntRange(1, 10_000_000), default=200, show_default=True, help="Seeds to run.")
@click.option("--seed", type=int, default=None, help="First seed (default: from the clock; printed).")
@click.option("--replay", type=int, default=None, help="Judge only this seed and print its config.")
@click.option("--save", is_flag=True, help="Record failures in tests/testdata/fault_regressions.json.")
@click.option("--stop", is_flag=True, help="Stop at the first failure.")
@click.option("--reconfig", is_flag=True, help="Every run also closes its epoch with a membership change (docs/membership.md).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (the seeds, every failure with its replay command) on stdout; "
                   "progress goes to stderr.")
def search_command(examples: int, seed: int | None, replay: int | None, save: bool, stop: bool, reconfig: bool,
                   as_json: bool) -> None:
    """Swarm fault search: each seed draws a cluster, network, disk, workload (puts,
    lease reads, CAS) and fault schedule; the run must be safe, linearizable and live."""
    import time

    from .search import REGRESSIONS, judge, replay_hint, save_regressions, search, swarm_config

    if replay is not None:
        cfg = swarm_config(replay, reconfig)
        result = judge(cfg)
        keys = ("failures", "lost_acked", "duplicated", "wrong_results", "linearizable", "view_changes", "committed",
                "epoch_end", "past_end")
        if as_json:
            click.echo(json.dumps({"seed": replay, **{k: result.get(k) for k in keys},
                                   "replay": f"cellar sim search --replay {replay}" + (" --reconfig" if reconfig else ""),
                                   "config": repr(cfg)}))
        else:
            click.echo(json.dumps({k: result.get(k) for k in keys}))
            click.echo(replay_hint(replay, cfg))
        sys.exit(1 if result["failures"] else 0)
    first = seed if seed is not None else int(time.time())

    def say(line: str) -> None:
        click.echo(line, err=as_json)

    say(f"SEED={first} examples={examples}")
    started = time.monotonic()
    found = search(range(first, first + examples), echo=say, stop_on_failure=stop, reconfig=reconfig)
    saved = save_regressions(found) if save and found else 0
    if saved:
        say(f"saved {saved} new regression case(s) to {REGRESSIONS}")
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        click.echo(json.dumps({
            "first": first, "examples": examples, "reconfig": reconfig, "seconds": seconds,
            "failures": [{"seed": f["seed"], "failures": f["failures"],
                          "replay": f"cellar sim search --replay {f['seed']}" + (" --reconfig" if reconfig else "")}
                         for f in found],
            "saved": saved,
        }))
    else:
        click.echo(f"seeds {first}..{first + examples - 1}: {len(found)} failure(s) in {seconds:.0f} s")
    sys.exit(1 if found else 0)


@sim.command("membership")
@click.option("--examples", type=click.IntRange(1, 1_000_000), default=100, show_default=True, help="Seeds to run.")
@click.option("--seed", type=int, default=None, help="First seed (default: from the clock; printed).")
@click.option("--replay", type=int, default=None, help="Judge only this seed and print its config and result.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per failure, and a summary.")
@click.option("--execute-after-send", "defer", is_flag=True,
              help="Members execute their commits after sending them, as `cellar serve` does by default "
                   "(docs/runtime.md); without it, inside the step that commits.")
def membership_command(examples: int, seed: int | None, replay: int | None, as_json: bool, defer: bool) -> None:
    """Fault search for membership change (docs/membership.md): processes across epochs
    under crashes, cut links, loss and reordering while an admin grows, shrinks and
    replaces the cluster; every epoch must close the same way everywhere, the history
    be linearizable and every command complete."""
    import time

    from .membership import judge_seed, swarm_membership

    if replay is not None:
        result = judge_seed(replay, defer)
        click.echo(json.dumps({"config": repr(swarm_membership(replay, defer)), **result}, default=str))
        sys.exit(1 if result["failures"] else 0)
    first = seed if seed is not None else int(time.time())
    started = time.monotonic()
    failed = []
    with click.progressbar(range(first, first + examples), label=f"seeds {first}..{first + examples - 1}",
                           file=sys.stderr) as bar:
        for s in bar:
            result = judge_seed(s, defer)
            if result["failures"]:
                failed.append(result)
                click.echo(json.dumps(result) if as_json else
                           f"FAIL seed {s}: {', '.join(result['failures'])} (replay: cellar sim membership --replay {s}"
                           f"{' --execute-after-send' if defer else ''})")
    summary = {"first": first, "examples": examples, "failures": len(failed), "seconds": round(time.monotonic() - started)}
    click.echo(json.dumps(summary) if as_json else
               f"seeds {first}..{first + examples - 1}: {len(failed)} failure(s) in {summary['seconds']} s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    from store.machines import install_in_simulator  # the composition root (consensus.sim.registry)

    install_in_simulator()
    sim()
