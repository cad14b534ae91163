"""Multi-Paxos baseline: a stable leader, phase 2 only in the normal case.

Same interface, batching, thrifty messaging and execution as ``SDPaxosReplica`` so
the two can be compared on the same work (``replica.py``). Non-leaders ``Forward``
their clients' commands to the leader; the leader puts each batch in the next log
slot and sends ``MAccept`` to a thrifty quorum; acceptors answer with cumulative
``MAck``; the leader commits a slot once a majority holds it and announces the
committed prefix with ``MCommit`` (carrying the batches a peer has not acked). A
blind write is answered when the replica that took it learns its slot committed.

Durable records: ``["M", view, start, batches]`` accepted slots; ``["MC", upto]``
committed prefix.
"""

from __future__ import annotations

import random

from .config import ProtocolConfig
from .messages import Forward, MAccept, MAck, MCommit
from .ready import Reply
from .replica import ReplicaBase, handles
from .statemachine import StateMachine

SLOTS_PER_MSG_MAX = 1024


class MSlot:
    __slots__ = ("view", "batch", "committed")

    def __init__(self, view: int, batch: list | None) -> None:
        self.view = view
        self.batch = batch
        self.committed = False


class MultiPaxosReplica(ReplicaBase):
    protocol = "multipaxos"
    _handlers: dict[type, object] = {}

    def __init__(
        self,
        node_id: int,
        cfg: ProtocolConfig,
        sm: StateMachine,
        records: list | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(node_id, cfg, sm, records, rng)
        self.view = 0
        self.leader = cfg.initial_sequencer
        self.log: dict[int, MSlot] = {}
        self.prefix = 0  # slots below accepted in this view or committed
        self.committed = 0  # slots below committed
        self.next_slot = 0  # leader only
        self.acked = [0] * self.n
        self._new: list[list] = []
        self._accept_tick = [0] * self.n
        self._commit_sent = [0] * self.n
        self._commit_tick = 0
        self.exec_slot = 0
        # Commands taken here and not yet known committed: (client, seq) -> None
        self._mine: dict[tuple, None] = {}
        self._fwd_log: list[tuple[int, list]] = []  # (tick sent, cmds) for resends
        if records:
            self._replay(records)

    def _replay(self, records: list) -> None:
        for rec in records:
            if rec[0] == "M":
                _, view, start, batches = rec
                for k, batch in enumerate(batches):
                    slot = self.log.get(start + k)
                    if slot is None or not slot.committed:
                        self.log[start + k] = MSlot(view, batch)
            elif rec[0] == "MC":
                for j in range(self.committed, rec[1]):
                    if j in self.log:
                        self.log[j].committed = True
                self.committed = max(self.committed, rec[1])
        self._advance_prefix()
        if self.id == self.leader:
            self.next_slot = self.prefix
        self._execute()

    # --- proposing ----------------------------------------------------------------------

    def _flush_proposals(self) -> None:
        if not self._pending:
            return
        for client, seq, _op in self._pending:
            self._mine[(client, seq)] = None
        if self.id != self.leader:
            cmds = self._pending
            self._pending = []
            self.send(self.leader, Forward(self.view, cmds))
            self._fwd_log.append((self.now, cmds))
            return
        while self._pending and self.next_slot - self.committed < self.cfg.inflight_max:
            self._append(self._take_batch())

    def _append(self, batch: list) -> None:
        j = self.next_slot
        self.next_slot += 1
        self.log[j] = MSlot(self.view, batch)
        self._new.append(batch)
        self.stats["instances"] += 1

    def _before_ready(self) -> None:
        if not self._new:
            return
        batches = self._new
        self._new = []
        start = self.next_slot - len(batches)
        self.persist(["M", self.view, start, batches])
        self._advance_prefix()
        msg = MAccept(self.view, start, batches)
        peers = self.cfg.peer_order[self.id]
        for dst in peers[: self.quorum - 1] if self.cfg.thrifty else peers:
            self.send(dst, msg)
            self._accept_tick[dst] = self.now
        self._recompute_commit()

    @handles(_handlers, Forward)
    def _on_forward(self, src: int, m: Forward) -> None:
        if self.id != self.leader or m.view < self.view:
            return
        for cmd in m.cmds:
            if type(cmd) is not list or len(cmd) != 3:
                return
        self._pending.extend(m.cmds)
        # Forwarded commands are batched with our own in _flush_proposals.

    # --- acceptors ------------------------------------------------------------------------

    @handles(_handlers, MAccept)
    def _on_maccept(self, src: int, m: MAccept) -> None:
        if m.view < self.view or src != self.leader or m.start < 0 or len(m.batches) > SLOTS_PER_MSG_MAX:
            return
        fresh = False
        for k, batch in enumerate(m.batches):
            j = m.start + k
            slot = self.log.get(j)
            if slot is not None and (slot.committed or slot.view == m.view):
                continue
            self.log[j] = MSlot(m.view, batch)
            fresh = True
        if fresh:
            self.persist(["M", m.view, m.start, m.batches])
        self._advance_prefix()
        self.send(src, MAck(self.view, self.prefix))

    def _advance_prefix(self) -> None:
        j = self.prefix
        while True:
            slot = self.log.get(j)
            if slot is None or not (slot.committed or slot.view == self.view):
                break
            j += 1
        self.prefix = j

    @handles(_handlers, MAck)
    def _on_mack(self, src: int, m: MAck) -> None:
        if m.view != self.view or self.id != self.leader:
            return
        if m.prefix > self.acked[src]:
            self.acked[src] = min(m.prefix, self.next_slot)
            self._recompute_commit()

    def _recompute_commit(self) -> None:
        self.acked[self.id] = self.prefix
        upto = min(sorted(self.acked, reverse=True)[self.quorum - 1], self.prefix)
        if upto > self.committed:
            self._commit(upto)
            # Tell everyone at once: forwarders are waiting to answer their clients.
            for dst in range(self.n):
                if dst != self.id:
                    self._send_commit(dst)

    def _send_commit(self, dst: int) -> None:
        upto = self.committed
        start = min(self.acked[dst], upto)
        if upto - start > SLOTS_PER_MSG_MAX:
            upto = start + SLOTS_PER_MSG_MAX
        batches = [self.log[j].batch for j in range(start, upto)]
        self.send(dst, MCommit(self.view, upto, start, batches))
        self._commit_sent[dst] = upto

    def _commit(self, upto: int) -> None:
        j = self.committed
        while j < upto:
            slot = self.log.get(j)
            if slot is None:
                break
            if not slot.committed:
                slot.committed = True
                self._learned(slot.batch)
            j += 1
        if j > self.committed:
            self.committed = j
            self._commit_tick = self.now
            self.persist(["MC", j])
            self._execute()

    def _learned(self, batch: list | None) -> None:
        """A slot we hold is chosen: answer the blind writes we took."""
        if not batch or not self._mine:
            return
        mine = self._mine
        needs = self._needs_result
        for client, seq, _op in batch:
            key = (client, seq)
            if key in mine:
                del mine[key]
                if key not in needs:
                    self._replies.append(Reply(client, seq))

    @handles(_handlers, MCommit)
    def _on_mcommit(self, src: int, m: MCommit) -> None:
        if m.view < self.view or src != self.leader or len(m.batches) > SLOTS_PER_MSG_MAX:
            return
        if m.upto <= self.committed:
            return
        for k, batch in enumerate(m.batches):
            j = m.start + k
            slot = self.log.get(j)
            if slot is None or (not slot.committed and slot.view != m.view):
                self.log[j] = MSlot(m.view, batch)
                self.persist(["M", m.view, j, [batch]])
        before = self.prefix
        self._advance_prefix()
        self._commit(min(m.upto, m.start + len(m.batches)) if m.batches else m.upto)
        if self.prefix > before:
            # Tell the leader what we now hold, so it stops resending it (lazily).
            self.send(src, MAck(self.view, self.prefix), lazy=True)

    def _execute(self) -> None:
        log = self.log
        while True:
            slot = log.get(self.exec_slot)
            if slot is None or not slot.committed:
                return
            self._apply(self.exec_slot, (self.exec_slot,), slot.batch)
            self.exec_slot += 1

    # --- timers -------------------------------------------------------------------------

    def _on_tick(self) -> None:
        now, resend = self.now, self.cfg.resend_ticks
        if self.id == self.leader:
            for dst in range(self.n):
                if dst == self.id:
                    continue
                # Thrifty: peers outside the quorum get accepts only when commit stalls.
                stalled = self.committed < self.next_slot and now - self._commit_tick >= resend
                if stalled and self.acked[dst] < self.next_slot and now - self._accept_tick[dst] >= resend:
                    start = self.acked[dst]
                    end = min(self.next_slot, start + SLOTS_PER_MSG_MAX)
                    self.send(dst, MAccept(self.view, start, [self.log[j].batch for j in range(start, end)]))
                    self._accept_tick[dst] = now
                if self.committed > self._commit_sent[dst] or now % self.cfg.heartbeat_ticks == 0:
                    self._send_commit(dst)
        elif self._fwd_log and now - self._fwd_log[0][0] >= resend:
            # Forwarded commands not seen committed within the timeout: forward again.
            mine = self._mine
            again = []
            while self._fwd_log and now - self._fwd_log[0][0] >= resend:
                _, cmds = self._fwd_log.pop(0)
                again.extend(cmd for cmd in cmds if (cmd[0], cmd[1]) in mine)
            if again:
                self.send(self.leader, Forward(self.view, again))
                self._fwd_log.append((now, again))

    def status(self) -> dict:
        return {
            "protocol": self.protocol,
            "id": self.id,
            "view": self.view,
            "leader": self.leader,
            "prefix": self.prefix,
            "committed": self.committed,
            "exec_slot": self.exec_slot,
            "pending": len(self._pending),
            "executed": self.stats["executed"],
        }
