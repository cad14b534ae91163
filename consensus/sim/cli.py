"""``cellar sim``: run one seeded simulation and print a table (or JSON)."""

from __future__ import annotations

import json
import sys

import click

from .geo import sites_for
from .simulator import PROTOCOLS, SimConfig, Simulation


def _resolve_sequencer(site: str | None, replicas: int, rtt: str, rtt_file: str | None) -> int:
    names, _ = sites_for(replicas, rtt, rtt_file)
    if site is None:
        return 0
    for i, name in enumerate(names):
        if name.lower() == site.lower() or site == str(i):
            return i
    raise click.BadParameter(f"{site!r} is not one of the sites {', '.join(names)}", param_hint="--sequencer")


@click.command("sim")
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
@click.option("--reads", "read_fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True, help="Fraction of gets (answered after execution).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def sim(
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
    as_json: bool,
) -> None:
    """Run one seeded simulation of SDPaxos or Multi-Paxos and report latencies.

    Same seed, same trace: the printed trace_hash identifies the run.
    """
    n = int(replicas)
    cfg = SimConfig(
        protocol=protocol,
        replicas=n,
        rtt=rtt,
        rtt_file=rtt_file,
        sequencer=_resolve_sequencer(sequencer_site, n, rtt, rtt_file),
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
    )
    try:
        result = Simulation(cfg).run().summary()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_table(result)
    if not result["consistent"] or result["lost_acked"] or result["duplicated"] or result["wrong_results"]:
        sys.exit(1)


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


if __name__ == "__main__":
    sim()
