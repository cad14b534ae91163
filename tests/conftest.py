"""Hypothesis profiles for the whole suite.

``ci`` (the default): derandomized, so a run of the suite draws the same examples on every
machine and a red run replays exactly. ``explore`` (``CELLAR_HYPOTHESIS=explore``): a fresh
random seed every run -- the way to search for new failures; a
failure prints its ``@reproduce_failure`` blob and the seed to replay it."""
from __future__ import annotations

import os

from hypothesis import settings

from store.machines import install_in_simulator

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("CELLAR_HYPOTHESIS", "ci"))

# The simulators resolve SimConfig.machine through the registry the application layer
# installs (consensus.sim.registry): the tests are a composition root.
install_in_simulator()
