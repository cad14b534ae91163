"""``cellar bench geo`` (bench/geo_bench.py): the bounds on their own, and a smoke run on 3
real replicas with tiny RTTs that checks the report's shape (every site has real, sim
and bound figures; results.json, the plot and summary.md written). No timing asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.geo_bench import bounds, geo_setting

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cellar(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_bounds_follow_table_1():
    names, m, _ = geo_setting(5, None, 1.0)
    assert names == ["CA", "OR", "OH", "IRE", "SEL"]
    sd = {n: b for n, b in zip(names, bounds(m, "sdpaxos"))}
    # Nearest majority (two others) plus the site's own round trip to its clients.
    assert sd["CA"]["bound_ms"] == pytest.approx(1.16 + 52)  # OR 20, OH 52
    assert sd["IRE"]["bound_ms"] == pytest.approx(0.48 + 125)  # OH 84, OR 125
    # The paper's one exception (§7, Fig. 12): the sequencer (CA, 139) is not in IRE's quorum.
    assert sd["IRE"]["via_sequencer_ms"] == pytest.approx(0.48 + 139)
    assert sd["OR"]["via_sequencer_ms"] == sd["OR"]["bound_ms"]
    mp = {n: b for n, b in zip(names, bounds(m, "multipaxos"))}
    assert mp["CA"]["bound_ms"] == pytest.approx(1.16 + 52)  # the leader's own majority
    assert mp["SEL"]["bound_ms"] == pytest.approx(1.11 + 146 + 52)  # to the leader, then its majority
    names3, m3, _ = geo_setting(3, None, 0.5)
    assert names3 == ["CA", "OR", "OH"]
    assert [b["bound_ms"] for b in bounds(m3, "sdpaxos")] == pytest.approx([(1.16 + 20) / 2, (0.02 + 20) / 2,
                                                                           (1.1 + 52) / 2])
    assert bounds(m3, "multipaxos")[2]["bound_ms"] == pytest.approx((1.1 + 52 + 20) / 2)


def test_geo_smoke_three_replicas(tmp_path):
    out = cellar("bench", "geo", "--replicas", "3", "--rtt-scale", "0.05", "--seconds", "1", "--warmup", "0.3",
                 "--clients-per-site", "2", "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["sites"] == ["CA", "OR", "OH"] and result["sequencer"] == "CA"
    assert result["protocols"] == ["sdpaxos", "multipaxos"]
    for protocol in ("sdpaxos", "multipaxos"):
        sites = result["results"][protocol]["sites"]
        assert list(sites) == ["CA", "OR", "OH"]
        for site, row in sites.items():
            assert row["real"]["ops"] > 0 and row["real"]["p50_ms"] is not None, (protocol, site, row)
            assert row["real"]["p50_ms"] <= row["real"]["p99_ms"]
            assert row["sim"]["p50_ms"] > 0 and row["bound"]["bound_ms"] > 0, (protocol, site, row)
            assert row["real_over_sim_p50"] is not None and row["real_over_bound_p50"] is not None
        links = result["results"][protocol]["proxies"]["links"]
        assert len(links) == 6  # one proxy per directed pair
        assert sum(1 for link in links.values() if link["connections"]) >= 3  # every pair connected through one
    folder = result["out_dir"]
    assert os.path.dirname(folder) == str(tmp_path) and os.path.basename(folder).startswith("geo-")
    assert sorted(os.listdir(folder)) == ["geo.png", "results.json", "rtt-table.json", "summary.md"]
    with open(os.path.join(folder, "results.json")) as f:
        assert json.load(f)["results"].keys() == result["results"].keys()


def test_geo_bad_arguments_are_one_line(tmp_path):
    bad = cellar("bench", "geo", "--protocol", "sdpaxos,raft")
    assert bad.returncode == 2 and "choose some of" in bad.stderr and "Traceback" not in bad.stderr
    bad = cellar("bench", "geo", "--replicas", "7")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    table = tmp_path / "rtt.json"
    table.write_text('{"regions": ["A", "B", "C"], "rtt_ms": {"A": {"B": 1}}}')
    bad = cellar("bench", "geo", "--rtt-file", str(table), "--out", str(tmp_path / "out"))
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("cellar bench geo: ") and "not an RTT table" in bad.stderr
    assert not (tmp_path / "out").exists()  # nothing written for a run that never started
    helped = cellar("bench", "--help")
    assert helped.returncode == 0 and "geo" in helped.stdout
