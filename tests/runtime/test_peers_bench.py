"""``cellar bench peers`` (bench/peers_bench.py) in a few seconds: Cellar's binary client beside
PySyncObj (bench/pysyncobj_server.py, journal synced) on real processes, the results folder,
every server gone afterwards; one clear line when etcd or pysyncobj is missing. With etcd
installed, ``-m slow`` runs every target. Nothing here asserts a time."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.runtime.test_kv_http_bench import cellar


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def run_peers(tmp_path, targets: str) -> dict:
    out = cellar("bench", "peers", "--targets", targets, "--clients", "4", "--seconds", "1", "--warmup", "0",
                 "--rounds", "1", "--out", str(tmp_path), "--json", timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_peers_bench_cellar_binary_beside_pysyncobj(tmp_path):
    result = run_peers(tmp_path, "cellar-binary,pysyncobj")
    (point,) = result["points"]
    assert point["clients"] == 4 and result["targets"] == ["cellar-binary", "pysyncobj"]
    for target in result["targets"]:
        m = point["median"][target]
        assert m["ops_per_s"] > 0 and m["errors"] == 0 and m["sessions"] == 4, (target, m)
        assert m["p50_ms"] <= m["p99_ms"]
    assert point["ratios"]["cellar-binary/pysyncobj"] > 0 and "cellar-binary/etcd-http" not in point["ratios"]
    assert set(result["durability"]) == {"cellar", "pysyncobj"}
    assert "fdatasync" in result["durability"]["pysyncobj"] and "batch" in result["durability"]["cellar"]
    (cellar,) = point["runs"]["cellar-binary"]
    assert [set(v) for v in cellar["cellar_after"]] == [{"view", "sequencer", "phase", "loop_lag_max_ms"}] * 3
    assert len(result["server_pids"]) == 6 and all(gone(pid) for pid in result["server_pids"])
    files = set(os.listdir(result["out_dir"]))
    assert {"results.json", "summary.md", "peers.png"} <= files, files
    with open(os.path.join(result["out_dir"], "summary.md")) as f:
        summary = f.read()
    assert "cellar bench peers --targets cellar-binary,pysyncobj --clients 4" in summary and "durability" in summary


def test_peers_bench_missing_peer_is_one_line_and_exit_2(tmp_path):
    shadow = tmp_path / "shadow" / "pysyncobj"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no pysyncobj here')\n")
    out = cellar("bench", "peers", "--targets", "cellar-binary,pysyncobj", "--out", str(tmp_path),
                 path_first=str(tmp_path / "shadow"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "pysyncobj not found" in out.stderr, out.stderr
    no_etcd = cellar("bench", "peers", "--etcd", "/nonexistent/etcd", "--out", str(tmp_path))
    assert no_etcd.returncode == 2 and "etcd not found" in no_etcd.stderr
    assert no_etcd.stderr.strip().count("\n") == 0, no_etcd.stderr
    bad = cellar("bench", "peers", "--clients", "0,32")
    assert bad.returncode == 2 and "--clients" in bad.stderr
    assert not any(p.startswith("peers-") for p in os.listdir(tmp_path))  # nothing ran, no results folder


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed (apt-get install etcd-server)")
def test_peers_bench_every_target(tmp_path):
    result = run_peers(tmp_path, "cellar-binary,cellar-http,etcd-http,pysyncobj,pysyncobj-nosync")
    (point,) = result["points"]
    for target in result["targets"]:
        assert point["median"][target]["ops_per_s"] > 0 and point["median"][target]["errors"] == 0, target
    assert set(point["ratios"]) == {"cellar-binary/etcd-http", "cellar-binary/pysyncobj", "cellar-http/etcd-http",
                                    "cellar-binary/pysyncobj-nosync"}
    assert result["etcd"].startswith("etcd ") and set(result["durability"]) == {
        "cellar", "etcd", "pysyncobj", "pysyncobj-nosync"}
    assert all(gone(pid) for pid in result["server_pids"]) and len(result["server_pids"]) == 12
