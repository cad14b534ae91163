"""The sequencer's read lease against clock-rate skew on real processes (issue 14).

``jepsen_like.lease_probe``: set the sequencer's and the voters' tick rates (``cellar
serve --clock-control``), cut the sequencer off, write through the majority and read
at the old sequencer, then check the history.

- **Within the drift bound** (the sequencer 2.4 % slow, the voters 2.4 % fast, the
  worst pair the clock nemesis makes): no stale read, ever. Asserted.
- **Outside it** (the sequencer 20 % slow, the voters 20 % fast): the old sequencer's
  lease outlives the voters' promises and it may serve stale reads. Whether a trial
  shows one depends on where the cut falls between pings, on the voters' randomized
  election timeouts and on scheduling, so only what is certain is asserted: a stale
  read seen directly (a read at the old sequencer returning a value older than one the
  majority acknowledged before the read began) makes the checker call the history
  non-linearizable. What the trial saw is printed (``-s``). On this machine 8 trials
  of 10 found stale reads (59-427 of them, the old sequencer serving 33-115 ms past the
  majority's first acknowledged write) and 2 found none (docs/jepsen.md).
"""

from __future__ import annotations

import json

import pytest

from consensus.sim.search import SKEW_MAX
from jepsen_like.lease_probe import probe
from jepsen_like.nemesis import iptables_available, rate_of

# xdist_group: one worker for every cluster on 127.0.0.20-22 (jepsen_like.db), which
# the probe's iptables rules cut (tests/runtime/test_nemesis.py).
pytestmark = [pytest.mark.skipif(iptables_available() is not None, reason=f"needs iptables: {iptables_available()}"),
              pytest.mark.xdist_group("loopback-hosts")]


async def test_within_the_drift_bound_the_isolated_sequencer_serves_no_stale_read(tmp_path):
    r = await probe(str(tmp_path / "db"), seq_rate=rate_of(SKEW_MAX), voter_rate=rate_of(-SKEW_MAX), window_s=2.0)
    print(json.dumps(r.to_json())[:1500])
    assert r.stale_reads == [] and r.linearizable is True, r.to_json()


@pytest.mark.slow  # a demonstration outside the drift bound
async def test_outside_the_bound_a_stale_read_if_any_is_caught(tmp_path):
    r = await probe(str(tmp_path / "db"), seq_rate=0.8, voter_rate=1.2, window_s=2.0)
    doc = r.to_json()
    doc["stale_reads"] = doc["stale_reads"][:3] + [f"{len(r.stale_reads)} in all"]
    print(json.dumps(doc))
    assert r.linearizable is not None  # the checker decided
    if r.stale_reads:
        assert r.linearizable is False, "a stale read the checker missed"
