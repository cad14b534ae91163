"""The clock nemesis (issue 14): a replica's tick *rate* skew, as the simulator models it
(``SimConfig.tick_skew``), on real processes through the testing knob ``cellar serve
--clock-control FILE`` (consensus.runtime.clock_control).

- the clock behind the knob: continuous across rate changes, a bad file ignored;
- the nemesis' skews stay within ``consensus.sim.search.SKEW_MAX``, so any two rates
  differ by less than the lease's drift bound, with fast and slow nodes and the
  sequencer skewed;
- a short run under the clock nemesis is valid and each node reports ticking at the
  rate the nemesis set (the fault really happened).
"""

from __future__ import annotations

import json
import random

import pytest

from consensus.core.config import ProtocolConfig
from consensus.runtime.clock_control import ClockControl, read_rate, write_rate
from consensus.sim.search import SKEW_MAX
from jepsen_like.nemesis import CLOCKS, clock_skews, rate_of, schedule
from jepsen_like.runner import VALID, RunSpec, run_test

# Under xdist, on one worker: these clusters listen on 127.0.0.20-22 (jepsen_like.db)
# and the nemesis' iptables rules cut those addresses, so no two may run at once.
pytestmark = pytest.mark.xdist_group("loopback-hosts")


def test_the_clock_runs_at_the_files_rate_and_never_jumps(tmp_path):
    path = str(tmp_path / "clock")
    clock = ClockControl(path, t0=100.0)  # no file: rate 1
    assert clock.rate == 1.0 and clock.elapsed(101.0) == pytest.approx(1.0)
    write_rate(path, 1.5)
    clock.poll(102.0)  # 2 s at rate 1, then rate 1.5
    assert clock.rate == 1.5
    assert clock.elapsed(102.0) == pytest.approx(2.0)
    assert clock.elapsed(104.0) == pytest.approx(5.0)
    assert clock.real_delay(6.5, 104.0) == pytest.approx(1.0)
    clock.poll(104.0)  # unchanged file
    write_rate(path, 0.5)
    clock.poll(104.01)  # within POLL_S of the last look: not re-read yet
    assert clock.rate == 1.5
    clock.poll(106.0)
    assert clock.rate == 0.5 and clock.elapsed(106.0) == pytest.approx(8.0) and clock.elapsed(108.0) == pytest.approx(9.0)
    (tmp_path / "clock").write_text("fast please\n")
    clock.poll(110.0)
    assert clock.rate == 0.5 and read_rate(path) is None  # unreadable: the previous rate stays
    (tmp_path / "clock").write_text("100\n")
    assert read_rate(path) is None  # out of range
    (tmp_path / "clock").write_text("")
    assert read_rate(path) == 1.0


@pytest.mark.parametrize("seed", range(20))
def test_the_nemesis_skews_stay_within_the_drift_bound(seed):
    rng = random.Random(seed)
    drift = ProtocolConfig(n=3).drift
    for n in (3, 5):
        for kind in CLOCKS:
            seq = rng.randrange(n)
            skews = clock_skews(kind, n, rng, seq)
            assert sorted(skews) == list(range(n))
            assert all(abs(s) <= SKEW_MAX for s in skews.values())
            rates = [rate_of(s) for s in skews.values()]
            assert max(rates) / min(rates) < 1 + drift  # any two clocks within the lease's bound
            assert min(skews.values()) < 0 < max(skews.values())  # fast and slow nodes
            assert skews[seq] != 0  # the sequencer is skewed too
    kinds = {k for _s, _e, k in schedule(["clock"], 600, random.Random(seed))}
    assert kinds <= set(CLOCKS) and kinds


@pytest.mark.slow  # the default suite runs clock skew in test_jepsen_scheduler.py
async def test_a_short_run_under_clock_skew_is_valid_and_every_node_ticks_at_its_rate(tmp_path):
    spec = RunSpec(nemesis=["clock"], nodes=3, seconds=9, sessions=6, keys=3, seed=4, out_root=str(tmp_path))
    r = await run_test(spec)
    assert r["verdict"] == VALID, json.dumps(r.get("checks", {}), default=str)[:2000]
    assert r["faults"] and all(f["kind"] in CLOCKS for f in r["faults"])
    for f in r["faults"]:
        # the rates the nodes reported while the fault held are the ones it set
        set_rates = dict(part.split(":") for part in f["detail"].split("rates ", 1)[1].split(", "))
        seen = f["observed"]["rates"]
        assert {i: round(float(v), 4) for i, v in set_rates.items()} == {i: round(v, 4) for i, v in seen.items()}
