"""A slow disk must slow a node down, not stop it. A node registered one durability
waiter per Ready with output; while a snapshot's fsync held the disk, 65,536 of them
piled up and the node stopped on CommitQueueFull (``cellar steady``, 14,000 writes/s).
Now a node keeps one waiter at a time: here every fdatasync takes 50 ms under a
write load, and the committer never holds more than a few of our waiters."""

from __future__ import annotations

import asyncio
import time

import consensus.storage.wal as walmod
from consensus.runtime import clientwire
from consensus.runtime.node import NodeConfig
from store.server import make_node
from store.server import free_ports


async def test_one_durability_waiter_at_a_time_under_a_slow_disk(tmp_path, monkeypatch):
    real = walmod._fdatasync

    def slow(fd: int) -> None:
        time.sleep(0.05)
        real(fd)

    monkeypatch.setattr(walmod, "_fdatasync", slow)
    ports = free_ports(6)
    addrs = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    nodes = []
    for i in range(3):
        node = make_node(NodeConfig(node_id=i, peers=addrs, client_address=("127.0.0.1", ports[3 + i]),
                               data_dir=str(tmp_path / f"n{i}"), fsync_worker="loop"))  # the slow fsync is ours
        node.open()
        nodes.append(node)
    for node in nodes:
        await node.start()
    most = [0]
    stop = time.monotonic() + 3.0

    async def watch() -> None:
        while time.monotonic() < stop:
            most[0] = max(most[0], max(n.committer.pending_waiters for n in nodes))
            await asyncio.sleep(0.005)

    async def client(c: int) -> int:
        done, seq = 0, 0
        while time.monotonic() < stop:
            seq += 1
            status, _ = await asyncio.wait_for(nodes[c % 3].submit(clientwire.WRITE, c, seq, ["put", f"k{c}", "v"]), 30)
            assert status == clientwire.OK
            done += 1
        return done

    try:
        watcher = asyncio.create_task(watch())
        counts = await asyncio.gather(*(client(c) for c in range(48)))
        await watcher
        assert sum(counts) > 48 and all(n.failure is None for n in nodes)
        assert most[0] <= 4, f"{most[0]} durability waiters pending at once"
    finally:
        for node in nodes:
            await node.stop()
