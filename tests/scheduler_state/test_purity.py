"""The state machine modules read no clock, draw no randomness and do no I/O: everything
apply does depends on the command and the state (the bench and CLI are outside)."""

from __future__ import annotations

import ast
import pathlib

import scheduler_state

PACKAGE = pathlib.Path(scheduler_state.__file__).parent
CORE = ["cells.py", "config.py", "invariants.py", "machine.py", "placement.py", "requests.py", "inspect.py",
        "replicated.py", "health.py", "__init__.py"]
ALLOWED = {"__future__", "bisect", "collections", "dataclasses", "hashlib", "pathlib", "re", "typing", "msgpack", "yaml",
           "scheduler_state"}


def test_core_modules_import_nothing_nondeterministic() -> None:
    for name in CORE:
        tree = ast.parse((PACKAGE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [] if node.level else [node.module.split(".")[0]]  # type: ignore[union-attr]
            else:
                continue
            for mod in mods:
                assert mod in ALLOWED, f"{name} imports {mod}"


def test_core_modules_do_not_iterate_sets() -> None:
    """Sets are for membership only: iterating one would make order depend on hashing."""
    for name in CORE:
        tree = ast.parse((PACKAGE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.For, ast.comprehension)):
                it = node.iter
                if isinstance(it, ast.Call) and isinstance(it.func, ast.Name):
                    assert it.func.id not in ("set", "frozenset"), f"{name}:{node.lineno} iterates a set"
                if isinstance(it, ast.Attribute):
                    assert it.attr not in ("bad_nodes", "taken", "removed"), f"{name}:{node.lineno} iterates a set"
