"""Load against a running cluster, latencies recorded: closed loop (``run_load``: many
sessions, each waiting for its answer) or open loop (``run_open_loop``: Poisson
arrivals at a set rate, each sent at its scheduled time whether or not earlier ones
are answered).

Keys: each session's own (the default, so the last acknowledged value of each key is
known), or shared ones drawn by a key chooser (``UniformKeys``, ``ZipfKeys``).

Used by ``cellar bench`` and ``cellar demo``. Every loop is bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from store.client import CellarClient, CellarError


@dataclass
class LoadResult:
    ops: int = 0
    errors: int = 0
    reads: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    completions: list[float] = field(default_factory=list)  # monotonic completion times
    seconds: float = 0.0
    acked_writes: dict = field(default_factory=dict)  # key -> last acknowledged value (each key has one writer)
    uncertain: set = field(default_factory=set)  # keys with a write whose outcome is unknown
    # (session, t_invoke, t_complete or None if indeterminate, f, key, value) with record_history
    history: list = field(default_factory=list)
    # Open loop only: arrivals scheduled, those dropped because ``max_inflight`` were
    # outstanding, and how late each was sent after its scheduled time.
    offered: int = 0
    shed: int = 0
    send_lag_ms: list[float] = field(default_factory=list)

    def history_ops(self) -> list:
        """The client history as jepsen_like ops for the KV model (value ``(key, v)``)."""
        from jepsen_like.history import Op

        events = []
        end = max([e[2] or e[1] for e in self.history], default=0.0) + 1.0
        for sid, t0, t1, f, key, value in self.history:
            events.append((t0, 1, sid, f, key, None if f == "get" else value))
            if t1 is None:
                events.append((end, 2, sid, f, key, None if f == "get" else value))
            else:
                events.append((t1, 0, sid, f, key, value))
        # Completions before invocations at equal times; indeterminate ones last.
        events.sort(key=lambda e: (e[0], e[1], e[2]))
        kinds = {1: "invoke", 0: "ok", 2: "info"}
        return [Op(i, t, sid, kinds[phase], f, (key, v)) for i, (t, phase, sid, f, key, v) in enumerate(events)]

    def throughput(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        data = sorted(self.latencies_ms)
        return data[min(len(data) - 1, int(q * len(data)))]

    def longest_gap_ms(self, start: float, end: float) -> float:
        """Longest interval in [start, end] without a completed operation."""
        from jepsen_like.plots import longest_gap

        return longest_gap(self.completions, start, end) * 1000


class UniformKeys:
    """Key ranks 0..n-1, each as likely."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self.n = n

    def __call__(self, rng: random.Random) -> int:
        return rng.randrange(self.n)

    def describe(self) -> str:
        return f"uniform over {self.n} keys"


class ZipfKeys:
    """Key ranks 0..n-1 with P(k) proportional to 1 / (k + 1) ** s (rank 0 the hottest):
    the cumulative distribution precomputed once, each draw a bisection of one uniform
    number from the caller's seeded ``rng``."""

    def __init__(self, n: int, s: float = 0.99) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        if not s >= 0:
            raise ValueError("s must be >= 0")
        self.n = n
        self.s = s
        weights = [1.0 / (k + 1) ** s for k in range(n)]
        total = sum(weights)
        acc = 0.0
        self.cdf: list[float] = []
        for w in weights:
            acc += w
            self.cdf.append(acc / total)
        self.cdf[-1] = 1.0  # rounding: every draw in [0, 1) lands on a rank

    def __call__(self, rng: random.Random) -> int:
        return bisect.bisect_right(self.cdf, rng.random())

    def probability(self, k: int) -> float:
        return self.cdf[k] - (self.cdf[k - 1] if k else 0.0)

    def describe(self) -> str:
        return f"Zipf s={self.s:g} over {self.n} keys"


KeyChooser = Callable[[random.Random], int]
SEND_BURST_MAX = 64  # open loop: arrivals sent (or shed) between two turns of the loop


def poisson_arrivals(rate: float, seconds: float, rng: random.Random) -> list[float]:
    """Offsets in [0, seconds) of a Poisson process of ``rate`` arrivals per second
    (exponential gaps). Bounded: at most ``2 * rate * seconds + 1000`` arrivals."""
    if not rate > 0 or not seconds > 0:
        raise ValueError("rate and seconds must be > 0")
    limit = int(2 * rate * seconds) + 1000
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < seconds and len(out) < limit:
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def run_load(
    cellar: CellarClient,
    *,
    sessions: int,
    seconds: float,
    value_bytes: int = 16,
    read_fraction: float = 0.0,
    keys: int = 1000,
    seed: int = 1,
    key_prefix: str = "",
    record_completions: bool = False,
    record_history: bool = False,
    on_progress=None,
    rate: float = 0.0,
    key_chooser: KeyChooser | None = None,
) -> LoadResult:
    """``sessions`` closed-loop clients for ``seconds``; each writes its own keys (so the
    last acknowledged value of each key is known) and reads random ones. Keys start
    with ``key_prefix`` (several loads at once on one cluster, say one per site).
    With ``key_chooser`` every session reads and writes the shared keys
    ``{key_prefix}k{rank}`` it draws (``keys`` is then unused, and the last
    acknowledged value of a key is not tracked: several sessions write it).
    ``rate`` > 0 paces them to about ``rate`` commands/s in all: each session starts
    a command at most every ``sessions / rate`` s (on a fixed schedule; a late one
    goes at once, and the schedule does not bunch up to catch up)."""
    result = LoadResult()
    value = "x" * max(0, value_bytes - 8)
    stop_at = time.monotonic() + seconds
    lat = result.latencies_ms
    comp = result.completions
    acked = result.acked_writes
    history = result.history

    async def one(idx: int) -> None:
        rng = random.Random(seed * 100_003 + idx)
        s = cellar.session()
        n = 0
        pid = idx  # history process; a new one after an indeterminate op (as Jepsen does)
        interval = sessions / rate if rate > 0 else 0.0
        next_at = time.monotonic() + rng.random() * interval  # sessions spread over one interval
        while time.monotonic() < stop_at:
            if interval:
                now = time.monotonic()
                if next_at > now:
                    await asyncio.sleep(min(next_at, stop_at) - now)  # the load's own schedule
                    if time.monotonic() >= stop_at:
                        break
                next_at = max(next_at, now) + interval
            t0 = time.perf_counter()
            read = bool(read_fraction) and rng.random() < read_fraction
            if key_chooser is not None:
                key = f"{key_prefix}k{key_chooser(rng)}"
            elif read:
                key = f"{key_prefix}s{rng.randrange(sessions)}k{rng.randrange(keys)}"
            else:
                key = f"{key_prefix}s{idx}k{rng.randrange(keys)}"
            if read:
                val = None
            else:
                val = f"{n:08d}{value}"
                n += 1
            try:
                if read:
                    val = await s.get(key)
                    result.reads += 1
                else:
                    await s.put(key, val)
                    if key_chooser is None and key not in result.uncertain:
                        acked[key] = val
            except (CellarError, ConnectionError, TimeoutError):
                result.errors += 1
                if not read and key_chooser is None:
                    # It may still land later: the key's final value is unknown.
                    acked.pop(key, None)
                    result.uncertain.add(key)
                if record_history:
                    history.append((pid, t0, None, "get" if read else "put", key, val))
                    pid += sessions
                continue
            t1 = time.perf_counter()
            if record_history:
                history.append((pid, t0, t1, "get" if read else "put", key, val))
            lat.append((t1 - t0) * 1000)
            result.ops += 1
            if record_completions:
                comp.append(time.monotonic())

    async def progress() -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(0.25)
            on_progress(result)

    t_start = time.monotonic()
    tasks = [asyncio.create_task(one(i)) for i in range(sessions)]
    if on_progress is not None:
        tasks.append(asyncio.create_task(progress()))
    # Each session stops at the deadline; its last command may wait for the client's own deadline.
    await asyncio.wait_for(asyncio.gather(*tasks), seconds + cellar.deadline_s + 5)
    result.seconds = time.monotonic() - t_start
    return result


async def run_open_loop(
    cellar: CellarClient,
    *,
    rate: float,
    seconds: float,
    max_inflight: int,
    key_chooser: KeyChooser,
    value_bytes: int = 16,
    seed: int = 1,
    key_prefix: str = "",
    on_progress=None,
    drain_s: float | None = None,
) -> LoadResult:
    """Blind writes arriving as a Poisson process of ``rate``/s for ``seconds``, each
    sent at its scheduled time whatever the earlier ones are doing (open loop). Each
    write goes through one of ``max_inflight`` sessions (a session sends one command
    at a time); an arrival that finds them all busy is dropped and counted in
    ``shed``, so what is outstanding stays bounded. Latency runs from the *scheduled*
    send time, so a sender that falls behind, or a full pipe, shows in it (no
    coordinated omission); ``send_lag_ms`` says how late each write actually left.
    Keys ``{key_prefix}k{rank}`` drawn by ``key_chooser``. Arrivals due at once go in
    bursts of at most ``SEND_BURST_MAX`` between turns of the loop. After the
    schedule, the writes still outstanding get ``drain_s`` (default: the client's
    deadline plus 5 s); any left then are cancelled and counted as errors, so every
    arrival ends up once in ``ops``, ``shed`` or ``errors``."""
    if max_inflight < 1:
        raise ValueError("max_inflight must be >= 1")
    result = LoadResult()
    arrivals = poisson_arrivals(rate, seconds, random.Random(seed * 100_003 + 1))
    rng = random.Random(seed * 100_003 + 2)
    value = "x" * max(0, value_bytes - 8)
    free = [cellar.session() for _ in range(max_inflight)]
    outstanding: set[asyncio.Task] = set()
    lat, comp, lag = result.latencies_ms, result.completions, result.send_lag_ms

    async def one(s, key: str, val: str, due: float) -> None:
        try:
            await s.put(key, val)
        except (CellarError, ConnectionError, TimeoutError):
            result.errors += 1
        except asyncio.CancelledError:
            result.errors += 1  # cancelled after the drain: its outcome is unknown
            raise
        else:
            now = time.monotonic()
            lat.append((now - due) * 1000)
            comp.append(now)
            result.ops += 1
        free.append(s)  # a cancelled one (after the drain) is not reused

    async def progress() -> None:
        while True:
            await asyncio.sleep(0.25)
            on_progress(result)

    reporter = asyncio.create_task(progress()) if on_progress is not None else None
    t_start = time.monotonic()
    try:
        k, n = 0, len(arrivals)
        while k < n:
            now = real = time.monotonic()
            wait = t_start + arrivals[k] - now
            if wait > 0:
                await asyncio.sleep(wait)  # one timer per wake-up, not one per arrival
                # uvloop's timers have millisecond resolution and may fire up to 1 ms
                # early: the arrival the timer was for goes now, rather than spinning
                # the loop to wait out the rest (its lag then shows below zero).
                real = time.monotonic()
                now = max(real, t_start + arrivals[k])
            # Every arrival due by now, in bursts of at most SEND_BURST_MAX between
            # yields: a sender that has fallen behind still lets the answers in (and
            # frees their sessions) rather than shedding a whole backlog unanswered.
            for _ in range(SEND_BURST_MAX):
                if k >= n:
                    break
                due = t_start + arrivals[k]
                if due > now:
                    break
                result.offered += 1
                if not free:
                    result.shed += 1
                else:
                    s = free.pop()
                    lag.append((real - due) * 1000)
                    task = asyncio.create_task(one(s, f"{key_prefix}k{key_chooser(rng)}", f"{k:08d}{value}", due))
                    outstanding.add(task)
                    task.add_done_callback(outstanding.discard)
                k += 1
            if k < n and t_start + arrivals[k] <= now:
                await asyncio.sleep(0)  # more due at once: let the loop turn first
        if outstanding:
            _, late = await asyncio.wait(set(outstanding),
                                         timeout=drain_s if drain_s is not None else cellar.deadline_s + 5)
            for task in late:
                task.cancel()
            if late:
                await asyncio.gather(*late, return_exceptions=True)
    finally:
        if reporter is not None:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
        for task in list(outstanding):
            task.cancel()
    result.seconds = seconds
    return result
