#!/usr/bin/env python3
"""Time-to-find of the steered search (``consensus.sim.steer``) for re-planted bugs.

For each mutant of ``tools/mutants.py`` (default: the four bugs of issue 9 and
bug2b), and for each starting seed: copy the repo (as ``tools/mutate.py`` does: the
working tree once, then one copy per run, never the tree itself), apply the mutant
in the copy, run ``python3 -m consensus.sim.steer --json`` there with
``PYTHONPATH=<copy>`` until its first failure or the budget, and record the runs and
wall seconds to the first find. A failure counts only if its replay passes on an
unmutated copy; one that fails there too is a bug of the core itself, listed apart
(``also_unmutated``), and the search goes on from the next seed. ``--baseline`` runs the same search on an
unmutated copy (the false-positive check: it must find nothing).

    python3 tools/steer_mutants.py --starts 1,1001,2001 --budget-seconds 600
    python3 tools/steer_mutants.py --only bug1-lease-promise --starts 1 -- --replicas 3
    python3 tools/steer_mutants.py --baseline --starts 1 --budget-seconds 900 -- --replicas 3

Arguments after ``--`` go to the steered search (``--replicas``, ``--families``,
``--guided``, ...); ``--mode NAME=ARGS`` sets them per mutant instead. Exit status 0
when every mutant was found in every start (and the baseline found nothing).

``--engine explorer`` runs the explorer's steered walks instead
(``python3 -m consensus.sim.explorer --steer``, ``EXPLORER_MODES``): a find is the
first violation; it counts unless its saved trace replays to a violation on the
unmutated copy too (a trace that no longer fits there, because the mutant changed
the messages, or that replays cleanly, counts). The baseline runs both cluster
sizes (``baseline-n3``, ``baseline-n5``):

    python3 tools/steer_mutants.py --engine explorer --starts 1,1001,2001 --budget-seconds 240
    python3 tools/steer_mutants.py --engine explorer --baseline --starts 1,1001,2001 --budget-seconds 240
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mutants as M  # noqa: E402
import mutate as MU  # noqa: E402

BUGS = ["bug1-lease-promise", "bug2-fig7-last-view", "bug2b-no-nocl-slot", "bug3-mixed-ballot-acks", "bug4-reprepare-no-keys"]
# The search mode per bug (see docs/steered-search.md): the cluster size the bug's
# rule concerns (N=3 lease and read rules, N=5 Fig. 7 and recovery quorums) and the
# coverage-guided forking, every family; no schedule. A find is a safety failure:
# liveness is not judged here (the planted bugs are safety bugs; a slow drain would
# stop the search early), so the baseline runs the same way.
MODES = {
    "bug1-lease-promise": ["--replicas", "3", "--guided", "--no-liveness"],
    "bug2-fig7-last-view": ["--replicas", "5", "--guided", "--no-liveness"],
    "bug2b-no-nocl-slot": ["--replicas", "5", "--guided", "--no-liveness"],
    "bug3-mixed-ballot-acks": ["--replicas", "5", "--guided", "--no-liveness"],
    "bug4-reprepare-no-keys": ["--replicas", "3", "--guided", "--no-liveness"],
    "baseline": ["--guided", "--no-liveness"],
}
# The explorer's steered walks (docs/explorer.md, "Steered walks"): message
# granularity (one message per delivery), the first sequencer R0, the workload
# wwr (put x a at R1, put x b at R2, get x at R0; probe reads watch every lease
# read a sequencer would answer), safety only. N=3 for the lease/read bugs, N=5 with
# up to two crashes for the Fig. 7 and recovery bugs; no schedule.
_EX = ["--workload", "wwr", "--depth", "150", "--granularity", "message", "--steer", "--no-liveness"]
EXPLORER_MODES = {
    "bug1-lease-promise": ["--replicas", "3", *_EX],
    "bug2-fig7-last-view": ["--replicas", "5", "--crashes", "2", *_EX],
    "bug2b-no-nocl-slot": ["--replicas", "5", "--crashes", "2", *_EX],
    "bug3-mixed-ballot-acks": ["--replicas", "5", "--crashes", "2", *_EX],
    "bug4-reprepare-no-keys": ["--replicas", "3", *_EX],
    "baseline-n3": ["--replicas", "3", *_EX],
    "baseline-n5": ["--replicas", "5", "--crashes", "2", *_EX],
}


def run_explorer(copy: Path, start: int, budget_s: float, extra: list[str], timeout_s: float, trace: Path) -> dict:
    """One steered-walk campaign from ``start`` until its first violation or the
    budget, in the same report shape as ``run_search``."""
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "consensus.sim.explorer", "--json", "--quiet", "--seed", str(start), "--walks", "100000000",
           "--budget-seconds", str(budget_s), "--save-trace", str(trace), *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
        proc.communicate()
        return {"error": "timeout", "seconds": round(time.monotonic() - t0, 1)}
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if not lines:
        return {"error": (err.strip().splitlines() or ["no output"])[-1], "seconds": round(time.monotonic() - t0, 1)}
    res = json.loads(lines[-1])
    v = res.get("violation")
    report = {"runs": res["walks"], "seconds": res["seconds"], "failures": []}
    if v:
        report["failures"].append({
            "seed": start, "run": res["walks"], "seconds": res["seconds"], "fork": None,
            "failures": [f"{v['kind']}: {v['detail']}"], "walk": v.get("walk"), "branch": v.get("branch"),
            "replay": "python3 -m consensus.sim.explorer " + " ".join(cmd[cmd.index("--seed"):]).replace(str(trace), "FILE"),
            "trace": json.loads(trace.read_text()) if trace.exists() else None,
        })
    return report


def explorer_replay_fails(copy: Path, saved: dict, path: Path) -> bool:
    """True if the saved trace reproduces a violation on ``copy`` (exit 1); a clean
    replay (0) or a trace that does not fit there (2: the mutant changed it) is not."""
    path.write_text(json.dumps(saved))
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-m", "consensus.sim.explorer", "--json", "--replay", str(path)], cwd=copy,
                         env=env, capture_output=True, text=True, timeout=600)
    return out.returncode == 1


def run_search(copy: Path, start: int, budget_s: float, runs: int, extra: list[str], timeout_s: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "consensus.sim.steer", "--json", "--seed", str(start), "--runs", str(runs),
           "--budget-seconds", str(budget_s), *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
        proc.communicate()
        return {"error": "timeout", "seconds": round(time.monotonic() - t0, 1)}
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if not lines:
        return {"error": (err.strip().splitlines() or ["no output"])[-1], "seconds": round(time.monotonic() - t0, 1)}
    report = json.loads(lines[-1])
    report["cmd"] = " ".join(cmd[1:])
    return report


def replay_fails(copy: Path, replay_args: list[str]) -> bool:
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-m", "consensus.sim.steer", "--json", *replay_args], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=600)
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    return not lines or bool(json.loads(lines[-1]).get("failures"))


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.0f} / {statistics.median(values):.0f} / {max(values):.0f}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1 :]
    ap = argparse.ArgumentParser(description="Time-to-find of the steered search for re-planted bugs.")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="these mutants (default: the issue 9 bugs)")
    ap.add_argument("--starts", default="1,1001,2001", help="first seeds, one search each (1,1001,2001)")
    ap.add_argument("--budget-seconds", type=float, default=600.0, help="per search (600)")
    ap.add_argument("--runs", type=int, default=100000, help="seeds per search at most")
    ap.add_argument("--baseline", action="store_true", help="the unmutated tree instead (false-positive check)")
    ap.add_argument("--mode", action="append", default=[], metavar="NAME=ARGS",
                    help="search arguments for one mutant, e.g. bug1-lease-promise='--replicas 3'")
    ap.add_argument("--engine", choices=("steer", "explorer"), default="steer",
                    help="consensus.sim.steer (default) or the explorer's steered walks")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    explorer = args.engine == "explorer"
    baseline = ["baseline-n3", "baseline-n5"] if explorer else ["baseline"]
    names = baseline if args.baseline else [x.strip() for x in (args.only or ",".join(BUGS)).split(",") if x.strip()]
    modes = dict(EXPLORER_MODES if explorer else MODES)
    for item in args.mode:
        name, _, rest = item.partition("=")
        modes[name] = rest.split()
    starts = [int(x) for x in args.starts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="cellar-steer-"))
    results = []
    try:
        base = work / "base"
        tree = MU.snapshot_tree(base, None)
        print(f"steer_mutants: tree {tree['source']} at {tree['head'][:10]}", file=sys.stderr, flush=True)
        for name in names:
            mutant = None if name.startswith("baseline") else M.BY_NAME[name]
            mode = extra or modes.get(name, [])
            finds = []
            for start in starts:
                copy = work / f"{name}-{start}"
                MU.make_copy(base, copy, mutant)
                clean = work / f"clean-{start}"
                if mutant is not None:
                    MU.make_copy(base, clean, None)
                row = {"mutant": name, "start": start, "mode": " ".join(mode), "runs": 0, "seconds": 0.0,
                       "found": False, "also_unmutated": []}
                try:
                    # Search; a failure counts only if its replay passes on the unmutated
                    # copy (else it is a bug of the core itself: recorded, and the search
                    # goes on from the next seed within the same budget).
                    seed, left = start, args.budget_seconds
                    while left > 0:
                        if explorer:
                            rep = run_explorer(copy, seed, left, mode, left * 2 + 120, work / "trace.json")
                        else:
                            rep = run_search(copy, seed, left, args.runs, mode, left * 2 + 120)
                        row["runs"] += rep.get("runs") or 0
                        row["seconds"] = round(row["seconds"] + (rep.get("seconds") or 0.0), 2)
                        left = args.budget_seconds - row["seconds"]
                        if rep.get("error"):
                            row["error"] = rep["error"]
                            break
                        first = (rep.get("failures") or [None])[0]
                        if first is None:
                            break
                        if explorer:
                            unmutated = mutant is not None and explorer_replay_fails(clean, first["trace"], work / "replay.json")
                        else:
                            unmutated = mutant is not None and replay_fails(clean, first["replay"].split()[3:])
                        if unmutated:
                            row["also_unmutated"].append(first["replay"])
                            seed = first["seed"] + 1
                            continue
                        row.update(found=True, run=row["runs"] - rep["runs"] + first["run"],
                                   seconds_to_find=round(row["seconds"] - rep["seconds"] + first["seconds"], 2),
                                   seed=first["seed"], failure="; ".join(first["failures"])[:200], replay=first["replay"])
                        if explorer:
                            row.update(walk=first["walk"], branch=first["branch"])
                        break
                finally:
                    shutil.rmtree(copy, ignore_errors=True)
                    shutil.rmtree(clean, ignore_errors=True)
                finds.append(row)
                results.append(row)
                what = (f"FOUND at run {row['run']} (seed {row['seed']}) after {row['seconds_to_find']} s: {row['failure']}"
                        if row["found"] else f"not found in {row['runs']} runs, {row['seconds']} s {row.get('error') or ''}")
                for cmd in row["also_unmutated"]:
                    what += f"\n    (fails on the unmutated core too, not counted: {cmd})"
                print(f"{name:26} start {start:6}  {what}", file=sys.stderr, flush=True)
            found = [r for r in finds if r["found"]]
            print(f"{name:26} found {len(found)}/{len(finds)}  seconds min/median/max {fmt([r['seconds_to_find'] for r in found])}"
                  f"  runs {fmt([r['run'] for r in found])}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
    if args.baseline:
        return 1 if any(r["found"] for r in results) else 0
    return 0 if all(r["found"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
