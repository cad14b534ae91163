"""Checker benchmark: time and peak memory on generated histories, and how they scale.

    python -m jepsen_like.bench                       # the acceptance history + scaling table
    python -m jepsen_like.bench --clients 50 --ops 10000 --keys 8 --info-rate 0.03
    python -m jepsen_like.bench --scaling 10,25,50,100 --workload cas --workers 2
    python -m jepsen_like.bench --profile             # cProfile of one check, top functions
    python -m jepsen_like.bench --json                # the same figures as one JSON object on stdout

docs/checker.md has figures measured with it.

Every measurement runs in a fresh interpreter (``--one``), so the peak RSS it reports
(``ru_maxrss``: interpreter, history and checker together) belongs to that check alone. The
history is generated inside the child (``jepsen_like.synth``, deterministic per seed) and
generation is not timed. Reported per run: the verdict, ``verdict s`` (time to the verdict),
``total s`` (including shrinking and explaining a violation), search steps, peak cache entries
and peak RSS (the larger of the process and, with ``--workers``, its largest worker). Nothing here asserts a time: machines differ; the test suite asserts verdicts.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import resource
import subprocess
import sys
import time
from typing import Any

import click

from .checker import check
from .synth import generate_with_key, history_options
from .models import KV


def _history(config: dict[str, Any]) -> tuple[list, str | None]:
    """The generated history a measurement configuration names (and its corrupted key)."""
    keys = ("clients", "ops", "keys", "info_rate", "workload", "seed", "corrupt")
    return generate_with_key(**{k: config[k] for k in keys})


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Generate and check one history in this process."""
    history, key = _history(config)
    t0 = time.perf_counter()
    result = check(history, KV(), timeout_s=config["timeout"], workers=config["workers"])
    total = time.perf_counter() - t0
    v = result.violation
    return {
        **config,
        "valid": result.valid,
        "expected_key": key,
        "violation_key": None if v is None else v.key,
        "verdict_s": round(result.verdict_seconds, 3),
        "total_s": round(total, 3),
        "steps": result.steps,
        "cache_peak": result.cache_entries_peak,
        "info_ops": sum(1 for op in history if op.type == "info"),
        # Peak of this process, or of a forked worker if one grew larger (--workers).
        "rss_mb": round(
            max(
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
            )
            / 1024,
            1,
        ),
    }


def _in_child(config: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like.bench", "--one", json.dumps(config)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        raise click.ClickException(f"measuring {config['clients']} clients, {config['ops']} ops, "
                                   f"{config['keys']} keys failed: {lines[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _client_counts(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    counts = []
    for part in value.split(","):
        if part.strip():
            try:
                count = int(part)
            except ValueError:
                raise click.BadParameter(f"{part.strip()!r} is not a client count") from None
            if count < 1:
                raise click.BadParameter(f"{count}: a client count is at least 1")
            counts.append(count)
    return counts


def _row(r: dict[str, Any]) -> str:
    verdict = {True: "linearizable", False: "NOT linearizable"}.get(r["valid"], str(r["valid"]))
    where = f" (key {r['violation_key']})" if r["violation_key"] is not None else ""
    return (
        f"{r['clients']:>7} {r['ops']:>6} {r['keys']:>4} {r['info_ops']:>5} "
        f"{verdict + where:<26} {r['verdict_s']:>9.2f} {r['total_s']:>8.2f} "
        f"{r['steps']:>10} {r['cache_peak']:>9} {r['rss_mb']:>8.1f}"
    )


HEADER = (
    f"{'clients':>7} {'ops':>6} {'keys':>4} {'info':>5} {'verdict':<26} {'verdict s':>9} "
    f"{'total s':>8} {'steps':>10} {'cache':>9} {'RSS MB':>8}"
)


@click.command()
@history_options(seed=1)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0.0, min_open=True), default=120.0, show_default=True,
              help="Seconds per check; past it the verdict is unknown.")
@click.option("--scaling", default="10,25,50,100", show_default=True, callback=_client_counts,
              help="Client counts ('' to skip).")
@click.option("--profile", is_flag=True, help="cProfile one check of the corrupted history.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout (progress on stderr).")
@click.option("--one", hidden=True, help="Internal: measure one JSON config and print JSON.")
def main(
    clients: int,
    n_ops: int,
    keys: int,
    info_rate: float,
    workload: str,
    seed: int,
    workers: int,
    timeout: float,
    scaling: list[int],
    profile: bool,
    as_json: bool,
    one: str | None,
) -> None:
    """Measure the checker on generated histories (linearizable and with one key corrupted)."""
    if one is not None:
        click.echo(json.dumps(measure(json.loads(one))))
        return
    base = {
        "clients": clients,
        "ops": n_ops,
        "keys": keys,
        "info_rate": info_rate,
        "workload": workload,
        "seed": seed,
        "workers": workers,
        "timeout": timeout,
    }
    if profile:
        _profile({**base, "corrupt": True})
        return
    say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    say(f"workload {workload}, info rate {info_rate}, seed {seed}, workers {workers}")
    say(HEADER)
    runs = []
    for corrupt in (False, True):
        runs.append(_in_child({**base, "corrupt": corrupt}))
        say(_row(runs[-1]))
    sweep = []
    if scaling:
        say(f"\nscaling with concurrency ({n_ops} ops, {keys} keys)")
        say(HEADER)
        for c in scaling:
            for corrupt in (False, True):
                sweep.append(_in_child({**base, "clients": c, "corrupt": corrupt}))
                say(_row(sweep[-1]))
    if as_json:
        click.echo(json.dumps({"config": base, "runs": runs, "scaling": sweep}))


def _profile(config: dict[str, Any]) -> None:
    try:
        history, _ = _history(config)
    except ValueError as e:  # e.g. nothing to corrupt
        raise click.ClickException(str(e)) from None
    prof = cProfile.Profile()
    prof.enable()
    result = check(history, KV(), timeout_s=config["timeout"])
    prof.disable()
    click.echo(f"valid={result.valid} verdict {result.verdict_seconds:.2f} s, total {result.seconds:.2f} s")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
    click.echo(buf.getvalue())


if __name__ == "__main__":
    main()
