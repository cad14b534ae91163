"""``cellar scheduler``: tools around the HiveD scheduler state machine.

- ``cellar scheduler validate CONFIG.yaml``: load and validate a HiveD config; print a
  summary (chains, nodes, leaf cells, VCs) or one line naming the offending entry and
  exit with status 1.
- ``cellar scheduler bench [--nodes 1024] [--vcs 8] [--ops 50000] [--seed 1] [--json]``:
  the apply-throughput benchmark of ``scheduler_state.bench`` (ops/s, p50/p99 apply time).
- ``cellar scheduler status|vcs|groups|allocate SPEC|release NAME|health NODE on|off
  [--endpoints HOST:PORT,...] [--json]``: the running replicas' HTTP API
  (``store.scheduler_cli``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from scheduler_state.config import ConfigError, load_config


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def scheduler() -> None:
    """HiveD scheduler state machine tools."""


@scheduler.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def validate(config: Path, as_json: bool) -> None:
    """Load and validate a HiveD config file."""
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        if as_json:
            click.echo(json.dumps({"valid": False, "file": str(config), "error": str(exc)}))
        else:
            click.echo(f"{config}: invalid: {exc}", err=True)
        sys.exit(1)
    summary = cfg.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    chains = summary["chains"]
    click.echo(f"{config}: valid: {len(chains)} chains, {len(cfg.node_names())} nodes, "
               f"{sum(c['leafCells'] for c in chains.values())} leaf cells, "
               f"{len(summary['virtualClusters'])} virtual clusters")
    for name, c in chains.items():
        click.echo(f"  chain {name}: {c['topCells']} top cells, {c['nodes']} nodes, "
                   f"{c['leafCells']} x {c['leafCellType']}")
    for name, v in summary["virtualClusters"].items():
        click.echo(f"  vc {name}: {v['virtualCells']} virtual cells ({v['nonPinnedLeafCells']} leaf cells), "
                   f"{v['pinnedCells']} pinned cells")


@scheduler.command()
@click.option("--nodes", type=click.IntRange(16, 1 << 20), default=1024, show_default=True, help="Nodes of 8 GPUs (a multiple of 16).")
@click.option("--vcs", type=click.IntRange(1, 4096), default=8, show_default=True, help="Virtual clusters sharing the cluster.")
@click.option("--ops", type=click.IntRange(1, 100_000_000), default=50_000, show_default=True, help="Timed allocate/release commands.")
@click.option("--warmup", type=click.IntRange(0, 100_000_000), default=2_000, show_default=True, help="Untimed commands first.")
@click.option("--seed", default=1, show_default=True, help="Seed of the command generator.")
@click.option("--utilization", type=click.FloatRange(0, 1, min_open=True), default=0.6, show_default=True, help="Target share of GPUs in use.")
@click.option("--gc-freeze/--no-gc-freeze", default=False, show_default=True,
              help="gc.freeze() the built cluster, as a long-running replica would.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench(nodes: int, vcs: int, ops: int, warmup: int, seed: int, utilization: float, gc_freeze: bool,
          as_json: bool) -> None:
    """Apply throughput for allocate+release of mixed-size groups (1-64 GPUs)."""
    from scheduler_state.bench import run

    try:
        result = run(nodes=nodes, vcs=vcs, ops=ops, seed=seed, utilization=utilization, warmup=warmup,
                     gc_freeze=gc_freeze)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    c = result["counts"]
    click.echo(f"cluster: {result['nodes']} nodes x 8 GPUs = {result['gpus']} GPUs, {result['vcs']} VCs "
               f"(built in {result['build_s']} s); seed {result['seed']}; gc.freeze: {result['gc_freeze']}")
    click.echo(f"ops: {result['ops']} timed ({c['allocate']} allocate: {c['allocated']} placed, "
               f"{c['waiting']} waiting, {c['preempted']} victims; {c['release']} release)")
    for kind in ("cpu", "wall"):
        f = result[kind]
        click.echo(f"{kind:>4}: {f['ops_per_s']:>9.0f} ops/s   p50 {f['p50_us']:>7.1f} us   "
                   f"p99 {f['p99_us']:>7.1f} us   max {f['max_us']:>8.1f} us")


def _add_service_commands() -> None:
    """The commands that talk to running replicas (``store.scheduler_cli``); they import
    aiohttp and rich only when run."""
    try:
        from store.scheduler_cli import COMMANDS
    except ImportError:  # pragma: no cover - a build without store/
        return
    for command in COMMANDS:
        scheduler.add_command(command)


_add_service_commands()
