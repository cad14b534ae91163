"""Deterministic simulation of the consensus protocols (see ``simulator``).

``SimConfig`` and ``Simulation`` are imported on first use (PEP 562), so that a
process that only installs the machine registry (``consensus.sim.registry``: every
``cellar`` command does, at start) does not import the simulator."""

from __future__ import annotations

from typing import Any

__all__ = ["SimConfig", "Simulation"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import simulator

        return getattr(simulator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
