"""Every command's decisions pinned across performance work (issue 11, acceptance 4):
a seeded stream over all commands of the machine (``golden_commands.py``: allocate,
release, the extender's pod commands, what_if, health, leases, reconfigure, reads, and
snapshot/restore round trips) on six configs gives exactly the results and digests it
gave before the apply-cost work of branch schedperf (d5b6095). A change that is meant to
change a decision must say so here.

Deliberate changes since: issue 10, "Preemption over time" (branch reserve): the free
cells of a Preempting group's plan are reserved for it. In these 400-step streams no
decision changed; the hashes moved because results carry new fields (``vc_status``:
``reserved_leaf_cells``; ``pod_preempt``: ``lazy_preempted``, ``reserved_leaf_cells``;
``add_allocated_pod``: ``scheduled``; a preempting ``group_status``:
``reserved_placement``) and snapshots (so digests) carry each Preempting group's
virtual plan and reserved cells. The long version (2,500 steps x 2 seeds x 6
configs, one hash per step) is ``python3 -m tests.scheduler_state.golden_commands
record|compare FILE``."""

from __future__ import annotations

import pytest

from tests.scheduler_state.golden_commands import PROFILES, stream_hash

GOLDEN = {  # profile -> hash of the per-step (result, digest) hashes, seed 3, 400 steps
    "bench": "37374b882162c7a2",
    "small": "02ede58b5d94bf14",
    "demo": "607092c808b62d8a",
    "mixed": "84059dc09cabd417",
    "fleet": "9caefb46f7e02cb0",
    "pinned": "586e7b01a5459728",
}


def test_every_profile_is_pinned():
    assert sorted(GOLDEN) == sorted(PROFILES)


@pytest.mark.parametrize("profile", sorted(GOLDEN))
def test_the_command_stream_decides_as_before(profile):
    assert stream_hash(profile, 3, 400) == GOLDEN[profile]
