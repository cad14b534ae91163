"""``cellar bench --machine scheduler`` (bench/scheduler_bench.py): a short run of every
mode on a small generated cluster, through the CLI, reports sane figures; bad input is
one line. No timed assertion: the figures depend on the machine's load."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.scheduler_bench import Workload, summary_lines


def cellar(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_bench_scheduler_runs_every_mode_and_reports_sane_figures():
    r = cellar("bench", "--machine", "scheduler", "--nodes", "64", "--vcs", "2", "--seconds", "0.5",
               "--warmup", "0.3", "--clients", "8", "--machine-ops", "500", "--json",
               "--modes", "machine,embedded,http,http-batch")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["nodes"] == 64 and out["gpus"] == 512 and out["replicas"] == 3
    assert list(out["modes"]) == ["machine", "embedded", "http", "http-batch"]
    for mode, m in out["modes"].items():
        assert m["ops"] > 0 and m["ops_per_s"] > 0, (mode, m)
        assert m["allocations"] + m["releases"] == m["ops"], (mode, m)
        assert 0 < m["p50_ms"] <= m["p99_ms"] <= m["max_ms"], (mode, m)
        assert m["errors"] == 0, (mode, m)
    assert out["modes"]["http-batch"]["ops_per_request"] > 1
    for mode in ("embedded", "http", "http-batch"):
        m = out["modes"][mode]
        assert m["placed"] > 0 and m["digests"]["equal"], (mode, m)
        assert len(m["digests"]["replicas"]) == 3
        assert m["cpu_ms_per_op"] > 0
    assert set(out["ratio_to_machine"]) == {"embedded", "http", "http-batch"}
    assert "http" in r.stderr and "ops/s" in r.stderr  # the progress lines (stdout holds the JSON only)
    lines = summary_lines(out)
    assert any(line.split()[0] == "http" for line in lines[2:])


def test_bench_scheduler_bad_input_is_one_line():
    r = cellar("bench", "--machine", "scheduler", "--nodes", "40", "--modes", "machine", "--quiet")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "multiple of 16" in r.stderr, r.stderr
    r = cellar("bench", "--machine", "scheduler", "--modes", "machine,nope")
    assert r.returncode == 2 and "nope" in r.stderr
    r = cellar("bench", "--help")
    assert r.returncode == 0 and "--machine [kv|scheduler]" in r.stdout


def test_workload_releases_each_group_once_and_keeps_the_target():
    w = Workload(nodes=64, vcs=2, seed=3)
    names: set[str] = set()
    released: list[str] = []
    for _ in range(2000):
        kind, arg = w.next_op()
        if kind == "allocate":
            name = arg["affinityGroup"]["name"]
            assert name not in names and arg["virtualCluster"] in ("vc0", "vc1")
            names.add(name)
            w.add(name)  # as if placed
        else:
            assert arg not in w.pos and arg not in released  # taken out of the live set at once
            released.append(arg)
        assert len(w.live) <= w.live_target
    assert released and len(w.live) + len(released) == len(names)


def test_node_options_reach_the_embedded_replica_under_its_config_names():
    """The served replicas take ``node_options`` through a TOML file; the replica in the
    bench's own process takes them as NodeConfig fields, so ``sequencer`` (the TOML
    key) is ``initial_sequencer`` there (it raised TypeError before)."""
    import dataclasses

    from bench.scheduler_bench import node_config_options
    from consensus.runtime.node import NodeConfig
    from store.server import TOML_SETTINGS

    fields = {f.name for f in dataclasses.fields(NodeConfig)}
    assert all(attr in fields for _key, attr, _typ in TOML_SETTINGS)
    opts = node_config_options({"sequencer": 1, "fsync_worker": "loop", "snapshot_every": 0})
    assert opts == {"initial_sequencer": 1, "fsync_worker": "loop", "snapshot_every": 0}
    assert set(opts) <= fields
    assert node_config_options(None) == {}
