"""``cellar jepsen run`` in the default suite (issue 14): a short test of real processes
under kills, pauses and partitions (through the fault proxy) is valid, every fault shows in the
results and the plots, and the same harness calls a run invalid when a planted bug
sits between the workload and the cluster (a client that serves stale reads)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jepsen_like.runner import INVALID, VALID, RunSpec, run_test

# Under xdist, on one worker: these clusters listen on 127.0.0.20-22 (jepsen_like.db)
# and the nemesis' iptables rules cut those addresses, so no two may run at once.
pytestmark = pytest.mark.xdist_group("loopback-hosts")


def _kinds() -> list[str]:
    return ["kill", "pause", "partition"]


async def test_a_short_run_under_faults_is_valid_and_shows_every_fault(tmp_path):
    # seed 2, 13 s: one combined window, 3.0-7.9 s: a flapping partition (through the
    # fault proxy) while the sequencer is killed. Partitions through iptables on real
    # processes: test_nemesis.py.
    spec = RunSpec(nemesis=_kinds(), net="proxy", nodes=3, seconds=13, sessions=8, keys=3, seed=2,
                   out_root=str(tmp_path))
    r = await run_test(spec)
    assert r["verdict"] == VALID, json.dumps(r.get("checks", {}), default=str)[:2000]
    assert r["checks"]["linearizable"] is True and r["checks"]["converged"] and r["checks"]["final_reads_agree"]
    assert [f["kind"] for f in r["faults"]] == ["flapping+kill-sequencer"], r["faults"]
    assert r["faults"][0]["observed"]["flaps"] >= 2, r["faults"]  # cut and healed, again and again
    assert r["net"]["kind"] == "proxy" and r["net"]["proxies"] == 6
    assert r["net"]["holds"] > 0, r["net"]  # the cut really stopped bytes
    out = tmp_path / r["name"]
    run_dir = next(out.iterdir())
    for name in ("results.json", "history.jsonl", "timeline.html", "latency.png", "rate.png"):
        assert (run_dir / name).exists(), name
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    started = {h["f"].split(" ", 1)[1] for h in history if h["process"] == "nemesis" and h["f"].startswith("start ")}
    assert started == {f["kind"] for f in r["faults"]}
    assert (tmp_path / "latest" / "results.json").exists()
    assert not (run_dir / "db").exists(), "a valid run keeps no data dirs"


@pytest.mark.slow  # the checkers catch planted bugs by default in tests/jepsen_like and test_jepsen_scheduler.py
async def test_a_stale_reading_client_is_caught(tmp_path):
    spec = RunSpec(nemesis=[], nodes=3, seconds=5, sessions=8, keys=2, seed=3, out_root=str(tmp_path),
                    planted="stale-reads")
    r = await run_test(spec)
    assert r["verdict"] == INVALID and r["checks"]["linearizable"] is False


def test_cli_usage_errors_are_one_line():
    out = subprocess.run([sys.executable, "-m", "store.cli", "jepsen", "run", "--nemesis", "meteor"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown nemesis meteor" in out.stderr and "Traceback" not in out.stderr
