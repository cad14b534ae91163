"""The protocol modules do no I/O and read no clock (issue 2, acceptance 5), and import
only each other, the standard library modules below and msgpack (issue 12, layering:
the rest of consensus/ and everything above it is ``tests/test_layering.py``)."""

import ast
import pathlib

import consensus.core

CORE = pathlib.Path(consensus.core.__file__).parent
ALLOWED_IMPORTS = {"__future__", "dataclasses", "typing", "msgpack", "random", "hashlib"}
FORBIDDEN_CALLS = {"open", "print", "input"}


def core_modules():
    return sorted(CORE.glob("*.py"))


def test_core_imports_nothing_that_does_io():
    for path in core_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                # A relative import stays inside consensus/core (``from .x``, never ``..``);
                # an absolute one of consensus (even consensus.core) is refused below.
                assert node.level <= 1, f"{path.name} imports {'.' * node.level}{node.module or ''} (outside core)"
                names = [] if node.level else [node.module.split(".")[0]]
            else:
                continue
            for name in names:
                assert name in ALLOWED_IMPORTS, f"{path.name} imports {name}"


def test_core_uses_only_injected_randomness_and_no_builtin_io():
    for path in core_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "random":
                assert node.attr == "Random", f"{path.name} calls random.{node.attr} (use the injected rng)"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, f"{path.name} calls {node.func.id}()"


def test_public_modules_document_their_interface():
    for path in core_modules():
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc) > 40, f"{path.name} needs a module docstring"
