"""Replicated machines by name: what ``cellar serve --machine`` and ``SimConfig.machine`` pick.

consensus/ never imports this module: ``store.server.make_node`` hands a node its machine,
and ``install_in_simulator`` plugs the registry into ``consensus.sim.registry``.

Every entry builds a ``consensus.core.statemachine.ReplicatedMachine``; the drivers use
nothing else of it. ``config`` is the machine's own start configuration:

- ``kv``: none (``store.kv_machine.KVStateMachine``).
- ``scheduler``: an optional HiveD ``scheduler_state.Config``. With none (the runtime)
  the machine starts empty and its config arrives as the first ``init`` command in the
  log (``scheduler_state.replicated``); with one (tests, the simulator) it starts
  initialized, as if that command had been applied first.

``scheduler_state`` is imported only when asked for, so the key-value path never
loads it.

``validator(name)`` is the machine's pure pre-proposal check (``op -> None | error
result``), what a server runs before proposing a client's command: ``kv``'s checks types
and size limits (``store.kv_machine.validate``, docs/kv.md), ``scheduler``'s the command's
shape and name (``scheduler_state.replicated.validate``; its fields are refused in
``apply``); a machine without one accepts every shape here and refuses bad commands in
``apply``.
"""

from __future__ import annotations

from typing import Any, Callable

from consensus.core.statemachine import ReplicatedMachine
from store.kv_machine import KVStateMachine, stamp, validate

MACHINES = ("kv", "scheduler")


def _kv(config: Any) -> ReplicatedMachine:
    if config is not None:
        raise ValueError("the kv machine takes no config")
    return KVStateMachine()


def _scheduler(config: Any) -> ReplicatedMachine:
    from scheduler_state.config import Config, load_config
    from scheduler_state.replicated import ReplicatedScheduler

    if config is not None and not isinstance(config, Config):
        config = load_config(config)  # YAML text, a mapping or a path
    return ReplicatedScheduler(config)


_FACTORIES: dict[str, Callable[[Any], ReplicatedMachine]] = {"kv": _kv, "scheduler": _scheduler}


def _accept(op: Any) -> None:
    return None


def _scheduler(name: str) -> Callable[..., Any]:
    """``scheduler_state.replicated.<name>``, imported on its first call."""
    def call(*args: Any) -> Any:
        from scheduler_state import replicated

        return getattr(replicated, name)(*args)

    return call


_VALIDATORS: dict[str, Callable[[Any], Any]] = {"kv": validate, "scheduler": _scheduler("validate")}


_STAMPERS: dict[str, Callable[[Any, int], Any]] = {"kv": stamp, "scheduler": _scheduler("stamp")}


def stamper(name: str) -> Callable[[Any, int], Any] | None:
    """``(op, now_ms) -> op`` that stamps the proposing replica's time into the commands
    of machine ``name`` that need it, or None (the machine stamps nothing)."""
    return _STAMPERS.get(name)


def validator(name: str) -> Callable[[Any], Any]:
    """The pure ``op -> None | error result`` check of machine ``name`` (module docstring)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown machine {name!r} ({', '.join(MACHINES)})")
    return _VALIDATORS.get(name, _accept)


def make_machine(name: str, config: Any = None) -> ReplicatedMachine:
    """A fresh machine ``name`` (one of ``MACHINES``) built from ``config``."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown machine {name!r} ({', '.join(MACHINES)})")
    return factory(config)


def machine_factory(name: str, config: Any = None) -> Callable[[], ReplicatedMachine]:
    """A zero-argument factory (one fresh machine per replica incarnation); checks
    ``name`` and ``config`` now, parsing the config once."""
    if name == "scheduler" and config is not None:
        from scheduler_state.config import Config, load_config

        if not isinstance(config, Config):
            config = load_config(config)
    make_machine(name, config)  # fail early on a bad name or config
    return lambda: make_machine(name, config)


def install_in_simulator() -> None:
    """Make this registry the one the simulators resolve ``SimConfig.machine`` through
    (``consensus.sim.registry``: consensus/ names no machine itself). Called by the
    composition roots: tests/conftest.py, the cellar command line, the ``python3 -m
    consensus.sim.*`` entry points, bench/geo_bench.py."""
    from consensus.sim import registry

    registry.install(machine_factory)
