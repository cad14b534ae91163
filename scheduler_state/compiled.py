"""Which build of the hot modules runs: the mypyc-compiled one or the ``.py`` files.

``setup.py`` compiles ``cells``, ``placement`` and ``machine`` with mypyc at install
time (the same source) and records, in ``_compiled.json`` beside the extensions, the
sha256 of every module of the package and of every library it built. ``guard()``,
called by the package before it imports them, lets the compiled modules load only when
all of those still hash to that record and ``CELLAR_PURE_PYTHON`` is unset (or 0), and
loads the build's shared library from its recorded path: an edited checkout never runs
stale, partial or another install's compiled code, it runs the ``.py`` files until
rebuilt (``pip install -e .``).
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


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def sources(package_dir: str) -> dict[str, str]:
    """Every module of the package, name -> sha256: what a build records and what must
    still hold for it to run (setup.py loads this file to write the record)."""
    return {n[:-3]: sha256(os.path.join(package_dir, n)) for n in sorted(os.listdir(package_dir)) if n.endswith(".py")}


def _record() -> dict | None:
    """The build's record when the compiled modules may run, else None: not refused by
    ``CELLAR_PURE_PYTHON``; every module of the package (the compiled code has the types
    of the modules it imports built in) hashes to what the build recorded, and no module
    was added or removed; every library it built is there and hashes to its record."""
    if os.environ.get("CELLAR_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        with open(os.path.join(HERE, "_compiled.json")) as f:
            record = json.load(f)
        libraries = record["libraries"]
        if not libraries or sources(HERE) != record["sources"]:
            return None
        root = os.path.dirname(HERE)
        for rel, digest in libraries.items():
            if sha256(os.path.join(root, rel)) != digest:
                return None
        return record
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def is_current() -> bool:
    """True when the compiled modules may run (``_record``)."""
    return _record() is not None


def _load_group(record: dict) -> bool:
    """Load the build's shared library from its recorded path (not whatever of that name
    ``sys.path`` finds first), so the compiled modules link to it. False if it will not."""
    root = os.path.dirname(HERE)
    for rel in record["libraries"]:
        if os.path.dirname(rel):
            continue  # a module's own file, inside the package
        name = os.path.basename(rel).split(".", 1)[0]
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.spec_from_file_location(name, os.path.join(root, rel))
            if spec is None or spec.loader is None:
                return False
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - any failure: the .py files run instead
            sys.modules.pop(name, None)
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
    compiled build is current and its shared library loads."""
    record = _record()
    if (record is None or not _load_group(record)) and not any(isinstance(f, FromSource) for f in sys.meta_path):
        sys.meta_path.insert(0, FromSource())


def running() -> bool:
    """Whether this process runs the compiled modules."""
    mods = [sys.modules.get(f"{PACKAGE}.{name}") for name in MODULES]
    return all(m is not None and not str(getattr(m, "__file__", "")).endswith(".py") for m in mods)
