"""``cellar bench kv-http`` (bench/kv_http_bench.py) in a few seconds: Cellar's HTTP gateway and
binary client on real replicas (no etcd needed), the missing-etcd error, and ``cellar bench``
still being the SDPaxos/Multi-Paxos bench without a subcommand. With etcd installed,
``-m slow`` also runs etcd's gateway beside Cellar's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cellar(*args: str, timeout: float = 120, path_first: str | None = None) -> subprocess.CompletedProcess:
    """``cellar ARGS`` from the repo; ``path_first`` goes on PYTHONPATH before it."""
    paths = [*([path_first] if path_first else []), ROOT, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths).rstrip(os.pathsep)}
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_kv_http_bench_against_cellar_only():
    out = cellar("bench", "kv-http", "--targets", "cellar-http,cellar-binary", "--seconds", "1", "--warmup", "0",
                 "--rounds", "1", "--sessions", "8", "--binary-sessions", "16", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["targets"] == ["cellar-http", "cellar-binary"] and result["etcd"] is None
    for target in ("cellar-http", "cellar-binary"):
        m = result["median"][target]
        assert m["ops_per_s"] > 0 and m["errors"] == 0 and m["p50_ms"] <= m["p99_ms"], (target, m)
    assert result["median"]["cellar-http"]["sessions"] == 8
    assert result["median"]["cellar-binary"]["sessions"] == 16
    assert result["ratio_cellar_http_over_etcd_http"] is None
    assert "cellar: 3 replicas" in out.stderr  # progress goes to stderr with --json


def test_kv_http_bench_without_etcd_is_one_clear_line():
    out = cellar("bench", "kv-http", "--etcd", "/nonexistent/etcd", "--seconds", "1")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "etcd not found" in out.stderr, out.stderr
    assert "--targets cellar-http,cellar-binary" in out.stderr and out.stdout == ""
    bad = cellar("bench", "kv-http", "--targets", "cellar-http,mongo")
    assert bad.returncode == 2 and "choose some of" in bad.stderr


def test_bench_without_subcommand_is_still_the_protocol_bench():
    helped = cellar("bench", "--help")
    assert helped.returncode == 0 and "kv-http" in helped.stdout and "--machine" in helped.stdout
    bad = cellar("bench", "--machine", "scheduler", "--modes", "bogus")
    assert bad.returncode == 2 and "--modes" in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed (apt-get install etcd-server)")
def test_kv_http_bench_beside_etcd():
    out = cellar("bench", "kv-http", "--targets", "cellar-http,etcd-http", "--seconds", "2", "--warmup", "0.5",
                 "--rounds", "1", "--sessions", "16", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["etcd"].startswith("etcd ") and result["median"]["etcd-http"]["ops_per_s"] > 0
    assert result["median"]["etcd-http"]["errors"] == 0 and result["ratio_cellar_http_over_etcd_http"] > 0
