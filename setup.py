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
import json
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = ["scheduler_state/cells.py", "scheduler_state/placement.py", "scheduler_state/machine.py"]
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(HERE, "scheduler_state")


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _sources() -> dict[str, str]:
    """Every module of the package, not only the compiled ones: the compiled code has
    the types of the modules it imports built in (a Request's fields, say)."""
    return {name[:-3]: _sha256(os.path.join(PACKAGE_DIR, name))
            for name in sorted(os.listdir(PACKAGE_DIR)) if name.endswith(".py")}


def _group_name() -> str:
    """The shared library's module name, unique to these sources: two builds never
    share one name, so another install's library is never taken for this one's."""
    h = hashlib.sha256(json.dumps(_sources(), sort_keys=True).encode()).hexdigest()
    return f"cellar_scheduler_{h[:16]}"


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python (removing whatever it had built, so no
    earlier build is shipped instead), and records what it compiled."""

    def _outputs(self) -> list[str]:
        paths = [self.get_ext_fullpath(ext.name) for ext in self.extensions]
        if self.extensions:
            paths.append(os.path.join(os.path.dirname(self.get_ext_fullpath("scheduler_state.cells")),
                                      "_compiled.json"))
        return paths

    def run(self) -> None:
        # an earlier build's files never outlive this one: its libraries (named after
        # its sources, so maybe not this build's names) and its record
        root = os.path.dirname(os.path.dirname(self.get_ext_fullpath("scheduler_state.cells")))
        for path in [*self._outputs(), *glob.glob(os.path.join(root, "cellar_scheduler_*__mypyc*"))]:
            if os.path.exists(path):
                os.remove(path)
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any compiler failure: install pure Python
            for path in self._outputs():
                if os.path.exists(path):
                    os.remove(path)
            print(f"cellar: compiling scheduler_state with mypyc failed ({type(e).__name__}: {e}); "
                  "installing pure Python", file=sys.stderr)
            return
        if not self.extensions:
            return
        target = os.path.dirname(self.get_ext_fullpath("scheduler_state.cells"))
        root = os.path.dirname(target)
        libs = {}
        for ext in self.extensions:  # each built file, relative to the folder above the package
            path = self.get_ext_fullpath(ext.name)
            libs[os.path.relpath(path, root)] = _sha256(path)
        import mypy.version

        with open(os.path.join(target, "_compiled.json"), "w") as f:
            json.dump({"sources": _sources(), "libraries": libs, "mypy": mypy.version.__version__}, f,
                      sort_keys=True, indent=1)

    def get_outputs(self) -> list[str]:
        return list(super().get_outputs()) + self._outputs()[len(self.extensions):]


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
