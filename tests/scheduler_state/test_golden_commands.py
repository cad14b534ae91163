"""Every command's decisions pinned across performance work (issue 11, acceptance 4):
a seeded stream over all commands of the machine (``golden_commands.py``: allocate,
release, the extender's pod commands, what_if, health, leases, reconfigure, reads, and
snapshot/restore round trips) on six configs gives exactly the results and digests it
gave before the apply-cost work of branch schedperf (d5b6095). A change that is meant to
change a decision must say so here. The long version (2,500 steps x 2 seeds x 6
configs, one hash per step) is ``python3 -m tests.scheduler_state.golden_commands
record|compare FILE``."""

from __future__ import annotations

import pytest

from tests.scheduler_state.golden_commands import PROFILES, stream_hash

GOLDEN = {  # profile -> hash of the per-step (result, digest) hashes, seed 3, 400 steps
    "bench": "0f036ac3e6acf2d7",
    "small": "5950cf6cf1356207",
    "demo": "b86cc40a6e5be2b4",
    "mixed": "f6d3470164d1aea5",
    "fleet": "582cb5a28b88a293",
    "pinned": "df4c9345dac83719",
}


def test_every_profile_is_pinned():
    assert sorted(GOLDEN) == sorted(PROFILES)


@pytest.mark.parametrize("profile", sorted(GOLDEN))
def test_the_command_stream_decides_as_before(profile):
    assert stream_hash(profile, 3, 400) == GOLDEN[profile]
