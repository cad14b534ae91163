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

import hashlib
import json
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = ["scheduler_state/cells.py", "scheduler_state/placement.py", "scheduler_state/machine.py"]
HERE = os.path.dirname(os.path.abspath(__file__))


def _sources_hash() -> dict[str, str]:
    out = {}
    for path in COMPILED:
        with open(os.path.join(HERE, path), "rb") as f:
            out[os.path.basename(path)[:-3]] = hashlib.sha256(f.read()).hexdigest()
    return out


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python, and records what it compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any compiler failure: install pure Python
            print(f"cellar: compiling scheduler_state with mypyc failed ({type(e).__name__}: {e}); "
                  "installing pure Python", file=sys.stderr)
            return
        if not self.extensions:
            return
        target = os.path.dirname(self.get_ext_fullpath("scheduler_state.cells"))
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, "_compiled.json"), "w") as f:
            json.dump({"sources": _sources_hash()}, f, sort_keys=True)

    def get_outputs(self) -> list[str]:
        outs = list(super().get_outputs())
        if self.extensions:
            outs.append(os.path.join(os.path.dirname(self.get_ext_fullpath("scheduler_state.cells")),
                                     "_compiled.json"))
        return outs


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
        return mypycify(["--follow-imports=silent", "--ignore-missing-imports", *COMPILED], opt_level="3")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - mypyc refuses the code: pure Python
        print(f"cellar: mypyc cannot compile scheduler_state ({type(e).__name__}: {e}); installing pure Python",
              file=sys.stderr)
        return []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
