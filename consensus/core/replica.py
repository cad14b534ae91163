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

Snapshots and log compaction (SDPaxos; Multi-Paxos answers None/False):

- ``__init__(..., records, snapshot=(meta, state))``: restart from the latest stored
  snapshot plus the durable records; records the snapshot covers are skipped.
- ``take_snapshot() -> (meta, state) | None``: the state at the execution point (pure).
- ``compact(meta) -> live records``: after the driver stored ``meta``'s snapshot.
- ``install_snapshot(meta, state) -> bool``: adopt a peer's snapshot
  (``Ready.snapshot_from`` asked for it).

The exact contracts, and the order the driver must follow, are in
``consensus.core.sdpaxos``.

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
from .messages import Echo, Message, Ping, Probe
from .nearness import Nearness
from .ready import Executed, Ready, Reply
from .statemachine import StateMachine
from .views import NEWER, STALE, ViewGate


# Ping.tick value of a plain liveness ping (not a sequencer heartbeat or a notice).
ALIVE = -2
# Most commands a replica remembers it owes an answer (bounds memory).
ANSWERS_MAX = 1 << 20


class ReplicaBase:
    """Outbox, proposal queue, client bookkeeping and execution shared by protocols."""

    protocol = "base"
    closes_epochs = False  # docs/membership.md: SDPaxos ends an epoch with an END slot

    def __init__(
        self,
        node_id: int,
        cfg: ProtocolConfig,
        sm: StateMachine,
        records: list | None = None,
        rng: random.Random | None = None,
        snapshot: tuple[dict, bytes] | None = None,
    ) -> None:
        if not 0 <= node_id < cfg.n:
            raise ValueError(f"node id {node_id} outside 0..{cfg.n - 1}")
        self.id = node_id
        self.cfg = cfg
        self.n = cfg.n
        self.quorum = cfg.quorum
        self.rng = rng or random.Random(node_id)
        # Only a protocol that closes epochs (SDPaxos's END) takes a reconfiguration.
        self.executor = Executor(sm, cfg.epoch if self.closes_epochs else None)
        self.now = 0  # ticks since this incarnation started
        self._out: dict[int, list[Message]] = {}
        self._urgent: dict[int, list[Message]] = {}  # Ready.urgent
        self._lazy: dict[int, list[Message]] = {}
        self._persist: list = []
        self._replies: list[Reply] = []
        self._executed: list[Executed] = []
        self._pending: list[list] = []  # commands not yet in an instance
        # Commands taken here, by how they are answered. Only what is listed gets an
        # answer: after a restart, or once answered, a command is no longer ours to answer.
        self._needs_result: dict[tuple, None] = {}  # (client, seq): after execution
        self._blind: dict[tuple, None] = {}  # (client, seq): as soon as ready
        self._exec_out: list = []
        self.execute_due = False  # ProtocolConfig.defer_execution: call execute()
        self._executing = False
        self.stats: dict[str, int] = {"proposed": 0, "instances": 0, "executed": 0}
        # The view and who owns it; only the gate changes them (consensus.core.views).
        self.gate = ViewGate(node_id, cfg.initial_view, 0)
        # Tick we last heard anything from each peer (failure suspicion).
        self.heard = [0] * cfg.n
        # Round trips to each peer, measured here, and the order we ask peers in.
        self.near = Nearness(node_id, cfg.n, cfg.peer_order[node_id], cfg.quorum - 1)
        self._snapshot_from: int | None = None  # Ready.snapshot_from, one-shot
        self._epoch_end: tuple | None = None  # Ready.epoch_end, one-shot
        self._token = 0  # Ready.token of the last Ready that had records
        self._durable_token = 0  # every Ready up to this one is durable (persisted())
        if snapshot is not None:
            meta, state = snapshot
            if type(meta) is not dict or meta.get("protocol") != self.protocol:
                raise ValueError(f"snapshot of protocol {meta.get('protocol') if type(meta) is dict else meta!r}, not {self.protocol}")
            self.executor.restore(state)

    @property
    def view(self) -> int:
        """The view this replica is in (read-only: the gate changes it)."""
        return self.gate.view

    @property
    def no_vote_until(self) -> int:
        return self.gate.no_vote_until

    def _view_ok(self, src: int, m: Message) -> bool:
        """Refuse stale views (and tell the sender); follow newer ones."""
        seen = self.gate.admit(m.view)
        if seen == STALE:
            self.send(src, Ping(self.gate.view, -1), lazy=True)
            return False
        if seen == NEWER:
            self._adopt_view(m.view)
        return True

    def _adopt_view(self, view: int) -> None:
        raise NotImplementedError

    # --- driver interface ---------------------------------------------------------

    def propose(self, client: Any, seq: int, op: Any, needs_result: bool = False) -> None:
        table = self._needs_result if needs_result else self._blind
        if (client, seq) in table and any(c[0] == client and c[1] == seq for c in self._pending):
            # A retry of a command still queued here (not yet in an instance): it is
            # answered once anyway. Queued again, a retry storm outgrows a queue that
            # drains a few instances per round trip (steered search seed 2067).
            return
        table[(client, seq)] = None
        if len(table) > ANSWERS_MAX:
            # A command whose instance was recovered as a no-op is never answered
            # here; its client retries elsewhere. Forget the oldest such entry.
            del table[next(iter(table))]
        self._pending.append([client, seq, op])
        self.stats["proposed"] += 1

    @property
    def backlog(self) -> int:
        """Commands proposed here and not yet in an instance (drivers push back on it)."""
        return len(self._pending)

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
            if self.cfg.measure_rtt:  # how near is each peer?
                self.near.probing(self.now)
                probe = Probe(self.view, self.now)
                for dst in range(self.n):
                    if dst != self.id:
                        self.send_urgent(dst, probe)
        for dst, msgs in self._lazy.items():
            if msgs:
                self._out.setdefault(dst, []).extend(msgs)
        self._lazy = {}
        self._on_tick()

    @property
    def token(self) -> int:
        """The last Ready's token (``persisted(replica.token)``: everything is durable)."""
        return self._token

    @property
    def durable_token(self) -> int:
        return self._durable_token

    def persisted(self, token: int) -> None:
        """The driver made every Ready's records up to ``token`` durable. What waited
        on that (our own acceptances counted towards a quorum) goes on; its effects are
        in the next ``ready()``."""
        if token > self._token:
            raise ValueError(f"persisted({token}): no Ready has that token yet (last {self._token})")
        if token > self._durable_token:
            self._durable_token = token
            self._on_persisted()

    def ready(self, sync: bool = False) -> Ready:
        """The effects to carry out (``consensus.core.ready``). ``sync=True``: the
        driver makes this Ready's records durable before acting on any of its effects,
        so they count as durable already (no ``persisted`` call)."""
        self._flush_proposals()
        self._before_ready()
        token = 0
        if self._persist:
            self._token += 1
            token = self._token
            self._sealed(token)
            if sync:
                self._durable_token = token
                self._on_persisted(sync=True)
        messages = []
        for dst in sorted(self._out):
            msgs = self._out[dst]
            lazy = self._lazy.pop(dst, None)
            if lazy:
                msgs = lazy + msgs
            if msgs:
                messages.append((dst, msgs))
        rd = Ready(self._persist, messages, self._replies, self._executed, self._snapshot_from, token,
                   [(dst, self._urgent[dst]) for dst in sorted(self._urgent)], self._epoch_end)
        self._snapshot_from = None
        self._epoch_end = None
        self._out = {}
        self._urgent = {}
        self._persist = []
        self._replies = []
        self._executed = []
        return rd

    def take_snapshot(self) -> tuple[dict, bytes] | None:
        """The state at the execution point, or None if the protocol cannot compact."""
        return None

    def compact(self, meta: dict, live: bool = True) -> list:
        raise NotImplementedError(f"{self.protocol} does not compact its log")

    def install_snapshot(self, meta: dict, state: bytes) -> bool:
        return False

    # --- helpers for protocols ------------------------------------------------------

    _handlers: dict[type, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every protocol answers probes and learns from echoes the same way.
        super().__init_subclass__(**kwargs)
        cls._handlers[Probe] = ReplicaBase._on_probe
        cls._handlers[Echo] = ReplicaBase._on_echo

    def send(self, dst: int, msg: Message, lazy: bool = False) -> None:
        (self._lazy if lazy else self._out).setdefault(dst, []).append(msg)

    def send_urgent(self, dst: int, msg: Message) -> None:
        """A message that vouches for no stored state (``Ready.urgent``)."""
        self._urgent.setdefault(dst, []).append(msg)

    def broadcast(self, msg: Message, lazy: bool = False) -> None:
        for dst in range(self.n):
            if dst != self.id:
                self.send(dst, msg, lazy)

    def suspected(self, peer: int) -> bool:
        """Heard nothing from ``peer`` for an election timeout."""
        return peer != self.id and self.now - self.heard[peer] >= self.cfg.election_ticks

    def note_ack_delay(self, peer: int, ticks: int) -> None:
        """An accept we sent ``peer`` was acked after ``ticks`` (slow-peer detection)."""
        self.near.ack(peer, ticks, self.now)

    def live_peers(self) -> list[int]:
        """Peers nearest first (as measured here, ``consensus.core.nearness``): healthy
        ones, then slow ones, then suspected ones. A member of the thrifty quorum is
        slow only against the healthy peers that would replace it."""
        alive, dead = [], []
        for p in self.near.order:
            (dead if self.suspected(p) else alive).append(p)
        k = self.quorum - 1
        near, now, others = self.near, self.now, alive[k:]
        good, slow = [], []
        for i, p in enumerate(alive):
            (slow if i < k and near.slow(p, now, others) else good).append(p)
        return good + slow + dead

    def _on_probe(self, src: int, m: Probe) -> None:
        # At once, and not behind our records' sync: the sample is the round trip.
        self.send_urgent(src, Echo(self.view, m.stamp))

    def _on_echo(self, src: int, m: Echo) -> None:
        sample = self.now - m.stamp
        if 0 <= m.stamp and 0 <= sample:  # not an echo of a probe from before a restart
            self.near.echo(src, sample, m.stamp)

    def persist(self, record: list) -> None:
        self._persist.append(record)

    def _take_batch(self) -> list:
        return take_batch(self._pending, self.cfg.batch_max, self.cfg.batch_bytes_max)

    def _reply_ready(self, cmds: list | None) -> None:
        """A batch became ready: answer its blind writes."""
        if not cmds or not self._blind:
            return
        blind = self._blind
        for client, seq, _op in cmds:
            if (client, seq) in blind:
                del blind[(client, seq)]
                self._replies.append(Reply(client, seq))

    def execute(self) -> None:
        """ProtocolConfig.defer_execution: execute what is committed and executable
        now (its replies, reads and ``executed`` come out of the next ``ready()``).
        The driver calls it once ``execute_due`` is set, after sending the Ready
        that set it."""
        self.execute_due = False
        self._executing = True
        try:
            self._execute()
        finally:
            self._executing = False

    def _execution_deferred(self) -> bool:
        """At the top of ``_execute``: with defer_execution, outside ``execute()``,
        only mark execution due, and only if it would do something now."""
        if self.cfg.defer_execution and not self._executing:
            if not self.execute_due and self._would_execute():
                self.execute_due = True
            return True
        return False

    def _would_execute(self) -> bool:
        """Would ``_execute`` now apply a batch or change its own state? (Saves the
        driver a turn per Ready when nothing is executable.)"""
        return True

    def _execute(self) -> None:
        raise NotImplementedError

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

    def _sealed(self, token: int) -> None:
        """The records persisted so far go out in the Ready numbered ``token``."""

    def _on_persisted(self, sync: bool = False) -> None:
        """Records up to ``self._durable_token`` are durable (``sync``: the ones of the
        Ready being built, which the driver persists before anything else)."""

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


def op_bytes(value: Any) -> int:
    """A cheap estimate of ``value``'s encoded size (strings count one byte per
    character). Pure and deterministic: it only bounds batches."""
    t = type(value)
    if t is str or t is bytes:
        return len(value) + 5
    if t is list or t is tuple:
        return 5 + sum(op_bytes(v) for v in value)
    if t is dict:
        return 5 + sum(op_bytes(k) + op_bytes(v) for k, v in value.items())
    return 9


def take_batch(queue: list, count_max: int, bytes_max: int) -> list:
    """Remove and return the first commands of ``queue``: at most ``count_max`` of
    them, stopping once their estimated size reaches ``bytes_max`` (the first one
    always goes)."""
    n = min(count_max, len(queue))
    used = 0
    for i in range(n):
        used += op_bytes(queue[i][2])
        if used >= bytes_max:
            n = i + 1
            break
    batch = queue[:n]
    del queue[:n]
    return batch
