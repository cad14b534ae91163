"""The interface every protocol replica offers its driver, and the plumbing they share.

A replica is a pure, deterministic state machine (etcd raft's ``RawNode``, h11's
``Connection``): it does no I/O, reads no clock and draws no randomness except from
the seeded ``random.Random`` it is given. Its driver (the simulator in
``consensus.sim`` or the asyncio runtime) feeds it events and carries out its effects:

- ``propose(client, seq, op, needs_result=False)``: a client command arrived here.
  A blind write (``needs_result`` False) is answered as soon as it is *ready* (cannot
  be lost or reordered any more); otherwise the answer carries the result of
  executing it, after it is executed here.
- ``step(src, msgs)``: one envelope from peer ``src`` (a list of messages).
- ``tick()``: one unit of logical time passed.
- ``ready() -> Ready``: collect the effects produced so far and clear them. The
  driver persists, then sends, then replies — see ``consensus.core.ready``.

Proposals are batched: commands proposed between two ``ready()`` calls go into one
instance (up to ``batch_max``), and while ``inflight_max`` instances are still
unanswered further commands wait, so batches grow with load and cost nothing when
idle. Messages produced for one destination between two ``ready()`` calls travel as
one envelope; *lazy* messages (acks and commits nobody waits on) wait for the next
eager message to the same peer or the next tick.
"""

from __future__ import annotations

import random
from typing import Any

from .config import ProtocolConfig
from .executor import Executor
from .messages import Message, Ping
from .ready import Executed, Ready, Reply
from .statemachine import StateMachine


# Ping.tick value of a plain liveness ping (not a sequencer heartbeat or a notice).
ALIVE = -2


class ReplicaBase:
    """Outbox, proposal queue, client bookkeeping and execution shared by protocols."""

    protocol = "base"

    def __init__(
        self,
        node_id: int,
        cfg: ProtocolConfig,
        sm: StateMachine,
        records: list | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 <= node_id < cfg.n:
            raise ValueError(f"node id {node_id} outside 0..{cfg.n - 1}")
        self.id = node_id
        self.cfg = cfg
        self.n = cfg.n
        self.quorum = cfg.quorum
        self.rng = rng or random.Random(node_id)
        self.executor = Executor(sm)
        self.now = 0  # ticks since this incarnation started
        self._out: dict[int, list[Message]] = {}
        self._lazy: dict[int, list[Message]] = {}
        self._persist: list = []
        self._replies: list[Reply] = []
        self._executed: list[Executed] = []
        self._pending: list[list] = []  # commands not yet in an instance
        self._needs_result: dict[tuple, None] = {}  # (client, seq) answered after execution
        self._exec_out: list = []
        self.stats: dict[str, int] = {"proposed": 0, "instances": 0, "executed": 0}
        self.view = 0
        # Tick we last heard anything from each peer (failure suspicion).
        self.heard = [0] * cfg.n

    # --- driver interface ---------------------------------------------------------

    def propose(self, client: Any, seq: int, op: Any, needs_result: bool = False) -> None:
        if needs_result:
            self._needs_result[(client, seq)] = None
        self._pending.append([client, seq, op])
        self.stats["proposed"] += 1

    def step(self, src: int, msgs: list[Message]) -> None:
        if not 0 <= src < self.n or src == self.id:
            return  # not a peer of ours; the transport should have refused it
        self.heard[src] = self.now
        for msg in msgs:
            handler = self._handlers.get(type(msg))
            if handler is not None:
                handler(self, src, msg)

    def tick(self) -> None:
        self.now += 1
        if self.now % self.cfg.heartbeat_ticks == 0:
            # "I am alive" (tick -2): lets peers pick live thrifty quorums and suspect
            # dead command leaders; lazy, so it rides on other traffic when there is any.
            self.broadcast(Ping(self.view, ALIVE), lazy=True)
        for dst, msgs in self._lazy.items():
            if msgs:
                self._out.setdefault(dst, []).extend(msgs)
        self._lazy = {}
        self._on_tick()

    def ready(self) -> Ready:
        self._flush_proposals()
        self._before_ready()
        messages = []
        for dst in sorted(self._out):
            msgs = self._out[dst]
            lazy = self._lazy.pop(dst, None)
            if lazy:
                msgs = lazy + msgs
            if msgs:
                messages.append((dst, msgs))
        rd = Ready(self._persist, messages, self._replies, self._executed)
        self._out = {}
        self._persist = []
        self._replies = []
        self._executed = []
        return rd

    # --- helpers for protocols ------------------------------------------------------

    _handlers: dict[type, Any] = {}

    def send(self, dst: int, msg: Message, lazy: bool = False) -> None:
        (self._lazy if lazy else self._out).setdefault(dst, []).append(msg)

    def broadcast(self, msg: Message, lazy: bool = False) -> None:
        for dst in range(self.n):
            if dst != self.id:
                self.send(dst, msg, lazy)

    def suspected(self, peer: int) -> bool:
        """Heard nothing from ``peer`` for an election timeout."""
        return peer != self.id and self.now - self.heard[peer] >= self.cfg.election_ticks

    def live_peers(self) -> list[int]:
        """Peers nearest first, those we do not suspect before those we do."""
        peers = self.cfg.peer_order[self.id]
        return [p for p in peers if not self.suspected(p)] + [p for p in peers if self.suspected(p)]

    def persist(self, record: list) -> None:
        self._persist.append(record)

    def _take_batch(self) -> list:
        batch = self._pending[: self.cfg.batch_max]
        del self._pending[: self.cfg.batch_max]
        return batch

    def _reply_ready(self, cmds: list | None) -> None:
        """A batch became ready: answer its blind writes."""
        if not cmds:
            return
        needs = self._needs_result
        for client, seq, _op in cmds:
            if (client, seq) not in needs:
                self._replies.append(Reply(client, seq))

    def _apply(self, slot: int, label: tuple, cmds: list | None) -> None:
        """Execute one batch at global position ``slot`` and answer waiting clients."""
        self._executed.append(Executed(slot, label, cmds))
        if not cmds:
            return
        out = self._exec_out
        self.executor.run(cmds, out)
        self.stats["executed"] += len(cmds)
        needs = self._needs_result
        if needs:
            for client, seq, result, _fresh in out:
                if (client, seq) in needs:
                    del needs[(client, seq)]
                    self._replies.append(Reply(client, seq, result))
        out.clear()

    # --- protocol hooks -------------------------------------------------------------

    def _flush_proposals(self) -> None:
        raise NotImplementedError

    def _before_ready(self) -> None:
        pass

    def _on_tick(self) -> None:
        pass

    def status(self) -> dict:
        raise NotImplementedError


def handles(table: dict, *types: type):
    """Register a method as the handler of message ``types`` (roles dispatch on type)."""

    def wrap(fn):
        for t in types:
            table[t] = fn
        return fn

    return wrap
