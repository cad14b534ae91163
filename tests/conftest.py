"""Hypothesis profiles for the whole suite.

``ci`` (the default): derandomized, so a run of the suite draws the same examples on every
machine and a red run replays exactly. ``explore`` (``CELLAR_HYPOTHESIS=explore``): a fresh
random seed every run -- the way to search for new failures; a
failure prints its ``@reproduce_failure`` blob and the seed to replay it."""
from __future__ import annotations

import os
import sys
import tempfile


def _cache_bytecode_outside_the_tree() -> None:
    """With ``PYTHONDONTWRITEBYTECODE`` set, every ``cellar serve`` and CLI process the
    suite starts (several hundred) compiles the whole package from source again: about
    0.15 s of CPU each, ~9 % of the suite on 2 cores. Cache the bytecode under the temp
    dir instead (``PYTHONPYCACHEPREFIX``: nothing is written in the tree), for this
    process and every process it starts. ``CELLAR_TEST_PYCACHE=0`` leaves the
    environment as it is (tools/mutate.py's runs of mutated copies set it). A clone
    under the temp dir is cached too: until 2026-11-27 night it was not, and the suite in
    a fresh clone in /tmp took about 880 s of CPU, against 570 s elsewhere."""
    tmp = os.path.realpath(tempfile.gettempdir())
    if (not sys.flags.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX")
            or os.environ.get("CELLAR_TEST_PYCACHE") == "0"):
        return
    prefix = os.path.join(tmp, f"cellar-test-pycache-{os.getuid()}")
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


_cache_bytecode_outside_the_tree()

from hypothesis import settings  # noqa: E402

from store.machines import install_in_simulator  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("CELLAR_HYPOTHESIS", "ci"))

# The simulators resolve SimConfig.machine through the registry the application layer
# installs (consensus.sim.registry): the tests are a composition root.
install_in_simulator()
