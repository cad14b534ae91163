"""``cellar bench load`` (bench/load_bench.py): the pure helpers (percentiles, a point's
accounting of offered, achieved, shed and errors, the sustained rate, the ratios over
rounds) and one tiny run on real replicas that checks the report's shape. No timing
asserted. (The load generator's own helpers: tests/store/test_loadgen.py.)"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import click
import pytest

from bench import load_bench as lb
from tests.runtime.test_paper_benches import _folder, cellar


def group(latencies, completions, offered=0, shed=0, errors=0, lag=()) -> SimpleNamespace:
    return SimpleNamespace(latencies_ms=list(latencies), completions=list(completions), offered=offered, shed=shed,
                           errors=errors, ops=len(latencies), send_lag_ms=list(lag))


def test_percentile_is_the_nearest_rank():
    data = list(range(1, 1001))  # 1..1000
    assert lb.percentile(data, 0.5) == 501
    assert lb.percentile(data, 0.99) == 991
    assert lb.percentile(data, 0.999) == 1000
    assert lb.percentile([7.0], 0.999) == 7.0
    assert lb.percentile([], 0.5) is None


def test_point_accounts_for_offered_shed_errors_and_the_window():
    # Two replicas' open loops over 2 s from t0 = 100: 5 answers each, one answered after the window.
    a = group([1.0, 2.0, 3.0, 4.0, 50.0], [100.1, 100.5, 101.0, 101.9, 102.3], offered=9, shed=3, errors=1,
              lag=[0.1, 0.2, 0.1, 0.3, 0.2])
    b = group([5.0, 6.0, 7.0, 8.0, 9.0], [100.2, 100.4, 100.6, 100.8, 101.5], offered=7, shed=1, errors=1,
              lag=[0.0, 0.5, 0.1, 0.1, 9.0])
    m = lb.point({0: a, 1: b}, 2.0, 100.0, "open")
    assert m["offered"] == 16 and m["offered_per_s"] == 8.0
    assert m["ops"] == 10 and m["shed"] == 4 and m["errors"] == 2
    assert m["offered"] == m["ops"] + m["shed"] + m["errors"]  # every arrival accounted for once
    assert m["achieved_per_s"] == 4.5  # 9 answers within [100, 102); the late one counts in latency only
    assert (m["p50_ms"], m["p99_ms"], m["p999_ms"]) == (6.0, 50.0, 50.0)
    assert m["send_lag_p99_ms"] == 9.0
    closed = lb.point({0: group([1.0, 3.0], [0.5, 0.7])}, 1.0, 0.0, "closed")
    assert closed["offered"] is None and closed["offered_per_s"] is None and closed["send_lag_p99_ms"] is None
    assert closed["achieved_per_s"] == 2.0 and closed["shed"] == 0


def test_sustained_rate_peak_and_ratios():
    pts = [{"achieved_per_s": 495.0, "shed": 0}, {"achieved_per_s": 1900.0, "shed": 0},
           {"achieved_per_s": 3000.0, "shed": 0}, {"achieved_per_s": 3900.0, "shed": 12}]
    assert lb.sustained_rate([500, 2000, 4000, 8000], pts) == 2000  # 3000 of 4000 is under 90 %
    assert lb.sustained_rate([500], [{"achieved_per_s": 100.0, "shed": 0}]) is None
    # Against what the Poisson schedule offered (1930/s asked 2000), not the level's name.
    assert lb.sustained_rate([2000], [{"achieved_per_s": 1756.0, "shed": 0, "offered_per_s": 1930.0}]) == 2000
    assert lb.peak(pts) == 3900.0 and lb.peak([]) is None

    def rounds(*vals):
        ms = [{"mode": "open", "level": 1000, "offered_per_s": 1000.0, "achieved_per_s": v, "p50_ms": v / 100,
               "p99_ms": None, "p999_ms": 1.0, "send_lag_p99_ms": 0.1, "ops": 10, "shed": 1, "errors": 0,
               "views_before": [0], "views_after": [0 if k else 1]} for k, v in enumerate(vals)]
        return lb.combine(ms)

    sd, mp = rounds(900.0, 1000.0, 950.0), rounds(1000.0, 500.0, 1900.0)
    assert sd["achieved_per_s"] == 950.0 and sd["shed"] == 3 and sd["ops"] == 30 and sd["p99_ms"] is None
    assert sd["views_changed"] == [True, False, False]
    # The median of each round's ratio (0.9, 2.0, 0.5), not the ratio of the medians.
    assert lb.paired_ratios([sd], [mp], "achieved_per_s") == [0.9]
    assert lb.paired_ratios([sd], [mp], "p99_ms") == [None]


def test_plan_alternates_point_by_point_and_round_by_round():
    combos = [(16, "zipf", "open"), (16, "zipf", "closed")]
    steps = lb.plan(combos, {"open": [500, 1000], "closed": [4, 16]}, rounds=2)
    assert len(steps) == 8
    first = [order[0] for _, _, _, order in steps]
    assert first[:4] == ["sdpaxos", "multipaxos", "sdpaxos", "multipaxos"]
    assert first[4:] == ["multipaxos", "sdpaxos", "multipaxos", "sdpaxos"]  # (4 points: an even count)
    for _, c, k, order in steps:
        assert sorted(order) == ["multipaxos", "sdpaxos"]
        # Every point is measured once in each order over the two rounds.
        assert {s[3][0] for s in steps if (s[1], s[2]) == (c, k)} == {"sdpaxos", "multipaxos"}


def test_a_collapsed_cluster_is_reported_not_dropped(tmp_path):
    # A made-up run: Multi-Paxos acknowledged nothing at the second rate, one replica gone.
    def m(level, ach, p50, ops, shed=0):
        return {"level": level, "mode": "open", "offered_per_s": float(level), "achieved_per_s": ach, "p50_ms": p50,
                "p99_ms": p50 and p50 * 3, "p999_ms": p50 and p50 * 4, "send_lag_p99_ms": 1.0, "ops": ops,
                "shed": shed, "errors": 0 if ops else 9, "views_before": [0, 0, 0], "views_after": [0, 0, 0]}

    sd = [lb.combine([m(100, 99.0, 5.0, 99)]), lb.combine([m(400, 390.0, 9.0, 390)]),
          lb.combine([m(800, 700.0, 20.0, 700)])]
    mp = [lb.combine([m(100, 98.0, 6.0, 98)]), lb.combine([m(400, 0.0, None, 0, shed=300)]),
          lb.combine([lb.skipped("open", 800, 1.0)])]  # not measured: the cluster had collapsed
    assert mp[2]["achieved_per_s"] is None and mp[2]["ops"] == 0 and lb.peak(mp) == 98.0
    series = [{"name": lb.series_name(16, "zipf", "open"), "value_bytes": 16, "key_dist": "zipf", "mode": "open",
               "levels": [100, 400, 800], "points": {"sdpaxos": sd, "multipaxos": mp},
               "ratio_sdpaxos_over_multipaxos": {k: lb.paired_ratios(sd, mp, k)
                                                 for k in ("p50_ms", "p99_ms", "achieved_per_s")}}]
    assert series[0]["ratio_sdpaxos_over_multipaxos"]["p50_ms"] == [0.833, None, None]
    result = {"replicas": 3, "seconds": 1.0, "rounds": 1, "max_inflight": 64, "fsync": "batch", "core_commit": "x",
              "cpus": 2, "load_average_before": [1.0, 1.0, 1.0], "load_average_after": None, "modes": ["open"],
              "key_distributions": {"zipf": "Zipf s=0.99 over 100 keys"}, "sustained_fraction": 0.9,
              "series": series, "value_sizes": [16], "key_dists": ["zipf"],
              "saturation": [{"value_bytes": 16, "key_dist": "zipf",
                              "peak_achieved_per_s": {"sdpaxos": 390.0, "multipaxos": 98.0},
                              "peak_ratio_sdpaxos_over_multipaxos": 3.98,
                              "sustained_offered_per_s": {"sdpaxos": 400, "multipaxos": 100},
                              "sustained_ratio_sdpaxos_over_multipaxos": 4.0}],
              "points_without_acks": ["16 B, zipf, open loop multipaxos at 400, round 1"],
              "points_skipped": ["16 B, zipf, open loop multipaxos at 800, round 1"],
              "replicas_exited": {"sdpaxos": {}, "multipaxos": {"0": {"exit_code": 1, "crash": "internal error",
                                                                      "log_tail": ""}}}}
    text = lb.format_table(result)
    assert "no write acknowledged at 1 point(s): 16 B, zipf, open loop multipaxos at 400" in text
    assert "multipaxos replica 0 exited (status 1) during the run: internal error" in text
    assert "not measured, the cluster having collapsed before: 1 point(s), from 16 B, zipf, open loop multipaxos at 800" in text
    row = [ln for ln in text.splitlines() if ln.strip().startswith("400")][0]
    assert "-" in row and "300" in row
    lb.plot(result, str(tmp_path / "load.png"))  # no acknowledgement: a gap in the line, not a failure
    assert (tmp_path / "load.png").stat().st_size > 0


def test_option_lists():
    assert lb.parse_list("500, 1000,2e3", "--rates", float, 1, 1e6) == [500.0, 1000.0, 2000.0]
    assert lb.parse_choices("zipf,uniform", "--key-dist", lb.KEY_DISTS) == ["zipf", "uniform"]
    for bad in ("", "0", "5,5", "x", "1,2000000"):
        with pytest.raises(click.BadParameter):
            lb.parse_list(bad, "--rates", float, 1, 1e6)
    with pytest.raises(click.BadParameter):
        lb.parse_choices("uniform,pareto", "--key-dist", lb.KEY_DISTS)
    # The command in summary.md names only what the run used, and runs as written.
    line = lb.command_line({"replicas": 3, "seconds": 2.0, "modes": ["closed"], "rates": [], "sessions": [1, 64],
                            "max_inflight": 1024, "value_sizes": [1024], "keys": 100, "key_dists": ["zipf"],
                            "zipf_s": 0.99, "warmup": 0.0, "rounds": 2, "fsync": "batch", "seed": 3})
    assert line == ("cellar bench load --replicas 3 --seconds 2 --modes closed --sessions 1,64 --value-bytes 1024 "
                    "--keys 100 --key-dist zipf --zipf-s 0.99 --warmup 0 --rounds 2 --fsync batch --seed 3")


def test_load_smoke(tmp_path):
    # Open loop only, 2 rates, 1 s each, both protocols: about 10 s here.
    out = cellar("bench", "load", "--seconds", "1", "--modes", "open", "--rates", "100,400", "--value-bytes", "16",
                 "--key-dist", "zipf", "--keys", "100", "--warmup", "0", "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    _folder(result, tmp_path, "load")
    assert result["modes"] == ["open"] and result["rates"] == [100.0, 400.0] and result["key_dists"] == ["zipf"]
    (s,) = result["series"]
    assert (s["value_bytes"], s["key_dist"], s["mode"], s["levels"]) == (16, "zipf", "open", [100.0, 400.0])
    for p in ("sdpaxos", "multipaxos"):
        for m in s["points"][p]:
            assert m["ops"] > 0 and m["achieved_per_s"] > 0 and m["p50_ms"] is not None
            assert m["p50_ms"] <= m["p99_ms"] <= m["p999_ms"]
            assert m["ops"] + m["shed"] + m["errors"] == m["rounds"][0]["offered"]  # each arrival once
    assert set(s["ratio_sdpaxos_over_multipaxos"]) == {"p50_ms", "p99_ms", "achieved_per_s"}
    assert all(len(v) == 2 for v in s["ratio_sdpaxos_over_multipaxos"].values())
    (sat,) = result["saturation"]
    assert set(sat["peak_achieved_per_s"]) == {"sdpaxos", "multipaxos"}
    with open(os.path.join(result["out_dir"], "summary.md")) as f:
        text = f.read()
    assert "cellar bench load --replicas 3 --seconds 1 --modes open --rates 100,400" in text and "SD/MP" in text


def test_bad_arguments_are_one_line(tmp_path):
    for args, words in ((["--rates", "0,100"], "--rates"), (["--modes", "open,sideways"], "choose some of"),
                        (["--value-bytes", "4"], "--value-bytes"), (["--key-dist", "zipf,zipf"], "each once")):
        bad = cellar("bench", "load", *args, "--out", str(tmp_path / "out"))
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
