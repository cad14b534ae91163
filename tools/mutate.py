#!/usr/bin/env python3
"""Mutation testing of the consensus core (issue 9, acceptance 3).

For each planted bug of ``tools/mutants.py``: copy the repo to a temporary directory,
apply the patch there (never to the tree), run the consensus test suite against the
copy and record whether it failed (the mutant is *killed*) and which test failed
first. Each mutant runs ``--runs`` times with different Hypothesis seeds, so a kill
that depends on one lucky seed shows as k/n < n/n.

    python3 tools/mutate.py --list
    python3 tools/mutate.py --baseline --runs 3 --jobs 1
    python3 tools/mutate.py --only bug1-lease-promise,fig7-off-by-one --runs 1
    python3 tools/mutate.py --suite long --json > mutation-long.json

The working tree is copied once at start (``--rev REV`` takes a commit instead) and
every run starts from that snapshot, so edits made meanwhile do not mix in. Each run
imports the copy's packages (``PYTHONPATH`` is the copy; a pytest plugin written into
the copy checks ``consensus.__file__`` and aborts otherwise). Exit status: 0 every
mutant killed, 1 some survived, 2 an error (anchor, baseline, infrastructure).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mutants as M  # noqa: E402

TESTS = "tests/consensus"
# The anchor test checks the list against the *unmutated* tree: it fails in every copy.
IGNORE = ["tests/consensus/test_mutants_list.py"]
IGNORED_NAMES = [".git", ".hypothesis", "__pycache__", ".pytest_cache", "*.egg-info", "runs", ".benchmarks",
                 "build", "dist", ".venv", "*.pyc"]
SUITES = {
    "default": {},
    # The long campaigns of README.md "Longer runs".
    "long": {
        "CELLAR_FAULT_EXAMPLES": "5000",  # test_fault_search.py (hypothesis version)
        "CELLAR_SEARCH_EXAMPLES": "5000",
        "CELLAR_SIM_EXAMPLES": "5000",  # test_safety.py
        "CELLAR_SNAPSHOT_EXAMPLES": "2000",  # test_snapshot.py
    },
}
TIMEOUT_S = {"default": 1800.0, "long": 6 * 3600.0}
GUARD_EXIT = 99
GUARD = f'''\
"""Written by tools/mutate.py: abort unless the packages come from this copy."""
import json, os, pytest

def pytest_configure(config):
    root = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    import consensus, consensus.core.sdpaxos, consensus.core.multipaxos
    found = {{m.__name__: os.path.realpath(m.__file__) for m in
             (consensus, consensus.core.sdpaxos, consensus.core.multipaxos)}}
    with open(os.path.join(root, ".mutant_guard"), "w") as f:
        json.dump(found, f)
    outside = sorted(k for k, v in found.items() if not v.startswith(root + os.sep))
    if outside:
        pytest.exit("mutate: " + ", ".join(outside) + " imported from outside the copy", returncode={GUARD_EXIT})
'''
FAIL_LINE = re.compile(r"^(FAILED|ERROR) (\S+)")
PYTEST_TIMEOUT = re.compile(r"^E\s+Failed: Timeout >", re.M)


class Abort(Exception):
    """One-line error: printed as ``mutate: ...`` with exit status 2."""


@dataclass
class Run:
    seed: int
    # killed | survived | timeout (the run, or one test under pytest-timeout, ran out of
    # time: on a loaded machine that proves nothing, so it is not counted as a kill)
    outcome: str
    test: str | None
    seconds: float
    log: str | None = None


@dataclass
class Result:
    name: str
    file: str
    rule: str
    description: str
    runs: list[Run] = field(default_factory=list)

    @property
    def killed(self) -> int:
        return sum(1 for r in self.runs if r.outcome == "killed")

    @property
    def timeouts(self) -> int:
        return sum(1 for r in self.runs if r.outcome == "timeout")

    def verdict(self) -> str:
        out = f"{self.killed}/{len(self.runs)}"
        return out + (f" (+{self.timeouts} timeout)" if self.timeouts else "")

    def killer(self) -> str:
        tests = collections.Counter(r.test or r.outcome for r in self.runs if r.outcome == "killed")
        if not tests:
            return "-"
        best, _ = tests.most_common(1)[0]
        return best + (f" (+{len(tests) - 1} other)" if len(tests) > 1 else "")


# --- copies -------------------------------------------------------------------------


def snapshot_tree(dest: Path, rev: str | None) -> dict:
    """The tree to mutate, copied once: the working tree, or ``rev`` via git archive."""
    head = _git("rev-parse", "HEAD")
    if rev:
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True)
        if archive.returncode != 0:
            raise Abort(f"git archive {rev} failed: {archive.stderr.decode().strip().splitlines()[-1:]}")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        return {"source": f"git archive {rev}", "commit": _git("rev-parse", rev), "head": head}
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(*IGNORED_NAMES), symlinks=True)
    status = [line for line in _git("status", "--porcelain").splitlines() if line]
    dirty = [line[3:] for line in status if not line.startswith("??")]
    untracked = [line[3:] for line in status if line.startswith("??")]
    return {"source": "working tree", "head": head, "dirty_files": dirty, "untracked_files": untracked}


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def make_copy(base: Path, dest: Path, mutant: M.Mutant | None) -> None:
    shutil.copytree(base, dest, symlinks=True)
    if mutant is not None:
        try:
            M.apply(dest, mutant)
        except M.AnchorError as e:
            raise Abort(str(e)) from None
        text = (dest / mutant.file).read_text()
        if mutant.new and mutant.new not in text:
            raise Abort(f"{mutant.name}: patch not found in the copy after applying it")
    (dest / "_mutant_guard.py").write_text(GUARD)


# --- one run ---------------------------------------------------------------------------


def run_suite(copy: Path, suite: str, seed: int, timeout_s: float, keep_going: bool, log_path: Path | None,
              tests: list[str] | None = None) -> Run:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["CELLAR_TEST_PYCACHE"] = "0"  # no bytecode cache for a copy compiled once (tests/conftest.py)
    env.update(SUITES[suite])
    # Hypothesis draws from --hypothesis-seed only when not derandomized (tests/conftest.py's
    # default "ci" profile is): each run explores its own seed.
    env["CELLAR_HYPOTHESIS"] = "explore"
    # -n 0: one process, as before pyproject's addopts took pytest-xdist's -n 2; --jobs is
    # this tool's parallelism, and -x's first failure stays the same test from run to run.
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_mutant_guard", "-rfE",
           "-n", "0", f"--hypothesis-seed={seed}"]
    if not keep_going:
        cmd.append("-x")
    if suite == "long":
        cmd.append("--timeout=0")  # campaigns outlast pytest-timeout's per-test limit
        cmd += ["-m", "not shared"]  # the campaigns are marked slow (deselected by default)
    for path in IGNORE:
        cmd.append(f"--ignore={path}")
    cmd.extend(tests or [TESTS])
    shutil.rmtree(copy / ".hypothesis", ignore_errors=True)  # no replay of another run's examples
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
        out, _ = proc.communicate()
        timed_out = True
    seconds = time.monotonic() - start
    if log_path is not None:
        log_path.write_text(f"$ cd {copy} && PYTHONPATH={copy} {' '.join(cmd)}\n{out}")
    if proc.returncode == GUARD_EXIT:
        line = next((x for x in out.splitlines() if "mutate:" in x), "the copy's packages were not imported")
        raise Abort(line.split("mutate:", 1)[-1].strip() + " (is an old install shadowing PYTHONPATH?)")
    if not timed_out:
        guard = copy / ".mutant_guard"
        if not guard.exists():
            raise Abort(f"the import guard did not run; pytest said: {_last_line(out)}")
    log = str(log_path) if log_path else None
    if timed_out:
        return Run(seed, "timeout", f"timeout after {timeout_s:.0f} s", seconds, log)
    failed = next((m.group(2) for m in map(FAIL_LINE.match, out.splitlines()) if m), None)
    if failed and PYTEST_TIMEOUT.search(out):
        return Run(seed, "timeout", f"{failed} hit pytest-timeout", seconds, log)
    if proc.returncode == 0:
        return Run(seed, "survived", None, seconds, log)
    if proc.returncode in (1, 2) and failed:
        return Run(seed, "killed", failed, seconds, log)
    raise Abort(f"pytest exited {proc.returncode} without a failing test: {_last_line(out)}")


def _last_line(out: str) -> str:
    lines = [x for x in out.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "(no output)"


# --- driver ----------------------------------------------------------------------------


def select(only: str | None) -> list[M.Mutant]:
    if not only:
        return list(M.MUTANTS)
    names = [x.strip() for x in only.split(",") if x.strip()]
    unknown = [x for x in names if x not in M.BY_NAME]
    if unknown:
        raise Abort(f"unknown mutant {unknown[0]!r} (see --list)")
    return [M.BY_NAME[x] for x in names]


def fmt_s(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def table(results: list[Result], runs: int) -> str:
    rows = [("mutant", "killing test (first failure)", f"killed k/{runs}", "time/run")]
    for r in results:
        mean = sum(x.seconds for x in r.runs) / max(1, len(r.runs))
        rows.append((r.name, r.killer(), r.verdict(), fmt_s(mean)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Plant each bug of tools/mutants.py in a copy and run the tests.")
    ap.add_argument("--list", action="store_true", help="list the mutants and check their anchors, run nothing")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="only these mutants")
    ap.add_argument("--runs", type=int, default=3, help="runs per mutant, Hypothesis seeds SEED..SEED+RUNS-1 (3)")
    ap.add_argument("--seed", type=int, default=0, help="first Hypothesis seed (0)")
    ap.add_argument("--suite", choices=sorted(SUITES), default="default", help="default, or long (README campaigns)")
    ap.add_argument("--jobs", type=int, default=1, help="test runs in parallel (1)")
    ap.add_argument("--baseline", action="store_true", help="first run the suite unmutated; abort if it fails")
    ap.add_argument("--timeout", type=float, help="seconds per run; beyond it the run counts as killed (timeout); "
                    "default 1800 (default suite) or 21600 (long)")
    ap.add_argument("--rev", help="mutate this commit (git archive) instead of the working tree")
    ap.add_argument("--tests", metavar="PATH[,PATH]", help=f"test paths or ids to run instead of {TESTS} "
                    "(e.g. tests/consensus/test_fault_search.py with --suite long)")
    ap.add_argument("--keep-going", action="store_true", help="no -x: run the whole suite, report the first failure")
    ap.add_argument("--logs", metavar="DIR", help="keep each run's pytest output here")
    ap.add_argument("--killers", metavar="FILE",
                    help="a previous --json output, or docs/mutation.md: run each mutant's known killing test "
                         "first and the whole suite only if it survives that (same verdicts, much sooner)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON (progress goes to stderr)")
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except Abort as e:
        print(f"mutate: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mutate: interrupted", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    chosen = select(args.only)
    if args.list:
        bad = 0
        for m in chosen:
            try:
                M.check(ROOT, m)
                status = "ok"
            except M.AnchorError as e:
                status, bad = f"ANCHOR: {e}", bad + 1
            print(f"{m.name:36} {m.file:30} {status}\n    breaks: {m.rule}\n    bug:    {m.description}")
        print(f"{len(chosen)} mutants, {bad} with a broken anchor")
        return 2 if bad else 0
    if args.runs < 1 or args.jobs < 1:
        raise Abort("--runs and --jobs must be at least 1")
    timeout_s = args.timeout or TIMEOUT_S[args.suite]
    tests = [x.strip() for x in args.tests.split(",") if x.strip()] if args.tests else None
    progress = sys.stderr if args.json else sys.stdout
    say_lock = threading.Lock()

    def say(text: str) -> None:
        with say_lock:
            print(text, file=progress, flush=True)

    work = Path(tempfile.mkdtemp(prefix="cellar-mutate-"))
    logs = Path(args.logs).resolve() if args.logs else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    try:
        base = work / "base"
        source = snapshot_tree(base, args.rev)
        for m in chosen:  # every anchor first: fail before hours of testing, not after
            try:
                M.check(base, m)
            except M.AnchorError as e:
                raise Abort(str(e)) from None
        seeds = [args.seed + k for k in range(args.runs)]
        say(f"mutate: {len(chosen)} mutants x {args.runs} runs, suite {args.suite}, jobs {args.jobs}, "
            f"seeds {seeds[0]}..{seeds[-1]}, {source['source']} at {source['head'][:10]}")
        counter = iter(range(1 << 30))

        known = load_killers(args.killers) if args.killers else {}

        def one(mutant: M.Mutant | None, seed: int) -> Run:
            name = mutant.name if mutant else "baseline"
            copy = work / f"{name}-{seed}-{next(counter)}"
            make_copy(base, copy, mutant)
            try:
                log = logs / f"{name}-seed{seed}.log" if logs else None
                first = known.get(name) if mutant is not None and not tests else None
                if first:
                    run = run_suite(copy, args.suite, seed, timeout_s, args.keep_going, log, first)
                    if run.outcome == "killed":
                        return run
                return run_suite(copy, args.suite, seed, timeout_s, args.keep_going, log, tests)
            finally:
                shutil.rmtree(copy, ignore_errors=True)

        baseline = None
        if args.baseline:
            say("mutate: baseline (unmutated copy) ...")
            b = one(None, seeds[0])
            baseline = asdict(b)
            if b.outcome != "survived":
                raise Abort(f"baseline fails on the unmutated tree: {b.test} after {fmt_s(b.seconds)}; fix that first")
            say(f"mutate: baseline passes in {fmt_s(b.seconds)}")
        results = {m.name: M_result(m) for m in chosen}
        pending = collections.Counter({m.name: args.runs for m in chosen})
        done_count = [0]
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(one, m, s): m for m in chosen for s in seeds}
            try:
                for fut in concurrent.futures.as_completed(futures):
                    m = futures[fut]
                    run = fut.result()
                    r = results[m.name]
                    r.runs.append(run)
                    pending[m.name] -= 1
                    if pending[m.name] == 0:
                        r.runs.sort(key=lambda x: x.seed)
                        done_count[0] += 1
                        total = sum(x.seconds for x in r.runs)
                        verdict = ("killed " if r.killed else "SURVIVED ") + r.verdict()
                        say(f"[{done_count[0]:2}/{len(chosen)}] {m.name:36} {verdict:14} {r.killer()}  ({fmt_s(total)})")
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        ordered = [results[m.name] for m in chosen]
        survivors = [r.name for r in ordered if r.killed < len(r.runs)]
        if args.json:
            doc = {
                "suite": args.suite,
                "env": SUITES[args.suite],
                "runs": args.runs,
                "seeds": seeds,
                "timeout_s": timeout_s,
                "tests": tests or [TESTS],
                "tree": source,
                "baseline": baseline,
                "mutants": [
                    {**{k: v for k, v in asdict(r).items() if k != "runs"}, "killed": r.killed, "timeouts": r.timeouts,
                     "runs": [asdict(x) for x in r.runs]}
                    for r in ordered
                ],
                "not_always_killed": survivors,
            }
            print(json.dumps(doc, indent=2))
        else:
            print()
            print(table(ordered, args.runs))
            print()
            if survivors:
                print(f"not killed in every run: {', '.join(survivors)}")
            else:
                print(f"every mutant killed in every run ({len(ordered)} x {args.runs})")
        return 1 if survivors else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load_killers(path: str) -> dict[str, list[str]]:
    """Mutant name -> the test ids that killed it before, from a ``--json`` output or
    the table in docs/mutation.md (ids relative to tests/consensus/ there)."""
    text = Path(path).read_text()
    out: dict[str, list[str]] = {}
    if path.endswith(".json"):
        for m in json.loads(text).get("mutants", []):
            ids = sorted({r["test"] for r in m.get("runs", []) if r.get("outcome") == "killed" and r.get("test")})
            if ids:
                out[m["name"]] = ids
        return out
    # The newest table comes first; a row's killer is its "first failure" cell, or a test
    # named in a later column (a re-run on a later tree) when that cell is empty.
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`") or cells[0].strip("`") in out:
            continue
        named = [c for c in cells[2:] if "::" in c]
        if not named:
            continue
        test = named[0].split(", ")[-1].split()[0] if "::" not in named[0].split()[0] else named[0].split()[0]
        if not test.startswith("tests/"):
            test = f"{TESTS.rstrip('/')}/{test}"
        out[cells[0].strip("`")] = [test]
    return out


def M_result(m: M.Mutant) -> Result:
    return Result(m.name, m.file, m.rule, m.description)


if __name__ == "__main__":
    sys.exit(main())
