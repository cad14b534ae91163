"""The mypyc-compiled build of the hot modules (setup.py, scheduler_state/compiled.py):
it decides exactly as the ``.py`` files do, and never runs when it is stale."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import scheduler_state
from scheduler_state import compiled

ROOT = Path(__file__).resolve().parents[2]

_STREAMS = """
import json, sys
import scheduler_state
from tests.scheduler_state.golden_commands import PROFILES, stream_hash
print(json.dumps({"compiled": scheduler_state.COMPILED,
                  "hashes": {p: stream_hash(p, 5, 200) for p in sorted(PROFILES)}}))
"""


def _streams(pure: bool) -> dict:
    env = dict(os.environ)
    env.pop("CELLAR_PURE_PYTHON", None)
    if pure:
        env["CELLAR_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", _STREAMS], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=240, check=True)
    return json.loads(out.stdout)


def test_compiled_and_pure_python_decide_alike():
    """Every command of the golden streams (six configs: allocate, release, the
    extender's pod commands, health, leases, reconfigure, reads, snapshot/restore),
    seed 5, gives the same result and digest at every step in both builds: replicas of
    either kind may share a cluster."""
    pure = _streams(pure=True)
    default = _streams(pure=False)
    assert pure["compiled"] is False
    assert default["hashes"] == pure["hashes"], f"compiled build: {default['compiled']}"


def test_this_process_runs_the_compiled_build_only_when_it_is_current():
    assert not scheduler_state.COMPILED or compiled.is_current()
    for name in compiled.MODULES:
        origin = sys.modules[f"scheduler_state.{name}"].__file__
        assert origin.endswith(".py") is not scheduler_state.COMPILED, origin


def _fake_build(tmp_path: Path) -> None:
    for name in compiled.MODULES:
        (tmp_path / f"{name}.py").write_text(f"X = {name!r}\n")
    record = {name: hashlib.sha256((tmp_path / f"{name}.py").read_bytes()).hexdigest() for name in compiled.MODULES}
    (tmp_path / "_compiled.json").write_text(json.dumps({"sources": record}))


def test_an_edited_source_or_the_switch_turns_the_compiled_build_off(tmp_path, monkeypatch):
    monkeypatch.delenv("CELLAR_PURE_PYTHON", raising=False)
    monkeypatch.setattr(compiled, "HERE", str(tmp_path))
    assert not compiled.is_current()  # nothing built
    _fake_build(tmp_path)
    assert compiled.is_current()
    monkeypatch.setenv("CELLAR_PURE_PYTHON", "1")
    assert not compiled.is_current()
    monkeypatch.setenv("CELLAR_PURE_PYTHON", "0")
    assert compiled.is_current()
    with open(tmp_path / "placement.py", "a") as f:
        f.write("# edited after the build\n")
    assert not compiled.is_current()
    (tmp_path / "_compiled.json").write_text("{not json")
    assert not compiled.is_current()


def test_the_source_finder_takes_the_py_file_of_the_hot_modules_only(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "HERE", str(tmp_path))
    finder = compiled.FromSource()
    spec = finder.find_spec("scheduler_state.cells")
    assert spec is not None and spec.origin == str(tmp_path / "cells.py")
    assert finder.find_spec("scheduler_state.config") is None
    assert finder.find_spec("cells") is None
