"""The replicated machines the simulators run, by name: a slot the application layer fills.

``SimConfig.machine`` is a name (``"kv"``, ``"scheduler"``) so that a configuration
stays plain data: ``search`` prints it as a replay line and saves it as JSON. But
consensus/ knows no machine by name: the machines are applications (``store/``,
``scheduler_state/``), and dependencies point from them to consensus/, never back
(``tests/test_layering.py``). So the layer above installs its registry here, once,
before the first simulation::

    from store.machines import install_in_simulator
    install_in_simulator()  # install(store.machines.machine_factory)

The composition roots do: ``tests/conftest.py``, the ``cellar`` command line
(``store/cli.py``), the ``python3 -m consensus.sim.*`` entry points (their
``__main__`` blocks only), ``bench/geo_bench.py``. The simulator, the explorer and the
transcripts resolve every name through ``machine_factory``; nothing else here varies
with the machine, so a run is the same with the registry injected as it was with the
registry imported.
"""

from __future__ import annotations

from typing import Any, Callable

# (name, config) -> zero-argument factory of fresh machines
# (consensus.core.statemachine.ReplicatedMachine); raises ValueError on a bad name or config.
Registry = Callable[[str, Any], Callable[[], Any]]

_registry: Registry | None = None


def install(registry: Registry) -> None:
    """Make ``registry`` the one the simulators resolve machine names through."""
    global _registry
    _registry = registry


def machine_factory(name: str, config: Any = None) -> Callable[[], Any]:
    """A zero-argument factory of machine ``name`` built from ``config``, from the
    installed registry."""
    if _registry is None:
        raise RuntimeError(
            "no machine registry is installed for the simulators: the application layer installs one "
            "(store.machines.install_in_simulator(), as tests/conftest.py and the cellar command line do)"
        )
    return _registry(name, config)
