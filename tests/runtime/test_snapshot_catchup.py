"""A replica restarted after its peers compacted past its log catches up by snapshot."""

from __future__ import annotations

import itertools
import signal
import time

from store.loadgen import run_load
from store.client import CellarClient

from .conftest import committing, converged


async def test_restarted_replica_catches_up_by_snapshot(make_cluster):
    cluster = make_cluster(3, extra_args=["--snapshot-every", "40"])
    cluster.start_all()
    await cluster.await_ready()
    async with CellarClient(cluster.client_addresses[:2], timeout_s=1.0, deadline_s=20.0) as cellar:
        await committing(cellar)
        cluster.kill(2, signal.SIGKILL)
        # Load until both survivors have taken two snapshots (80 executed slots), not for a
        # fixed time: on a busy machine batches grow and 3 s of load executed only 60 slots.
        # Each round writes its own keys, so the last acknowledged value of each is known.
        acked: dict[str, str] = {}
        deadline = time.monotonic() + 20.0
        for rnd in itertools.count():
            res = await run_load(cellar, sessions=16, seconds=1.0, keys=30, key_prefix=f"r{rnd}")
            acked.update(res.acked_writes)
            statuses = [await cellar.status(i) for i in (0, 1)]
            if all(s["stats"]["snapshots_taken"] >= 2 for s in statuses) or time.monotonic() > deadline:
                break
    assert all(s["stats"]["snapshots_taken"] >= 2 for s in statuses), statuses
    # The survivors' logs were compacted: their WALs no longer start at the beginning, or
    # they hold a second snapshot (at slot 80 or later: the first at 40 or later, the next
    # 40 slots on), and a core compacts below the previous one. A second snapshot exactly
    # at slot 80 is that too (the bound was "> 80", and failed when batches landed on it).
    assert any(s["wal"]["first_seq"] > 1 for s in statuses) or all(s["snapshot_slot"] >= 80 for s in statuses)
    cluster.start(2)
    await cluster.await_ready(2)
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=20.0) as cellar:
        await committing(cellar, "after")
        final = await converged(cellar, [0, 1, 2])
        assert final[2]["stats"]["snapshots_installed"] >= 1, final[2]
        reader = cellar.session(2)
        for key, value in sorted(acked.items()):
            assert await reader.get(key) == value
    # And it restarts again from its own snapshot plus live records.
    cluster.kill(2, signal.SIGKILL)
    cluster.start(2)
    await cluster.await_ready(2)
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=20.0) as cellar:
        await committing(cellar, "again")
        await converged(cellar, [0, 1, 2])
