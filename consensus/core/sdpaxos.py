"""SDPaxos (Zhao et al., SoCC '18) as a pure state machine. Interface: ``replica.py``.

Replication is decentralized: every replica is the *command leader* (CL) of its own
sequence of C-instances, replicated by classic Paxos (``CAccept``/``CAck``/``CCommit``)
to a thrifty quorum. Ordering is centralized: the *sequencer* proposes, in O-instances
(``OAccept``/``OAck``/``OCommit``), which CL owns each global slot. The k-th O-slot
naming CL ``n`` stands for ``n``'s k-th C-instance (numbering by position, paper
Fig. 2), so the merged global log executes C-instance ``k`` of ``n`` at that slot.

Normal case, with the choices that make it safe where the authors' prototype is not
(``../shared/papers/sdpaxos-implementation-notes.md``):

- Assignment is idempotent: a C-request or accepted C-accept for ``(n, i)`` appends
  O-slots for ``n`` until ``n`` owns ``i + 1`` of them, so duplicates, resends and
  reordering never shift the numbering (trap 1). A rejected C-accept assigns nothing.
- Counts come from the O-log itself, never from counting messages (trap 2).
- Ready conditions are exactly Fig. 5 (trap 3):
  * N = 3 or N >= 7: C_n^i committed and >= i+1 committed O-slots naming n. With
    N = 3 an acceptor's accept plus the sequencer's is a majority, so every replica
    commits an O-slot the moment it accepts it from the sequencer.
  * N = 5, non-sequencer: C_n^i committed and every O-slot up to n's (i+1)-th one
    accepted by n in the current view (the sequencer accepted them all; it sends
    every O-accept to every replica, so nothing is missed).
  * N = 5, sequencer: C_n^i committed and every O-slot up to its (i+1)-th one
    accepted by a majority.
- An instance is committed once; late acks are ignored (trap 4). Short commits go
  only to peers that acked that very ballot (trap 6). Everything is resent on
  timeouts and a replica missing a committed C-instance fetches it (trap 5).

Failures (paper §3.3, §3.5, §4, appendix A):

- **Views are ballots** (``round << 5 | sequencer``), carried by every message;
  stale views are refused. A replica adopts any higher view it sees, which only
  restricts what it accepts. One vote per view number follows from the encoding.
- **View change**: a replica that hears nothing from the sequencer for
  ``election_ticks`` (randomized) sends ``VRequest`` (the O-prepare of every slot from
  its committed prefix on); each ``Vote`` carries the voter's O-slots with the view
  they were accepted in and its highest accepted C-instance per CL. With a majority,
  the candidate keeps the highest-view value per slot, runs Fig. 7 for N = 5 when
  the last sequencer did not vote, fills holes with no-cl, re-proposes the whole
  suffix in its view and serves only once a majority has accepted it (trap 7, 8).
- **Sequencer lease**: pings carry the sequencer's tick, pongs echo it; a replica
  that pongs promises not to vote for another sequencer for ``lease_ticks``. With a
  majority of pongs the sequencer answers ``RRequest`` with i_A from its history
  table (or i_G); the reader executes through that slot and reads locally. Without
  a lease, reads go through the log. A restarted replica waits one lease before
  voting, since its promise was volatile.
- **C-instance recovery**: a replica blocked on a committed O-slot whose C-instance
  it lacks fetches it, and later (staggered by distance from the CL) runs Prepare
  over that CL's instances and re-proposes what it finds or a no-op. A CL nacked by
  a higher ballot re-prepares its own instances before proposing again.
- **Straggler detection**, **handover** (``transfer_sequencer``) and **catch-up**
  (``OCommit`` values from the peer's acked prefix, pipelined ``Fetch``).

Where each rule lives (one role at a time, ``../shared/reviews/core-structure-2026-11.md``):

- ``views.ViewGate`` alone changes the view (``join``, ``stand``) and alone decides
  whether a vote may be given (``may_vote``: the lease promise and the restart
  wait, in every view); ``_adopt_view`` is what this replica does on joining.
- ``CInst`` is an acceptor record (value at the highest ballot, chosen or not);
  ``Proposal`` is this replica proposing a value for an instance, with a tally of
  one ballot (``follow``). ``unready`` (our own instances) and
  ``CRecovery.accepting`` hold proposals; ``clog`` holds records.
- ``rules``: ``pick_highest`` (phase 1, shared with Multi-Paxos), ``ready_limit``
  (Fig. 5), ``fig7`` (Fig. 7's blind spot; ``_fig7`` gathers what the voters
  report), pure and table-tested.

Durable records (``Ready.persist``), replayed by ``__init__(records=...)``:
``["P", leader, ballot]`` promise; ``["C", leader, inst, ballot, cmds]`` accepted;
``["CC", leader, inst]`` committed; ``["O", view, start, leaders]`` accepted O-slots;
``["OC", upto]`` committed O-prefix; ``["V", view]`` joined (voted for) a view.

Snapshots and log compaction
----------------------------

A snapshot is ``(meta, state)``: ``state = executor.snapshot()`` after executing
every O-slot below ``meta["slot"]``, i.e. C-instances ``0 .. exec_inst[l] - 1`` of
each leader ``l`` (exactly ``exec_inst[l]`` of those O-slots name ``l``).
``meta = {"protocol": "sdpaxos", "n", "slot", "exec_inst", "view"}``; ``state`` is
byte-identical on every replica at the same slot. The replica's *floor*
(``floor_slot``, ``floor_inst``) is the point below which its log is gone.

- ``take_snapshot() -> (meta, state)``: at the execution point; pure.
- ``compact(meta) -> live records``, after the driver stored that snapshot. Drops
  the log below the *previous* stored snapshot (one interval of margin for Fetch)
  and returns records restating everything above the floor (view, promises,
  C-instances, O-slots, commit markers).
- ``__init__(..., records, snapshot)``: restores the executor and the execution
  point from ``snapshot``, which becomes the floor, then replays ``records``
  skipping whatever the floor covers (old WAL segments may still be there).
- ``install_snapshot(meta, state) -> bool``: adopt a peer's snapshot when
  ``meta["slot"] > exec_slot``; the new floor is that point.

Driver order for its own snapshots: ``take_snapshot`` → store it durably (it is now
the latest) → ``compact(meta)`` → write the live records to a fresh WAL segment →
delete older segments (keeping the previous snapshot file is fine: the live records
also pair with it). For a peer's snapshot (``Ready.snapshot_from``): see
``install_snapshot``. A crash between any two steps is safe: the durable state is
always some stored snapshot plus a WAL that covers everything above it. (The
runtime, consensus/runtime/node.py, calls ``take_snapshot`` and ``compact(meta)`` on
a forked copy of the replica instead, stores the live records in the snapshot file,
and after the store calls ``compact(meta, live=False)`` here: the same floor, the
previous snapshot's, since ``compact`` only ever drops to a stored one.)

Safety: a compacted range is chosen, but its values are gone, so no answer from the
log may pass it off as empty. ``CPrepare`` below ``floor_inst`` and ``VRequest``
below ``floor_slot`` get no promise or vote but a ``Compacted`` notice (a quorum
of complete reports is still needed and enough; the most advanced replica can still
win); ``Fetch`` below the floor and the sequencer's resends to a peer acked below
its floor also get the notice. A receiver that has not executed through the
notice's slot asks its driver for the sender's snapshot (``Ready.snapshot_from``)
and a recoverer drops a recovery that started below the notice; one that has marks
those slots committed (executed slots are decided). Counts of O-slots per leader
below the floor are ``floor_inst`` (readiness, sequencer ``assigned``, Fig. 7).
"""

from __future__ import annotations

import random
from typing import Any

from .config import END, NOCL, ProtocolConfig, ballot_owner, ballot_round, make_ballot
from .messages import (
    CAccept,
    CAck,
    CCommit,
    CPrepare,
    CPromise,
    Compacted,
    CRequest,
    Fetch,
    Handover,
    OAccept,
    OAck,
    OCommit,
    Ping,
    Pong,
    RReply,
    RRequest,
    Straggler,
    PreVote,
    PreVoteReply,
    Vote,
    VRequest,
)
from .ready import Reply
from .replica import ALIVE, ReplicaBase, handles
from .rules import fig7, pick_highest, ready_limit
from .statemachine import StateMachine
from .views import ViewGate

# Most O-slot values carried by one OAccept or OCommit (bounds message size).
OSLOTS_PER_MSG_MAX = 8192
# Most committed C-instances one Fetch answer carries.
FETCH_INSTANCES_MAX = 64
# Most C-instances one CPromise reports.
PROMISE_INSTANCES_MAX = 4096
# Early send: instances reserved ahead of use (one "CR" record per EARLY_RESERVE / 2
# proposals). A restart re-prepares at most this many of its own instances.
EARLY_RESERVE = 64
# RReply.slot meaning "no lease: send the read through the log".
READ_VIA_LOG = -2


class SafetyViolation(AssertionError):
    """An invariant the protocol relies on does not hold (assertions stay on)."""


class CInst:
    """One C-instance as this replica's acceptor holds it: the value accepted at the
    highest ballot, and whether it is known chosen. What a proposer of the instance
    tracks (who accepted, when it sent) is a ``Proposal``, apart."""

    __slots__ = ("ballot", "cmds", "committed")

    def __init__(self, ballot: int, cmds: list | None) -> None:
        self.ballot = ballot
        self.cmds = cmds
        self.committed = False


class Proposal:
    """This replica proposing a value for one C-instance: its own batch as command
    leader (``unready``), or a recovery's pick (``CRecovery.accepting``).

    ``acks`` holds acceptors of ``ballot`` only: Paxos chooses a value by a quorum of
    one ballot. When our own acceptor record of the instance takes another ballot (a
    recoverer's accept reached us, or its commit), the proposal follows it
    (``follow``) and its tally restarts, so acks of two ballots never add up (bug 3 of
    issue 9). ``rec`` is that acceptor record (whether the instance is chosen).
    """

    __slots__ = ("rec", "ballot", "cmds", "acks", "sent_to", "sent_tick", "born", "resent")

    def __init__(self, rec: CInst, acks: int, sent_tick: int = 0, born: int = 0) -> None:
        self.rec = rec
        self.ballot = rec.ballot
        self.cmds = rec.cmds
        self.acks = acks  # bitmask of acceptors of ``ballot``
        self.sent_to = 0  # bitmask of peers the accept went to
        self.sent_tick = sent_tick
        self.born = born  # tick proposed (straggler detection)
        self.resent = False  # the accept went out again: its acks time nothing (Karn)

    def follow(self, ballot: int, cmds: list | None) -> None:
        """Our acceptor record took ``(ballot, cmds)``: propose that, with a tally of
        that ballot (empty if the ballot changed)."""
        if ballot != self.ballot:
            self.acks = 0
        self.ballot, self.cmds = ballot, cmds


class OSlot:
    """One O-instance: the CL it names, the view it was accepted in, commit state."""

    __slots__ = ("leader", "view", "committed", "fast", "durable")

    def __init__(self, leader: int, view: int, durable: bool = False) -> None:
        self.leader = leader
        self.view = view
        self.committed = False
        # N = 5 only: committed at its CL on the sequencer's O-accept (Fig. 5 line 29).
        self.fast = False
        # Our record of this accept is on disk (replayed, or its Ready persisted): only
        # then does our own acceptance count towards a quorum (o_durable).
        self.durable = durable


class CRecovery:
    """Prepare/accept over another leader's C-instances (or our own, re-prepared)."""

    __slots__ = ("leader", "ballot", "from_inst", "need", "promises", "started", "accepting")

    def __init__(self, leader: int, ballot: int, from_inst: int, need: int, started: int) -> None:
        self.leader = leader
        self.ballot = ballot
        self.from_inst = from_inst
        self.need = need  # highest instance that must be decided
        self.promises: dict[int, list] = {}
        self.started = started
        self.accepting: dict[int, Proposal] = {}


class SDPaxosReplica(ReplicaBase):
    closes_epochs = True
    protocol = "sdpaxos"
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
        super().__init__(node_id, cfg, sm, records, rng, snapshot)
        n = self.n
        # The view, its sequencer and our lease promise (views.py: the only code that
        # changes the view). A restart forgets promises: wait one promise's length
        # (and the ticks that quantization may have cut from either end of it).
        self.gate = ViewGate(node_id, cfg.initial_view, cfg.lease_ticks + 2)
        self.phase = "normal"  # normal | candidate | recovering (new sequencer) | stale
        # C-log: clog[leader][inst]
        self.clog: list[dict[int, CInst]] = [{} for _ in range(n)]
        self.c_max = [-1] * n  # highest C-instance accepted here, per leader
        self.promised = [0] * n
        self.ballot = make_ballot(0, node_id)  # ballot of my own C-instances
        self.next_inst = 0
        self.unready: dict[int, Proposal] = {}  # my instances not yet answered, by inst
        # Early send (ProtocolConfig.early_send, docs/early-send.md): my C-accepts of
        # instances below the durable reservation leave before my own record of them
        # is durable; my own vote counts only once it is (_on_persisted). A restart
        # re-prepares every instance below the reservation that its log lacks (they
        # may be accepted elsewhere) before proposing anything.
        self.c_reserved = 0  # durable: no C-accept of mine left early at or above it
        self._c_reserve_asked = 0  # the highest reservation persisted (maybe not durable)
        self._c_early: list[tuple[int, CInst, int]] = []  # (inst, record, ballot) sent early since the last Ready
        self._c_resv_new = False  # a reservation was persisted since the last Ready
        # Per Ready with either: (its token, its early instances, the reservation asked by then).
        self._c_wait: list[tuple[int, list[tuple[int, CInst, int]], int]] = []
        self._c_unsure = 0  # after a restart: my instances below it may exist elsewhere
        self.crec: dict[int, CRecovery] = {}
        # Per leader: no recovery of its instances from here before this tick (we saw
        # a higher ballot at work on them, or our attempt timed out: back off).
        self._crec_after = [0] * n
        # O-log
        self.oslots: dict[int, OSlot] = {}
        self.o_prefix = 0  # slots below are accepted in this view or committed
        # ... and, of those, our accept is durable (what our own vote in an O-quorum
        # counts: a crash forgets an accept whose record was not yet on disk).
        self.o_durable = 0
        self._unsynced: list[OSlot] = []  # accepted since the last Ready
        self._sync_wait: list[tuple[int, list[OSlot]]] = []  # (Ready token, its accepts)
        self._oc_due = False  # a commit marker to write on the next tick (_on_persisted)
        self.o_committed = 0  # slots below are all committed
        self.my_committed = 0  # committed O-slots naming me (N = 3, N >= 7 rule)
        self.my_in_prefix = 0  # O-slots naming me below o_prefix (N = 5 rule)
        self.my_in_majority = 0  # O-slots naming me below majority_prefix
        self.acked = [0] * n  # cumulative O-acks received in this view, per replica
        self.majority_prefix = 0
        # Sequencer state
        self.next_slot = 0
        self.assigned = [0] * n  # O-slots naming each CL in my log
        self._new_slots: list[int] = []
        self._commit_sent = [0] * n
        # Per peer: when its O-accept resend timer started (something became outstanding,
        # its acked prefix advanced, or we resent from it).
        self._oaccept_tick = [0] * n
        self._deferred: list[tuple[int, int, list]] = []  # C-requests while recovering
        self.recover_end = 0
        self.history: dict[Any, int] = {}  # key -> last slot assigned to a write on it
        self.unknown_keys_slot = -1  # highest slot assigned without knowing its keys
        keys_of = getattr(sm, "keys_of", None)
        self._keys_of = keys_of if callable(keys_of) else None
        # Leases and failure detection
        self.last_heard = 0
        self.election_due = self._election_deadline()
        self.lease_acks = [-1] * n  # sequencer: ping tick each replica last answered
        self.lease_expiry = -1  # sequencer: lease valid while now < lease_expiry
        self._handover: tuple[int, int, int] | None = None  # (view, target, since tick) while handing over
        self.votes: dict[int, Vote] = {}
        self.vote_base = 0
        # Pre-vote (Raft §9.6): the view we would stand for, and who would vote for it.
        self._prevote_view = -1
        self._prevotes: set[int] = set()
        # The highest view whose sequencer's O-accepts we took (or, as sequencer, made),
        # durable through "AV" records only. We OAck a view only once we took its
        # O-accepts (``_may_ack``), and a view serves only on a majority of OAcks, so a
        # majority of votes always shows the last view that served, and the voter that
        # shows it holds what that view's sequencer proposed to it: Fig. 7 needs that.
        self.o_view = self.view
        # N = 5: we saw an O-accept of this view marked serving (its recovery is over);
        # until then our own slots of this view make nothing ready or executed.
        self.view_serving = False
        self._recover_end_seen = -1  # this view's recovered-log end, from its O-accepts
        # New sequencer (N = 5): (leader, inst) to decide before serving (_take_office).
        self._phantoms: list[tuple[int, int]] = []
        self._phantom_slot = 0
        self._vote_tick = 0
        # Reads
        self._next_rid = 0
        self._reads: dict[int, tuple] = {}  # rid -> (client, seq, op, sent tick)
        self._reads_waiting: list[tuple[int, Any, int, Any]] = []  # (slot, client, seq, op)
        # Straggler detection
        self._window_start = 0
        self._window_total = 0  # ticks my instances took to become ready, this window
        self._window_count = 0
        self._best_ready = 1 << 30  # fastest ever: about one round trip to the quorum
        self._last_window: tuple[int, int, int] = (0, 0, 0)  # (ticks, instances, served): status only
        self._window_served = 0  # O-slots naming me accepted this window
        self._served_baseline = 0.0  # moving average over healthy windows
        self._strikes = 0  # slow windows in a row
        self._doubts = 0  # doubtful windows in a row (slow ones included)
        # Who judges this view's sequencer slow: replica -> tick the judgment was last
        # made or heard. A vote counts for two windows (``_fresh_vote``).
        self._straggler_votes: dict[int, int] = {}
        self._last_view_change = -cfg.straggler_cooldown_ticks
        # Execution of the merged log
        self.exec_slot = 0
        # The END slot closing this epoch (docs/membership.md): executed here (ended),
        # or proposed or kept by us as its sequencer (end_slot); -1 while not.
        self.ended = -1
        self.end_slot = -1
        self.exec_inst = [0] * n
        self._blocked_since = -1
        self._blocked_on: tuple[int, int] | None = None
        # A Fetch was sent for the current block: execution is catching up, and the next
        # block after it is fetched at once (a pipeline). A block that clears without
        # one (the C-commit came on its own, as it does without loss) fetches nothing.
        self._fetching = False
        self._fetch_rr = 0
        # Compaction: O-slots below floor_slot and C-instances of leader l below
        # floor_inst[l] are gone, covered by a stored snapshot. floor_inst[l] is also
        # the number of O-slots naming l below floor_slot (each executed the next one).
        self.floor_slot = 0
        self.floor_inst = [0] * n
        self._floor_ballot = [0] * n  # highest ballot among dropped C-instances
        self._snap_meta: dict | None = None  # latest snapshot the driver stored
        self._snap_asked = -1  # tick we last asked the driver for a snapshot
        self.stats.update(
            {
                "elections": 0,
                "view_changes_started": 0,
                "recoveries": 0,
                "lease_reads": 0,
                "log_reads": 0,
                "compactions": 0,
                "snapshots_installed": 0,
                "snapshot_requests": 0,
            }
        )
        if snapshot is not None:
            self._restore_point(snapshot[0])
        if records:
            self._replay(records)
        if records or snapshot is not None:
            self._after_replay()
        if self.id == self.sequencer and (records or snapshot is not None):
            # We were the sequencer (or a candidate) before a restart: we cannot know
            # whether we won, and our lease is gone, so run a fresh election.
            self.phase = "stale"

    # Read-only views of the gate (observers, tests): only the gate changes them.
    @property
    def sequencer(self) -> int:
        return self.gate.owner

    @property
    def lease_until(self) -> int:
        """Our lease promise runs until this tick ..."""
        return self.gate.promise_until

    @property
    def lease_to(self) -> int:
        """... to this sequencer (it may get our vote)."""
        return self.gate.promise_to

    @property
    def distrust_view(self) -> int:
        return self.gate.distrust_view

    # --- recovery from durable records ------------------------------------------------

    def _replay(self, records: list) -> None:
        for rec in records:
            kind = rec[0]
            if kind == "C":
                _, leader, inst, ballot, cmds = rec
                self.promised[leader] = max(self.promised[leader], ballot)
                if inst < self.floor_inst[leader]:
                    continue  # covered by the snapshot (an older WAL segment)
                c = self.clog[leader].get(inst)
                if c is None:
                    self.clog[leader][inst] = CInst(ballot, cmds)
                elif not c.committed:
                    c.ballot, c.cmds = ballot, cmds
                self.promised[leader] = max(self.promised[leader], ballot)
                self.c_max[leader] = max(self.c_max[leader], inst)
            elif kind == "CC":
                c = self.clog[rec[1]].get(rec[2])
                if c is not None:
                    c.committed = True
            elif kind == "P":
                self.promised[rec[1]] = max(self.promised[rec[1]], rec[2])
            elif kind == "CR":
                self.c_reserved = self._c_reserve_asked = max(self.c_reserved, rec[1])
            elif kind == "O":
                _, view, start, leaders = rec
                for k, leader in enumerate(leaders):
                    if start + k < self.floor_slot:
                        continue  # covered by the snapshot
                    slot = self.oslots.get(start + k)
                    if slot is None or (not slot.committed and view >= slot.view):
                        self.oslots[start + k] = OSlot(leader, view, durable=True)
            elif kind == "OC":
                upto = rec[1]
                for j in range(self.o_committed, upto):
                    slot = self.oslots.get(j)
                    if slot is not None:
                        slot.committed = True
                self.o_committed = max(self.o_committed, upto)
            elif kind == "AV":
                self.o_view = max(self.o_view, rec[1])
            elif kind == "V":
                self.gate.join(rec[1])

    def _after_replay(self) -> None:
        own = self.clog[self.id]
        self.next_inst = max(self.floor_inst[self.id], max(own) + 1 if own else 0)
        # Below the reservation our C-accepts may have left before their records were
        # durable: peers may hold values at instances our log lacks. Re-prepare them
        # (_flush_proposals) before proposing: a new value there at our round-0 ballot
        # could differ from one a peer accepted at that same ballot.
        if self.c_reserved > self.next_inst:
            self._c_unsure = self.c_reserved
        # Propose only at a ballot whose phase 1 completed: our round-0 ballot, or one
        # of our re-prepares that reached phase 2 (it left records at that ballot).
        # Never make one up from a promise: above a recoverer's ballot it would skip
        # phase 1, and an unfinished re-prepare's promise was never granted (review 8).
        # A promise above it (someone prepared our instances, or our own re-prepare
        # did not finish) makes _flush_proposals re-prepare before anything new.
        mine = [c.ballot for c in own.values() if ballot_owner(c.ballot) == self.id]
        self.ballot = max([self.ballot] + mine)
        for inst in sorted(own):
            c = own[inst]
            if not c.committed:
                self.unready[inst] = Proposal(c, 1 << self.id)  # re-proposed by the resend timer
        self._reset_prefix()
        if self.id == self.sequencer:
            self._rebuild_sequencer_state(self.o_prefix)
        self._execute()

    # --- driver interface additions ---------------------------------------------------

    def read(self, client: Any, seq: int, op: Any, key: Any) -> None:
        """A read-only ``op`` on ``key``: through the sequencer lease when possible."""
        if self.id == self.sequencer:
            slot = self._read_slot(key)
            if slot == READ_VIA_LOG:
                self._read_via_log(client, seq, op)
            else:
                self.stats["lease_reads"] += 1
                self._wait_read(slot, client, seq, op)
            return
        rid = self._next_rid
        self._next_rid += 1
        self._reads[rid] = (client, seq, op, self.now)
        self.send(self.sequencer, RRequest(self.view, rid, key))

    def transfer_sequencer(self, target: int) -> bool:
        """Graceful handover: the sequencer steps down and ``target`` takes over."""
        if self.id != self.sequencer or self.phase != "normal" or not 0 <= target < self.n or target == self.id:
            return False
        self.lease_expiry = -1
        self.gate.release()
        self.gate.distrust_view = self.view
        self._handover = (self.view, target, self.now)
        self.broadcast(Handover(self.view, target))
        return True

    def _handing_over(self) -> bool:
        return self._handover is not None and self._handover[0] == self.view

    # --- snapshots and log compaction -------------------------------------------------

    def take_snapshot(self) -> tuple[dict, bytes]:
        """The state at the execution point, and where that point is. Pure.

        ``state`` is byte-identical on every replica at the same ``slot``; ``meta``
        (str keys, msgpack-friendly) says which O-slots (``slot``) and which
        C-instances of each leader (``exec_inst``) it reflects.

        None (ask again later) while we executed a slot not yet known committed (N =
        5: a command leader executes its own slot on the sequencer's O-accept alone).
        A snapshot's slots count as chosen everywhere (compaction, restarts, peers
        that install it), but such a slot is safe only while this replica can still
        report it in a view change (Fig. 7): compacting it away would let a view that
        never served, led by this replica, hide it from the next majority.
        """
        if self.exec_slot > self.o_committed:
            return None
        meta = {
            "protocol": self.protocol,
            "n": self.n,
            "slot": self.exec_slot,
            "exec_inst": list(self.exec_inst),
            "view": self.view,
        }
        if self.ended >= 0:
            meta["ended"] = self.ended  # the state after this epoch's END (docs/membership.md)
        return meta, self.executor.snapshot()

    def compact(self, meta: dict, live: bool = True) -> list:
        """The driver durably stored the snapshot ``meta`` describes: forget old log.

        Keeps a margin of one snapshot interval: drops only what the *previous*
        stored snapshot covers (the one passed to the previous ``compact``, or the
        one this replica was restarted from or installed), so peers lagging by less
        than an interval still catch up by ``Fetch``. Returns the live records: view,
        promises and every C-instance and O-slot still in memory, with commit
        markers. Replayed on top of this snapshot *or the previous one* they rebuild
        this replica's durable state, so the driver may replace its WAL with them.
        ``live=False``: the same compaction, and ``[]`` (a driver that has the live
        records already, made from a copy of this replica, skips building them).
        """
        slot, insts = self._check_meta(meta)
        prev = self._snap_meta
        if prev is None or slot > prev["slot"]:
            self._snap_meta = dict(meta)
        target = prev if prev is not None and prev["slot"] < slot else (meta if prev is not None else None)
        if target is not None:
            t_slot, t_insts = self._check_meta(target)
            if t_slot > self.floor_slot:
                if t_slot > self.exec_slot:
                    raise SafetyViolation(f"replica {self.id}: compacting to {t_slot} past execution at {self.exec_slot}")
                self._raise_floor(t_slot, t_insts)
                self.stats["compactions"] += 1
        return self._live_records() if live else []

    def install_snapshot(self, meta: dict, state: bytes) -> bool:
        """Adopt a peer's snapshot if it is ahead of our execution point.

        Driver steps, with nothing else (``step``, ``tick``, ``ready``) in between:
        ``install_snapshot`` → if True, store ``(meta, state)`` durably as this
        replica's latest snapshot (older stored snapshots no longer pair with the
        WAL: drop them) → ``compact(meta)`` → write the live records to a fresh WAL
        segment and delete the older segments. Installing persists nothing by
        itself; the records and messages that follow it (next ``ready()``) may rely
        on the covered state, which is why the snapshot must be stored before that
        ``ready()``. A crash anywhere in between restarts from the old snapshot and
        WAL (before the store) or from the new snapshot and any WAL (after it).
        """
        try:
            slot, insts = self._check_meta(meta)
        except ValueError:
            return False
        if slot <= self.exec_slot:
            return False
        for leader in range(self.n):
            if insts[leader] < self.exec_inst[leader]:
                raise SafetyViolation(f"replica {self.id}: snapshot at slot {slot} is behind our execution of leader {leader}")
        self.executor.restore(state)
        self.exec_slot = slot
        self.exec_inst = list(insts)
        self._raise_floor(slot, insts)
        self._snap_meta = dict(meta)
        if "ended" in meta:
            self.ended = meta["ended"]
            self._epoch_end = (self.ended, list(self.executor.reconfig or []))
        self._blocked_on = None
        self._blocked_since = -1
        self._fetching = False
        if self.id == self.sequencer and self.phase in ("normal", "recovering"):
            self._rebuild_sequencer_state(self.next_slot)
        self.stats["snapshots_installed"] += 1
        self._check_ready()
        self._execute()
        self._serve_reads()
        return True

    def _check_meta(self, meta: Any) -> tuple[int, list[int]]:
        if type(meta) is not dict or meta.get("protocol") != self.protocol:
            raise ValueError("not an sdpaxos snapshot")
        slot, insts = meta.get("slot"), meta.get("exec_inst")
        if meta.get("n", self.n) != self.n or type(slot) is not int or slot < 0 or type(insts) is not list:
            raise ValueError("malformed snapshot meta")
        if len(insts) != self.n or any(type(x) is not int or x < 0 for x in insts) or sum(insts) > slot:
            raise ValueError("malformed snapshot exec_inst")
        if "ended" in meta and meta["ended"] != slot - 1:
            raise ValueError("malformed snapshot: an epoch's END is the slot before the snapshot's")
        return slot, insts

    def _restore_point(self, meta: dict) -> None:
        """Restart from a snapshot (the base class restored the executor)."""
        slot, insts = self._check_meta(meta)
        self.exec_slot = self.floor_slot = slot
        self.exec_inst = list(insts)
        self.floor_inst = list(insts)
        self.o_committed = self.o_prefix = self.o_durable = self.majority_prefix = slot
        self.c_max = [max(-1, i - 1) for i in insts]
        self.next_inst = insts[self.id]
        self._snap_meta = dict(meta)
        self.ended = meta.get("ended", -1)
        if self.ended >= 0:
            self._epoch_end = (self.ended, list(self.executor.reconfig or []))

    def _raise_floor(self, slot: int, insts: list[int]) -> None:
        """Drop the log below an executed point; it now counts as committed."""
        me = self.id
        oslots = self.oslots
        if slot - self.floor_slot <= len(oslots):
            for j in range(self.floor_slot, slot):
                oslots.pop(j, None)
        else:
            for j in [j for j in oslots if j < slot]:
                del oslots[j]
        for leader in range(self.n):
            log = self.clog[leader]
            upto = max(insts[leader], self.floor_inst[leader])
            if upto - self.floor_inst[leader] <= len(log):
                gone = [i for i in range(self.floor_inst[leader], upto) if i in log]
            else:
                gone = [i for i in log if i < upto]
            top = self._floor_ballot[leader]
            for i in gone:
                c = log.pop(i)
                if c.ballot > top:
                    top = c.ballot
            self._floor_ballot[leader] = top
            if upto - 1 > self.c_max[leader]:
                self.c_max[leader] = upto - 1
            self.floor_inst[leader] = upto
        for inst in [i for i in self.unready if i < self.floor_inst[me]]:
            p = self.unready.pop(inst)
            if p.rec.committed:
                self._reply_ready(p.cmds)  # chosen and executed: answer it
            # else: we never learned what was chosen there; the client retries
        self.next_inst = max(self.next_inst, self.floor_inst[me])
        self.floor_slot = max(self.floor_slot, slot)
        floor = self.floor_slot
        if floor > self.o_committed:
            self.o_committed = floor  # executed slots are decided
        if floor > self.o_prefix:
            self.o_prefix = floor
        if floor > self.majority_prefix:
            self.majority_prefix = floor
        self._advance_o_prefix()
        self._recount_mine()
        # Recoveries of compacted instances are moot (those instances are chosen).
        for leader, rec in list(self.crec.items()):
            low = self.floor_inst[leader]
            for inst in [i for i in rec.accepting if i < low]:
                del rec.accepting[inst]
            if leader != me and (rec.need < low or (rec.promises == {} and not rec.accepting)):
                del self.crec[leader]
            elif rec.from_inst < low:
                rec.from_inst = low

    def _live_records(self) -> list:
        """Persist-records restating every durable fact above the floor."""
        out: list = [["V", self.view], ["AV", self.o_view]]
        for leader in range(self.n):
            ballot = max(self.promised[leader], self._floor_ballot[leader])
            if ballot > 0:
                out.append(["P", leader, ballot])
        for leader in range(self.n):
            log = self.clog[leader]
            for inst in sorted(log):
                c = log[inst]
                out.append(["C", leader, inst, c.ballot, c.cmds])
                if c.committed:
                    out.append(["CC", leader, inst])
        run_start, run_view, run = -1, -1, []
        for j in sorted(self.oslots):
            slot = self.oslots[j]
            if run and (j != run_start + len(run) or slot.view != run_view):
                out.append(["O", run_view, run_start, run])
                run = []
            if not run:
                run_start, run_view = j, slot.view
            run.append(slot.leader)
        if run:
            out.append(["O", run_view, run_start, run])
        if self._c_reserve_asked:
            out.append(["CR", self._c_reserve_asked])
        out.append(["OC", self.o_committed])
        return out

    def _want_snapshot(self, peer: int) -> None:
        """Ask the driver for ``peer``'s snapshot (at most once per resend period)."""
        if self._snap_asked >= 0 and self.now - self._snap_asked < self.cfg.resend_ticks:
            return
        self._snap_asked = self.now
        self._snapshot_from = peer
        self.stats["snapshot_requests"] += 1

    def _compacted_notice(self, leader: int = -1) -> Compacted:
        inst = self.floor_inst[leader] if 0 <= leader < self.n else 0
        return Compacted(self.view, self.floor_slot, leader, inst)

    @handles(_handlers, Compacted)
    def _on_compacted(self, src: int, m: Compacted) -> None:
        """A peer could not answer from its log: it was compacted below ``m.slot``."""
        if m.view > self.view:
            self._adopt_view(m.view)
        rec = self.crec.get(m.leader) if 0 <= m.leader < self.n else None
        if rec is not None and not rec.accepting and rec.from_inst < m.inst:
            del self.crec[m.leader]  # its phase 1 cannot be answered there: chosen range
            self._crec_after[m.leader] = self.now + self.cfg.resend_ticks  # not again at every ready()
        if self.exec_slot < m.slot:
            self._want_snapshot(src)
            return
        # We executed everything the sender compacted: those slots are decided.
        if m.slot > self.o_committed:
            self._commit_oslots(m.slot)
            self._advance_o_prefix()
        if src == self.sequencer and m.view == self.view and self.id != self.sequencer and self._may_ack():
            self.send(src, OAck(self.view, self.o_prefix))

    # --- proposing (command leader) ---------------------------------------------------

    def _flush_proposals(self) -> None:
        if self.id in self.crec:
            return  # re-preparing our own instances: new ones wait
        me = self.id
        while self._pending and len(self.unready) < self.cfg.inflight_max:
            if self.promised[me] > self.ballot or self.next_inst in self.clog[me] or self.next_inst < self._c_unsure:
                # A recoverer prepared our instances (we promised it a higher ballot),
                # or we hold a value someone else proposed at our next instance (a
                # phantom's no-op): proposing now would break that promise or write
                # over that value (review 7). Re-prepare first, as after a nack: it
                # adopts what was accepted and moves next_inst past it.
                if self.now >= self._crec_after[me]:
                    top = max(self.clog[me], default=self.next_inst - 1)
                    self._start_crecovery(me, min(self.unready, default=self.next_inst),
                                          max(self.next_inst - 1, top, self._c_unsure - 1), self.promised[me])
                return
            self._propose_instance(self._take_batch())

    def _propose_instance(self, cmds: list) -> None:
        inst = self.next_inst
        self.next_inst += 1
        c = CInst(self.ballot, cmds)
        early = self.cfg.early_send and inst < self.c_reserved
        # Sent early, our accept counts once its record is durable (_on_persisted).
        p = Proposal(c, 0 if early else 1 << self.id, self.now, self.now)
        self.clog[self.id][inst] = c
        self.c_max[self.id] = inst
        self.unready[inst] = p
        self.stats["instances"] += 1
        self.persist(["C", self.id, inst, self.ballot, cmds])
        if early:
            self._c_early.append((inst, c, self.ballot))
        send = self.send_urgent if early else self.send
        msg = CAccept(self.view, self.id, inst, self.ballot, cmds)
        targets = self._thrifty_targets()
        for dst in targets:
            send(dst, msg)
            p.sent_to |= 1 << dst
        if self.id == self.sequencer:
            self._assign(self.id, inst, self._keys(cmds))
        elif self.sequencer not in targets:
            send(self.sequencer, CRequest(self.view, self.id, inst, self._keys(cmds)))
        if self.cfg.early_send and inst + EARLY_RESERVE // 2 >= self._c_reserve_asked:
            # Reserve the next instances ahead of use: the record is durable with this
            # Ready's, long before the reserved instances are proposed.
            self._c_reserve_asked = inst + 1 + EARLY_RESERVE
            self._c_resv_new = True
            self.persist(["CR", self._c_reserve_asked])

    def _thrifty_targets(self) -> list[int]:
        peers = self.live_peers()
        return peers[: self.quorum - 1] if self.cfg.thrifty else peers

    def _keys(self, cmds: list | None) -> list:
        if not cmds or self._keys_of is None:
            return []
        keys = []
        for cmd in cmds:
            keys.extend(self._keys_of(cmd[2]))
        return keys

    # --- C-phase ------------------------------------------------------------------------

    @handles(_handlers, CAccept)
    def _on_caccept(self, src: int, m: CAccept) -> None:
        if not self._view_ok(src, m) or not 0 <= m.leader < self.n or m.inst < 0:
            if m.view < self.view:
                self.send(src, CAck(self.view, m.leader, m.inst, self.promised[m.leader], False))
            return
        log = self.clog[m.leader]
        c = log.get(m.inst)
        if m.ballot < self.promised[m.leader]:
            self.send(src, CAck(self.view, m.leader, m.inst, self.promised[m.leader], False))
            return
        if m.inst < self.floor_inst[m.leader]:
            # Compacted, so chosen: as for a committed instance, a ballot not below
            # our promise can only carry the chosen value.
            self.send(src, CAck(self.view, m.leader, m.inst, m.ballot, True))
        elif c is not None and c.committed:
            # Already chosen: a higher ballot can only carry the same value.
            self.send(src, CAck(self.view, m.leader, m.inst, m.ballot, True))
        else:
            if c is None:
                log[m.inst] = CInst(m.ballot, m.cmds)
            else:
                c.ballot, c.cmds = m.ballot, m.cmds
                p = self._proposal(m.leader, m.inst)
                if p is not None:
                    p.follow(m.ballot, m.cmds)
                    p.acks |= 1 << self.id
            self.promised[m.leader] = m.ballot
            if m.inst > self.c_max[m.leader]:
                self.c_max[m.leader] = m.inst
            self.persist(["C", m.leader, m.inst, m.ballot, m.cmds])
            self.send(src, CAck(self.view, m.leader, m.inst, m.ballot, True))
        if self.id == self.sequencer and m.leader == src:
            self._assign(m.leader, m.inst, self._keys(m.cmds))

    @handles(_handlers, CAck)
    def _on_cack(self, src: int, m: CAck) -> None:
        if not 0 <= m.leader < self.n:
            return
        if m.view > self.view:
            self._adopt_view(m.view)
        rec = self.crec.get(m.leader)
        if m.leader != self.id or (rec is not None and rec.accepting):
            if rec is not None and m.ok and m.ballot == rec.ballot:
                self._recovery_ack(rec, src, m.inst)
            return
        p = self.unready.get(m.inst)
        if p is None or p.rec.committed:
            return
        if not m.ok:
            if m.ballot > p.ballot and self.id not in self.crec:
                # Someone prepared our instances with a higher ballot (we were
                # suspected): re-prepare before proposing anything again.
                self._start_crecovery(self.id, min(self.unready, default=m.inst), self.next_inst - 1, m.ballot)
            return
        if m.ballot != p.ballot:
            return  # late, duplicate or for an older ballot: ignore (trap 4)
        if p.sent_to >> src & 1 and not p.acks >> src & 1 and not p.resent:
            # Karn's rule: an ack of a resent accept does not say which send it answers.
            self.note_ack_delay(src, self.now - p.sent_tick)
        p.acks |= 1 << src
        if p.acks.bit_count() >= self.quorum:
            self._commit_c(self.id, m.inst, p)

    def _resend_caccept(self, inst: int, p: Proposal) -> None:
        """Our instance ``inst`` again, to every peer that has not acked its ballot."""
        msg = CAccept(self.view, self.id, inst, p.ballot, p.cmds)
        p.resent = True
        for dst in range(self.n):
            if dst != self.id and not p.acks >> dst & 1:
                self.send(dst, msg)

    def _proposal(self, leader: int, inst: int) -> Proposal | None:
        """Our proposal for ``leader``'s instance ``inst``, if we are proposing one."""
        if leader == self.id:
            return self.unready.get(inst)
        rec = self.crec.get(leader)
        return rec.accepting.get(inst) if rec is not None else None

    def _commit_c(self, leader: int, inst: int, p: Proposal) -> None:
        p.rec.committed = True
        self.persist(["CC", leader, inst])
        full = CCommit(self.view, leader, inst, p.ballot, True, p.cmds)
        short = CCommit(self.view, leader, inst, p.ballot, False, None)
        for dst in range(self.n):
            if dst != self.id:
                self.send(dst, short if p.acks >> dst & 1 else full)
        self._check_ready()
        self._execute()
        self._serve_if_decided()

    @handles(_handlers, CCommit)
    def _on_ccommit(self, src: int, m: CCommit) -> None:
        if not 0 <= m.leader < self.n or m.inst < self.floor_inst[m.leader]:
            return  # malformed, or compacted (executed) here
        log = self.clog[m.leader]
        c = log.get(m.inst)
        if c is not None and c.committed:
            return
        if m.full:
            if c is None:
                log[m.inst] = c = CInst(m.ballot, m.cmds)
            else:
                c.ballot, c.cmds = m.ballot, m.cmds
                p = self._proposal(m.leader, m.inst)
                if p is not None:
                    p.follow(m.ballot, m.cmds)
            if m.inst > self.c_max[m.leader]:
                self.c_max[m.leader] = m.inst
            self.persist(["C", m.leader, m.inst, m.ballot, m.cmds])
        elif c is None or c.ballot != m.ballot:
            return  # we do not hold that ballot's value: fetch it when execution needs it
        c.committed = True
        self.persist(["CC", m.leader, m.inst])
        if m.leader == self.id:
            self._check_ready()
        self._execute()
        self._serve_if_decided()

    @handles(_handlers, CRequest)
    def _on_crequest(self, src: int, m: CRequest) -> None:
        if not self._view_ok(src, m) or m.leader != src or m.inst < 0:
            return
        if self.id == self.sequencer:
            self._assign(m.leader, m.inst, m.keys)

    # --- C-instance recovery (paper §3.3) -----------------------------------------------

    def _start_crecovery(self, leader: int, from_inst: int, need: int, seen_ballot: int = 0) -> None:
        from_inst = max(from_inst, self.floor_inst[leader])  # below: chosen, compacted
        if need < from_inst and leader != self.id:
            return
        top = max(self.promised[leader], seen_ballot, self.ballot if leader == self.id else 0)
        ballot = make_ballot(ballot_round(top) + 1, self.id)
        rec = CRecovery(leader, ballot, from_inst, need, self.now)
        self.crec[leader] = rec
        self.promised[leader] = ballot
        self.stats["recoveries"] += 1
        self.persist(["P", leader, ballot])
        rec.promises[self.id] = self._accepted_from(leader, from_inst)
        self.broadcast(CPrepare(self.view, leader, from_inst, ballot, need))

    def _accepted_from(self, leader: int, from_inst: int) -> list:
        log = self.clog[leader]
        out = []
        for inst in range(from_inst, min(self.c_max[leader] + 1, from_inst + PROMISE_INSTANCES_MAX)):
            c = log.get(inst)
            if c is not None:
                out.append([inst, c.ballot, c.cmds, c.committed])
        return out

    @handles(_handlers, CPrepare)
    def _on_cprepare(self, src: int, m: CPrepare) -> None:
        if not 0 <= m.leader < self.n or m.from_inst < 0 or ballot_owner(m.ballot) != src:
            return
        if m.from_inst < self.floor_inst[m.leader]:
            # Those instances are chosen but their values are gone from our log.
            # Reporting "nothing accepted" would let the recoverer choose no-ops over
            # them: refuse to promise and point it at our snapshot instead.
            self.send(src, self._compacted_notice(m.leader))
            return
        if m.ballot < self.promised[m.leader]:
            self.send(src, CPromise(self.view, m.leader, self.promised[m.leader], False, []))
            return
        if m.ballot > self.promised[m.leader]:
            self.promised[m.leader] = m.ballot
            self.persist(["P", m.leader, m.ballot])
            rec = self.crec.get(m.leader)
            if rec is not None and m.leader != self.id and rec.ballot < m.ballot:
                # A peer recovers the same instances with a higher ballot: let it
                # finish rather than duel (with every live replica in the quorum,
                # two recoverers that keep re-preparing never decide anything).
                del self.crec[m.leader]
                self._crec_after[m.leader] = self.now + self.cfg.resend_ticks
        self.send(src, CPromise(self.view, m.leader, m.ballot, True, self._accepted_from(m.leader, m.from_inst)))

    @handles(_handlers, CPromise)
    def _on_cpromise(self, src: int, m: CPromise) -> None:
        rec = self.crec.get(m.leader) if 0 <= m.leader < self.n else None
        if rec is None or rec.accepting:
            return
        if not m.ok:
            if m.ballot > rec.ballot:
                del self.crec[m.leader]  # retried later with a higher ballot
                self.promised[m.leader] = max(self.promised[m.leader], m.ballot)
            return
        if m.ballot != rec.ballot:
            return
        for entry in m.accepted:
            if type(entry) is not list or len(entry) != 4 or type(entry[0]) is not int or type(entry[1]) is not int:
                return
        rec.promises[src] = m.accepted
        if len(rec.promises) >= self.quorum:
            self._recovery_propose(rec)

    def _recovery_propose(self, rec: CRecovery) -> None:
        """Phase 2 of recovery: the highest-ballot value per instance, else a no-op."""
        leader = rec.leader
        if self.promised[leader] > rec.ballot:
            # We promised a higher ballot while gathering promises (a peer recovers the
            # same instances; our own re-prepare is not dropped on its prepare):
            # accepting at ours now would break that promise. Give way; a nack of a
            # resend brings us back with a higher ballot if we still need to.
            if self.crec.get(leader) is rec:
                del self.crec[leader]
            self._crec_after[leader] = self.now + self.cfg.resend_ticks
            rec.promises = {}
            return
        best = pick_highest(rec.promises.values())
        # Promises report at most PROMISE_INSTANCES_MAX instances from from_inst: past
        # that window nothing was reported, and a no-op there could replace a chosen
        # value. Stop at the window; a later recovery (nack, blocked executor) goes on.
        upto = min(max([rec.need] + list(best)), rec.from_inst + PROMISE_INSTANCES_MAX - 1)
        log = self.clog[leader]
        own = leader == self.id
        if own:
            self.ballot = rec.ballot
            self.next_inst = max(self.next_inst, upto + 1)
        for inst in range(max(rec.from_inst, self.floor_inst[leader]), upto + 1):
            c = log.get(inst)
            if c is not None and c.committed:
                continue
            cmds = best[inst][1] if inst in best else None
            if c is None:
                log[inst] = c = CInst(rec.ballot, cmds)
            else:
                c.ballot, c.cmds = rec.ballot, cmds
            p = self.unready.get(inst) if own else None
            if p is None:
                p = Proposal(c, 0)
            p.follow(rec.ballot, cmds)
            p.acks = 1 << self.id
            p.sent_tick = self.now
            if inst > self.c_max[leader]:
                self.c_max[leader] = inst
            self.persist(["C", leader, inst, rec.ballot, cmds])
            rec.accepting[inst] = p
            if own:
                self.unready[inst] = p
            self.broadcast(CAccept(self.view, leader, inst, rec.ballot, cmds))
        if own:
            # Our instances are ordinary again, at the new ballot.
            self.unready = dict(sorted(self.unready.items()))
            del self.crec[leader]
            if self.id != self.sequencer:
                for inst, p in self.unready.items():
                    self.send(self.sequencer, CRequest(self.view, self.id, inst, self._keys(p.cmds)))
        elif not rec.accepting:
            del self.crec[leader]
        rec.promises = {}

    def _recovery_ack(self, rec: CRecovery, src: int, inst: int) -> None:
        p = rec.accepting.get(inst)
        if p is None or p.rec.committed or p.ballot != rec.ballot:
            return  # decided, or a higher ballot took over this instance here
        p.acks |= 1 << src
        if p.acks.bit_count() >= self.quorum:
            del rec.accepting[inst]
            self._commit_c(rec.leader, inst, p)
            if not rec.accepting and self.crec.get(rec.leader) is rec:
                del self.crec[rec.leader]

    # --- O-phase: sequencer -------------------------------------------------------------

    def _assign(self, leader: int, inst: int, keys: list) -> None:
        """Idempotent: give ``leader`` O-slots until it owns ``inst + 1`` of them."""
        if self.end_slot >= 0 or self.executor.reconfig is not None:
            # S1 (docs/membership.md): this epoch is closing; what is not ordered yet
            # never is in this epoch (its commands were never ready: unfinished()).
            return
        if self.phase != "normal":
            # Candidate or recovering: order these right after the recovered log.
            if self.phase in ("candidate", "recovering") and len(self._deferred) < 65536:
                self._deferred.append((leader, inst, keys))
            return
        if self.assigned[leader] > inst:
            return
        while self.assigned[leader] <= inst:
            slot = self.next_slot
            self.next_slot += 1
            self.assigned[leader] += 1
            self._accepted(slot, leader, self.view)
            self._new_slots.append(leader)
            if self.assigned[leader] <= inst:
                self.unknown_keys_slot = slot  # an earlier instance whose keys we never saw
        for key in keys:
            if type(key) in (str, int, bytes):
                self.history[key] = self.next_slot - 1
            else:  # keys known only once applied (a prefix delete, a lease expiry): every read waits
                self.unknown_keys_slot = self.next_slot - 1

    def _before_ready(self) -> None:
        if (self.executor.reconfig is not None and self.end_slot < 0 and self.ended < 0 and self.phase == "normal"
                and self.id == self.sequencer and self.majority_prefix >= self.next_slot):
            # S1: every slot we assigned is chosen; close the epoch after them.
            self.end_slot = self.next_slot
            self._accepted(self.next_slot, END, self.view)
            self.next_slot += 1
            self._new_slots.append(END)
        if not self._new_slots:
            return
        leaders = self._new_slots
        self._new_slots = []
        start = self.next_slot - len(leaders)
        self._propose_slots(start, leaders)

    def _propose_slots(self, start: int, leaders: list[int]) -> None:
        if self.o_view < self.view:
            self.o_view = self.view
            self.persist(["AV", self.view])
        self.persist(["O", self.view, start, leaders])
        self._advance_o_prefix()
        for lo in range(0, len(leaders), OSLOTS_PER_MSG_MAX):
            msg = OAccept(self.view, start + lo, leaders[lo : lo + OSLOTS_PER_MSG_MAX], self.phase == "normal", self.recover_end)
            for dst in range(self.n):
                if dst != self.id:
                    self.send(dst, msg)
                    if self.acked[dst] >= start:
                        # Nothing was outstanding: the resend timer starts now. Otherwise it
                        # keeps running, so new traffic never postpones filling a gap.
                        self._oaccept_tick[dst] = self.now
        self._recompute_majority()

    @handles(_handlers, OAck)
    def _on_oack(self, src: int, m: OAck) -> None:
        if m.view != self.view:
            self._view_ok(src, m)
            return
        if m.prefix > self.acked[src]:
            self.acked[src] = m.prefix
            self._oaccept_tick[src] = self.now  # progress: the resend timer restarts
            self._recompute_majority()

    def _recompute_majority(self) -> None:
        self.acked[self.id] = self.o_durable  # our own accepts count once on disk
        prefix = sorted(self.acked, reverse=True)[self.quorum - 1]
        prefix = min(prefix, self.o_prefix)  # we must hold the values we commit
        if self._phantoms and self._phantoms_pending():
            # Nothing at or after a slot that may stand for an unproposed instance
            # commits (or makes anything ready) until that instance is decided.
            prefix = min(prefix, self._phantom_slot)
        if prefix > self.majority_prefix:
            me = self.id
            for j in range(self.majority_prefix, prefix):
                if self.oslots[j].leader == me:
                    self.my_in_majority += 1
            self.majority_prefix = prefix
            if self.id == self.sequencer or self.n >= 7:
                self._commit_oslots(prefix)
        # On the acked prefix, not on majority_prefix: an installed snapshot raises
        # that to its floor without a single OAck of this view (_raise_floor).
        if self.phase == "recovering" and prefix >= self.recover_end and not self._phantoms_pending():
            self._start_serving()

    def _recover_phantoms(self) -> None:
        """C-recover each leader's open phantom instances (not already recovering)."""
        for leader in sorted({l for l, _ in self._phantoms}):
            if leader in self.crec or self.now < self._crec_after[leader]:
                continue
            insts = [k for l, k in self._phantoms if l == leader]
            self._start_crecovery(leader, insts[0], insts[-1])

    def _slot_of(self, leader: int, inst: int) -> int:
        """The O-slot that stands for ``leader``'s C-instance ``inst`` (by position)."""
        seen = self.floor_inst[leader]
        for j in range(self.floor_slot, self.next_slot):
            slot = self.oslots.get(j)
            if slot is not None and slot.leader == leader:
                if seen == inst:
                    return j
                seen += 1
        return self.next_slot

    def _phantoms_pending(self) -> bool:
        """A new sequencer's O-slots that may stand for unproposed instances
        (``_take_office``) whose C-instances are not decided yet."""
        if self._phantoms:
            self._phantoms = [
                (l, k) for l, k in self._phantoms
                if k >= self.floor_inst[l] and not getattr(self.clog[l].get(k), "committed", False)
            ]
        return bool(self._phantoms)

    def _serve_if_decided(self) -> None:
        if self.phase == "recovering" and self._phantoms and not self._phantoms_pending():
            self._recompute_majority()

    # --- O-phase: acceptors and command leaders ------------------------------------

    @handles(_handlers, OAccept)
    def _on_oaccept(self, src: int, m: OAccept) -> None:
        if not self._view_ok(src, m) or src != self.sequencer or m.start < 0:
            return
        if len(m.leaders) > OSLOTS_PER_MSG_MAX:
            return
        for leader in m.leaders:
            if type(leader) is not int or not END <= leader < self.n:
                return
        self._heard_from_sequencer()
        me = self.id
        fresh = False
        named_seq = False
        replaced = False
        floor = self.floor_slot
        for k, leader in enumerate(m.leaders):
            j = m.start + k
            if j < floor:
                continue  # compacted: chosen and executed here
            slot = self.oslots.get(j)
            if slot is not None and (slot.committed or slot.view == m.view):
                continue
            if slot is not None:
                replaced = True
                if j < self.exec_slot and slot.leader != leader:
                    raise SafetyViolation(f"replica {me}: executed O-slot {j} ({slot.leader}) re-proposed as {leader}")
            slot = self._accepted(j, leader, m.view)
            if leader == me:
                self._window_served += 1
                if self.n == 5 and m.serving:
                    # Fig. 5 line 29: the CL commits on the O-accept. Not on a recovering
                    # sequencer's: a view that never serves may be known to no voter of
                    # the next view change, whose Fig. 7 would then miss this slot.
                    slot.fast = True
            fresh = True
            named_seq = named_seq or leader == self.sequencer
        if fresh:
            self.persist(["O", m.view, m.start, m.leaders])
        self._recover_end_seen = m.recover_end
        if m.serving and not self.view_serving:
            self.view_serving = True  # our slots of this view in the prefix count now
        if replaced:
            self._recount_mine()
        old = self.o_prefix
        self._advance_o_prefix()
        if m.view > self.o_view and self.o_prefix >= m.recover_end:
            # We hold the view's whole recovered log (accepted in it, or committed):
            # only now do we report the view as ours in a view change (Fig. 7).
            self.o_view = m.view
            self.persist(["AV", m.view])
        if self.n == 3:
            # The sequencer's accept and ours: a majority, once ours is on disk (the
            # sequencer's is: it persists before it sends). Otherwise _on_persisted.
            self._commit_oslots(self.o_durable)
        elif self.n >= 7:
            # The sequencer accepted everything it proposed; we learn O-slots from acks.
            end = m.start + len(m.leaders)
            if end > self.acked[src]:
                self.acked[src] = end
            self._recompute_majority()
        if (self.o_prefix > old or not fresh) and self._may_ack():
            ack = OAck(self.view, self.o_prefix)
            # The sequencer waits on acks only for its own slots; others can ride later.
            self.send(self.sequencer, ack, lazy=not named_seq and self.phase == "normal")
            if self.n >= 7:
                for leader in sorted({x for x in m.leaders if x >= 0 and x not in (me, self.sequencer)}):
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
        # Every slot below o_prefix is committed or accepted in this view.
        d = max(min(self.o_durable, j), self.o_committed)
        while d < j:
            slot = oslots.get(d)
            if slot is None or not (slot.committed or slot.durable):
                break
            d += 1
        self.o_durable = d

    def _reset_prefix(self) -> None:
        """A new view: only committed slots and this view's accepts count."""
        self.o_prefix = self.o_committed
        self.majority_prefix = self.o_committed
        self._recount_mine()
        self._advance_o_prefix()

    def _accepted(self, j: int, leader: int, view: int) -> OSlot:
        """O-slot ``j`` newly accepted here (it replaces whatever was there); the caller
        persists its "O" record in this step. It counts as ours in an O-quorum once
        that record is durable (_on_persisted), so the durable prefix stops before it."""
        slot = OSlot(leader, view)
        self.oslots[j] = slot
        self._unsynced.append(slot)
        if j < self.o_durable:
            self.o_durable = j  # review 10: a re-proposal over a durable accept of an older view
        return slot

    def _sealed(self, token: int) -> None:
        if self._unsynced:
            self._sync_wait.append((token, self._unsynced))
            self._unsynced = []
        if self._c_early or self._c_resv_new:
            self._c_wait.append((token, self._c_early, self._c_reserve_asked))
            self._c_early = []
            self._c_resv_new = False

    def _on_persisted(self, sync: bool = False) -> None:
        """Our accepts up to the durable Ready are on disk: they count now. (N = 3: a
        replica that commits on the sequencer's O-accept and its own, in the step it
        accepts, executes state a crash before the sync could make unchosen; a view
        change without the sequencer could fill the slot otherwise. No client sees
        it, replies wait for the sync, but reads, watches and snapshots of that
        state would.)"""
        token = self._durable_token
        if self._c_wait:
            self._c_durable(token)
        wait = self._sync_wait
        k = 0
        while k < len(wait) and wait[k][0] <= token:
            for slot in wait[k][1]:
                slot.durable = True
            k += 1
        if not k:
            return
        del wait[:k]
        self._advance_o_prefix()
        if self.id == self.sequencer or self.n >= 7:
            self._recompute_majority()
        elif self.n == 3 and self.id != self.sequencer:
            # The commit marker is a hint (a restart re-learns what is committed), and
            # one written now would hold back the replies this commit releases until
            # another sync: write it on the next tick (sync: it joins this Ready's).
            self._commit_oslots(self.o_durable, record=sync)
        self._check_ready()
        self._execute()

    def _c_durable(self, token: int) -> None:
        """Early send: reservations and our early-sent accepts up to ``token`` are
        durable. Our vote for such an instance counts now, if our record still holds
        the ballot we proposed (a recoverer's accept may have replaced it meanwhile:
        the proposal then follows that ballot, with its own tally)."""
        wait = self._c_wait
        k = 0
        while k < len(wait) and wait[k][0] <= token:
            _, early, reserved = wait[k]
            k += 1
            self.c_reserved = max(self.c_reserved, reserved)
            for inst, c, ballot in early:
                p = self.unready.get(inst)
                if p is None or p.rec is not c or c.committed or p.ballot != ballot or c.ballot != ballot:
                    continue
                p.acks |= 1 << self.id
                if p.acks.bit_count() >= self.quorum:
                    self._commit_c(self.id, inst, p)
        del wait[:k]

    def _commit_oslots(self, upto: int, record: bool = True) -> None:
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
            if record:
                self.persist(["OC", j])
                self._oc_due = False
            else:
                self._oc_due = True
        self._check_ready()
        self._execute()

    @handles(_handlers, OCommit)
    def _on_ocommit(self, src: int, m: OCommit) -> None:
        if not self._view_ok(src, m) or src != self.sequencer:
            return
        self._heard_from_sequencer()
        if m.upto <= self.o_committed or len(m.leaders) > OSLOTS_PER_MSG_MAX:
            return
        for leader in m.leaders:
            if type(leader) is not int or not END <= leader < self.n:
                return
        learned = False
        floor = self.floor_slot
        for k, leader in enumerate(m.leaders):
            j = m.start + k
            if j < floor:
                continue  # compacted: chosen and executed here
            slot = self.oslots.get(j)
            if slot is None or (not slot.committed and (slot.leader != leader or slot.view != m.view)):
                if slot is not None and j < self.exec_slot and slot.leader != leader:
                    raise SafetyViolation(f"replica {self.id}: executed O-slot {j} ({slot.leader}) committed as {leader}")
                self._accepted(j, leader, m.view)
                learned = True
        if learned:
            self.persist(["O", m.view, m.start, m.leaders])
            self._recount_mine()
        before = self.o_prefix
        self._advance_o_prefix()
        self._commit_oslots(min(m.upto, m.start + len(m.leaders)) if m.leaders else m.upto)
        if self.o_prefix > before and self._may_ack():
            self.send(src, OAck(self.view, self.o_prefix), lazy=True)

    def _may_ack(self) -> bool:
        """An OAck that may count towards serving (its prefix reaches the view's
        recovered log's end) only once we hold that whole log (o_view): a view serves
        on a majority of such acks, and Fig. 7 needs every later majority to hold a
        voter that took it. An ack below the end counts for nothing there; it tells
        the sequencer where to resend from."""
        return self.o_view >= self.view or self.o_prefix < self._recover_end_seen

    def _recount_mine(self) -> None:
        """Recompute the counts derived from the O-log after values were replaced."""
        me = self.id
        # Compacted slots are committed and below both prefixes.
        self.my_committed = self.my_in_prefix = self.my_in_majority = self.floor_inst[me]
        for j, slot in self.oslots.items():
            if slot.leader != me:
                continue
            if slot.committed:
                self.my_committed += 1
            if j < self.o_prefix:
                self.my_in_prefix += 1
            if j < self.majority_prefix:
                self.my_in_majority += 1

    # --- readiness and execution ----------------------------------------------------

    def _ready_count(self) -> int:
        """How many of my C-instances have their O-side satisfied (Fig. 5)."""
        if self.n == 5 and self.id != self.sequencer and not self.view_serving:
            # A recovering sequencer's O-accepts make nothing ready on their own (a view
            # that never serves may be unknown to the next view change's majority).
            return self.my_committed
        return ready_limit(self.n, self.id == self.sequencer, self.my_committed, self.my_in_prefix, self.my_in_majority)

    def _check_ready(self) -> None:
        if not self.unready:
            return
        limit = self._ready_count()
        done = []
        for inst, p in self.unready.items():
            if inst >= limit:
                break
            if p.rec.committed:
                done.append(inst)
        for inst in done:
            p = self.unready.pop(inst)
            self._reply_ready(p.cmds)
            # Straggler detection: how long this instance took to become ready.
            took = self.now - p.born
            self._window_total += took
            self._window_count += 1
            if took < self._best_ready:
                self._best_ready = took

    def _would_execute(self) -> bool:
        """The head of ``_execute``'s loop: it acts now if the next slot is executable
        (committed, or our own fast durable one) and either names no C-instance (NOCL,
        END), or its C-instance is committed here, or it blocks on a C-instance it was
        not blocked on yet (which starts the fetch timer); or if the next slot is not
        executable and a blocked state is left to clear. Otherwise it would return at
        once: nothing applied, nothing to serve (a read waits only for slots at or
        above the execution point)."""
        slot = self.oslots.get(self.exec_slot)
        if slot is None or not (slot.committed or (slot.fast and slot.durable and slot.leader == self.id
                                                   and slot.view == self.view)):
            return self._blocked_on is not None or self._blocked_since != -1 or self._fetching
        leader = slot.leader
        if leader == NOCL or leader == END:
            return True
        inst = self.exec_inst[leader]
        c = self.clog[leader].get(inst)
        return (c is not None and c.committed) or self._blocked_on != (leader, inst)

    def _execute(self) -> None:
        if self.ended >= 0:
            return  # X: this epoch is over here
        if self._execution_deferred():
            return
        oslots, clog, me = self.oslots, self.clog, self.id
        progressed = False
        while True:
            j = self.exec_slot
            slot = oslots.get(j)
            if slot is None or not (slot.committed or (slot.fast and slot.durable and slot.leader == me and slot.view == self.view)):
                break
            leader = slot.leader
            if leader == NOCL:
                self._apply(j, (NOCL, -1), None)
                self.exec_slot += 1
                progressed = True
                continue
            if leader == END:
                self._end_epoch(j)
                break
            inst = self.exec_inst[leader]
            c = clog[leader].get(inst)
            if c is None or not c.committed:
                if self._blocked_on != (leader, inst):
                    fetch_now = progressed and self._fetching
                    self._blocked_on = (leader, inst)
                    self._blocked_since = self.now
                    self._fetching = False
                    if fetch_now:
                        self._fetch_missing()  # catching up: pipeline the next fetch
                self._serve_reads()
                return
            self._apply(j, (leader, inst), c.cmds)
            self.exec_inst[leader] = inst + 1
            self.exec_slot = j + 1
            progressed = True
        self._blocked_on = None
        self._blocked_since = -1
        self._fetching = False
        if progressed:
            self._serve_reads()

    def _end_epoch(self, j: int) -> None:
        """X (docs/membership.md): we executed END at ``j``; nothing more runs here."""
        reconfig = self.executor.reconfig
        if reconfig is None:
            raise SafetyViolation(f"replica {self.id}: END at slot {j} without a reconfiguration executed before it")
        self._apply(j, (END, -1), None)
        self.exec_slot = j + 1
        self.ended = j
        self._epoch_end = (j, list(reconfig))
        self.stats["epoch_ended"] = j

    def unfinished(self) -> list:
        """Commands and reads this replica still owes an answer, as ``[client, seq, op,
        needs_result]``: after END they are never answered in this epoch, and the
        epoch layer re-proposes them in the next one (the executor's sessions drop a
        command that was also executed below END)."""
        owed = []
        seen = set()
        cmds = list(self._pending)
        for inst in sorted(self.clog[self.id]):
            if inst >= self.exec_inst[self.id]:
                c = self.clog[self.id][inst]
                cmds.extend(c.cmds or [])
        for p in self.unready.values():
            cmds.extend(p.rec.cmds or [])
        for client, seq, op in cmds:
            key = (client, seq)
            if key in seen:
                continue
            if key in self._needs_result or key in self._blind:
                seen.add(key)
                owed.append([client, seq, op, key in self._needs_result])
        for client, seq, op, _tick in self._reads.values():
            owed.append([client, seq, op, True])
        for _slot, client, seq, op in self._reads_waiting:
            owed.append([client, seq, op, True])
        return owed

    # --- reads (paper §3.5) -----------------------------------------------------------

    def _read_slot(self, key: Any) -> int:
        """The slot a read of ``key`` must wait for, or READ_VIA_LOG without a lease."""
        if (self.phase != "normal" or self.now >= self.lease_expiry or self.end_slot >= 0
                or self.executor.reconfig is not None):
            # S2 (docs/membership.md): a closing sequencer hands out no read slot.
            return READ_VIA_LOG
        slot = self.history.get(key, -1) if type(key) in (str, int, bytes) else self.next_slot - 1
        return max(slot, self.unknown_keys_slot)

    def _wait_read(self, slot: int, client: Any, seq: int, op: Any) -> None:
        if slot < self.exec_slot:
            self._answer_read(client, seq, op)
        else:
            self._reads_waiting.append((slot, client, seq, op))

    def _serve_reads(self) -> None:
        if not self._reads_waiting:
            return
        keep = []
        for entry in self._reads_waiting:
            if entry[0] < self.exec_slot:
                self._answer_read(entry[1], entry[2], entry[3])
            else:
                keep.append(entry)
        self._reads_waiting = keep

    def _answer_read(self, client: Any, seq: int, op: Any) -> None:
        sm = self.executor.sm
        query = getattr(sm, "query", None)
        result = query(op) if callable(query) else sm.apply(op)
        self._replies.append(Reply(client, seq, result))

    def _read_via_log(self, client: Any, seq: int, op: Any) -> None:
        self.stats["log_reads"] += 1
        self.propose(client, seq, op, needs_result=True)

    @handles(_handlers, RRequest)
    def _on_rrequest(self, src: int, m: RRequest) -> None:
        if self.id != self.sequencer or m.view > self.view:
            self.send(src, RReply(self.view, m.rid, READ_VIA_LOG))
            return
        self.send(src, RReply(self.view, m.rid, self._read_slot(m.key)))

    @handles(_handlers, RReply)
    def _on_rreply(self, src: int, m: RReply) -> None:
        entry = self._reads.pop(m.rid, None)
        if entry is None:
            return
        client, seq, op, _ = entry
        if m.slot == READ_VIA_LOG or m.slot < -1:
            self._read_via_log(client, seq, op)
        else:
            self.stats["lease_reads"] += 1
            self._wait_read(m.slot, client, seq, op)

    # --- views ---------------------------------------------------------------------------

    def _adopt_view(self, view: int) -> None:
        if not self.gate.join(view):
            return
        self.view_serving = False
        self._recover_end_seen = -1
        self.persist(["V", view])
        # A view we own but did not win in this incarnation: never act as its
        # sequencer (we skipped phase 1); elect ourselves properly instead.
        self.phase = "normal" if self.sequencer != self.id else "stale"
        self.votes = {}
        self._deferred = []
        self.lease_expiry = -1
        self.acked = [0] * self.n
        self._reset_prefix()
        self._last_view_change = self.now
        self._strikes = self._doubts = 0
        self._straggler_votes = {}
        self.election_due = self._election_deadline()  # give the new sequencer time
        # Our unanswered instances need slots from the new sequencer: ask at once.
        for inst, p in self.unready.items():
            p.sent_tick = self.now
            if self.sequencer != self.id:
                self.send(self.sequencer, CRequest(view, self.id, inst, self._keys(p.cmds)))
            if not p.rec.committed:
                self._resend_caccept(inst, p)
        # Reads waiting on the old sequencer's answer go through the new one.
        for rid, (client, seq, op, _) in list(self._reads.items()):
            del self._reads[rid]
            self._read_via_log(client, seq, op)

    def _heard_from_sequencer(self) -> None:
        self.last_heard = self.now
        if self.gate.distrust_view != self.view:  # a judged straggler does not hold off elections
            self.election_due = self._election_deadline()

    def _election_deadline(self) -> int:
        base = self.cfg.election_ticks
        return self.now + base + self.rng.randrange(max(1, base // 2))

    def _lost_quorum(self) -> bool:
        """Check-quorum (Raft §6.2): a serving sequencer that has heard nothing from a
        majority (itself included) for an election timeout cannot commit anything."""
        now, timeout = self.now, self.cfg.election_ticks
        if now - self._last_view_change < timeout or now < timeout:
            return False
        heard = sum(1 for p in range(self.n) if p != self.id and now - self.heard[p] < timeout)
        return heard + 1 < self.quorum

    def _step_down(self) -> None:
        """Stop serving: no more pings, so peers that still hear us (an asymmetric
        cut) time out and elect a sequencer a majority can reach; our pre-vote, like
        theirs, must then win a majority."""
        self.phase = "stale"
        self.lease_expiry = -1
        self.election_due = self._election_deadline()
        self.stats["step_downs"] = self.stats.get("step_downs", 0) + 1

    def _start_prevote(self) -> None:
        """Ask whether a majority would vote before raising our view: a replica cut
        off from a healthy majority then never forces a view change when it returns.
        Retried at every election deadline."""
        self._prevote_view = self.gate.next_view()
        self._prevotes = {self.id}
        self.election_due = self._election_deadline()
        self.broadcast(PreVote(self._prevote_view))

    def _grants_prevote(self, src: int, view: int) -> bool:
        if view <= self.view or not self.gate.may_vote(src, self.now):
            return False
        if self.id == self.sequencer:
            return self.phase != "normal"  # serving: we are the live sequencer
        # A live sequencer we heard from within an election timeout keeps our support,
        # unless a majority judged it a straggler.
        return self.now - self.last_heard >= self.cfg.election_ticks or self.gate.distrust_view == self.view

    @handles(_handlers, PreVote)
    def _on_prevote(self, src: int, m: PreVote) -> None:
        if ballot_owner(m.view) != src:
            return
        # No view is adopted here: the pre-vote's view is only a proposal.
        self.send(src, PreVoteReply(m.view, self._grants_prevote(src, m.view)))
        if m.view <= self.view:
            self.send(src, Ping(self.view, -1))  # it is behind: tell it our view

    @handles(_handlers, PreVoteReply)
    def _on_prevote_reply(self, src: int, m: PreVoteReply) -> None:
        if not m.ok or m.view != self._prevote_view:
            return
        if ballot_round(self.view) >= ballot_round(m.view):
            self._prevote_view = -1  # we moved to this view or past it meanwhile
            return
        self._prevotes.add(src)
        if len(self._prevotes) >= self.quorum:
            self._prevote_view = -1
            if not self.gate.may_vote(self.id, self.now):
                # We answered the sequencer's ping since the pre-vote began: our own
                # vote is promised to it. Stand again once the promise is over.
                self.election_due = max(self.election_due, self.gate.promise_until)
                return
            self._start_election()

    def _start_election(self) -> None:
        self._prevote_view = -1
        view = self.gate.stand()
        self.view_serving = False
        self._recover_end_seen = -1
        self.phase = "candidate"
        self.persist(["V", view])
        self.votes = {}
        self._deferred = []
        self.vote_base = self.o_committed
        self._vote_tick = self.now
        self.lease_expiry = -1
        self.acked = [0] * self.n
        self.stats["view_changes_started"] += 1
        self.election_due = self._election_deadline()
        self.broadcast(VRequest(view, self.vote_base))

    @handles(_handlers, VRequest)
    def _on_vrequest(self, src: int, m: VRequest) -> None:
        if ballot_owner(m.view) != src or m.from_slot < 0:
            return
        if m.view < self.view:
            self.send(src, Ping(self.view, -1))
            return
        if m.from_slot < self.floor_slot:
            # We cannot report the slots we compacted; a vote without them would let
            # the candidate fill chosen slots with no-cl. Withhold it (and do not join
            # the view); the candidate catches up from our snapshot and tries again.
            self.send(src, self._compacted_notice())
            return
        # The promises hold in every view: a replica joins a candidate's view from any
        # message (its pings, say) without voting, so a retried VRequest may come in
        # our own view and must meet the same conditions as the first one.
        if not self.gate.may_vote(src, self.now):
            return  # restarted (we may have promised a lease we no longer remember), or
            # our lease promise to another sequencer still holds
        if m.view > self.view:
            self._adopt_view(m.view)
        slots = [
            [j, s.leader, s.view, s.committed] for j, s in sorted(self.oslots.items()) if j >= m.from_slot
        ]
        self.send(src, Vote(self.view, self.o_committed, slots, list(self.c_max), self.o_view, self._taken()))

    def _taken(self) -> list[int]:
        """Per leader l, the highest C-instance l is known here to have taken: one we
        accepted at a ballot of l's own (l proposed it, or re-prepared its own, and
        l's next_inst is past it for good), or a chosen command (l proposed it). Below
        it, every instance was proposed by l too (in order). ``c_max`` is no such
        bound: a recoverer's no-op, chosen or not, raises it, and l's next command may
        still take an open instance below it (reviews 6 and 7)."""
        out = [f - 1 for f in self.floor_inst]
        for leader in range(self.n):
            top = out[leader]
            for inst, c in self.clog[leader].items():
                # A chosen command was proposed by l (only l makes its commands), and
                # l proposes in order; a chosen no-op may be a recoverer's, with open
                # instances of l below it (review 7).
                if inst > top and (ballot_owner(c.ballot) == leader or (c.committed and c.cmds is not None)):
                    top = inst
            out[leader] = top
        out[self.id] = max(out[self.id], self.next_inst - 1)
        return out

    @handles(_handlers, Vote)
    def _on_vote(self, src: int, m: Vote) -> None:
        if self.phase != "candidate" or m.view != self.view:
            if m.view > self.view:
                self._adopt_view(m.view)
            return
        for entry in m.slots:
            if type(entry) is not list or len(entry) != 4 or type(entry[0]) is not int or type(entry[1]) is not int:
                return
            if not END <= entry[1] < self.n:
                return
        if len(m.c_max) != self.n or len(m.c_own) != self.n:
            return
        self.votes[src] = m
        if len(self.votes) + 1 >= self.quorum:
            self._take_office()

    def _take_office(self) -> None:
        """Reconstruct the assignment log from a majority of votes (Fig. 7)."""
        # Slots below our floor are chosen and executed (a snapshot covers them); every
        # vote reported all slots >= vote_base (voters compacted past it refuse).
        base = max(self.vote_base, self.floor_slot)
        voters = sorted(self.votes) + [self.id]
        reports = [[(j, s.view, s.leader, s.committed) for j, s in self.oslots.items()]]
        reports += [[(j, view, leader, committed) for j, leader, view, committed in v.slots] for v in self.votes.values()]
        best = pick_highest(reports, base)  # slot -> (view, leader, committed)
        log: dict[int, int] = {j: e[1] for j, e in best.items()}
        # V (docs/membership.md): an END that may be chosen ends the recovered log.
        last_view = max([self.o_view] + [v.o_view for v in self.votes.values()])
        term = self._end_below(base)
        if term < 0:
            term = self._judge_end(best, log, last_view)
        end = max(log) + 1 if log else base
        if self.n == 5:
            self._fig7(base, log, voters, last_view, best)
            end = max(log) + 1 if log else base
            if end == base and term < 0:
                # Nothing to re-propose: propose one no-cl slot anyway and serve only
                # once a majority took it, so that every later majority holds a
                # voter that knows this view served (its o_view, for Fig. 7).
                log[base] = NOCL
                end = base + 1
        if term >= 0:
            end = max(base, term + 1)  # nothing after a chosen END is chosen (Fig. 7 fills included)
        self.end_slot = term
        leaders = [log.get(j, NOCL) for j in range(base, end)]
        # Become the sequencer of this view.
        self.phase = "recovering"
        self.stats["elections"] += 1
        self._last_view_change = self.now
        for k, leader in enumerate(leaders):
            j = base + k
            old = self.oslots.get(j)
            if old is not None and old.committed:
                if old.leader != leader:
                    raise SafetyViolation(f"new sequencer {self.id}: committed slot {j} changes {old.leader}->{leader}")
                continue
            if j < self.exec_slot and old is not None and old.leader != leader:
                raise SafetyViolation(f"new sequencer {self.id}: executed slot {j} changes {old.leader}->{leader}")
            self._accepted(j, leader, self.view)
        for j in [j for j in self.oslots if j >= end]:
            del self.oslots[j]  # proposed by an old view and seen by no voter: void
        self._reset_prefix()
        self._rebuild_sequencer_state(end)
        self._phantoms = []
        if self.n == 5:
            # Slots name leaders by position: a slot of leader l past every instance
            # l is known to have taken (_taken: accepted at l's own ballot, or chosen)
            # may stand for an instance l has not proposed yet (a Fig. 7 fill shifts
            # the numbering, this view's or an earlier one's that never served). If
            # l's next command took it, it would be ordered before commands we
            # acknowledge meanwhile (§3.4). Decide those instances first (a no-op
            # where l has nothing); nothing after the first of them commits, and we
            # serve only then.
            taken = self._taken()
            for leader in range(self.n):
                known = max([taken[leader]] + [v.c_own[leader] for v in self.votes.values()])
                lo = max(known + 1, self.floor_inst[leader])
                self._phantoms += [(leader, k) for k in range(lo, self.assigned[leader])]
            if self._phantoms_pending():
                self._phantom_slot = min(self._slot_of(l, k) for l, k in self._phantoms)
                self._recover_phantoms()
        self.recover_end = end
        self.history = {}
        self.unknown_keys_slot = end - 1
        self.lease_acks = [-1] * self.n
        self.votes = {}
        if leaders:
            self._propose_slots(base, leaders)
        else:
            self._recompute_majority()
        if self.majority_prefix >= end:
            self._start_serving()
        self._ping()

    def _end_below(self, base: int) -> int:
        """An END this candidate knows chosen: executed, or committed below ``base`` (its
        committed prefix, which no vote reports): -1 if none. A candidate that missed it
        would order new commands after it (swarm search --reconfig, seed 100452)."""
        if self.ended >= 0:
            return self.ended
        return min((j for j, s in self.oslots.items() if j < base and s.leader == END), default=-1)

    def _judge_end(self, best: dict, log: dict[int, int], last_view: int) -> int:
        """V (docs/membership.md): the lowest END in the recovered log that may have been
        chosen, or -1. A committed END is chosen, whatever view it is reported at (a
        replica that holds a slot committed keeps the view it took it in when a later
        view re-proposes it, while its o_view moves on: review of 2026-11-27, D1).
        Otherwise an END at slot j, view v_E, may be chosen only if no view after v_E
        served (``last_view``) and no value after j is from a view after v_E: a view that
        found a chosen END re-proposed it and nothing after it. Any other END was not
        chosen and becomes a no-op (mutates ``log``)."""
        for j in sorted(k for k, leader in log.items() if leader == END):
            v_end, _leader, committed = best[j]
            if committed or (v_end >= last_view and all(best[k][0] <= v_end for k in best if k > j)):
                return j
            log[j] = NOCL
        return -1

    def _fig7(self, base: int, log: dict[int, int], voters: list[int], last_view: int, best: dict | None = None) -> tuple[int, int] | None:
        """N = 5 (paper Fig. 7): ``rules.fig7`` on what this candidate and its voters
        report. The last sequencer that may have proposed unseen slots served only once
        a majority took its O-accepts, so some voter reports its view (``o_view``); a
        higher reported view whose sequencer never served re-proposed every slot that
        may have been executed, to the voter that reports it."""
        votes = self.votes.values()
        oslots, floor_inst = self.oslots, self.floor_inst

        def below(m: int) -> int:  # O-slots naming m under base (compacted ones included)
            return floor_inst[m] + sum(1 for j, s in oslots.items() if j < base and s.leader == m)

        return fig7(self.n, base, log, best, voters, last_view, [self.c_max] + [v.c_max for v in votes], below)

    def _rebuild_sequencer_state(self, end: int) -> None:
        end = max(end, self.floor_slot)
        self.next_slot = end
        # Below the floor, leader l owns exactly floor_inst[l] slots.
        self.assigned = list(self.floor_inst)
        for j in range(self.floor_slot, end):
            slot = self.oslots.get(j)
            if slot is not None and slot.leader >= 0:
                self.assigned[slot.leader] += 1
        self._commit_sent = [0] * self.n

    def _start_serving(self) -> None:
        self.phase = "normal"
        deferred, self._deferred = self._deferred, []
        for leader, inst, keys in deferred:
            self._assign(leader, inst, keys)

    # --- leases and failure detection -------------------------------------------------

    def _ping(self) -> None:
        if not self._handing_over():
            # Our own promise (we vote for nobody else meanwhile); not while handing
            # over: we must be able to vote in our target's election (review 9).
            self.gate.promise(self.id, self.now + self.cfg.lease_ticks)
        self.broadcast(Ping(self.view, self.now))

    @handles(_handlers, Ping)
    def _on_ping(self, src: int, m: Ping) -> None:
        if m.view < self.view:
            if m.tick != ALIVE or src == ballot_owner(m.view):
                self.send(src, Ping(self.view, -1), lazy=m.tick < 0)
            return
        if m.view > self.view:
            self._adopt_view(m.view)
        if src != self.sequencer or m.tick < 0:
            return
        self._heard_from_sequencer()
        if self.gate.distrust_view != self.view:
            # ``now`` counts whole ticks and part of this one has passed: one tick more
            # makes the promise last at least lease_ticks full ticks after the ping
            # arrived, which the sequencer's lease (lease_ticks * (1 - drift) of its
            # own ticks from the send) never outlasts while the clocks' rates differ
            # by at most ``drift``.
            self.gate.promise(src, self.now + self.cfg.lease_ticks + 1)
            self.send(src, Pong(self.view, m.tick))

    @handles(_handlers, Pong)
    def _on_pong(self, src: int, m: Pong) -> None:
        if m.view != self.view or self.id != self.sequencer:
            return
        if m.tick > self.lease_acks[src]:
            self.lease_acks[src] = m.tick
            acks = sorted([self.lease_acks[r] if r != self.id else self.now for r in range(self.n)], reverse=True)
            granted = acks[self.quorum - 1]
            if granted >= 0 and self.gate.distrust_view != self.view:
                self.lease_expiry = granted + int(self.cfg.lease_ticks * (1 - self.cfg.drift))

    @handles(_handlers, Handover)
    def _on_handover(self, src: int, m: Handover) -> None:
        if m.view != self.view or src != self.sequencer:
            return
        self.gate.release()  # the sequencer released us from our lease promise
        self.gate.distrust_view = self.view
        if m.target == self.id:
            self._start_election()

    # --- straggler detection (paper §4) ---------------------------------------------

    def _straggler_window(self) -> None:
        """Paper §4: judge the sequencer by how well it serves my requests.

        Closed-loop clients slow down with a slow sequencer, so counting O-accepts
        against requests hides it, and a slow sequencer in the thrifty quorum slows
        replication too. So compare, over the window, the mean time my instances take
        to become ready (those still waiting count with their age) with the fastest
        this replica has ever seen, which is about its round trip to the quorum and
        the sequencer. Majority confirmation (each confirmer on its own evidence, see
        ``_on_straggler``) and the cooldown guard against misjudging mere load.
        """
        now = self.now
        total, count = self._window_total, self._window_count
        for p in self.unready.values():
            total += now - p.born
            count += 1
        self._window_total = self._window_count = 0
        self._window_start = now
        self._last_window = (total, count, self._window_served)  # status only
        if self.id == self.sequencer or self.phase != "normal":
            self._strikes = self._doubts = 0
            return
        enough = count >= self.cfg.straggler_min_demand
        # An instance answered within the tick it was proposed in took up to one tick
        # (the clock's resolution): a best of 0 would make two ticks of queueing on a
        # busy machine look like a slow sequencer. And never below the configured
        # floor: queueing that every replica suffers is no sign of a slow sequencer.
        best = max(self._best_ready, 1, self.cfg.straggler_floor_ticks)
        served, base = self._window_served, self._served_baseline
        demand = bool(self.unready) and base >= self.cfg.straggler_min_demand

        def late(times_best: int) -> bool:
            return enough and total > count * (times_best * best + 2)

        def worse(times_best: int, served_num: int, served_den: int) -> bool:
            # Signal 1: my instances took times_best x my best (+ 2 ticks) to become
            # ready. Signal 2 (the paper's): the O-slots served for me fell below
            # served_num/served_den of my healthy rate while I had commands waiting,
            # and they were late at all (above my best + 2 ticks): served below the
            # healthy rate with instances as fast as ever is my demand falling
            # (clients gone, or bigger batches on a loaded machine), not the sequencer.
            return late(times_best) or (demand and served * served_den < base * served_num and late(1))

        slow = worse(3, 1, 2)
        # The same signals, milder: the window is doubtful. Only a run of doubtful
        # windows (straggler_agree_strikes) lets me confirm a peer's request: one is
        # noise (a loaded machine, my own clients' demand moving by a third).
        doubtful = slow or worse(2, 7, 10)
        if not slow:
            self._served_baseline = served if base == 0 else (4 * base + served) / 5
        self._window_served = 0
        self._strikes = self._strikes + 1 if slow else 0
        self._doubts = self._doubts + 1 if doubtful else 0
        cooled = now - self._last_view_change >= self.cfg.straggler_cooldown_ticks
        if self._strikes >= self.cfg.straggler_strikes and cooled:
            self._straggler_votes[self.id] = now
            self.broadcast(Straggler(self.view, True))  # asked again every bad window

    def _fresh_vote(self, r: int) -> bool:
        """``r``'s judgment "the sequencer is slow" was made or heard within two windows."""
        heard = self._straggler_votes.get(r)
        return heard is not None and self.now - heard <= 2 * self.cfg.straggler_window_ticks

    @handles(_handlers, Straggler)
    def _on_straggler(self, src: int, m: Straggler) -> None:
        if m.view != self.view or self.id == self.sequencer or not m.slow:
            return
        self._straggler_votes[src] = self.now
        # Confirm only on my own evidence: doubtful windows of my own in a row. A slowed
        # ordinary replica finds its own instances late and blames the sequencer; the
        # healthy replicas must not agree on one noisy window.
        if self._doubts >= self.cfg.straggler_agree_strikes and not self._fresh_vote(self.id):
            self._straggler_votes[self.id] = self.now
            self.send(src, Straggler(self.view, True))
        if not self._fresh_vote(self.id):
            return
        fresh = sum(1 for r in self._straggler_votes if self._fresh_vote(r))
        if fresh >= self.quorum and self.gate.distrust_view != self.view:
            # Stop renewing the slow sequencer's lease; elect once our promise expires.
            self.gate.distrust_view = self.view
            self.election_due = max(self.now, self.gate.promise_until) + self.rng.randrange(max(1, self.cfg.election_ticks // 4))

    # --- timers ------------------------------------------------------------------------

    def _on_tick(self) -> None:
        now, cfg = self.now, self.cfg
        if self._oc_due:
            self._oc_due = False
            self.persist(["OC", self.o_committed])
        resend = cfg.resend_ticks
        # My instances still waiting: resend the C-accept to everyone not yet acked,
        # and the C-request (the sequencer assigns idempotently, so repeats are safe).
        suspects = 0
        for peer in range(self.n):
            if self.suspected(peer):
                suspects |= 1 << peer
        if self.id not in self.crec:
            for inst, p in self.unready.items():
                if not p.rec.committed and p.sent_to & suspects & ~p.acks:
                    # A peer we counted on went quiet: go to everyone else now.
                    p.sent_to = (1 << self.n) - 1
                    self._resend_caccept(inst, p)
                    continue
                if now - p.sent_tick < resend:
                    continue
                p.sent_tick = now
                if not p.rec.committed:
                    self._resend_caccept(inst, p)
                if self.id == self.sequencer:
                    self._assign(self.id, inst, self._keys(p.cmds))
                else:
                    self.send(self.sequencer, CRequest(self.view, self.id, inst, self._keys(p.cmds)))
        if self.id == self.sequencer:
            if self.phase == "stale":
                if now >= self.gate.no_vote_until and now >= self.election_due:
                    self._start_prevote()
            elif self.phase == "candidate":
                if now - self._vote_tick >= cfg.heartbeat_ticks:
                    self._vote_tick = now
                    self.broadcast(VRequest(self.view, self.vote_base))
                if now >= self.election_due:
                    self._start_election()  # split vote or no majority: next round
            elif self._lost_quorum():
                self._step_down()
            else:
                self._sequencer_tick()
        elif now >= self.election_due and now >= self.gate.no_vote_until and now >= self.gate.promise_until:
            self._start_prevote()
        if self._blocked_on is not None:
            self._on_blocked_tick()
        for leader, rec in list(self.crec.items()):
            if now - rec.started >= resend:
                del self.crec[leader]  # stuck (lost messages, competing ballots): retry
                # ... after a random share of a resend period, so that competing
                # recoverers do not restart in lockstep.
                self._crec_after[leader] = now + self.rng.randrange(max(1, resend))
                if leader == self.id:
                    self._start_crecovery(leader, min(self.unready, default=rec.from_inst), max(rec.need, self.next_inst - 1))
        if self._reads:
            for rid, (client, seq, op, sent) in list(self._reads.items()):
                if now - sent >= resend:
                    del self._reads[rid]
                    self._read_via_log(client, seq, op)
        if now - self._window_start >= cfg.straggler_window_ticks:
            self._straggler_window()

    def _sequencer_tick(self) -> None:
        now = self.now
        if self.phase == "recovering":
            if self._phantoms_pending():
                self._recover_phantoms()
            else:
                self._recompute_majority()  # a snapshot may have decided the last one
        if now % self.cfg.heartbeat_ticks == 0:
            if self._handing_over():
                # A Handover may be lost, or its target cut off: resend it, and if no
                # new view came within an election timeout, step down so that the
                # replicas elect someone (review 9: else no lease, ever).
                _view, target, since = self._handover
                if now - since >= self.cfg.election_ticks:
                    self._handover = None
                    self._step_down()
                    return
                self.broadcast(Handover(self.view, target))
            self._ping()
        for dst in range(self.n):
            if dst == self.id:
                continue
            # A peer whose acked prefix (in this view) is below our floor: we no longer
            # hold the values it may lack. Tell it; it acks if it has them, else it
            # fetches our snapshot.
            behind = self.acked[dst] < self.floor_slot
            noticed = False
            # O-accepts a peer has not acked for a while: resend from its acked prefix.
            if self.acked[dst] < self.next_slot and now - self._oaccept_tick[dst] >= self.cfg.resend_ticks:
                start = self.acked[dst]
                if behind:
                    self.send(dst, self._compacted_notice())
                    noticed = True
                    # ... and what we hold from the floor: whatever it lacks below, it
                    # must take one of our O-accepts before it may ack this view.
                    start = self.floor_slot
                if start < self.next_slot:
                    leaders = [self.oslots[j].leader for j in range(start, min(self.next_slot, start + OSLOTS_PER_MSG_MAX))]
                    self.send(dst, OAccept(self.view, start, leaders, self.phase == "normal", self.recover_end))
                self._oaccept_tick[dst] = now
            # The committed prefix, when it moved and as a heartbeat.
            upto = self.o_committed
            if upto > self._commit_sent[dst] or now % self.cfg.heartbeat_ticks == 0:
                if behind:
                    if not noticed:
                        self.send(dst, self._compacted_notice())
                    self._commit_sent[dst] = upto
                    continue
                start = min(self.acked[dst], upto)
                if upto - start > OSLOTS_PER_MSG_MAX:
                    upto = start + OSLOTS_PER_MSG_MAX
                leaders = [self.oslots[j].leader for j in range(start, upto)]
                self.send(dst, OCommit(self.view, upto, start, leaders))
                self._commit_sent[dst] = upto

    def _on_blocked_tick(self) -> None:
        leader, inst = self._blocked_on
        c = self.clog[leader].get(inst)
        if c is not None and c.committed:
            # Committed since we blocked on it: the block is stale until the deferred
            # execute() clears it (defer_execution; the immediate path clears it in the
            # step that commits). Neither fetch nor recover what we hold (review 65).
            return
        waited = self.now - self._blocked_since
        if waited > 0 and waited % max(1, self.cfg.resend_ticks // 2) == 0:
            self._fetch_missing()
        if leader == self.id or leader in self.crec:
            return
        # The next replica after the leader recovers first; others later, in turn.
        distance = (self.id - leader) % self.n
        stagger = max(1, self.cfg.heartbeat_ticks) * (distance - 1)
        if self.suspected(leader):
            due = max(0, self.heard[leader] + self.cfg.election_ticks + stagger - self._blocked_since)
        else:
            due = self.cfg.recovery_ticks * (1 + distance)
        if waited >= due and self.now >= self._crec_after[leader]:
            self._start_crecovery(leader, inst, inst)

    def _fetch_missing(self) -> None:
        if self._blocked_on is None:
            return
        leader, inst = self._blocked_on
        # Ask the leader first, then rotate through the others.
        peers = [leader] + [p for p in self.cfg.peer_order[self.id] if p != leader]
        peers = [p for p in peers if p != self.id]
        dst = peers[self._fetch_rr % len(peers)]
        self._fetch_rr += 1
        self._fetching = True
        self.send(dst, Fetch(self.view, leader, inst))

    @handles(_handlers, Fetch)
    def _on_fetch(self, src: int, m: Fetch) -> None:
        """Send the committed run of ``leader``'s instances starting at ``inst``."""
        if not 0 <= m.leader < self.n or m.inst < 0:
            return
        if m.inst < self.floor_inst[m.leader]:
            self.send(src, self._compacted_notice(m.leader))  # fetch my snapshot
            return
        log = self.clog[m.leader]
        for inst in range(m.inst, m.inst + FETCH_INSTANCES_MAX):
            c = log.get(inst)
            if c is None or not c.committed:
                break
            self.send(src, CCommit(self.view, m.leader, inst, c.ballot, True, c.cmds))

    # --- observability ------------------------------------------------------------------

    def idle(self) -> bool:
        """Nothing pending, in flight, blocked or ordered-but-unexecuted here."""
        return (
            not self.unready
            and not self._pending
            and not self.crec
            and self._blocked_on is None
            and self.exec_slot >= self.o_committed
            and (self.id != self.sequencer or self.o_committed >= self.next_slot)
        )

    def lease_valid(self) -> bool:
        return self.id == self.sequencer and self.phase == "normal" and self.now < self.lease_expiry

    def status(self) -> dict:
        return {
            "protocol": self.protocol,
            "id": self.id,
            "view": self.view,
            "sequencer": self.sequencer,
            "phase": self.phase,
            "lease": self.lease_valid(),
            "next_inst": self.next_inst,
            "unready": len(self.unready),
            "pending": len(self._pending),
            "o_prefix": self.o_prefix,
            "o_committed": self.o_committed,
            "exec_slot": self.exec_slot,
            "floor_slot": self.floor_slot,
            "executed": self.stats["executed"],
            "epoch": self.cfg.epoch,
            "closing": self.end_slot >= 0 or self.executor.reconfig is not None,
            "ended": self.ended,
            "straggler": {  # paper §4: how this replica judges the sequencer (window of its own instances)
                "strikes": self._strikes,
                "doubts": self._doubts,
                "best_ready_ticks": self._best_ready if self._best_ready < 1 << 30 else None,
                "last_window": {"ticks": self._last_window[0], "instances": self._last_window[1],
                                "served": self._last_window[2]},
                "served_baseline": round(self._served_baseline, 1),
                "votes": sorted(r for r in self._straggler_votes if self._fresh_vote(r)),
            },
        }
