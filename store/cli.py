"""The ``cellar`` command line: one entry point for the whole product.

Subcommands live next to the code they drive and are imported only when used, so
``cellar --help`` stays fast and a broken optional piece cannot break the others.
Each entry of ``SUBCOMMANDS`` maps a name to ``module:attribute`` (a click command).
"""

from __future__ import annotations

import importlib
import os
import sys

import click

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("consensus.sim.cli:sim", "Run one seeded simulation of SDPaxos or Multi-Paxos."),
    "check": ("jepsen_like.cli:check", "Check a history for linearizability."),
    "jepsen": ("jepsen_like.jepsen_cli:jepsen", "Fault-injection tests of real processes: jepsen run|campaign."),
    "scheduler": ("scheduler_state.cli:scheduler", "HiveD scheduler state machine tools."),
    "serve": ("store.server:serve", "Run one replica (config file or flags)."),
    "up": ("store.server:up", "Start a local cluster on 127.0.0.1 until Ctrl-C."),
    "demo": ("store.demo:demo", "Local cluster, live workload, sequencer killed and restarted."),
    "bench": ("bench.kv_http_bench:bench", "Write throughput and latency: SDPaxos vs Multi-Paxos, side by side; "
              "bench kv-http: HTTP beside etcd."),
    "steady": ("bench.steady:steady", "A steady load with snapshots on: view changes, loop pauses, p99.9."),
    "status": ("store.admin_cli:status", "Each replica's role, view, sequencer, executed slot and digest."),
    "sequencer": ("store.admin_cli:sequencer", "Move the sequencer: sequencer transfer --to ID."),
    "member": ("store.member_cli:member", "The cluster's members: member list|add|remove|replace|promote."),
    "snapshot": ("store.snapshot_cli:snapshot", "A replica's state to a file (save); a new cluster from it (restore)."),
    "kv": ("store.kv_cli:kv", "Keys and values: kv put|get|del|txn (client ports), kv watch (HTTP ports)."),
    "lease": ("store.kv_cli:lease", "Leases on keys: lease grant|keepalive|revoke|timetolive|list."),
    "certs": ("store.certs:certs", "TLS certificates: certs init DIR --nodes N (a local CA, node, admin, client)."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in SUBCOMMANDS:
            return command
        target, _ = SUBCOMMANDS[cmd_name]
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise click.ClickException(f"'{cmd_name}' is not available in this build") from exc
            raise
        return getattr(module, attr)

    def invoke(self, ctx: click.Context):
        """Every command: a failure nobody foresaw is one line and exit status 1, never
        a traceback (``CELLAR_DEBUG=1`` shows it)."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Abort, click.exceptions.Exit):
            raise
        except Exception as exc:
            if os.environ.get("CELLAR_DEBUG"):
                raise
            name = ctx.invoked_subcommand or ctx.info_name or "cellar"
            text = " ".join(str(exc).split())[:300]
            click.echo(f"cellar {name}: internal error: {type(exc).__name__}"
                       f"{': ' + text if text else ''} (CELLAR_DEBUG=1 shows where)", err=True)
            ctx.exit(1)

    def main(self, args=None, prog_name=None, **extra):
        """Usage errors (an unknown option, a bad value, a missing argument) are one
        line too, ``cellar bench: Invalid value for '--net': ... (see --help)``, exit
        status 2; click's own form takes four lines."""
        if extra.get("standalone_mode", True) is False:
            return super().main(args, prog_name, **extra)
        extra.pop("standalone_mode", None)
        try:
            rv = super().main(args, prog_name or "cellar", standalone_mode=False, **extra)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "cellar"
            click.echo(f"{where}: {e.format_message()} (see {where} --help)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in sorted(SUBCOMMANDS)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cellar")
def main() -> None:
    """Cellar: a replicated control-plane state store built on SDPaxos."""
    # The composition root: ``cellar sim`` resolves machine names through this registry
    # (consensus.sim.registry; consensus/ names no machine itself).
    from store.machines import install_in_simulator

    install_in_simulator()


if __name__ == "__main__":
    main()
