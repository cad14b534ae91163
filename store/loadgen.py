"""Closed-loop load against a running cluster: many sessions, latencies recorded.

Used by ``cellar bench`` and ``cellar demo``. Every loop is bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

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
) -> LoadResult:
    """``sessions`` closed-loop clients for ``seconds``; each writes its own keys (so the
    last acknowledged value of each key is known) and reads random ones. Keys start
    with ``key_prefix`` (several loads at once on one cluster, say one per site).
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
            if read:
                key = f"{key_prefix}s{rng.randrange(sessions)}k{rng.randrange(keys)}"
                val = None
            else:
                key = f"{key_prefix}s{idx}k{rng.randrange(keys)}"
                val = f"{n:08d}{value}"
                n += 1
            try:
                if read:
                    val = await s.get(key)
                    result.reads += 1
                else:
                    await s.put(key, val)
                    if key not in result.uncertain:
                        acked[key] = val
            except (CellarError, ConnectionError, TimeoutError):
                result.errors += 1
                if not read:
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
