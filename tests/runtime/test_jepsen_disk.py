"""The disk nemesis (issue 14): torn writes, flipped bytes and a full disk on real data
directories, and the WAL's recovery rules (consensus.storage.wal) holding against them.

- on a WAL in this process: a torn write after the end is truncated at open and every
  record comes back; a flipped byte in a durable record (vouched for by a later commit
  marker, or in a sealed segment) is refused (``WALCorruption``); put back, every
  record comes back;
- on a real 3-node cluster under writes: each fault on one node (torn, flip, full),
  and the node does what the rules say: truncates and starts; refuses with one line
  (status 2) and starts once the byte is back; stops with one line (status 1, ENOSPC)
  and restarts on the same data; the replicas converge;
- a short ``cellar jepsen`` run under the disk nemesis is valid.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from consensus.storage.wal import WAL, WALCorruption
from jepsen_like.client import HttpKV
from jepsen_like.db import CellarDB
from jepsen_like.disk import can_mount, flip_byte, tear_tail, unflip, vouched_end
from jepsen_like.nemesis import DiskNemesis
from jepsen_like.runner import VALID, RunSpec, run_test

# Under xdist, on one worker: these clusters listen on 127.0.0.20-22 (jepsen_like.db)
# and the nemesis' iptables rules cut those addresses, so no two may run at once.
pytestmark = pytest.mark.xdist_group("loopback-hosts")


def _wal(tmp_path, records: int, segment_bytes_max: int = 1 << 20) -> str:
    d = tmp_path / "node"
    wal, _ = WAL.open(str(d / "wal"), fsync="batch", segment_bytes_max=segment_bytes_max)
    for k in range(records):
        wal.append(f"record {k} ".encode() * 8)
        if k % 7 == 6:
            wal.sync()
    wal.sync()
    wal.close()
    return str(d)


def _records(d: str) -> list[tuple[int, bytes]]:
    wal, recs = WAL.open(f"{d}/wal", fsync="never")
    wal.close()
    return list(recs)


@pytest.mark.parametrize("seed", range(12))
def test_a_torn_tail_is_truncated_and_a_flipped_durable_byte_refused(tmp_path, seed):
    rng = random.Random(seed)
    d = _wal(tmp_path, 300, segment_bytes_max=8192 if seed % 2 else 1 << 20)
    before = _records(d)
    assert len(before) == 300
    assert tear_tail(d, rng) is not None
    assert _records(d) == before  # the torn write dropped, nothing else
    info = flip_byte(d, rng)
    assert info is not None and info["offset"] < info["vouched_to"]
    with pytest.raises(WALCorruption):
        WAL.open(f"{d}/wal", fsync="never")
    unflip(info)
    assert _records(d) == before


def test_vouched_end_is_where_the_last_marker_says_the_log_was_durable(tmp_path):
    d = _wal(tmp_path, 50)
    from jepsen_like.disk import last_segment

    path = last_segment(d)
    assert path is not None and 32 < vouched_end(path) < __import__("os").path.getsize(path)


needs_tmpfs = pytest.mark.skipif(can_mount() is not None, reason=f"cannot mount a tmpfs: {can_mount()}")


@needs_tmpfs
@pytest.mark.slow  # the scheduler short run (default suite) applies the disk faults and checks them handled
async def test_each_disk_fault_on_a_real_node_is_handled_as_the_recovery_rules_say(tmp_path):
    db = CellarDB(str(tmp_path / "db"), 3, disk_tmpfs="32m")
    nem = DiskNemesis(db, random.Random(5))
    stop = asyncio.Event()
    seen: dict[str, dict] = {}
    try:
        db.start_all()
        await db.await_ready(timeout_s=30.0)
        async with HttpKV(db.urls, timeout_s=2.0) as http:
            async with asyncio.timeout(30.0):
                while not all(b and b.get("ready") for b in await http.readyz()):
                    await asyncio.sleep(0.1)

            async def writer(w: int) -> None:
                k = 0
                while not stop.is_set():
                    k += 1
                    out = await http.write(f"/disk/{w}", str(k), (w + k) % 2)  # through nodes 0 and 1
                    if out.type != "ok":
                        await asyncio.sleep(0.05)

            writers = [asyncio.create_task(writer(w)) for w in range(6)]
            loop = asyncio.get_running_loop()
            for kind in ("disk-torn", "disk-flip", "disk-full"):
                await asyncio.sleep(0.7)  # node 2 acknowledges some writes first
                what = await loop.run_in_executor(None, nem.apply, kind, 2)
                if kind == "disk-full":
                    for _ in range(100):  # bounded: the node stops within a few writes
                        if not db.alive(2):
                            break
                        await asyncio.sleep(0.05)
                else:
                    await asyncio.sleep(0.3)
                seen[kind] = {"applied": what, **await loop.run_in_executor(None, nem.undo, kind, 2)}
            stop.set()
            await asyncio.wait(writers, timeout=10.0)
        from jepsen_like.runner import _converge

        ok, statuses = await _converge(db, 30.0)
        assert ok, statuses
    finally:
        stop.set()
        db.teardown()
    print(json.dumps(seen, default=str)[:3000])
    assert seen["disk-torn"]["truncated_torn_tail"] and seen["disk-torn"]["restart"] == "ready"
    assert seen["disk-flip"]["refused"] and seen["disk-flip"]["exit_status"] == 2
    assert seen["disk-flip"]["line"].startswith("cellar serve: refusing to start: WAL corruption")
    assert seen["disk-flip"]["after_unflip"] == "ready"
    full = seen["disk-full"]
    assert full["stopped"] and full["exit_status"] == 1 and "No space left on device" in full["line"]
    assert full["no_traceback"] and full["restart"] == "ready"
    assert all(s["ok"] for s in seen.values())


@pytest.mark.slow  # the default suite runs disk faults in test_jepsen_scheduler.py
async def test_a_short_run_under_disk_faults_is_valid(tmp_path):
    # seed 8: one fault, a flipped byte on a killed node (refused, put back, restarted)
    spec = RunSpec(nemesis=["disk"], nodes=3, seconds=9, sessions=6, keys=3, seed=8, out_root=str(tmp_path))
    r = await run_test(spec)
    assert r["verdict"] == VALID, json.dumps({k: r.get(k) for k in ("checks", "faults")}, default=str)[:3000]
    assert [f["kind"] for f in r["faults"]] == ["disk-flip"]
    assert r["checks"]["disk_faults_handled"] is True
    assert r["faults"][0]["observed"]["refused"] is True
