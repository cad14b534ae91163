"""SDPaxos (Zhao et al., SoCC '18) as a pure state machine. Interface: ``replica.py``.

Replication is decentralized: every replica is the *command leader* (CL) of its own
sequence of C-instances, replicated by classic Paxos (``CAccept``/``CAck``/``CCommit``)
to a thrifty quorum. Ordering is centralized: the *sequencer* proposes, in O-instances
(``OAccept``/``OAck``/``OCommit``), which CL owns each global slot. The k-th O-slot
naming CL ``n`` stands for ``n``'s k-th C-instance (numbering by position, paper
Fig. 2), so the merged global log executes C-instance ``k`` of ``n`` at that slot.

Choices that make it safe where the authors' prototype is not
(``../shared/papers/sdpaxos-implementation-notes.md``):

- Assignment is idempotent: a C-request or accepted C-accept for ``(n, i)`` appends
  O-slots for ``n`` until ``n`` owns ``i + 1`` of them, so duplicates, resends and
  reordering never shift the position numbering (trap 1). A rejected C-accept
  assigns nothing.
- Counts come from the O-log itself, never from counting messages (trap 2).
- Ready conditions are exactly Fig. 5 (trap 3):
  * N = 3 or N >= 7: C_n^i committed and >= i+1 committed O-slots naming n. With
    N = 3 an acceptor's accept plus the sequencer's is a majority, so every replica
    commits an O-slot the moment it accepts it from the sequencer.
  * N = 5, non-sequencer: C_n^i committed and every O-slot up to n's (i+1)-th one
    accepted by n itself in the current view (the sequencer accepted them all).
    The sequencer sends every O-accept to every replica, so nothing is missed.
  * N = 5, sequencer: C_n^i committed and every O-slot up to its (i+1)-th one
    accepted by a majority.
- An instance is committed once; late acks are ignored (trap 4). Short commits
  (no commands) go only to peers that acked that very ballot (trap 6).
- Everything is resent on timeouts; a replica missing a committed C-instance fetches
  it (trap 5). Messages carry the view; stale views are refused.

O-acks are cumulative ("every slot below ``prefix`` accepted in this view"), go to the
sequencer (and with N >= 7 to the CLs named, the learners of the paper), and the
sequencer announces the committed prefix in ``OCommit`` with the values a peer
has not acked, which doubles as its heartbeat. Batching: commands proposed between
two ``ready()`` calls share one C-instance; the O-slots assigned in one step travel
in one ``OAccept`` (O-instance batching at the message level; with command batching
one O-slot already orders a whole batch).

Durable records (``Ready.persist``), replayed by ``__init__(records=...)``:
``["P", leader, ballot]`` promise; ``["C", leader, inst, ballot, cmds]`` accepted;
``["CC", leader, inst]`` committed; ``["O", view, start, leaders]`` accepted O-slots;
``["OC", upto]`` committed O-prefix.
"""

from __future__ import annotations

import random

from .config import NOCL, ProtocolConfig, make_ballot
from .messages import CAccept, CAck, CCommit, CRequest, Fetch, Message, OAccept, OAck, OCommit
from .replica import ReplicaBase, handles
from .statemachine import StateMachine

# Most O-slot values carried by one OAccept or OCommit (bounds message size).
OSLOTS_PER_MSG_MAX = 8192
# Most committed C-instances one Fetch answer carries.
FETCH_INSTANCES_MAX = 64


class CInst:
    """One C-instance as this replica knows it."""

    __slots__ = ("ballot", "cmds", "committed", "acks", "sent_tick")

    def __init__(self, ballot: int, cmds: list | None) -> None:
        self.ballot = ballot
        self.cmds = cmds
        self.committed = False
        self.acks = 0  # bitmask of acceptors (command leader only)
        self.sent_tick = 0


class OSlot:
    """One O-instance: the CL it names, the view it was accepted in, commit state."""

    __slots__ = ("leader", "view", "committed", "fast")

    def __init__(self, leader: int, view: int) -> None:
        self.leader = leader
        self.view = view
        self.committed = False
        # N = 5 only: committed at its CL on the sequencer's O-accept (Fig. 5 line 29).
        self.fast = False


class SDPaxosReplica(ReplicaBase):
    protocol = "sdpaxos"
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
        n = self.n
        self.view = 0
        self.sequencer = cfg.initial_sequencer
        # C-log: clog[leader][inst]
        self.clog: list[dict[int, CInst]] = [{} for _ in range(n)]
        self.promised = [0] * n
        self.ballot = make_ballot(0, node_id)  # ballot of my own C-instances
        self.next_inst = 0
        self.unready: dict[int, CInst] = {}  # my instances not yet answered, by inst
        # O-log
        self.oslots: dict[int, OSlot] = {}
        self.o_prefix = 0  # slots below are accepted in this view or committed
        self.o_committed = 0  # slots below are all committed
        self.my_committed = 0  # committed O-slots naming me (N = 3, N >= 7 rule)
        self.my_in_prefix = 0  # O-slots naming me below o_prefix (N = 5 rule)
        self.my_in_majority = 0  # O-slots naming me below majority_prefix
        self.acked = [0] * n  # cumulative O-acks received, per replica
        self.majority_prefix = 0
        # Sequencer state
        self.next_slot = 0
        self.assigned = [0] * n  # O-slots naming each CL in my log
        self._new_slots: list[int] = []
        self._commit_sent = [0] * n
        self._oaccept_tick = [0] * n
        # Execution of the merged log
        self.exec_slot = 0
        self.exec_inst = [0] * n
        self._blocked_since = -1
        self._fetch_rr = 0
        if records:
            self._replay(records)

    # --- recovery from durable records ------------------------------------------------

    def _replay(self, records: list) -> None:
        for rec in records:
            kind = rec[0]
            if kind == "C":
                _, leader, inst, ballot, cmds = rec
                c = self.clog[leader].get(inst)
                if c is None:
                    self.clog[leader][inst] = CInst(ballot, cmds)
                elif not c.committed:
                    c.ballot, c.cmds = ballot, cmds
                self.promised[leader] = max(self.promised[leader], ballot)
            elif kind == "CC":
                c = self.clog[rec[1]].get(rec[2])
                if c is not None:
                    c.committed = True
            elif kind == "P":
                self.promised[rec[1]] = max(self.promised[rec[1]], rec[2])
            elif kind == "O":
                _, view, start, leaders = rec
                for k, leader in enumerate(leaders):
                    slot = self.oslots.get(start + k)
                    if slot is None or not slot.committed:
                        self.oslots[start + k] = OSlot(leader, view)
            elif kind == "OC":
                upto = rec[1]
                for j in range(self.o_committed, upto):
                    slot = self.oslots.get(j)
                    if slot is not None:
                        slot.committed = True
                self.o_committed = max(self.o_committed, upto)
        own = self.clog[self.id]
        self.next_inst = max(own) + 1 if own else 0
        for inst in sorted(own):
            c = own[inst]
            if not c.committed:
                c.acks = 1 << self.id
                self.unready[inst] = c  # re-proposed by the resend timer
        self.my_committed = sum(1 for s in self.oslots.values() if s.committed and s.leader == self.id)
        self._advance_o_prefix()
        if self.id == self.sequencer:
            self.next_slot = self.o_prefix
            for j in range(self.next_slot):
                leader = self.oslots[j].leader
                if leader != NOCL:
                    self.assigned[leader] += 1
            self._recompute_majority()
        self._execute()

    # --- proposing (command leader) ---------------------------------------------------

    def _flush_proposals(self) -> None:
        while self._pending and len(self.unready) < self.cfg.inflight_max:
            self._propose_instance(self._take_batch())

    def _propose_instance(self, cmds: list) -> None:
        inst = self.next_inst
        self.next_inst += 1
        c = CInst(self.ballot, cmds)
        c.acks = 1 << self.id
        c.sent_tick = self.now
        self.clog[self.id][inst] = c
        self.unready[inst] = c
        self.stats["instances"] += 1
        self.persist(["C", self.id, inst, self.ballot, cmds])
        msg = CAccept(self.view, self.id, inst, self.ballot, cmds)
        targets = self._thrifty_targets()
        for dst in targets:
            self.send(dst, msg)
        if self.id == self.sequencer:
            self._assign(self.id, inst)
        elif self.sequencer not in targets:
            self.send(self.sequencer, CRequest(self.view, self.id, inst, []))

    def _thrifty_targets(self) -> tuple[int, ...]:
        peers = self.cfg.peer_order[self.id]
        return peers[: self.quorum - 1] if self.cfg.thrifty else peers

    # --- C-phase ------------------------------------------------------------------------

    @handles(_handlers, CAccept)
    def _on_caccept(self, src: int, m: CAccept) -> None:
        if not self._view_ok(src, m) or not 0 <= m.leader < self.n or m.inst < 0:
            return
        log = self.clog[m.leader]
        c = log.get(m.inst)
        if m.ballot < self.promised[m.leader]:
            self.send(src, CAck(self.view, m.leader, m.inst, self.promised[m.leader], False))
            return
        if c is not None and c.committed:
            # Already chosen: the value cannot differ; just confirm.
            self.send(src, CAck(self.view, m.leader, m.inst, m.ballot, True))
        else:
            if c is None:
                log[m.inst] = CInst(m.ballot, m.cmds)
            else:
                c.ballot, c.cmds = m.ballot, m.cmds
            self.promised[m.leader] = m.ballot
            self.persist(["C", m.leader, m.inst, m.ballot, m.cmds])
            self.send(src, CAck(self.view, m.leader, m.inst, m.ballot, True))
        if self.id == self.sequencer and m.leader == src:
            self._assign(m.leader, m.inst)

    @handles(_handlers, CAck)
    def _on_cack(self, src: int, m: CAck) -> None:
        if m.leader != self.id:
            return
        c = self.clog[self.id].get(m.inst)
        if c is None or c.committed or not m.ok or m.ballot != c.ballot:
            return  # late, duplicate or for an older ballot: ignore (trap 4)
        c.acks |= 1 << src
        if c.acks.bit_count() >= self.quorum:
            self._commit_own(m.inst, c)

    def _commit_own(self, inst: int, c: CInst) -> None:
        c.committed = True
        self.persist(["CC", self.id, inst])
        full = CCommit(self.view, self.id, inst, c.ballot, True, c.cmds)
        short = CCommit(self.view, self.id, inst, c.ballot, False, None)
        for dst in range(self.n):
            if dst != self.id:
                self.send(dst, short if c.acks >> dst & 1 else full)
        self._check_ready()
        self._execute()

    @handles(_handlers, CCommit)
    def _on_ccommit(self, src: int, m: CCommit) -> None:
        if not 0 <= m.leader < self.n or m.inst < 0:
            return
        log = self.clog[m.leader]
        c = log.get(m.inst)
        if c is not None and c.committed:
            return
        if m.full:
            if c is None:
                log[m.inst] = c = CInst(m.ballot, m.cmds)
            else:
                c.ballot, c.cmds = m.ballot, m.cmds
            self.persist(["C", m.leader, m.inst, m.ballot, m.cmds])
        elif c is None or c.ballot != m.ballot:
            return  # we do not hold that ballot's value: fetch it when execution needs it
        c.committed = True
        self.persist(["CC", m.leader, m.inst])
        self._execute()

    @handles(_handlers, CRequest)
    def _on_crequest(self, src: int, m: CRequest) -> None:
        if not self._view_ok(src, m) or m.leader != src or m.inst < 0:
            return
        if self.id == self.sequencer:
            self._assign(m.leader, m.inst)

    # --- O-phase: sequencer -------------------------------------------------------------

    def _assign(self, leader: int, inst: int) -> None:
        """Idempotent: give ``leader`` O-slots until it owns ``inst + 1`` of them."""
        while self.assigned[leader] <= inst:
            slot = self.next_slot
            self.next_slot += 1
            self.assigned[leader] += 1
            self.oslots[slot] = OSlot(leader, self.view)
            self._new_slots.append(leader)

    def _before_ready(self) -> None:
        if not self._new_slots:
            return
        leaders = self._new_slots
        self._new_slots = []
        start = self.next_slot - len(leaders)
        self.persist(["O", self.view, start, leaders])
        self._advance_o_prefix()
        msg = OAccept(self.view, start, leaders)
        for dst in range(self.n):
            if dst != self.id:
                self.send(dst, msg)
                self._oaccept_tick[dst] = self.now
        self._recompute_majority()

    @handles(_handlers, OAck)
    def _on_oack(self, src: int, m: OAck) -> None:
        if m.view != self.view:
            return
        if m.prefix > self.acked[src]:
            self.acked[src] = m.prefix
            self._recompute_majority()

    def _recompute_majority(self) -> None:
        self.acked[self.id] = self.o_prefix
        prefix = sorted(self.acked, reverse=True)[self.quorum - 1]
        prefix = min(prefix, self.o_prefix)  # we must hold the values we commit
        if prefix <= self.majority_prefix:
            return
        me = self.id
        for j in range(self.majority_prefix, prefix):
            if self.oslots[j].leader == me:
                self.my_in_majority += 1
        self.majority_prefix = prefix
        if self.id == self.sequencer or self.n >= 7:
            self._commit_oslots(prefix)

    # --- O-phase: acceptors and command leaders ------------------------------------

    @handles(_handlers, OAccept)
    def _on_oaccept(self, src: int, m: OAccept) -> None:
        if not self._view_ok(src, m) or src != self.sequencer or m.start < 0:
            return
        if len(m.leaders) > OSLOTS_PER_MSG_MAX:
            return
        me = self.id
        fresh = False
        named_seq = False
        for k, leader in enumerate(m.leaders):
            if type(leader) is not int or not NOCL <= leader < self.n:
                return
        for k, leader in enumerate(m.leaders):
            j = m.start + k
            slot = self.oslots.get(j)
            if slot is not None and (slot.committed or slot.view == m.view):
                continue
            slot = OSlot(leader, m.view)
            if self.n == 5 and leader == me:
                slot.fast = True  # Fig. 5 line 29: the CL commits on the O-accept
            self.oslots[j] = slot
            fresh = True
            named_seq = named_seq or leader == self.sequencer
        if fresh:
            self.persist(["O", m.view, m.start, m.leaders])
        old = self.o_prefix
        self._advance_o_prefix()
        if self.n == 3:
            self._commit_oslots(self.o_prefix)
        elif self.n >= 7:
            # The sequencer accepted everything it proposed; we learn O-slots from acks.
            end = m.start + len(m.leaders)
            if end > self.acked[src]:
                self.acked[src] = end
            self._recompute_majority()
        if self.o_prefix > old or not fresh:
            ack = OAck(self.view, self.o_prefix)
            # The sequencer waits on acks only for its own slots; others can ride later.
            self.send(self.sequencer, ack, lazy=not named_seq)
            if self.n >= 7:
                for leader in sorted({x for x in m.leaders if x not in (NOCL, me, self.sequencer)}):
                    self.send(leader, ack)
        self._check_ready()
        self._execute()

    def _advance_o_prefix(self) -> None:
        j = self.o_prefix
        oslots, view, me = self.oslots, self.view, self.id
        mine = 0
        while True:
            slot = oslots.get(j)
            if slot is None or not (slot.committed or slot.view == view):
                break
            if slot.leader == me:
                mine += 1
            j += 1
        self.o_prefix = j
        self.my_in_prefix += mine

    def _commit_oslots(self, upto: int) -> None:
        """Mark every held O-slot below ``upto`` committed (they are chosen)."""
        if upto <= self.o_committed:
            return
        me = self.id
        j = self.o_committed
        while j < upto:
            slot = self.oslots.get(j)
            if slot is None:
                break
            if not slot.committed:
                slot.committed = True
                if slot.leader == me:
                    self.my_committed += 1
            j += 1
        if j > self.o_committed:
            self.o_committed = j
            self.persist(["OC", j])
        self._check_ready()
        self._execute()

    @handles(_handlers, OCommit)
    def _on_ocommit(self, src: int, m: OCommit) -> None:
        if not self._view_ok(src, m) or src != self.sequencer:
            return
        if m.upto <= self.o_committed or len(m.leaders) > OSLOTS_PER_MSG_MAX:
            return
        learned = []
        for k, leader in enumerate(m.leaders):
            if type(leader) is not int or not NOCL <= leader < self.n:
                return
        for k, leader in enumerate(m.leaders):
            j = m.start + k
            slot = self.oslots.get(j)
            if slot is None or (not slot.committed and (slot.leader != leader or slot.view != m.view)):
                self.oslots[j] = OSlot(leader, m.view)
                learned.append(j)
        if learned:
            self.persist(["O", m.view, m.start, m.leaders])
            self._recount_mine()
        before = self.o_prefix
        self._advance_o_prefix()
        self._commit_oslots(min(m.upto, m.start + len(m.leaders)) if m.leaders else m.upto)
        if self.o_prefix > before:
            self.send(src, OAck(self.view, self.o_prefix), lazy=True)

    def _recount_mine(self) -> None:
        """Recompute the counts derived from the O-log after values were replaced."""
        me = self.id
        self.my_committed = 0
        self.my_in_prefix = 0
        for j, slot in self.oslots.items():
            if slot.leader != me:
                continue
            if slot.committed:
                self.my_committed += 1
            if j < self.o_prefix:
                self.my_in_prefix += 1

    # --- readiness and execution ----------------------------------------------------

    def _ready_count(self) -> int:
        """How many of my C-instances have their O-side satisfied (Fig. 5)."""
        if self.n == 5:
            return self.my_in_majority if self.id == self.sequencer else self.my_in_prefix
        return self.my_committed

    def _check_ready(self) -> None:
        if not self.unready:
            return
        limit = self._ready_count()
        done = []
        for inst, c in self.unready.items():
            if inst >= limit:
                break
            if c.committed:
                done.append(inst)
        for inst in done:
            c = self.unready.pop(inst)
            self._reply_ready(c.cmds)

    def _execute(self) -> None:
        oslots, clog, me = self.oslots, self.clog, self.id
        while True:
            j = self.exec_slot
            slot = oslots.get(j)
            if slot is None or not (slot.committed or (slot.fast and slot.leader == me)):
                break
            leader = slot.leader
            if leader == NOCL:
                self._apply(j, (NOCL, -1), None)
                self.exec_slot += 1
                continue
            inst = self.exec_inst[leader]
            c = clog[leader].get(inst)
            if c is None or not c.committed:
                if self._blocked_since < 0:
                    self._blocked_since = self.now
                return
            self._apply(j, (leader, inst), c.cmds)
            self.exec_inst[leader] = inst + 1
            self.exec_slot = j + 1
        self._blocked_since = -1

    # --- timers ------------------------------------------------------------------------

    def _on_tick(self) -> None:
        now, resend = self.now, self.cfg.resend_ticks
        # My instances still waiting: resend the C-accept to everyone not yet acked,
        # and the C-request (the sequencer assigns idempotently, so repeats are safe).
        for inst, c in self.unready.items():
            if now - c.sent_tick < resend:
                continue
            c.sent_tick = now
            if not c.committed:
                msg = CAccept(self.view, self.id, inst, c.ballot, c.cmds)
                for dst in range(self.n):
                    if dst != self.id and not c.acks >> dst & 1:
                        self.send(dst, msg)
            if self.id == self.sequencer:
                self._assign(self.id, inst)
            else:
                self.send(self.sequencer, CRequest(self.view, self.id, inst, []))
        if self.id == self.sequencer:
            self._sequencer_tick()
        # A commit we miss is usually only late; ask after half a resend period.
        if self._blocked_since >= 0 and now - self._blocked_since >= max(1, resend // 2):
            self._blocked_since = now
            self._fetch_missing()

    def _sequencer_tick(self) -> None:
        now = self.now
        for dst in range(self.n):
            if dst == self.id:
                continue
            # O-accepts a peer has not acked for a while: resend from its acked prefix.
            if self.acked[dst] < self.next_slot and now - self._oaccept_tick[dst] >= self.cfg.resend_ticks:
                start = self.acked[dst]
                leaders = [self.oslots[j].leader for j in range(start, min(self.next_slot, start + OSLOTS_PER_MSG_MAX))]
                self.send(dst, OAccept(self.view, start, leaders))
                self._oaccept_tick[dst] = now
            # The committed prefix: lazily when it moved, and as a heartbeat.
            upto = self.o_committed
            if upto > self._commit_sent[dst] or now % self.cfg.heartbeat_ticks == 0:
                start = min(self.acked[dst], upto)
                if upto - start > OSLOTS_PER_MSG_MAX:
                    upto = start + OSLOTS_PER_MSG_MAX
                leaders = [self.oslots[j].leader for j in range(start, upto)]
                self.send(dst, OCommit(self.view, upto, start, leaders))
                self._commit_sent[dst] = upto

    def _fetch_missing(self) -> None:
        slot = self.oslots.get(self.exec_slot)
        if slot is None or slot.leader == NOCL:
            return
        leader = slot.leader
        inst = self.exec_inst[leader]
        # Ask the leader first, then rotate through the others.
        peers = [leader] + [p for p in self.cfg.peer_order[self.id] if p != leader]
        peers = [p for p in peers if p != self.id]
        dst = peers[self._fetch_rr % len(peers)]
        self._fetch_rr += 1
        self.send(dst, Fetch(self.view, leader, inst))

    @handles(_handlers, Fetch)
    def _on_fetch(self, src: int, m: Fetch) -> None:
        """Send the committed run of ``leader``'s instances starting at ``inst``."""
        if not 0 <= m.leader < self.n or m.inst < 0:
            return
        log = self.clog[m.leader]
        for inst in range(m.inst, m.inst + FETCH_INSTANCES_MAX):
            c = log.get(inst)
            if c is None or not c.committed:
                break
            self.send(src, CCommit(self.view, m.leader, inst, c.ballot, True, c.cmds))

    # --- views (extended by the fault-tolerance layer) ------------------------------

    def _view_ok(self, src: int, m: Message) -> bool:
        return m.view >= self.view

    # --- observability ------------------------------------------------------------------

    def status(self) -> dict:
        return {
            "protocol": self.protocol,
            "id": self.id,
            "view": self.view,
            "sequencer": self.sequencer,
            "next_inst": self.next_inst,
            "unready": len(self.unready),
            "pending": len(self._pending),
            "o_prefix": self.o_prefix,
            "o_committed": self.o_committed,
            "exec_slot": self.exec_slot,
            "executed": self.stats["executed"],
        }
