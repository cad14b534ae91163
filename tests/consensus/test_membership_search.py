"""The membership fault search (``cellar sim membership``, consensus/sim/membership.py):
processes across epochs under crashes, cut links, loss, duplication and reordering,
while an admin grows, shrinks and replaces the cluster and moves its sequencer (the
proposer of a change crashed mid-way in some runs). A short smoke here; the campaign
is ``cellar sim membership --examples 500`` (README, docs/membership.md)."""

from __future__ import annotations

import os

import pytest

from consensus.sim.membership import judge_seed, swarm_membership


@pytest.mark.parametrize("seed", [14, 33, 40])
def test_membership_changes_under_faults_are_safe_and_live(seed):
    result = judge_seed(seed)
    assert result["failures"] == [], result
    assert result["reconfigs_ok"] >= 2 and result["epochs"] >= 2, result


@pytest.mark.parametrize("seed", [14, 33])
def test_membership_changes_with_execution_after_send(seed):
    """The runtime's default (docs/runtime.md): members execute after sending."""
    result = judge_seed(seed, defer_execution=True)
    assert result["failures"] == [], result
    assert result["reconfigs_ok"] >= 2 and result["epochs"] >= 2, result


def test_a_run_replays_from_its_seed():
    assert judge_seed(7) == judge_seed(7)
    assert swarm_membership(7) == swarm_membership(7)


@pytest.mark.slow
def test_membership_campaign():
    """``CELLAR_MEMBERSHIP_EXAMPLES`` seeds from ``CELLAR_MEMBERSHIP_SEED`` (100 from 1000)."""
    first = int(os.environ.get("CELLAR_MEMBERSHIP_SEED", "1000"))
    count = int(os.environ.get("CELLAR_MEMBERSHIP_EXAMPLES", "100"))
    for seed in range(first, first + count):
        result = judge_seed(seed)
        assert not result["failures"], result
