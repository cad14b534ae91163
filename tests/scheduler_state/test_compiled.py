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
    # a current build runs compiled; only an install that built nothing (no C compiler,
    # CELLAR_COMPILE=0: then this compares the .py files with themselves) runs pure
    assert default["compiled"] is _installed_compiled()
    assert default["hashes"] == pure["hashes"]


def _installed_compiled() -> bool:
    env = dict(os.environ)
    env.pop("CELLAR_PURE_PYTHON", None)
    out = subprocess.run([sys.executable, "-c", "from scheduler_state import compiled; print(compiled.is_current())"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip() == "True"


def test_this_process_runs_the_compiled_build_only_when_it_is_current():
    assert scheduler_state.COMPILED is compiled.is_current()
    for name in compiled.MODULES:
        origin = sys.modules[f"scheduler_state.{name}"].__file__
        assert origin.endswith(".py") is not scheduler_state.COMPILED, origin


def _fake_build(tmp_path: Path) -> Path:
    """A package folder with its modules and a build record (no real libraries)."""
    pkg = tmp_path / "scheduler_state"
    pkg.mkdir()
    for name in (*compiled.MODULES, "requests", "__init__"):
        (pkg / f"{name}.py").write_text(f"X = {name!r}\n")
    (pkg / "cells.so").write_bytes(b"cells")
    (tmp_path / "group__mypyc.so").write_bytes(b"group")
    _record(pkg)
    return pkg


def _record(pkg: Path) -> None:
    sources = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in pkg.glob("*.py")}
    libs = {rel: hashlib.sha256((pkg.parent / rel).read_bytes()).hexdigest()
            for rel in ("scheduler_state/cells.so", "group__mypyc.so")}
    (pkg / "_compiled.json").write_text(json.dumps({"sources": sources, "libraries": libs}))


def test_any_edited_module_or_library_or_the_switch_turns_the_compiled_build_off(tmp_path, monkeypatch):
    """Not only the compiled modules: the compiled code has the types of the modules it
    imports built in (a Request's fields), so an edit to any module of the package makes
    the build stale; so does a library missing or replaced, or a module added."""
    monkeypatch.delenv("CELLAR_PURE_PYTHON", raising=False)
    monkeypatch.setattr(compiled, "HERE", str(tmp_path / "nothing-built"))
    assert not compiled.is_current()
    pkg = _fake_build(tmp_path)
    monkeypatch.setattr(compiled, "HERE", str(pkg))
    assert compiled.is_current()
    monkeypatch.setenv("CELLAR_PURE_PYTHON", "1")
    assert not compiled.is_current()
    monkeypatch.setenv("CELLAR_PURE_PYTHON", "0")
    assert compiled.is_current()

    def stale_after(change) -> None:
        change()
        assert not compiled.is_current()
        _record(pkg)  # rebuilt
        assert compiled.is_current()

    stale_after(lambda: (pkg / "requests.py").write_text("X = 'requests, edited'\n"))  # imported, not compiled
    stale_after(lambda: (pkg / "placement.py").write_text("X = 'placement, edited'\n"))
    stale_after(lambda: (pkg / "new_module.py").write_text("X = 1\n"))
    stale_after(lambda: (tmp_path / "group__mypyc.so").write_bytes(b"another build's library"))
    (pkg / "cells.so").unlink()  # a partial build
    assert not compiled.is_current()
    (pkg / "_compiled.json").write_text("{not json")
    assert not compiled.is_current()


def test_the_source_finder_takes_the_py_file_of_the_hot_modules_only(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "HERE", str(tmp_path))
    finder = compiled.FromSource()
    spec = finder.find_spec("scheduler_state.cells")
    assert spec is not None and spec.origin == str(tmp_path / "cells.py")
    assert finder.find_spec("scheduler_state.config") is None
    assert finder.find_spec("cells") is None
