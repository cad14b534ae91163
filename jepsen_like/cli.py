"""``cellar check``: is a recorded history linearizable?

    cellar check --model register|cas-register|kv HISTORY_FILE [--format auto|jsonl|jepsen|kv]
                 [--timeout S] [--memory-mb MB] [--workers N] [--report out.html] [--json]

Exit status (as Jepsen): 0 linearizable, 1 not linearizable, 2 unknown (the time or memory
budget ran out) or bad input (unreadable file, unknown format, malformed line: the message names
the file and line). ``--json`` prints ``{"linearizable": true|false|null, "ops": n,
"partitions": n, "seconds": x}`` on stdout and nothing else there.
"""

from __future__ import annotations

import json
import os
import sys

import click

from .checker import check as run_check
from .checker.core import DEFAULT_MEMORY_BYTES_MAX, CheckResult
from .history import FORMATS, HistoryError, pair, read_history
from .models import MODELS, ModelError, get_model

__all__ = ["check"]

EXIT_OK, EXIT_INVALID, EXIT_UNKNOWN = 0, 1, 2


@click.command("check")
@click.option("--model", "model_name", type=click.Choice(sorted(MODELS)), required=True, help="Sequential specification.")
@click.argument("history_file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto", show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="Seconds before answering unknown.")
@click.option(
    "--memory-mb",
    type=int,
    default=DEFAULT_MEMORY_BYTES_MAX >> 20,
    show_default=True,
    help="Budget for the search caches (estimated) before answering unknown.",
)
@click.option("--workers", type=int, default=1, show_default=True, help="Processes to check partitions in (fork).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write an HTML timeline here.")
@click.option("--json", "as_json", is_flag=True, help="Print a one-line JSON verdict.")
def check(
    model_name: str,
    history_file: str,
    fmt: str,
    timeout_s: float,
    memory_mb: int,
    workers: int,
    report_path: str | None,
    as_json: bool,
) -> None:
    """Check HISTORY_FILE for linearizability against a model."""
    model = get_model(model_name)
    try:
        history = read_history(history_file, fmt)
        ops = pair(history, source=history_file)
        result = run_check(
            ops, model, timeout_s=timeout_s, memory_bytes_max=memory_mb << 20, workers=max(1, workers)
        )
    except (HistoryError, ModelError) as exc:
        msg = str(exc)
        if isinstance(exc, ModelError):
            msg = f"{history_file}: {msg}"
        click.echo(f"error: {msg}", err=True)
        sys.exit(EXIT_UNKNOWN)
    if report_path:
        from .report import write_report

        try:
            os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
            write_report(report_path, ops, model, result, title=f"{history_file} ({model_name})")
        except OSError as exc:
            click.echo(f"error: cannot write the report {report_path}: {exc.strerror or exc}", err=True)
            sys.exit(EXIT_UNKNOWN)
    if as_json:
        click.echo(json.dumps(result.to_json()))
    else:
        _summary(result, report_path)
    sys.exit({True: EXIT_OK, False: EXIT_INVALID}.get(result.valid, EXIT_UNKNOWN))  # type: ignore[arg-type]


def _summary(result: CheckResult, report_path: str | None) -> None:
    verdict = {True: "linearizable", False: "NOT linearizable"}.get(result.valid, "unknown")  # type: ignore[arg-type]
    reason = f" ({result.reason})" if result.reason else ""
    click.echo(
        f"{verdict}{reason}: {result.ops} operations, {result.partitions} partition(s), "
        f"{result.seconds:.2f} s"
    )
    v = result.violation
    if v is not None:
        model = get_model(result.model).for_partition(v.key)
        key = "" if v.key is None else f" (key {v.key!r})"
        click.echo(f"violation{key}:")
        if v.reason:
            click.echo(f"  {v.reason}")
        for o in v.involved:
            click.echo(f"  {model.describe_op(o)}  [{o.type}, process {o.process}, index {o.invoke.index}]")
        click.echo(f"  longest linearizable prefix: {len(v.longest)} operations, leaving {v.state}")
        if v.minimized:
            click.echo(f"  shortest failing prefix: {len(v.cut)} of {len(v.ops)} operations of this key")
    if report_path:
        click.echo(f"report: {report_path}")
