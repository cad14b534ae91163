"""Partitions through the fault proxy (jepsen_like/proxy.py) on real processes: a short
Cellar run with ``--net proxy`` and a short etcd run (``--target etcd``: members that
all dial from 127.0.0.1, which iptables cannot tell apart) are valid, and their
partition faults really held bytes at the proxy's gates; slow links (the delay
nemesis) cut throughput and stay valid."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jepsen_like.runner import VALID, RunSpec, run_test

# Under xdist, on one worker: these clusters listen on 127.0.0.20-22 (jepsen_like.db)
# and the nemesis' iptables rules cut those addresses, so no two may run at once.
pytestmark = pytest.mark.xdist_group("loopback-hosts")


def _ok(r: dict) -> None:
    assert r["verdict"] == VALID, json.dumps({k: v for k, v in r.get("checks", {}).items() if k != "final_reads"},
                                             default=str)[:2000]
    assert r["checks"]["linearizable"] is True and r["checks"]["converged"] and r["checks"]["final_reads_agree"]


@pytest.mark.slow  # the default suite's short run (test_jepsen_run.py) partitions through the proxy
async def test_cellar_partitioned_through_the_proxy_is_valid(tmp_path):
    # seed 7, 9 s: one fault, "isolate" (a node cut off both ways) from 3.0 to 6.0 s
    spec = RunSpec(nemesis=["partition"], net="proxy", nodes=3, seconds=9, sessions=8, keys=3, seed=7,
                   out_root=str(tmp_path))
    r = await run_test(spec)
    _ok(r)
    assert [f["kind"] for f in r["faults"]] == ["isolate"]
    assert r["net"]["kind"] == "proxy" and r["net"]["proxies"] == 6
    assert r["net"]["holds"] > 0, r["net"]  # the cut really stopped bytes
    run_dir = next((tmp_path / r["name"]).iterdir())
    for name in ("results.json", "history.jsonl", "timeline.html", "latency.png", "rate.png"):
        assert (run_dir / name).exists(), name


@pytest.mark.slow  # about 10 s: the default suite's budget; the proxy's delay is unit-tested in tests/jepsen_like
async def test_slow_links_through_the_proxy_dip_throughput_and_stay_valid(tmp_path):
    # seed 3, 9 s, nemesis delay: delay-all (every link 20-200 ms slower each way) 3.0-5.7 s
    spec = RunSpec(nemesis=["delay"], nodes=3, seconds=9, sessions=8, keys=3, seed=3, out_root=str(tmp_path))
    r = await run_test(spec)
    _ok(r)
    assert r["net"]["kind"] == "proxy"  # chosen by itself: slow links exist only in the proxy
    (fault,) = r["availability"]["faults"]
    assert fault["kind"] == "delay-all" and "ms each way" in fault["detail"]
    assert fault["ok_per_s"] < r["availability"]["quiet_ok_per_s"] / 3, r["availability"]


needs_etcd = pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed (apt-get install etcd-server)")


def _etcd_ok(r: dict, kinds: list[str]) -> None:
    _ok(r)
    assert [f["kind"] for f in r["faults"]] == kinds
    # unplaced: a caller gone before the proxy looked at its socket (closed; etcd dials again)
    assert r["net"]["holds"] > 0 and r["net"]["unplaced"] * 4 < r["net"]["connections"], r["net"]
    assert r["name"].startswith("etcd-")
    run_dir = next((Path(r["dir"]).parent).iterdir())
    assert (run_dir / "node0.log").exists() and not (run_dir / "db").exists()  # data dirs wiped: valid


@pytest.mark.slow  # about 14 s, and etcd is a system package (apt-get install etcd-server), not part of the clone
@needs_etcd
async def test_etcd_with_its_leader_cut_off_through_the_proxy_is_valid(tmp_path):
    # seed 1, 9 s, nemeses partition and kill: one fault, isolate-sequencer (the leader) 3.0-5.4 s
    spec = RunSpec(target="etcd", workload="register", nemesis=["partition", "kill"], nodes=3, seconds=9,
                   sessions=8, seed=1, out_root=str(tmp_path))
    _etcd_ok(await run_test(spec), ["isolate-sequencer"])


@pytest.mark.slow  # about 22 s
@needs_etcd
async def test_etcd_under_kill_and_partition_through_the_proxy_is_valid(tmp_path):
    # seed 146, 13 s: kill-sequencer (the leader) 3.0-5.4 s, isolate-sequencer 6.7-9.6 s
    spec = RunSpec(target="etcd", workload="register", nemesis=["partition", "kill"], nodes=3, seconds=13,
                   sessions=8, seed=146, out_root=str(tmp_path))
    _etcd_ok(await run_test(spec), ["kill-sequencer", "isolate-sequencer"])


def test_etcd_cli_errors_are_one_line():
    for args, words in ((["--target", "etcd", "--nemesis", "clock"], "partition, kill, pause and delay"),
                        (["--target", "etcd", "--net", "iptables"], "--net proxy"),
                        (["--target", "etcd", "--workload", "scheduler"], "kv and register")):
        out = subprocess.run([sys.executable, "-m", "store.cli", "jepsen", "run", *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.slow  # about 10 s; the faulty proxy's bugs are caught by default in tests/jepsen_like/test_faulty_proxy.py
async def test_a_proxy_acknowledging_writes_it_dropped_is_caught_on_a_real_cluster(tmp_path):
    spec = RunSpec(nemesis=[], nodes=3, seconds=5, sessions=8, keys=2, seed=3, out_root=str(tmp_path),
                   planted="proxy-ack-dropped-writes")
    r = await run_test(spec)
    assert r["verdict"] == "invalid" and r["checks"]["linearizable"] is False
