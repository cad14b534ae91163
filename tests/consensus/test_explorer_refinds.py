"""The explorer's steered walks (``consensus.sim.explorer --steer``) re-find re-planted
bugs of issue 9 (bugs 1, 3 and 4) within a small budget, and find nothing on the
unmutated core.

Each mutant test copies ``consensus/`` and ``jepsen_like/`` to a temporary
directory, applies the mutant there with ``tools/mutants.py`` (never to the tree),
and runs ``python3 -m consensus.sim.explorer --steer`` in a subprocess with
``PYTHONPATH`` set to the copy, from a fixed seed, for a fixed number of walks (the
search is deterministic: walk ``w`` of a seed, and the branches forked after it, are
the same on every run). The budgets are the measured walks-to-find of these seeds
(docs/explorer.md, "Steered walks", has the figures and the campaign command). The
violation must replay from its saved trace in the copy, and must not replay on the
unmutated core (there the trace either does not fit, because the planted bug
changed the messages, or runs clean).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from consensus.sim import explorer as ex

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import mutants as M  # noqa: E402

_EX = ["--workload", "wwr", "--depth", "150", "--granularity", "message", "--steer", "--no-liveness"]
N3 = ["--replicas", "3", *_EX]
N5 = ["--replicas", "5", "--crashes", "2", *_EX]

# (mutant, seed, search arguments, walks, the violation kind expected). Measured:
# the walk (0-based) of the find, plus one; runs = walks + the branches forked.
FINDS = [
    # Seed 2001 (one of the starts of docs/steered-search.md, 202 runs to find): walk 5,
    # 202 runs, against 46 walks / 1 380 runs from seed 1.
    ("bug1-lease-promise", 2001, N3, 6, "stale_read"),
    # -m slow (about 9 s of CPU: 17 walks, then the same search unmutated): its mutant's
    # killer is test_core_bugs.py's schedule; bug 1 above keeps the re-find in the default suite.
    pytest.param("bug4-reprepare-no-keys", 11, N3, 17, "stale_read", marks=pytest.mark.slow),
    # Walk 174, nested branch 0.1.7 (818 runs): forked at recovering-live-leader /
    # foreign-ballot states (docs/steered-search.md, "Nested forks").
    # -m slow (about 10 s): its mutant's killer is test_core_bugs.py's schedule.
    pytest.param("bug3-mixed-ballot-acks", 1001, N5, 175, "quorum", marks=pytest.mark.slow),
]
TIMEOUT_S = 180


def _copy_with(tmp: Path, mutant: M.Mutant | None) -> Path:
    for name in ("consensus", "store", "jepsen_like"):  # store: the machine registry (consensus.sim.registry)
        shutil.copytree(ROOT / name, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if mutant is not None:
        M.apply(tmp, mutant)
        assert mutant.new in (tmp / mutant.file).read_text() or not mutant.new
    return tmp


def _explorer(copy: Path, args: list[str]) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-m", "consensus.sim.explorer", *args], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    return out.returncode, out.stdout + out.stderr[-2000:]


def refind(tmp_path: Path, name: str, seed: int, args: list[str], walks: int, kind: str) -> tuple[dict, dict]:
    """Plant mutant ``name`` in a copy, find it with the steered walks of ``seed``,
    replay the saved trace there, and check the unmutated core neither fails on the
    trace nor finds anything in the same search. The search's JSON result and the
    saved trace."""
    copy = _copy_with(tmp_path / "copy", M.BY_NAME[name])
    trace = tmp_path / "trace.json"
    code, out = _explorer(copy, ["--json", "--quiet", "--seed", str(seed), "--walks", str(walks), "--save-trace", str(trace), *args])
    assert code == 1, f"{name}: not found in {walks} walks from seed {seed}\n{out}"
    res = json.loads(out.splitlines()[0])
    saved = json.loads(trace.read_text())
    assert saved["violation"]["kind"] == kind, saved["violation"]
    # The saved trace replays to the same violation in the copy ...
    code, out = _explorer(copy, ["--json", "--replay", str(trace)])
    assert code == 1 and json.loads(out.splitlines()[0])["reproduced"]["kind"] == kind, out
    # ... and not on the unmutated core (this process runs the tree's code): the
    # trace does not fail there, and the same search within the same budget finds
    # nothing (the false-positive check).
    cfg = ex.ExplorerConfig.from_json(saved["config"])
    try:
        rp = ex.replay(cfg, saved["trace"])
        assert rp.violation is None, f"the trace fails on the unmutated core too: {rp.violation}"
    except ex.ReplayError:
        pass  # the planted bug changed the messages: the trace does not fit unmutated
    clean = ex.steered_walks(cfg, walks=walks, depth=150, seed=seed)
    assert clean.violation is None, f"unmutated: {clean.violation['kind']}: {clean.violation['detail']}"
    return res, saved


@pytest.mark.parametrize("name,seed,args,walks,kind", FINDS, ids=[getattr(f, "values", f)[0] for f in FINDS])
def test_steered_walks_find_the_replanted_bug(tmp_path, name, seed, args, walks, kind):
    refind(tmp_path, name, seed, args, walks, kind)


# N=3 under -m slow (about 5 s): the default suite keeps the N=5 walks, and the N=3
# searches above must come up clean on the unmutated core too.
@pytest.mark.parametrize("replicas,crashes,walks", [pytest.param(3, 1, 60, marks=pytest.mark.slow), (5, 2, 100)])
def test_steered_walks_are_clean_on_the_unmutated_core(replicas, crashes, walks):
    """The false-positive smoke check: the same search, unmutated, a small budget."""
    cfg = ex.ExplorerConfig(replicas=replicas, workload="wwr", granularity="message", max_crashes=crashes,
                            check_liveness=False)
    res = ex.steered_walks(cfg, walks=walks, depth=150, seed=7, budget_s=60)
    assert res.violation is None, f"{res.violation['kind']}: {res.violation['detail']}"
    assert res.walks > walks  # branches were forked


def test_steered_walks_replay_deterministically():
    cfg = ex.ExplorerConfig(replicas=3, workload="wwr", granularity="message", check_liveness=False)
    # 10 walks: 162 runs, forked at eight kinds of rare signal (nested forks included).
    a = ex.steered_walks(cfg, walks=10, depth=120, seed=11)
    b = ex.steered_walks(cfg, walks=10, depth=120, seed=11)
    assert (a.walks, a.transitions, a.by_depth) == (b.walks, b.transitions, b.by_depth)
    assert a.by_depth["forks"], "some walk showed a rare signal and was forked"


def test_the_quorum_oracle_counts_one_ballot():
    """A commit at ballot b needs a majority with a C record at b (or that knew the
    instance chosen): acks gathered at another ballot do not count (bug 3's rule)."""
    cfg = ex.steer_config(ex.ExplorerConfig(replicas=5, workload="wr"))
    w = ex.World(cfg)
    w._quorum_records(0, [["C", 3, 0, 3, [[100, 1, ["put", "x", "X"]]]]])  # R0 accepts X at b=3
    for r in (3, 4):
        w._quorum_records(r, [["C", 3, 0, 36, None]])  # R3, R4 accept the no-op at b'=36
    with pytest.raises(ex.Violation) as err:
        w._quorum_records(3, [["CC", 3, 0]])  # R3 commits at b' with {R3, R4}: no majority
    assert err.value.kind == "quorum"
    w2 = ex.World(cfg)
    for r in (1, 3, 4):
        w2._quorum_records(r, [["C", 3, 0, 36, None]])
    w2._quorum_records(3, [["CC", 3, 0]])  # a majority at b': fine
    w2._quorum_records(0, [["C", 3, 0, 36, None], ["CC", 3, 0]])  # a learner: fine
