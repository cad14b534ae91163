"""Execution after send in the runtime's driver (``Node._process`` step 5, docs/runtime.md):
the replica executes once the Ready that carried its commits has left the outbox, not
once the whole outbox is empty. Review 62 found the first version waiting for an empty
outbox: with fsync=batch a Ready's output leaves one loop turn after it is written, so a
peer frame every turn or two (any load) kept the outbox from ever emptying, and nothing
committed was applied until the load stopped. The real ``_process``, ``_carry_out``,
``_on_durable`` and ``_release`` run here over a real WAL and its inline committer, with a
stub replica whose every step emits one record and one message (a follower's accept)."""

from __future__ import annotations

import asyncio
import collections
import os

import pytest

from consensus.core.messages import Ping
from consensus.core.ready import Ready
from consensus.runtime.node import Node, NodeConfig
from consensus.storage.wal import WAL, GroupCommitter


class StubReplica:
    def __init__(self) -> None:
        self.execute_due = True  # something committed at turn 0
        self.executed_at: int | None = None
        self.turn = 0
        self.new = 1
        self._token = 0

    def step(self, *_: object) -> None:
        self.new += 1

    def ready(self, sync: bool = False) -> Ready:
        persist = [["A", self.turn]] * self.new
        self.new = 0
        token = 0
        if persist:
            self._token += 1
            token = self._token
        return Ready(persist=persist, messages=[(1, [Ping(0, 0)])] if persist else [], token=token)

    def persisted(self, token: int) -> None:
        pass

    def execute(self) -> None:
        self.execute_due = False
        self.executed_at = self.turn

    def take_snapshot(self) -> None:
        return None


class NullTransport:
    def send(self, dst: int, env: object) -> None:
        pass

    def flush(self) -> None:
        pass


def driver(tmp_path, fsync: str) -> tuple[Node, StubReplica]:
    wal, _ = WAL.open(os.path.join(tmp_path, "wal"), fsync=fsync, stream=True)
    node = Node.__new__(Node)  # the driver's methods only, over the fields they use
    node.cfg = NodeConfig(node_id=0, peers={0: ("127.0.0.1", 1), 1: ("127.0.0.1", 2), 2: ("127.0.0.1", 3)},
                          client_address=("127.0.0.1", 4), data_dir=str(tmp_path), snapshot_every=0)
    node.replica = replica = StubReplica()
    node.wal = wal
    node.committer = GroupCommitter(wal, inline=True)
    node.transport = NullTransport()
    node._outbox, node._tokens = collections.deque(), collections.deque()
    node._durable_waiting = node._scheduled = node._stopping = node._installing = False
    node._failed = node._fetched = node._end_pending = node.epoch_ended = node._exec_mark = None
    node._waiters, node._dirty_clients, node._snap_task = {}, [], None
    node.messages_sent = collections.Counter()
    return node, replica


@pytest.mark.parametrize("fsync", ["batch", "never", "always"])
@pytest.mark.parametrize("every", [1, 2, 3])
async def test_execution_is_not_put_off_by_load(tmp_path, fsync, every):
    node, replica = driver(tmp_path, fsync)
    load_turns = 400
    loop = asyncio.get_running_loop()
    turns = 0

    def peer_frame() -> None:  # one per loop turn while the load lasts
        nonlocal turns
        turns += 1
        replica.turn = turns
        if turns <= load_turns:
            if turns % every == 0:
                replica.step(1, [])  # a peer's accept: one record, one answer
                node._kick()
            loop.call_soon(peer_frame)

    node._kick()
    loop.call_soon(peer_frame)
    for _ in range(load_turns + 20):  # bounded: a fixed number of loop turns
        await asyncio.sleep(0)
    assert replica.executed_at is not None and replica.executed_at <= 5, (fsync, every, replica.executed_at)
