"""The scheduler's hot modules compiled with mypyc, from the same source.

``scheduler_state``'s cells, placement and machine modules are plain, typed Python; at
install time they are also compiled with mypyc (mypy's compiler, a build requirement in
pyproject.toml) into C extensions, which Python imports in place of the ``.py`` files:
the same code, about 1.9x faster per command (docs/scheduler_service.md). Every other
setting is in pyproject.toml.

- ``CELLAR_COMPILE=0 pip install ...`` builds pure Python only.
- A failed compile (no C compiler, say) is not a failed install: the package installs
  pure Python and says so on stderr.
- Beside the extensions the build writes ``scheduler_state/_compiled.json``, the
  sha256 of each compiled source. ``scheduler_state/compiled.py`` lets the compiled
  modules only when the sources still hash to it, so an edited checkout (an editable
  install) never runs stale compiled code: it runs the ``.py`` files until rebuilt.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = ["scheduler_state/cells.py", "scheduler_state/placement.py", "scheduler_state/machine.py"]
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(HERE, "scheduler_state")


def _record_module():  # noqa: ANN202
    """``scheduler_state/compiled.py`` (standard library only), loaded by path without
    importing the package: one definition of the record the build writes and the
    package checks."""
    spec = importlib.util.spec_from_file_location("_cellar_compiled", os.path.join(PACKAGE_DIR, "compiled.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORD = _record_module()


def _group_name() -> str:
    """The shared library's module name, unique to these sources: two builds never
    share one name, so another install's library is never taken for this one's."""
    h = hashlib.sha256(json.dumps(RECORD.sources(PACKAGE_DIR), sort_keys=True).encode()).hexdigest()
    return f"cellar_scheduler_{h[:16]}"


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python (removing whatever it had built, so no
    earlier build is shipped instead), and records what it compiled."""

    def _record_path(self) -> str:
        return os.path.join(os.path.dirname(self.get_ext_fullpath("scheduler_state.cells")), "_compiled.json")

    def _remove_outputs(self) -> None:
        """This build's files, and any earlier build's libraries (named after their
        sources, so maybe not this build's names) and record."""
        root = os.path.dirname(os.path.dirname(self._record_path()))
        for path in [*(self.get_ext_fullpath(ext.name) for ext in self.extensions), self._record_path(),
                     *glob.glob(os.path.join(root, "cellar_scheduler_*__mypyc*"))]:
            if os.path.exists(path):
                os.remove(path)

    def run(self) -> None:
        self._remove_outputs()  # an earlier build's files never outlive this one
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any compiler failure: install pure Python
            self._remove_outputs()
            print(f"cellar: compiling scheduler_state with mypyc failed ({type(e).__name__}: {e}); "
                  "installing pure Python", file=sys.stderr)
            return
        if not self.extensions:
            return
        root = os.path.dirname(os.path.dirname(self._record_path()))
        libs = {os.path.relpath(path, root): RECORD.sha256(path)  # each built file, from the folder above the package
                for path in (self.get_ext_fullpath(ext.name) for ext in self.extensions)}
        import mypy.version

        with open(self._record_path(), "w") as f:
            json.dump({"sources": RECORD.sources(PACKAGE_DIR), "libraries": libs, "mypy": mypy.version.__version__},
                      f, sort_keys=True, indent=1)

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), *([self._record_path()] if self.extensions else [])]


def _ext_modules() -> list:
    if os.environ.get("CELLAR_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        print(f"cellar: mypyc is not available ({e}); installing pure Python", file=sys.stderr)
        return []
    try:
        # the other modules are imported for their types, not compiled: their errors are not ours here
        return mypycify(["--follow-imports=silent", "--ignore-missing-imports", *COMPILED], opt_level="3",
                        group_name=_group_name())
    except (Exception, SystemExit) as e:  # noqa: BLE001 - mypyc refuses the code: pure Python
        print(f"cellar: mypyc cannot compile scheduler_state ({type(e).__name__}: {e}); installing pure Python",
              file=sys.stderr)
        return []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
