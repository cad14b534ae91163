"""Cellar's consensus layer: SDPaxos and a Multi-Paxos baseline.

- ``consensus.core``: the protocols as pure, deterministic state machines (no I/O,
  no clock, no randomness except a seeded one passed in).
- ``consensus.sim``: a seeded discrete-event simulator that drives them.
"""
