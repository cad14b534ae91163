"""The harness catches a broken state machine in real replicas (issue 14, acceptance 3):
``cellar serve`` unchanged, its machine swapped for a deliberately wrong one
(jepsen_like/planted.py, no build flag in the product), and a short faultless run
comes out invalid, for the reason the bug gives: an acknowledged write a later read
does not see, a compare-and-set that succeeds where it must fail, replicas whose
states part, an acknowledged allocation missing from the scheduler's final state."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jepsen_like.planted import MACHINE_BUGS
from jepsen_like.runner import INVALID, RunSpec, run_test

CAUGHT_BY = {
    "kv-lost-write": lambda c: c["linearizable"] is False,
    "kv-cas-ignores-compare": lambda c: c["linearizable"] is False,
    "kv-diverge": lambda c: c["converged"] is False,
    "scheduler-ack-unplaced": lambda c: "acknowledged, never released, missing" in str(c["scheduler"]),
}


# About 10 s each against real processes: under -m slow (the default suite's checkers
# catch the same kinds of history in tests/jepsen_like and test_jepsen_scheduler.py).
@pytest.mark.slow
@pytest.mark.parametrize("bug", MACHINE_BUGS)
async def test_a_broken_state_machine_is_caught(tmp_path, bug):
    spec = RunSpec(workload="scheduler" if bug.startswith("scheduler-") else "kv", nemesis=[], nodes=3, seconds=6,
                   sessions=8, keys=2, seed=3, out_root=str(tmp_path), planted=f"machine-{bug}", base_ip=60)
    r = await run_test(spec)
    assert r["verdict"] == INVALID, r.get("checks")
    assert CAUGHT_BY[bug](r["checks"]), r["checks"]
    assert r["name"].endswith(f"-planted-machine-{bug}")


def test_the_launcher_refuses_an_unknown_bug_in_one_line():
    out = subprocess.run([sys.executable, "-m", "jepsen_like.planted", "no-such-bug", "serve", "--id", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown planted machine bug" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
