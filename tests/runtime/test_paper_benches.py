"""``cellar bench failover``, ``reads`` and ``straggler`` (bench/failover_bench.py,
bench/reads_bench.py, bench/straggler_bench.py, bench/paper_common.py): the pure
timeline helpers, the duty cycle on a process of our own, and one tiny run of each
command on real replicas that checks the report's shape and that the events happened
(the kill and both protocols' recovery; the slowdown; reads served). No timing asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import click
import pytest

from bench import paper_common as pc
from bench.failover_bench import analyse
from bench.reads_bench import parse_fractions
from bench.straggler_bench import DutyCycle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cellar(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


# --- pure helpers -----------------------------------------------------------------------------


def test_bucket_counts_and_rate():
    times = [10.0, 10.05, 10.1, 10.25, 10.99, 11.0, 9.9]
    assert pc.bucket_counts(times, 10.0, 10.5) == [2, 1, 1, 0, 0]
    assert pc.bucket_counts(times, 10.0, 11.0, width=0.5) == [4, 1]  # 11.0 is past the end
    assert pc.bucket_counts([], 0.0, 0.3) == [0, 0, 0]
    assert pc.rate(times, 10.0, 10.5) == pytest.approx(4 / 0.5)
    assert pc.rate(times, 11.0, 11.0) == 0.0
    with pytest.raises(ValueError):
        pc.bucket_counts(times, 0, 1, width=0)


def test_first_ack_after_counts_only_operations_invoked_after():
    invokes = [0.9, 1.2, 1.05, 2.0]
    completes = [1.01, 1.5, 1.4, 2.1]  # the first was in flight at the kill (t=1.0): not counted
    assert pc.first_ack_after(invokes, completes, 1.0) == 1.4
    assert pc.first_ack_after(invokes, completes, 3.0) is None
    assert pc.invokes_of([2.0, 3.0], [500.0, 250.0]) == pytest.approx([1.5, 2.75])


def test_recovery_time():
    counts = [10, 10, 10, 0, 0, 0, 2, 6, 9]  # kill at 0.3 s (bucket 3)
    assert pc.recovery_time(counts, 0.1, 0.3, 5) == pytest.approx(0.5)  # bucket 7 ends 0.8 s
    assert pc.recovery_time(counts, 0.1, 0.25, 5) == pytest.approx(0.55)  # the first whole bucket after
    assert pc.recovery_time(counts, 0.1, 0.3, 10) is None
    assert pc.recovery_time(counts, 0.1, 0.3, 0) is None  # no level: no recovery to speak of


def test_alternate_and_fractions():
    assert pc.alternate(["a", "b"], 0) == ["a", "b"] and pc.alternate(["a", "b"], 1) == ["b", "a"]
    assert parse_fractions("0, 0.5,0.95") == [0.0, 0.5, 0.95]
    for bad in ("1", "0,0", "x", "", "-0.1"):
        with pytest.raises(click.BadParameter):
            parse_fractions(bad)


def test_failover_analysis_of_a_made_up_timeline():
    # Two survivors; 100 writes/s each until the kill at t=1, nothing for 0.5 s, then again.
    def load(offset: float) -> SimpleNamespace:
        comps = [k / 100 + offset for k in range(100)] + [1.5 + k / 100 + offset for k in range(150)]
        return SimpleNamespace(completions=comps, latencies_ms=[5.0] * len(comps), ops=len(comps), errors=0)

    res = analyse({1: load(0.0), 2: load(0.003)}, 0.0, 3.0, 1.0)
    assert res["before_per_s"] == pytest.approx(200, rel=0.02)
    assert res["after_per_s"] == pytest.approx(200, rel=0.05)
    assert res["first_ack_s"] == {"1": pytest.approx(0.5), "2": pytest.approx(0.503)}
    assert res["recovered_50_s"] == pytest.approx(0.6)  # the bucket [1.5, 1.6) is back, done at 1.6
    assert res["longest_gap_s"] == pytest.approx(0.5, abs=0.02)
    assert len(res["ops_per_100ms"]) == 30 and res["ops_per_100ms"][12] == 0


def test_duty_cycle_stops_and_always_resumes_its_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        duty = DutyCycle(proc, 0.02, 0.03, limit_s=10)
        duty.start()
        time.sleep(0.3)
        duty.stop()
        assert duty.cycles >= 3 and 0 < duty.stopped_fraction() < 1
        with open(f"/proc/{proc.pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        assert state != "T"  # SIGCONTed, whatever the thread was doing
        with pytest.raises(ValueError):
            DutyCycle(proc, 0.05, 0.05, limit_s=1)
    finally:
        proc.kill()
        proc.wait()
    duty = DutyCycle(proc, 0.01, 0.02, limit_s=1)  # a process that is gone: never signalled
    duty.start()
    duty.stop()
    assert duty.cycles == 0


# --- smoke runs on real replicas --------------------------------------------------------------


def _folder(result: dict, tmp_path, exp: str) -> None:
    folder = result["out_dir"]
    assert os.path.dirname(folder) == str(tmp_path) and os.path.basename(folder).startswith(f"{exp}-")
    assert sorted(os.listdir(folder)) == sorted([f"{exp}.png", "results.json", "summary.md"])
    with open(os.path.join(folder, "results.json")) as f:
        assert json.load(f)["experiment"] == exp
    assert result["load_average_before"] is not None and result["fsync"] == "batch"


def test_failover_smoke(tmp_path):
    # 2.2 s after the kill: a new view and a write at both survivors (about 0.5-1.7 s here,
    # loaded or not) fit in it.
    out = cellar("bench", "failover", "--seconds", "3", "--kill-at", "0.8", "--rounds", "1", "--sessions", "8",
                 "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    _folder(result, tmp_path, "failover")
    assert result["all_recovered"] is True
    for p in ("sdpaxos", "multipaxos"):
        (m,) = result["runs"][p]
        # The clients avoid the orderer of the start; the kill takes whoever orders at the
        # kill, which a view change under the suite's load may have moved to a client's
        # replica (whose clients then leave the figures).
        assert m["killed_pid"] and m["killed"] in (0, 1, 2), m
        clients = sorted({0, 1, 2} - {m["orderer_at_start"], m["killed"]})
        assert clients and m["clients_at"] == clients, m
        assert m["elected"] in {0, 1, 2} - {m["killed"]}, m
        assert set(m["first_ack_s"]) == {str(i) for i in clients}
        assert all(v is not None and v > 0 for v in m["first_ack_s"].values())
        assert all(v is not None for v in m["view_change_s"].values()), m["view_change_s"]
        assert m["before_per_s"] > 0 and m["after_per_s"] > 0
        # The kill comes after the asked 0.8 s (uvloop's timers have millisecond
        # resolution and may fire up to 1 ms early: a fresh clone once saw 0.799).
        assert len(m["ops_per_100ms"]) == 30 and m["kill_at_s"] >= 0.8 - 0.002
    assert set(result["ratios_sdpaxos_over_multipaxos"]) == set(result["median"]["sdpaxos"])


@pytest.mark.slow  # the default suite smokes the failover bench; -m slow runs these
def test_reads_smoke(tmp_path):
    out = cellar("bench", "reads", "--seconds", "1", "--read-fractions", "0,0.75", "--warmup", "0", "--sessions", "8",
                 "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    _folder(result, tmp_path, "reads")
    assert result["read_fractions"] == [0.0, 0.75]
    assert result["sequencer_lease_at_start"]["sdpaxos"] is True
    for p in ("sdpaxos", "multipaxos"):
        none, most = result["points"][p]
        assert none["reads"] == 0 and none["writes_per_s"] > 0 and none["errors"] == 0
        assert most["reads"] > most["ops"] / 2 and most["ops"] > 0 and most["errors"] == 0
        assert len(most["rounds"]) == 1 and most["per_round_ops_per_s"] == [most["ops_per_s"]]
        assert most["views_changed"] in ([False], [True])  # recorded (a busy machine may see one)
    assert len(result["ratio_sdpaxos_over_multipaxos"]) == 2
    assert result["over_own_all_writes"]["sdpaxos"][0] == 1.0


@pytest.mark.slow  # the default suite smokes the failover bench; -m slow runs these
def test_straggler_smoke(tmp_path):
    out = cellar("bench", "straggler", "--seconds", "1.2", "--slow-at", "0.6", "--sessions", "8",
                 "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    _folder(result, tmp_path, "straggler")
    assert result["cases"] == ["sdpaxos-sequencer", "sdpaxos-replica", "multipaxos-leader"]
    for case in result["cases"]:
        (m,) = result["runs"][case]
        assert m["duty_cycle"]["cycles"] > 0 and 0 < m["duty_cycle"]["stopped_fraction"] < 1
        assert m["slowed"] == (1 if case == "sdpaxos-replica" else 0) and m["slowed_pid"]
        assert m["before_per_s"] > 0 and m["ops"] > 0
        assert len(m["ops_per_100ms"]) == 12
    assert "sdpaxos_replica_over_multipaxos_leader_slowed" in result["ratios"]


def test_bad_arguments_are_one_line(tmp_path):
    bad = cellar("bench", "straggler", "--cases", "sdpaxos-sequencer,raft-leader")
    assert bad.returncode == 2 and "choose some of" in bad.stderr and "Traceback" not in bad.stderr
    bad = cellar("bench", "straggler", "--stop-ms", "60", "--period-ms", "50")
    assert bad.returncode == 2 and "less than the period" in bad.stderr
    bad = cellar("bench", "failover", "--seconds", "3", "--kill-at", "2.8")
    assert bad.returncode == 2 and "before the end" in bad.stderr
    bad = cellar("bench", "reads", "--read-fractions", "0,1.5", "--out", str(tmp_path / "out"))
    assert bad.returncode == 2 and "[0, 1)" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "out").exists()
