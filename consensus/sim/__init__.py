"""Deterministic simulation of the consensus protocols (see ``simulator``)."""

from .simulator import SimConfig, Simulation

__all__ = ["SimConfig", "Simulation"]
