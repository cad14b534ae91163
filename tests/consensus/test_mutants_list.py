"""The mutation list (``tools/mutants.py``) stays in sync with the core.

Every planted bug is a textual patch whose anchor must occur exactly once in the
current tree; when the core changes under an anchor this test fails and the list must
be updated (``python3 tools/mutate.py --list`` shows which). ``tools/mutate.py``
ignores this file in its mutated copies, where the anchor is gone by design.
"""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"cellar_tools_{name}", ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


mutants = _load("mutants")

REQUIRED = [
    "bug1-lease-promise",
    "bug2-fig7-last-view",
    "bug2b-no-nocl-slot",
    "bug3-mixed-ballot-acks",
    "bug4-reprepare-no-keys",
    "quorum-off-by-one",
    "caccept-vs-accepted-ballot",
    "recovery-first-value",
    "reply-before-persist",
    "lease-one-pong",
    "lease-from-pong-arrival",
    "oslot-out-of-order",
    "no-noop-fill",
    "fig7-off-by-one",
    "n5-ready-rule-as-n3",
    "exec-uncommitted-oslot",
    "multipaxos-recovery-ignores-views",
]


def test_the_list_holds_every_required_mutant_once():
    names = [m.name for m in mutants.MUTANTS]
    assert len(names) == len(set(names))
    assert [n for n in REQUIRED if n not in names] == []
    for m in mutants.MUTANTS:
        assert m.rule.strip() and m.description.strip(), m.name
        assert m.old != m.new, m.name
        assert not m.file.startswith(("tests/", "tools/")), f"{m.name}: plant bugs in the code, not in the tests"


@pytest.mark.parametrize("m", mutants.MUTANTS, ids=lambda m: m.name)
def test_each_anchor_occurs_exactly_once_and_the_patch_parses(m):
    text = (ROOT / m.file).read_text()
    out = mutants.patched(text, m)  # AnchorError names the mutant and the anchor
    assert out != text
    ast.parse(out, filename=f"{m.file} with {m.name}")


def test_a_missing_or_repeated_anchor_is_an_error():
    m = mutants.Mutant("x", "f.py", "a = 1\n", "a = 2\n", "r", "d")
    assert mutants.patched("b = 0\na = 1\n", m) == "b = 0\na = 2\n"
    with pytest.raises(mutants.AnchorError, match="missing"):
        mutants.patched("b = 0\n", m)
    with pytest.raises(mutants.AnchorError, match="2 times"):
        mutants.patched("a = 1\na = 1\n", m)


def test_the_runner_reads_the_first_failing_test_and_prints_a_table():
    mutate = _load("mutate")
    out = "..F\n=== short test summary info ===\nFAILED tests/consensus/test_x.py::test_y[3] - AssertionError\n"
    first = next(m.group(2) for m in map(mutate.FAIL_LINE.match, out.splitlines()) if m)
    assert first == "tests/consensus/test_x.py::test_y[3]"
    r = mutate.Result("bug", "f.py", "rule", "desc", [mutate.Run(0, "killed", first, 10.0), mutate.Run(1, "survived", None, 20.0)])
    text = mutate.table([r], 2)
    assert "bug" in text and "1/2" in text and first in text
    assert "test_mutants_list.py" in " ".join(mutate.IGNORE)
