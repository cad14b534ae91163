"""Disk full on one replica of a real 3-replica cluster (issue 17, acceptance 2).

Replica 2's data dir is a small tmpfs. Under a write load its disk is filled (a
filler file); it must stop by itself with one line naming the error (exit status 1)
while replicas 0 and 1 keep acknowledging writes. Once the filler is deleted it is
restarted on the same data dir, catches up (same digest at the same executed slot)
and every acknowledged write is readable. The times to stop and to catch up are
printed (``-s``) and quoted in docs/storage.md.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

from jepsen_like.disk import Tmpfs, fill
from store.client import CellarClient, CellarError

from .conftest import committing, converged

FULL = 2  # the replica whose disk fills up (not the initial sequencer)
TMPFS_SIZE = "8m"
WRITERS = 8
FIGURES: dict[str, float] = {}


class Load:
    """WRITERS sessions putting distinct keys; remembers every acknowledged write."""

    def __init__(self, cellar: CellarClient) -> None:
        self.cellar = cellar
        self.acked: dict[str, int] = {}
        self.ack_times: list[float] = []
        self.failed = 0
        self.running = True
        self.tasks = [asyncio.ensure_future(self._writer(w)) for w in range(WRITERS)]

    async def _writer(self, w: int) -> None:
        session = self.cellar.session(w % 3)  # some sessions start on the replica that fills up
        i = 0
        while self.running:
            key = f"w{w}-{i}"
            try:
                await session.put(key, i)
            except (CellarError, ConnectionError, OSError, TimeoutError):
                self.failed += 1  # not acknowledged: may or may not be applied
            else:
                self.acked[key] = i
                self.ack_times.append(time.monotonic())
            i += 1

    def acks_since(self, t: float) -> int:
        return sum(1 for x in self.ack_times if x >= t)

    async def stop(self) -> None:
        self.running = False
        async with asyncio.timeout(30):
            await asyncio.gather(*self.tasks)


async def test_a_full_disk_stops_one_replica_the_others_serve_and_it_catches_up(make_cluster):
    cluster = make_cluster(3)
    data = cluster.data_dir(FULL)
    try:
        tmpfs = Tmpfs(data, TMPFS_SIZE)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a tmpfs for the full disk ({e})")
    filler = os.path.join(data, "filler")
    load = None
    try:
        cluster.start_all()
        await cluster.await_ready()
        async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=20.0) as cellar:
            await committing(cellar)
            load = Load(cellar)
            await asyncio.sleep(1.0)
            before = (await cellar.status(FULL))["exec_slot"]
            assert before > 0 and len(load.acked) > 0

            # The disk fills up under the load.
            filled = await asyncio.get_running_loop().run_in_executor(None, fill, filler)
            t_full = time.monotonic()
            proc = cluster.procs[FULL]
            status = await asyncio.get_running_loop().run_in_executor(None, lambda: proc.wait(timeout=20))
            t_stopped = time.monotonic()
            FIGURES["time_to_stop_s"] = round(t_stopped - t_full, 3)
            FIGURES["filler_bytes"] = filled
            assert status == 1, (status, cluster.log_tail(FULL))
            with open(os.path.join(cluster.root, f"node{FULL}.log"), errors="replace") as f:
                log_text = f.read()
            last = log_text.strip().splitlines()[-1]
            assert last.startswith(f"cellar serve: replica {FULL} stopped: "), last
            assert "No space left on device" in last, last
            assert "Traceback" not in log_text, log_text[-2000:]

            # The other two keep acknowledging writes.
            await asyncio.sleep(1.5)
            served = load.acks_since(t_stopped + 0.5)
            FIGURES["acks_by_the_two_in_1s"] = served
            assert served > 0, "replicas 0 and 1 acknowledged nothing after replica 2 stopped"
            for i in (0, 1):
                assert cluster.alive(i), cluster.log_tail(i)

            # Space freed: restart on the same data dir; it catches up.
            await load.stop()
            os.unlink(filler)
            t_restart = time.monotonic()
            cluster.start(FULL)
            await cluster.await_ready(FULL)
            t_ready = time.monotonic()
            final = await converged(cellar, [0, 1, 2], timeout_s=30.0)
            t_caught_up = time.monotonic()
            FIGURES["restart_to_ready_s"] = round(t_ready - t_restart, 3)
            FIGURES["restart_to_caught_up_s"] = round(t_caught_up - t_restart, 3)
            FIGURES["exec_slot"] = final[0]["exec_slot"]
            FIGURES["acknowledged"] = len(load.acked)
            FIGURES["not_acknowledged"] = load.failed

            # Every acknowledged write is there; the replica serves again.
            keys = sorted(load.acked)
            missing: list = []

            async def check(part: list[str], node: int) -> None:
                session = cellar.session(node)
                for key in part:
                    value = await session.get(key)
                    if value != load.acked[key]:
                        missing.append((key, load.acked[key], value))

            await asyncio.gather(*(check(keys[j::6], j % 3) for j in range(6)))
            assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:5]}"
            await asyncio.wait_for(cellar.session(FULL).put("after", "ok"), 20)
            await converged(cellar, [0, 1, 2], timeout_s=30.0)
            print(f"disk full figures: {FIGURES}\nreplica {FULL}'s last line: {last}")
    finally:
        if load is not None:
            load.running = False
            for task in load.tasks:
                task.cancel()
        cluster.stop_all()
        tmpfs.umount()
