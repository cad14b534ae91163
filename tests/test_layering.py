"""Dependencies point one way (issue 12): consensus/core <- the rest of consensus/
(runtime, sim, storage, transport) <- the services (store/, scheduler_state/) <- the
command lines, benchmarks and tools. Checked on the source (the AST of every module),
so an import inside a function counts as much as one at the top.

``tests/consensus/test_purity.py`` holds consensus/core to the standard library and
msgpack; this file holds the rest of consensus/ to consensus/ and third-party
libraries, and store/ to not reaching up into bench/.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The applications and everything above them: consensus/ imports none of them.
ABOVE_CONSENSUS = {"store", "scheduler_state", "bench", "jepsen_like", "tools", "tests"}

# Kept, with the reason. The simulators check their client histories for
# linearizability with jepsen_like's checker: a standalone library (histories, models,
# the checker; the standard library only, ``test_the_checker_the_simulators_use_is_standalone``),
# not the fault-injection harness around it. Injecting it would buy nothing: no other
# checker exists, and it depends on nothing of Cellar.
ALLOWED_ABOVE = {
    "consensus/sim/simulator.py": {"jepsen_like.history", "jepsen_like.checker", "jepsen_like.models"},
    "consensus/sim/explorer.py": {"jepsen_like.history", "jepsen_like.checker", "jepsen_like.models"},
    "consensus/sim/transcript.py": {"jepsen_like.history", "jepsen_like.checker", "jepsen_like.models"},
    "consensus/sim/membership.py": {"jepsen_like.history", "jepsen_like.checker", "jepsen_like.models"},
}
CHECKER_MODULES = ["jepsen_like/history.py", "jepsen_like/models.py", "jepsen_like/edn.py", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "jepsen_like" / "checker").glob("*.py"))]

# A ``python3 -m consensus.sim.X`` entry point is a composition root: its
# ``if __name__ == "__main__":`` block (run only as a script, never on import) installs
# the application's machine registry (consensus.sim.registry). That one import, there only.
MAIN_BLOCK_ALLOWED = {"store.machines"}


def _is_main_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    return (isinstance(test.left, ast.Name) and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__")


def imports_of(path: pathlib.Path) -> list[tuple[str, bool]]:
    """(absolute module name, inside the ``__main__`` block) for every import in ``path``;
    relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    main_nodes = {id(n) for top in tree.body if _is_main_block(top) for n in ast.walk(top)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module]
        else:
            continue
        out.extend((name, id(node) in main_nodes) for name in names)
    return out


def modules(top: str) -> list[pathlib.Path]:
    return sorted((ROOT / top).rglob("*.py"))


def test_consensus_imports_no_application_nor_anything_above():
    bad = []
    for path in modules("consensus"):
        rel = str(path.relative_to(ROOT))
        for name, in_main in imports_of(path):
            top = name.split(".")[0]
            if top not in ABOVE_CONSENSUS:
                continue
            if in_main and name in MAIN_BLOCK_ALLOWED:
                continue
            if name in ALLOWED_ABOVE.get(rel, ()):
                continue
            bad.append(f"{rel} imports {name}{' (in its __main__ block)' if in_main else ''}")
    assert not bad, "consensus/ must not depend on the layers above it:\n" + "\n".join(bad)


def test_the_runtime_storage_and_transport_do_not_import_the_simulator():
    bad = [f"{p.relative_to(ROOT)} imports {name}"
           for top in ("consensus/runtime", "consensus/storage", "consensus/transport") for p in modules(top)
           for name, _ in imports_of(p) if name == "consensus.sim" or name.startswith("consensus.sim.")]
    assert not bad, "\n".join(bad)


def test_the_checker_the_simulators_use_is_standalone():
    """The jepsen_like modules consensus/sim may import reach nothing of Cellar (and
    nothing of the harness around them: runner, nemeses, clients)."""
    allowed = {p.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for p in CHECKER_MODULES}
    allowed.add("jepsen_like")  # the package's own __init__ (a docstring)
    assert not imports_of(ROOT / "jepsen_like" / "__init__.py")
    bad = []
    for rel in CHECKER_MODULES:
        for name, _ in imports_of(ROOT / rel):
            top = name.split(".")[0]
            if top in ABOVE_CONSENSUS - {"jepsen_like"} or top == "consensus" or (top == "jepsen_like" and name not in allowed):
                bad.append(f"{rel} imports {name}")
    assert not bad, "\n".join(bad)
    for names in ALLOWED_ABOVE.values():
        assert names <= allowed


def test_services_do_not_import_the_benchmarks_or_tools():
    bad = [f"{p.relative_to(ROOT)} imports {name}" for top in ("store", "scheduler_state") for p in modules(top)
           for name, _ in imports_of(p) if name.split(".")[0] in {"bench", "tools", "tests"}]
    assert not bad, "\n".join(bad)


def test_the_walker_sees_what_it_should():
    """The checks above are only as good as ``imports_of``: relative, nested and
    ``__main__`` imports resolve as intended."""
    found = dict(imports_of(ROOT / "consensus" / "sim" / "cli.py"))
    assert found["consensus.sim.simulator"] is False  # from .simulator import ...
    assert found["store.machines"] is True  # the composition root, and only there
    assert ("jepsen_like.checker", False) in imports_of(ROOT / "consensus" / "sim" / "simulator.py")  # in a method


def test_the_simulators_take_the_installed_registry():
    """consensus.sim.registry resolves names through whatever the layer above installed
    (tests/conftest.py installs store.machines'), and says what to do when none is."""
    from consensus.sim import SimConfig, Simulation, registry
    from store.kv_machine import KVStateMachine
    from store.machines import machine_factory

    asked = []

    def spy(name, config):
        asked.append((name, config))
        return machine_factory(name, config)

    try:
        registry.install(spy)
        sim = Simulation(SimConfig(seconds=0.1))
        assert asked == [("kv", None)] and type(sim.new_machine()) is KVStateMachine
        registry.install(None)
        with pytest.raises(RuntimeError, match="install_in_simulator"):
            Simulation(SimConfig(seconds=0.1))
    finally:
        registry.install(machine_factory)
