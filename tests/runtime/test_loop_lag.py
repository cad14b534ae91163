"""The event-loop lag monitor (issue 16): a pause of the loop shows in ``status()``."""

from __future__ import annotations

import asyncio
import time

from consensus.runtime.node import LoopLag

from .test_crash_only import single_node

WAIT_S = 10.0


def test_lag_windows_and_pause_count():
    lag = LoopLag()
    lag.record(100.2, 0.002)
    lag.record(100.7, 0.080)  # an 80 ms pause
    lag.record(101.1, 0.001)
    st = lag.status(101.5)
    assert st["lag_max_ms_1s"] == 80.0 and st["lag_max_ms_60s"] == 80.0
    assert st["lag_max_ms"] == 80.0 and st["pauses_50ms"] == 1
    lag.record(170.0, -0.001)  # early is not negative lateness
    st = lag.status(170.5)
    assert st["lag_max_ms_1s"] == 0.0 and st["lag_max_ms_60s"] == 0.0  # the pause left the minute
    assert st["lag_max_ms"] == 80.0 and st["pauses_50ms"] == 1


async def test_a_blocked_loop_shows_in_status(tmp_path):
    node = single_node(tmp_path)
    await node.start()
    try:
        async with asyncio.timeout(WAIT_S):
            while node._ticks_done < 3:  # the timer runs
                await asyncio.sleep(node.cfg.tick_ms / 1000)
        before = node.status()["loop"]["pauses_50ms"]
        time.sleep(0.12)  # the pause under test: a callback that holds the loop
        ticks = node._ticks_done
        async with asyncio.timeout(WAIT_S):
            while node._ticks_done == ticks:
                await asyncio.sleep(node.cfg.tick_ms / 1000)
        loop = node.status()["loop"]
        assert loop["pauses_50ms"] >= before + 1  # (a busy machine may add its own)
        assert loop["lag_max_ms"] >= 100 and loop["lag_max_ms_60s"] >= 100
    finally:
        await node.stop()
