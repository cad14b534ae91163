"""The steered search (``consensus.sim.steer``) re-finds re-planted bugs of issue 9
within a small budget, and finds nothing on the unmutated core.

Each mutant test copies ``consensus/`` and ``jepsen_like/`` to a temporary
directory, applies the mutant there with ``tools/mutants.py`` (never to the tree),
and runs ``python3 -m consensus.sim.steer`` in a subprocess with ``PYTHONPATH`` set
to the copy, from a fixed first seed, until its first failure or a run budget. The
budgets are the measured runs-to-find of these seeds plus a margin (see
docs/steered-search.md for the figures); each test takes a few seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from consensus.sim import steer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import mutants as M  # noqa: E402

# (mutant, first seed, search arguments, run budget): found within the budget. Only
# bug 2 is re-found within a default-suite budget (docs/steered-search.md has the
# campaigns: bugs 1, 2b, 3 and 4 were not re-found in 700-850 runs each).
FINDS = [
    # -m slow (about 10 s); the explorer's steered walks re-find bugs 1 and 4 by default.
    pytest.param("bug2-fig7-last-view", 1001, ["--replicas", "5", "--guided", "--no-liveness"], 50,
                 marks=pytest.mark.slow),
]
TIMEOUT_S = 120

# A failure of the *unmutated* core the steered search found (issue 9 acceptance 2's
# false-positive check): N=5, network faults only, no crash. Open: reported, not fixed.
CORE_FINDINGS = [
    (5095, (136, 1), ["--replicas", "5", "--no-liveness"]),
]


def _copy_with(tmp: Path, mutant: M.Mutant | None) -> Path:
    for name in ("consensus", "store", "jepsen_like"):  # store: the machine registry (consensus.sim.registry)
        shutil.copytree(ROOT / name, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if mutant is not None:
        M.apply(tmp, mutant)
        assert mutant.new in (tmp / mutant.file).read_text() or not mutant.new
    return tmp


def _search(copy: Path, args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-m", "consensus.sim.steer", "--json", *args], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    assert lines, out.stderr[-2000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("name,seed,args,runs", FINDS, ids=[getattr(f, "values", f)[0] for f in FINDS])
def test_steered_search_finds_the_replanted_bug(tmp_path, name, seed, args, runs):
    copy = _copy_with(tmp_path, M.BY_NAME[name])
    report = _search(copy, ["--seed", str(seed), "--runs", str(runs), *args])
    assert report["failures"], f"{name}: not found in {report['runs']} runs from seed {seed}"
    first = report["failures"][0]
    # The failure replays in the copy (the printed command, run there) ...
    replay = first["replay"].split()[3:]  # after "python3 -m consensus.sim.steer"
    again = _search(copy, replay)
    assert again["failures"], f"{first['replay']} did not fail again"
    # ... and not on the unmutated core: it is the planted bug that was found.
    opts = steer.Options(replicas=(5,), check_liveness=False)
    _, clean = steer.run_seed(first["seed"], opts, tuple(first["fork"]) if first["fork"] else None)
    assert not clean["failures"], f"{first['replay']} fails on the unmutated core too: {clean['failures']}"


@pytest.mark.parametrize("seed,fork,args", CORE_FINDINGS, ids=[f"seed-{f[0]}-fork-{f[1][0]}-{f[1][1]}" for f in CORE_FINDINGS])
def test_core_finding_replays_clean(seed, fork, args):
    """Found by the steered search on the unmutated core (19ce4a0): a new N=5
    sequencer re-proposed a stale view-36 value at a slot that the last serving view
    (67) had given R_m and R_m had executed on the fast path (SafetyViolation at R2).
    Fixed in _fig7: such a slot is a hole (mutant fig7-keeps-stale-old-view)."""
    opts = steer.Options(replicas=(5,), check_liveness=False)
    _, result = steer.run_seed(seed, opts, fork)
    assert not result["failures"], f"{result['failures']}\n{steer.replay_command(seed, opts, fork)}"


def test_steered_search_is_clean_on_the_unmutated_core():
    """The false-positive smoke check: a small budget of both cluster sizes, guided."""
    report = steer.campaign(range(1, 6), steer.Options(), guided=steer.Coverage(branches=4))
    assert not report["failures"], report["failures"]
    assert report["runs"] > 5


def test_a_branch_replays_bit_for_bit():
    opts = steer.Options(replicas=(3,))
    plan_a, a = steer.run_seed(7, opts, fork=(40, 3))
    plan_b, b = steer.run_seed(7, opts, fork=(40, 3))
    assert a["sim"].trace_hash == b["sim"].trace_hash and plan_a.log == plan_b.log
    _, base = steer.run_seed(7, opts)
    assert base["sim"].trace_hash != a["sim"].trace_hash, "the branch draws differently after its fork"
