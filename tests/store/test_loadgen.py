"""store/loadgen.py: the key choosers (uniform, Zipf from a precomputed CDF), the Poisson
schedule, and the open loop's accounting (shed at the in-flight cap, errors, latency
from the scheduled time) against a fake client, no sockets. Seeded; no timing asserted."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections import Counter

import pytest

from store.client import CellarError
from store.loadgen import UniformKeys, ZipfKeys, poisson_arrivals, run_open_loop


def test_zipf_sampler_follows_its_distribution():
    n, s, draws = 100, 0.99, 200_000
    zipf = ZipfKeys(n, s)
    assert zipf.cdf[-1] == 1.0 and all(a < b for a, b in zip(zipf.cdf, zipf.cdf[1:]))
    harmonic = sum(1 / (k + 1) ** s for k in range(n))
    assert zipf.probability(0) == pytest.approx(1 / harmonic)
    assert sum(zipf.probability(k) for k in range(n)) == pytest.approx(1.0)
    rng = random.Random(1)
    counts = Counter(zipf(rng) for _ in range(draws))
    assert set(counts) <= set(range(n)) and len(counts) == n  # every rank drawn, none outside
    for k in (0, 1, 2, 9, 49):
        assert counts[k] / draws == pytest.approx(zipf.probability(k), rel=0.1), k
    assert counts[0] / counts[1] == pytest.approx(2 ** s, rel=0.05)
    # The head is heavy: the 10 hottest ranks take about half of the draws.
    assert sum(counts[k] for k in range(10)) / draws == pytest.approx(sum(zipf.probability(k) for k in range(10)),
                                                                      abs=0.01)
    # Seeded: the same draws again.
    assert [zipf(random.Random(7)) for _ in range(5)] == [zipf(random.Random(7)) for _ in range(5)]


def test_zipf_of_exponent_zero_and_uniform_are_flat():
    for chooser in (ZipfKeys(10, 0.0), UniformKeys(10)):
        rng = random.Random(2)
        counts = Counter(chooser(rng) for _ in range(50_000))
        assert sorted(counts) == list(range(10))
        assert max(counts.values()) / min(counts.values()) < 1.1
    assert ZipfKeys(1)(random.Random(0)) == 0
    for bad in (lambda: ZipfKeys(0), lambda: ZipfKeys(5, -1), lambda: UniformKeys(0)):
        with pytest.raises(ValueError):
            bad()


def test_poisson_schedule_has_the_asked_rate_and_exponential_gaps():
    rate, seconds = 1000.0, 20.0
    at = poisson_arrivals(rate, seconds, random.Random(1))
    assert at == sorted(at) and 0 <= at[0] and at[-1] < seconds
    assert len(at) / seconds == pytest.approx(rate, rel=0.03)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / rate, rel=0.03)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential: CV 1
    # Arrivals per 100 ms: a Poisson count, variance about its mean.
    counts = Counter(int(t / 0.1) for t in at)
    per = [counts[k] for k in range(int(seconds / 0.1))]
    assert statistics.variance(per) / statistics.mean(per) == pytest.approx(1.0, abs=0.25)
    assert poisson_arrivals(rate, seconds, random.Random(1)) == at  # seeded
    with pytest.raises(ValueError):
        poisson_arrivals(0, 1, random.Random(1))
    assert math.isclose(len(poisson_arrivals(5.0, 1000.0, random.Random(3))) / 1000.0, 5.0, rel_tol=0.05)


class FakeSession:
    def __init__(self, cellar: "FakeCellar") -> None:
        self.cellar = cellar

    async def put(self, key, value) -> None:
        self.cellar.sent.append((key, value))
        self.cellar.busy += 1
        self.cellar.busy_max = max(self.cellar.busy_max, self.cellar.busy)
        try:
            await self.cellar.gate.wait()
            if self.cellar.fail_every and len(self.cellar.sent) % self.cellar.fail_every == 0:
                raise CellarError("refused")
        finally:
            self.cellar.busy -= 1


class FakeCellar:
    deadline_s = 1.0

    def __init__(self, fail_every: int = 0) -> None:
        self.gate = asyncio.Event()
        self.sent: list = []
        self.busy = 0
        self.busy_max = 0
        self.fail_every = fail_every

    def session(self) -> FakeSession:
        return FakeSession(self)


async def test_open_loop_sheds_at_the_cap_and_counts_every_arrival():
    # Nothing is answered until the schedule is over: the first 3 arrivals take the 3
    # sessions, every later one is shed; the 3 are answered in the drain.
    cellar = FakeCellar()

    async def release() -> None:
        await asyncio.sleep(0.45)
        cellar.gate.set()

    opener = asyncio.create_task(release())
    res = await run_open_loop(cellar, rate=200, seconds=0.4, max_inflight=3, key_chooser=ZipfKeys(50), seed=4)
    await opener
    expected = len(poisson_arrivals(200, 0.4, random.Random(4 * 100_003 + 1)))
    assert res.offered == expected and res.offered > 10
    assert res.ops == 3 and res.shed == res.offered - 3 and res.errors == 0
    assert cellar.busy_max == 3 and len(cellar.sent) == 3
    assert len(res.latencies_ms) == 3 == len(res.completions) == len(res.send_lag_ms)
    # From the scheduled time: each write's latency holds its own lateness in leaving.
    assert sum(res.latencies_ms) > sum(res.send_lag_ms)  # (a lag may be below zero: timers fire 1 ms early)
    assert all(key.startswith("k") and 0 <= int(key[1:]) < 50 for key, _ in cellar.sent)


async def test_open_loop_counts_errors_and_reuses_sessions():
    cellar = FakeCellar(fail_every=4)
    cellar.gate.set()  # answered at once: nothing shed
    res = await run_open_loop(cellar, rate=300, seconds=0.3, max_inflight=50, key_chooser=UniformKeys(10),
                              value_bytes=1024, seed=2)
    assert res.shed == 0 and res.offered == len(cellar.sent)
    assert res.errors == res.offered // 4 and res.ops == res.offered - res.errors
    assert all(len(v) == 1024 for _, v in cellar.sent)
    with pytest.raises(ValueError):
        await run_open_loop(cellar, rate=1, seconds=1, max_inflight=0, key_chooser=UniformKeys(1))


async def test_open_loop_counts_writes_left_at_the_drain_as_errors():
    cellar = FakeCellar()  # never answers
    res = await run_open_loop(cellar, rate=100, seconds=0.3, max_inflight=4, key_chooser=UniformKeys(5), seed=1,
                              drain_s=0.05)
    assert res.ops == 0 and res.errors == 4 and res.shed == res.offered - 4
    assert res.offered == res.ops + res.shed + res.errors and cellar.busy == 0
