"""Multi-Paxos baseline: a stable leader, phase 2 only in the normal case.

Leader election uses the same view machinery as SDPaxos (views are ballots,
``view & 31`` is the leader): a replica that hears no ``Ping`` for
``election_ticks`` (randomized) sends ``VRequest`` (phase 1a for every slot from its
committed prefix); votes carry accepted slots with their views, in chunks of at most
``VOTE_BYTES_MAX`` (the candidate asks each voter for the rest, ``_on_vote``); once a
majority's reports are whole, the winner keeps the highest-view batch per slot, fills
holes with no-ops, re-proposes the suffix and serves once a majority holds it.
Forwarders resend their pending commands to the new leader.

Same interface, batching, thrifty messaging and execution as ``SDPaxosReplica`` so
the two can be compared on the same work (``replica.py``). Non-leaders ``Forward``
their clients' commands to the leader; the leader puts each batch in the next log
slot and sends ``MAccept`` to a thrifty quorum; acceptors answer with cumulative
``MAck``; the leader commits a slot once a majority holds it and announces the
committed prefix with ``MCommit`` (carrying the batches a peer has not acked). A
blind write is answered when the replica that took it learns its slot committed.

Durable records: ``["M", view, start, batches]`` accepted slots; ``["MC", upto]``
committed prefix; ``["V", view]`` joined a view.
"""

from __future__ import annotations

import random

from .config import ProtocolConfig, ballot_owner
from .messages import Forward, MAccept, MAck, MCommit, Ping, Vote, VRequest
from .ready import Reply
from .replica import ALIVE, ReplicaBase, handles, op_bytes, take_batch
from .rules import pick_highest
from .statemachine import StateMachine
from .views import ViewGate

SLOTS_PER_MSG_MAX = 1024
# A message carrying several slots' batches is cut once their estimated size reaches
# this (op_bytes; the first slot always goes), so it stays under a peer frame (8 MiB).
MSG_BYTES_MAX = 4 << 20
# A vote's report is cut too (by bytes, as etcd raft's MaxSizePerMsg, and at
# VOTE_SLOTS_MAX entries): it carries every slot from the candidate's commit point,
# values included, and a lagging candidate's came to 9-37 MB under overload, over the
# frame, never sent, so the election never ended (issue 15). The candidate asks for
# the rest (``_on_vote``).
VOTE_BYTES_MAX = 1 << 20
VOTE_SLOTS_MAX = 8192
# A voter re-asked for a chunk of at least this size (the candidate re-asks every
# heartbeat) sends it again only after resend_ticks: on a loaded machine one took
# longer than a heartbeat to arrive, and every re-ask queued another megabyte.
VOTE_RESEND_BYTES = 64 << 10
VOTE_ENTRY_BYTES = 24  # an entry's slot, view and flag (msgpack), beside its batch


def cut_by_bytes(batches: list, count_max: int = SLOTS_PER_MSG_MAX, bytes_max: int = MSG_BYTES_MAX) -> int:
    """How many of ``batches`` (from the first) one message carries."""
    n = min(count_max, len(batches))
    used = 0
    for i in range(n):
        used += op_bytes(batches[i])
        if used >= bytes_max:
            return i + 1
    return n


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
        snapshot: tuple[dict, bytes] | None = None,
    ) -> None:
        if snapshot is not None:
            # No compaction here: take_snapshot() is None, so no driver stores one.
            raise ValueError("multipaxos replicas restart from their records, not a snapshot")
        super().__init__(node_id, cfg, sm, records, rng)
        # The view and its leader; only the gate changes them (views.py). A restart
        # waits a heartbeat before voting (as SDPaxos waits out a lease promise).
        self.gate = ViewGate(node_id, cfg.initial_view, cfg.heartbeat_ticks)
        self.phase = "normal"  # normal | candidate | recovering | stale
        self.election_due = self._election_deadline()
        # Candidate: each voter's whole report (slot entries >= vote_base), and the
        # parts of the ones still coming in chunks: what we have, the slot we asked
        # from next, and when we asked.
        self.votes: dict[int, list] = {}
        self._vote_parts: dict[int, list] = {}
        self._vote_next: dict[int, int] = {}
        self._vote_asked = [0] * self.n
        self.vote_base = 0
        # Voter: the last big chunk we sent (view, start, tick), and the last's size.
        self._chunk_sent = (-1, -1, 0)
        self._chunk_bytes = 0
        self.recover_end = 0
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
        self._queue: list[list] = []  # leader: commands waiting for a slot
        self._queued: dict[tuple, None] = {}  # their (client, seq), to drop resends
        self._fwd_log: list[tuple[int, list]] = []  # (tick sent, cmds) for resends
        # Follower: the leader of our view is known to serve (else our commands wait in
        # _pending and _handover, the ones we had before the view changed).
        self._serving = True
        self._handover: list[list] = []
        if records:
            self._replay(records)

    @property
    def leader(self) -> int:
        return self.gate.owner

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
            elif rec[0] == "V":
                self.gate.join(rec[1])
        self.prefix = self.committed
        self._advance_prefix()
        if self.id == self.leader:
            self.phase = "stale"  # we cannot know whether we still lead: re-elect
        self._execute()

    # --- proposing ----------------------------------------------------------------------

    def _flush_proposals(self) -> None:
        if self._pending:
            # Commands our own clients gave us: we answer them when they commit.
            for client, seq, _op in self._pending:
                self._mine[(client, seq)] = None
            if self.id != self.leader:
                if self.phase != "normal" or not self._serving:
                    return
                self._forward(self.view, self._pending)  # bounded by bytes only: the leader batches by count
                return
            self._queue.extend(self._pending)
            self._pending = []
        if self.id != self.leader or self.phase != "normal":
            return
        batch_max, bytes_max = self.cfg.batch_max, self.cfg.batch_bytes_max
        queued = self._queued
        while self._queue and self.next_slot - self.committed < self.cfg.inflight_max:
            batch = take_batch(self._queue, batch_max, bytes_max)
            for cmd in batch:
                queued.pop((cmd[0], cmd[1]), None)
            self._append(batch)

    def _forward(self, view: int, cmds: list) -> None:
        """Forward ``cmds`` (emptied) to the leader in messages of at most
        ``batch_bytes_max``, each remembered for its resend. Under overload a follower's
        resends and its hand-over to a new leader came to 8-9 MB in one Forward, over
        the peer frame (issue 15)."""
        while cmds:
            part = take_batch(cmds, len(cmds), self.cfg.batch_bytes_max)
            self.send(self.leader, Forward(view, part))
            self._fwd_log.append((self.now, part))

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
        peers = self.live_peers()
        targets = peers[: self.quorum - 1] if self.cfg.thrifty else peers
        lo = 0
        while lo < len(batches):
            k = cut_by_bytes(batches[lo:], len(batches) - lo)
            self.persist(["M", self.view, start + lo, batches[lo : lo + k]])  # a record per accept
            msg = MAccept(self.view, start + lo, batches[lo : lo + k])
            for dst in targets:
                self.send(dst, msg)
            lo += k
        self._advance_prefix()
        for dst in targets:
            self._accept_tick[dst] = self.now
        self._recompute_commit()

    @handles(_handlers, Forward)
    def _on_forward(self, src: int, m: Forward) -> None:
        if not self._view_ok(src, m) or self.id != self.leader:
            return
        for cmd in m.cmds:
            if type(cmd) is not list or len(cmd) != 3:
                return
        # Not ours to answer (the forwarder does); batched with ours. Forwarders resend
        # until they see a commit, so drop what is already queued or executed.
        sessions = self.executor.sessions
        queued = self._queued
        for cmd in m.cmds:
            key = (cmd[0], cmd[1])
            done = sessions.get(cmd[0])
            if key in queued or (done is not None and type(cmd[1]) is int and cmd[1] <= done[0]):
                continue
            if len(self._queue) >= 1 << 20:
                break
            queued[key] = None
            self._queue.append(cmd)

    # --- acceptors ------------------------------------------------------------------------

    @handles(_handlers, MAccept)
    def _on_maccept(self, src: int, m: MAccept) -> None:
        if not self._view_ok(src, m) or src != self.leader or m.start < 0 or len(m.batches) > SLOTS_PER_MSG_MAX:
            return
        self._heard_from_leader()
        self._leader_serves()
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
            self._view_ok(src, m)
            return
        if m.prefix > self.acked[src]:
            self.acked[src] = min(m.prefix, self.next_slot)
            self._recompute_commit()

    def _recompute_commit(self) -> None:
        self.acked[self.id] = self.prefix
        upto = min(sorted(self.acked, reverse=True)[self.quorum - 1], self.prefix)
        if self.phase == "recovering" and upto >= self.recover_end:
            self.phase = "normal"
        if upto > self.committed:
            self._commit(upto)
            # Tell everyone at once: forwarders are waiting to answer their clients. Not
            # a suspected peer: a commit carries the slots it has not acked (up to
            # SLOTS_PER_MSG_MAX), re-encoded on every commit for a peer that answers
            # nothing (after a failover under load, megabytes per second to a dead
            # replica, and throughput collapsed); it catches up once heard again.
            for dst in range(self.n):
                if dst != self.id and not self.suspected(dst):
                    self._send_commit(dst)

    def _send_commit(self, dst: int) -> None:
        upto = self.committed
        start = min(self.acked[dst], upto)
        if upto - start > SLOTS_PER_MSG_MAX:
            upto = start + SLOTS_PER_MSG_MAX
        batches = [self.log[j].batch for j in range(start, upto)]
        k = cut_by_bytes(batches)
        if k < len(batches):
            batches = batches[:k]
            upto = start + k
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

    def _answer_executed(self, key: tuple, session: list) -> None:
        if key in self._blind:
            del self._blind[key]
            self._replies.append(Reply(key[0], key[1]))
        elif key in self._needs_result and key[1] == session[0]:
            del self._needs_result[key]
            self._replies.append(Reply(key[0], key[1], session[1]))

    def _learned(self, batch: list | None) -> None:
        """A slot we hold is chosen: answer the blind writes we took."""
        if not batch or not self._mine:
            return
        mine = self._mine
        blind = self._blind
        for client, seq, _op in batch:
            key = (client, seq)
            if key in mine:
                del mine[key]
                if key in blind:
                    del blind[key]
                    self._replies.append(Reply(client, seq))

    @handles(_handlers, MCommit)
    def _on_mcommit(self, src: int, m: MCommit) -> None:
        if not self._view_ok(src, m) or src != self.leader or len(m.batches) > SLOTS_PER_MSG_MAX:
            return
        self._heard_from_leader()
        self._leader_serves()
        if m.upto <= self.committed:
            if len(m.batches) == SLOTS_PER_MSG_MAX or (m.batches and op_bytes(m.batches) >= MSG_BYTES_MAX):
                # The leader resends slots we hold, cut at SLOTS_PER_MSG_MAX or by bytes (its
                # ``acked`` for us restarted at 0 in its view): tell it our prefix, or
                # it resends the same slots forever and we never get the ones we lack.
                # (A shorter stale commit ends at the leader's commit point: the next
                # one carries what we lack.)
                self.send(src, MAck(self.view, self.prefix), lazy=True)
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

    def _would_execute(self) -> bool:
        slot = self.log.get(self.exec_slot)
        return slot is not None and slot.committed

    def _execute(self) -> None:
        if self._execution_deferred():
            return
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
            if self.phase == "stale":
                if now >= self.gate.no_vote_until:
                    self._start_election()
                return
            if self.phase == "candidate":
                # Ask again every heartbeat each voter whose report is not whole yet,
                # from where its chunks got to; one whose report is whole, from its end
                # (it answers with nothing new, and waits for us meanwhile: with only
                # the others asked, it stood while their chunks still came in).
                for dst in range(self.n):
                    if dst != self.id and now - self._vote_asked[dst] >= self.cfg.heartbeat_ticks:
                        self._vote_asked[dst] = now
                        self.send(dst, VRequest(self.view, self._vote_next.get(dst, self.vote_base)))
                if now >= self.election_due:
                    self._start_election()
                return
            if now % self.cfg.heartbeat_ticks == 0:
                self.broadcast(Ping(self.view, now))
            for dst in range(self.n):
                if dst == self.id or self.suspected(dst):
                    # A suspected peer gets nothing but pings until we hear from it again
                    # (then resends from its `acked` catch it up): resending it up to
                    # SLOTS_PER_MSG_MAX slots every resend, and every commit, to a dead
                    # replica took the leader's CPU after a failover under load.
                    continue
                # Thrifty: peers outside the quorum get accepts only when commit stalls.
                stalled = self.committed < self.next_slot and (
                    now - self._commit_tick >= resend or any(self.suspected(p) for p in range(self.n))
                )
                if stalled and self.acked[dst] < self.next_slot and now - self._accept_tick[dst] >= resend:
                    start = self.acked[dst]
                    end = min(self.next_slot, start + SLOTS_PER_MSG_MAX)
                    batches = [self.log[j].batch for j in range(start, end)]
                    self.send(dst, MAccept(self.view, start, batches[: cut_by_bytes(batches)]))
                    self._accept_tick[dst] = now
                if self.committed > self._commit_sent[dst] or now % self.cfg.heartbeat_ticks == 0:
                    self._send_commit(dst)
            return
        if now >= self.election_due and now >= self.gate.no_vote_until:
            self._start_election()
        elif self._fwd_log and now - self._fwd_log[0][0] >= resend and self._serving:
            # Forwarded commands not seen committed within the timeout: forward again.
            mine = self._mine
            sessions = self.executor.sessions
            again = []
            while self._fwd_log and now - self._fwd_log[0][0] >= resend:
                _, cmds = self._fwd_log.pop(0)
                for cmd in cmds:
                    key = (cmd[0], cmd[1])
                    if key not in mine:
                        continue
                    done = sessions.get(cmd[0])
                    if done is not None and type(cmd[1]) is int and cmd[1] <= done[0]:
                        # Executed already (another copy committed before we took this
                        # one): answer instead of resending forever.
                        del mine[key]
                        self._answer_executed(key, done)
                    else:
                        again.append(cmd)
            if again:
                self._forward(self.view, again)

    # --- views and elections --------------------------------------------------------

    def _adopt_view(self, view: int) -> None:
        if not self.gate.join(view):
            return
        self.persist(["V", view])
        self.phase = "normal" if self.leader != self.id else "stale"
        self._forget_votes()
        self.acked = [0] * self.n
        self.prefix = self.committed
        self._advance_prefix()
        self._heard_from_leader()
        # Commands we took and have not seen committed go to the new leader; the ones
        # others forwarded to us are theirs to resend.
        if self.leader != self.id:
            pending = [cmd for _, cmds in self._fwd_log for cmd in cmds if (cmd[0], cmd[1]) in self._mine]
            pending += [cmd for cmd in self._queue if (cmd[0], cmd[1]) in self._mine]
            # ... and those we had put in slots as leader that never committed: the new
            # leader's log may not keep them.
            for j in sorted(j for j in self.log if j >= self.committed):
                slot = self.log[j]
                if not slot.committed and slot.batch:
                    pending += [cmd for cmd in slot.batch if (cmd[0], cmd[1]) in self._mine]
            self._queue = []
            self._queued = {}
            self._fwd_log = []
            # They go once the new leader serves (_leader_serves): handed to every
            # candidate at once, under overload with views churning, a follower's
            # thousands of pending commands (megabytes) went out again with each new
            # view, filled the send queues and pushed the pings out (issue 15).
            handover = {(cmd[0], cmd[1]): cmd for cmd in self._handover}
            for cmd in pending:
                handover.setdefault((cmd[0], cmd[1]), cmd)
            self._handover = list(handover.values())
            self._serving = False

    def _leader_serves(self) -> None:
        """The leader of our view sent what only a serving leader sends (a ping of its
        clock, accepts, commits): hand it our pending commands."""
        if not self._serving:
            self._serving = True
            if self._handover:
                handover, self._handover = self._handover, []
                self._forward(self.view, handover)

    def _forget_votes(self) -> None:
        self.votes = {}
        self._vote_parts = {}
        self._vote_next = {}

    def _heard_from_leader(self) -> None:
        self.election_due = self._election_deadline()

    def _election_deadline(self) -> int:
        base = self.cfg.election_ticks
        return self.now + base + self.rng.randrange(max(1, base // 2))

    def _start_election(self) -> None:
        self.gate.stand()
        self.phase = "candidate"
        self.persist(["V", self.view])
        self._forget_votes()
        self.vote_base = self.committed
        self._vote_asked = [self.now] * self.n
        self.acked = [0] * self.n
        self.stats["view_changes_started"] = self.stats.get("view_changes_started", 0) + 1
        self.election_due = self._election_deadline()
        self.broadcast(VRequest(self.view, self.vote_base))

    @handles(_handlers, Ping)
    def _on_ping(self, src: int, m: Ping) -> None:
        if m.view < self.view:
            if m.tick != ALIVE or src == ballot_owner(m.view):
                self.send(src, Ping(self.view, -1), lazy=True)
            return
        if not self._view_ok(src, m):
            return
        if src == self.leader and m.tick >= 0:
            self._heard_from_leader()
            self._leader_serves()

    @handles(_handlers, VRequest)
    def _on_vrequest(self, src: int, m: VRequest) -> None:
        if ballot_owner(m.view) != src or m.from_slot < 0:
            return
        if m.view < self.view:
            self.send(src, Ping(self.view, -1))
            return
        if not self.gate.may_vote(src, self.now):
            return  # restarted: wait before voting, in any view (as SDPaxos does)
        if m.view > self.view:
            self._adopt_view(m.view)
        elif src == self.leader:
            self._heard_from_leader()  # its candidacy goes on (asking for our next chunk)
        last = self._chunk_sent
        if last[0] == self.view and last[1] == m.from_slot and self.now - last[2] < self.cfg.resend_ticks:
            return  # that big chunk is on its way
        vote = self._vote_chunk(m.from_slot)
        self._chunk_sent = (self.view, m.from_slot, self.now) if self._chunk_bytes >= VOTE_RESEND_BYTES else (-1, -1, 0)
        self.send(src, vote)

    def _vote_chunk(self, start: int) -> Vote:
        """Our report of the slots from ``start``, cut at ``VOTE_BYTES_MAX``: ``c_max`` is
        ``[start, upto]``, and the report holds every slot we hold in [start, upto)
        (``upto`` -1: every one from ``start``; the candidate asks again from ``upto``).
        We are in the candidate's view already, so any part is sent after our promise,
        and we accept nothing below that view from then on."""
        log = self.log
        slots: list = []
        used = 0
        upto = -1
        for j in sorted(j for j in log if j >= start):
            if slots and (used >= VOTE_BYTES_MAX or len(slots) >= VOTE_SLOTS_MAX):
                upto = j
                break
            s = log[j]
            slots.append([j, s.view, s.batch, s.committed])
            used += op_bytes(s.batch) + VOTE_ENTRY_BYTES
        self._chunk_bytes = used
        return Vote(self.view, self.committed, slots, [start, upto], 0, [])

    @handles(_handlers, Vote)
    def _on_vote(self, src: int, m: Vote) -> None:
        if self.phase != "candidate" or m.view != self.view:
            if m.view > self.view:
                self._adopt_view(m.view)
            return
        if src in self.votes or src == self.id:
            return  # its report is whole already: a duplicate
        expected = self._vote_next.get(src, self.vote_base)
        if m.c_max == []:
            start, upto = self.vote_base, -1  # one whole report from vote_base (votes built by hand)
        elif len(m.c_max) == 2 and type(m.c_max[0]) is int and type(m.c_max[1]) is int:
            start, upto = m.c_max
        else:
            return
        if start != expected or (upto != -1 and upto <= start):
            return  # an answer to an earlier request (we asked from `expected` since)
        for entry in m.slots:
            if type(entry) is not list or len(entry) != 4 or type(entry[0]) is not int or type(entry[1]) is not int:
                return
            if entry[0] < start or (upto != -1 and entry[0] >= upto):
                return  # outside the range it claims to report whole
        # Safety: a voter counts only once its report covers every slot from vote_base
        # (the chunks [vote_base, u1), [u1, u2), ..., [uk, end) follow each other, each
        # sent in our view, so after the voter's promise). Taking office on a part would
        # let us fill a slot the part left out with a no-op or an older value, though a
        # quorum may have chosen another there (test_multipaxos_vote_chunks).
        parts = self._vote_parts.setdefault(src, [])
        parts.extend(m.slots)
        if upto == -1:
            report = self._vote_parts.pop(src)
            self.votes[src] = report
            self._vote_next[src] = max(start, report[-1][0] + 1) if report else start
            if len(self.votes) + 1 >= self.quorum:
                self._take_office()
            return
        self._vote_next[src] = upto
        self._vote_asked[src] = self.now
        # The exchange moves on: our election deadline is not up while it does.
        self.election_due = max(self.election_due, self._election_deadline())
        self.send(src, VRequest(self.view, upto))

    def _take_office(self) -> None:
        base = self.vote_base
        reports = [[(j, s.view, s.batch, s.committed) for j, s in self.log.items()]]
        reports += list(self.votes.values())  # whole reports from vote_base (_on_vote)
        best = pick_highest(reports, base)  # slot -> (view, batch, committed)
        end = max(best) + 1 if best else base
        batches = [best[j][1] if j in best else None for j in range(base, end)]  # holes: no-op
        for k, batch in enumerate(batches):
            slot = self.log.get(base + k)
            if slot is None or not slot.committed:
                self.log[base + k] = MSlot(self.view, batch)
        for j in [j for j in self.log if j >= end]:
            del self.log[j]
        self.stats["elections"] = self.stats.get("elections", 0) + 1
        # Commands we forwarded to the old leader and never saw committed are ours now.
        again = [cmd for _, cmds in self._fwd_log for cmd in cmds if (cmd[0], cmd[1]) in self._mine]
        again += [cmd for cmd in self._handover if (cmd[0], cmd[1]) in self._mine]
        self._fwd_log = []
        self._handover = []
        self._queue = again + self._queue
        self.phase = "recovering"
        self.recover_end = end
        self.next_slot = end
        self.prefix = self.committed
        self._forget_votes()
        if batches:
            # One record and one accept per MSG_BYTES_MAX: a lagging candidate re-proposes
            # every slot from its commit point, and in one record that came to 17 MB under
            # overload, over the WAL's segment_bytes_max (16 MiB): the new leader exited.
            lo = 0
            while lo < len(batches):
                k = cut_by_bytes(batches[lo:])
                self.persist(["M", self.view, base + lo, batches[lo : lo + k]])
                self.broadcast(MAccept(self.view, base + lo, batches[lo : lo + k]))
                lo += k
            self._advance_prefix()
            self._accept_tick = [self.now] * self.n
        else:
            self._advance_prefix()
        self._recompute_commit()
        if self.recover_end <= self.committed:
            self.phase = "normal"
        self.broadcast(Ping(self.view, self.now))

    def idle(self) -> bool:
        """Nothing pending, in flight or committed-but-unexecuted here."""
        return (
            not self._pending
            and not self._queue
            and not self._mine
            and self.exec_slot >= self.committed
            and (self.id != self.leader or self.committed >= self.next_slot)
        )

    def status(self) -> dict:
        return {
            "protocol": self.protocol,
            "id": self.id,
            "view": self.view,
            "leader": self.leader,
            "phase": self.phase,
            "prefix": self.prefix,
            "committed": self.committed,
            "exec_slot": self.exec_slot,
            "pending": len(self._pending),
            "executed": self.stats["executed"],
        }
