"""Storage faults injected under a node that is really replicating (issue 17, "a node
failure-injection test").

Three in-process nodes on 127.0.0.1 replicate writes submitted to node 0 (the
sequencer), in ``batch`` mode with 16 KiB WAL segments so that segments rotate
often. Faults are injected at the system-call level of ``consensus.storage.wal`` (its ``os``
module and its ``_fdatasync``), only for files under node 0's ``wal/``: disk full on
``write``, an I/O error on the fsync that seals a segment at rotation, disk full on
the creation of the next segment, an I/O error on a group-commit fsync; and a slow
fsync. Every message node 0 sends and every answer it gives is checked as it
leaves: the records appended up to the ``Ready`` that produced it must be durable,
and nothing leaves once the node has failed. A failing node stops with one line
naming the error, and its data dir opens again.

(``tests/runtime/test_crash_only.py`` covers the same rules with the WAL's methods
replaced and scripted ``Ready``s; this file exercises the real write, rotation and
segment-creation code under real traffic.)
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time

import pytest

import consensus.runtime.node as node_mod
import consensus.storage.wal as wal_mod
from consensus.core.ready import Ready
from consensus.runtime import clientwire
from consensus.runtime.node import Node, NodeConfig
from store.server import make_node
from store.server import free_ports

from .test_crash_only import WAIT_S, single_node, stopped

SEGMENT_BYTES = 16 << 10
WRITERS = 6


class OsProxy:
    """``consensus.storage.wal``'s view of ``os``: the real module, except the calls in ``hooks``."""

    def __init__(self, real, hooks: dict) -> None:
        self._real = real
        self._hooks = hooks

    def __getattr__(self, name: str):
        return self._hooks.get(name) or getattr(self._real, name)


def fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def make_cluster(tmp_path) -> list[Node]:
    ports = free_ports(6)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    nodes = []
    for i in range(3):
        cfg = NodeConfig(node_id=i, peers=peers, client_address=("127.0.0.1", ports[3 + i]),
                         data_dir=str(tmp_path / f"n{i}"), fsync="batch", segment_bytes_max=SEGMENT_BYTES,
                         snapshot_every=0, fsync_worker="loop")  # the faults are injected in this process
        node = make_node(cfg)
        node.open()
        nodes.append(node)
    return nodes


class Watch:
    """Checks everything node 0 sends or answers, as it leaves."""

    def __init__(self, node: Node, monkeypatch) -> None:
        self.node = node
        self.need: dict[int, int] = {}  # id(message) -> WAL seq that must be durable first
        self.need_reply: dict[tuple, int] = {}
        self.violations: list[str] = []
        self.messages = 0
        self.replies = 0
        self.releasing = False
        wal = node.wal
        real_ready = node.replica.ready

        def ready():
            rd = real_ready()
            need = wal.last_seq + len(rd.persist)  # the Ready's own records, and all before
            for _dst, msgs in rd.messages:
                for m in msgs:
                    self.need[id(m)] = need
            for r in rd.replies:
                self.need_reply[(r.client, r.seq)] = need
            return rd

        node.replica.ready = ready
        real_release = node._release

        def release(batch):
            if node._failed is not None:
                self.violations.append("output released after the failure")
            self.releasing = True
            try:
                real_release(batch)
            finally:
                self.releasing = False

        node._release = release
        real_encode = node_mod.encode_message

        def encode(m):
            if self.releasing:
                self.messages += 1
                need = self.need.pop(id(m), 0)
                if wal.durable_seq < need:
                    self.violations.append(f"message {type(m).__name__} sent at durable seq {wal.durable_seq} < {need}")
            return real_encode(m)

        monkeypatch.setattr(node_mod, "encode_message", encode)
        real_reply = node._local.reply

        def reply(item):
            self.replies += 1
            if node._failed is not None:
                self.violations.append("answer after the failure")
            need = self.need_reply.pop((item[0], item[1]), 0)
            if wal.durable_seq < need:
                self.violations.append(f"answer at durable seq {wal.durable_seq} < {need}")
            real_reply(item)

        node._local.reply = reply


class Load:
    """WRITERS in-process clients writing through node 0."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.acked = 0
        self.running = True
        self.tasks = [asyncio.ensure_future(self._writer(w)) for w in range(WRITERS)]

    async def _writer(self, w: int) -> None:
        seq = 0
        while self.running and not self.node._down:
            seq += 1
            fut = self.node.submit(clientwire.WRITE, f"c{w}", seq, ["put", f"w{w}-{seq}", "v" * 64])
            try:
                status, _ = await asyncio.wait_for(fut, 5)
            except (ConnectionError, TimeoutError):
                self.node.forget(f"c{w}", seq)
                continue
            if status == clientwire.OK:
                self.acked += 1

    async def stop(self) -> None:
        self.running = False
        async with asyncio.timeout(WAIT_S):
            await asyncio.gather(*self.tasks, return_exceptions=True)


async def until(predicate, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


FAULTS = {
    # name: (the failure line starts with (str.startswith), the error named in it)
    # the group commit's write, or the write of a full buffer during an append
    "write": (("write-ahead log write failed: OSError: ", "write-ahead log append failed: OSError: "),
              "No space left on device"),
    "rotation-fsync": ("write-ahead log append failed: OSError: ", "Input/output error"),
    "segment-creation": ("write-ahead log append failed: OSError: ", "No space left on device"),
    "group-commit-fsync": ("write-ahead log fsync failed: ", "Input/output error"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_storage_fault_stops_the_node_before_anything_unwritten_leaves(tmp_path, monkeypatch, fault):
    nodes = make_cluster(tmp_path)
    node = nodes[0]
    wal = node.wal
    mine = os.path.realpath(wal.directory) + os.sep
    armed = threading.Event()
    in_rotation = threading.local()
    hits: list[str] = []

    def os_write(fd, data):
        if fault == "write" and armed.is_set() and fd_path(fd).startswith(mine):
            hits.append("write")
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def os_open(path, flags, *args):
        if (fault == "segment-creation" and armed.is_set() and flags & os.O_CREAT
                and os.path.realpath(path).startswith(mine)):
            hits.append("open")
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.open(path, flags, *args)

    real_fdatasync = wal_mod._fdatasync

    def fdatasync(fd):
        rotating = getattr(in_rotation, "on", False)
        if armed.is_set() and fd_path(fd).startswith(mine) and (
                (fault == "rotation-fsync" and rotating) or (fault == "group-commit-fsync" and not rotating)):
            hits.append("fdatasync")
            raise OSError(errno.EIO, "Input/output error")
        return real_fdatasync(fd)

    monkeypatch.setattr(wal_mod, "os", OsProxy(os, {"write": os_write, "open": os_open}))
    monkeypatch.setattr(wal_mod, "_fdatasync", fdatasync)
    real_rotate = wal._rotate

    def rotate():
        in_rotation.on = True
        try:
            real_rotate()
        finally:
            in_rotation.on = False

    wal._rotate = rotate
    load = None
    try:
        for n in nodes:
            await n.start()
        watch = Watch(node, monkeypatch)
        load = Load(node)
        segments = wal.stats["segments_created"]
        await until(lambda: load.acked >= 50 and wal.stats["segments_created"] > segments, "writes and a rotation")
        armed.set()
        failure = await stopped(node)
        start, error = FAULTS[fault]
        assert failure.startswith(start) and error in failure, failure
        assert len(failure.splitlines()) == 1 and hits, (failure, hits)
        acked = load.acked
        await asyncio.sleep(0.3)  # whatever was waiting for an fsync stays unsent
        assert load.acked == acked
        assert watch.messages > 0 and watch.replies > 0
        assert not watch.violations, watch.violations[:5]
    finally:
        if load is not None:
            await load.stop()
        for n in nodes:
            await n.stop()
    monkeypatch.undo()
    again = make_node(node.cfg)  # the data dir opens again (a torn tail at most)
    again.open()
    again.wal.close()


async def test_a_slow_fsync_holds_every_message_and_answer_until_it_completes(tmp_path, monkeypatch):
    nodes = make_cluster(tmp_path)
    node = nodes[0]
    wal = node.wal
    real_perform = wal.perform_sync

    def slow(ticket):
        time.sleep(0.05)
        real_perform(ticket)

    wal.perform_sync = slow
    load = None
    try:
        for n in nodes:
            await n.start()
        watch = Watch(node, monkeypatch)
        load = Load(node)
        await until(lambda: load.acked >= 100 and wal.stats["segments_created"] > 1, "writes and a rotation")
        assert node.failure is None
        assert watch.messages > 0 and watch.replies > 0
        assert not watch.violations, watch.violations[:5]
    finally:
        if load is not None:
            await load.stop()
        for n in nodes:
            await n.stop()


async def test_a_failed_fsync_nobody_waits_for_still_stops_the_node(tmp_path):
    """A Ready with records and no output asks for a sync no reply waits for; if that
    fsync fails, the node stops then, not at its next output."""
    node = single_node(tmp_path, fsync="batch")
    await node.start()

    def broken(ticket):
        raise OSError(errno.EIO, "Input/output error")

    node.wal.perform_sync = broken
    script = [Ready(persist=[["test-record"]])]
    real_ready = node.replica.ready
    node.replica.ready = lambda: script.pop(0) if script else Ready()
    try:
        node._kick()
        failure = await stopped(node)
        assert failure.startswith("write-ahead log fsync failed"), failure
    finally:
        node.replica.ready = real_ready
        await node.stop()
