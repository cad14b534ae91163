"""Which build of the hot modules runs: the mypyc-compiled one or the ``.py`` files.

``setup.py`` compiles ``cells``, ``placement`` and ``machine`` with mypyc at install
time (the same source) and records the sha256 of each compiled source in
``_compiled.json`` beside the extensions. ``guard()``, called by the package before it
imports them, lets the compiled modules load only when every source still hashes to
that record and ``CELLAR_PURE_PYTHON`` is unset (or 0): an edited checkout never runs
stale compiled code, it runs the ``.py`` files until rebuilt (``pip install -e .``).
Both builds decide alike (tests/scheduler_state/test_compiled.py replays the golden
streams under each), so replicas of either kind may share a cluster."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from importlib.machinery import ModuleSpec

PACKAGE = "scheduler_state"
HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ("cells", "placement", "machine")


def is_current() -> bool:
    """True when the compiled modules may run: not refused by ``CELLAR_PURE_PYTHON``,
    and every compiled source hashes to what the build recorded in ``_compiled.json``."""
    if os.environ.get("CELLAR_PURE_PYTHON", "") not in ("", "0"):
        return False
    try:
        with open(os.path.join(HERE, "_compiled.json")) as f:
            recorded = json.load(f)["sources"]
        for name in MODULES:
            with open(os.path.join(HERE, name + ".py"), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != recorded.get(name):
                    return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


class FromSource:
    """A meta-path finder that imports the compiled modules from their ``.py`` files
    even when a compiled extension sits beside them (a stale build, or refused)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package == PACKAGE and name in MODULES:
            return importlib.util.spec_from_file_location(fullname, os.path.join(HERE, name + ".py"))
        return None


def guard() -> None:
    """Before the package imports the hot modules: the ``.py`` files unless the
    compiled build is current."""
    if not is_current() and not any(isinstance(f, FromSource) for f in sys.meta_path):
        sys.meta_path.insert(0, FromSource())


def running() -> bool:
    """Whether this process runs the compiled modules."""
    mods = [sys.modules.get(f"{PACKAGE}.{name}") for name in MODULES]
    return all(m is not None and not str(getattr(m, "__file__", "")).endswith(".py") for m in mods)
