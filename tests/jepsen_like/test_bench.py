"""Acceptance 3: the 50-client, 10,000-operation, 8-key history with info operations, and the
same history with one key made non-linearizable. Verdicts only: times and memory are measured
by ``python -m jepsen_like.bench`` (see docs/checker.md), never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jepsen_like.bench import measure
from jepsen_like.checker import check
from jepsen_like.synth import generate, generate_with_key
from jepsen_like.history import pair
from jepsen_like.models import KV


@pytest.mark.parametrize("workload", ["kv", "cas"])
def test_acceptance_history(workload: str) -> None:
    history, _ = generate_with_key(clients=50, ops=10_000, keys=8, info_rate=0.03, workload=workload, seed=1)
    ops = pair(history)
    assert len(ops) == 10_000
    assert len({o.key for o in ops}) == 8
    assert sum(o.type == "info" for o in ops) > 200
    result = check(ops, KV(), timeout_s=120)
    assert result.valid is True
    assert result.partitions == 8


@pytest.mark.parametrize("workload", ["kv", "cas"])
def test_acceptance_history_with_one_key_corrupted(workload: str) -> None:
    history, key = generate_with_key(
        clients=50, ops=10_000, keys=8, info_rate=0.03, workload=workload, seed=1, corrupt=True
    )
    good = generate(clients=50, ops=10_000, keys=8, info_rate=0.03, workload=workload, seed=1)
    (bad,) = [a for a, b in zip(history, good) if a != b]
    result = check(history, KV(), timeout_s=120)
    assert result.valid is False
    v = result.violation
    assert v is not None and v.key == key
    assert bad.index in {o.complete.index for o in v.involved if o.complete is not None}


def test_bench_measures_in_a_child_process() -> None:
    config = {
        "clients": 5,
        "ops": 200,
        "keys": 2,
        "info_rate": 0.05,
        "workload": "kv",
        "seed": 3,
        "workers": 1,
        "timeout": 30.0,
        "corrupt": True,
    }
    assert measure(config)["valid"] is False
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like.bench", "--one", json.dumps(config)],
        check=True,
        capture_output=True,
        text=True,
    )
    row = json.loads(out.stdout)
    assert row["valid"] is False and row["violation_key"] == row["expected_key"]
    assert row["rss_mb"] > 0 and row["verdict_s"] >= 0


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jepsen_like.bench", *args], capture_output=True, text=True,
                          timeout=120)


def test_bench_json_is_one_object_with_every_run() -> None:
    out = _bench("--clients", "4", "--ops", "200", "--keys", "2", "--scaling", "3", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [r["valid"] for r in result["runs"]] == [True, False]
    assert [(r["clients"], r["valid"]) for r in result["scaling"]] == [(3, True), (3, False)]
    assert "verdict" in out.stderr  # the table went to stderr


@pytest.mark.parametrize("args, fragment", [
    (["--clients", "0"], "'--clients'"),
    (["--info-rate", "1.5"], "'--info-rate'"),
    (["--workers", "0"], "'--workers'"),
    (["--timeout", "0"], "'--timeout'"),
    (["--scaling", "10,x"], "'x' is not a client count"),
    (["--scaling", "0"], "a client count is at least 1"),
    (["--ops", "20", "--info-rate", "1", "--scaling", ""], "could not find a read to corrupt"),
])
def test_bench_bad_input_is_one_line_and_no_traceback(args: list[str], fragment: str) -> None:
    out = _bench(*args)
    assert out.returncode in (1, 2), out
    assert fragment in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--keys", "0"], "'--keys'"),
    (["--ops", "20", "--info-rate", "1", "--corrupt"], "could not find a read to corrupt"),
    (["--ops", "5", "-o", "/nonexistent-dir/h.jsonl"], "cannot write /nonexistent-dir/h.jsonl"),
])
def test_synth_bad_input_is_one_line_and_no_traceback(args: list[str], fragment: str) -> None:
    out = subprocess.run([sys.executable, "-m", "jepsen_like.synth", *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode in (1, 2), out
    assert fragment in out.stderr and "Traceback" not in out.stderr, out.stderr
