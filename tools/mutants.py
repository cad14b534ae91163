"""Planted bugs for mutation testing (issue 9, acceptance 3). Data plus the patcher.

Each mutant is one small textual patch of the core: in ``file`` (relative to the repo
root) the exact snippet ``old`` must occur exactly once and is replaced by ``new``.
An anchor that is missing or not unique is an error, never a skip: when the core
changes, this list must change with it (``tests/consensus/test_mutants_list.py``
checks every anchor against the tree). ``rule`` names the rule the bug breaks (the
paper's figure or section, or the implementation note's trap), ``description`` says
in one line what the planted bug does.

The runner is ``tools/mutate.py``; it applies each patch to a copy of the repo, never
to the tree itself. ``docs/mutation.md`` has the table of results.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SDP = "consensus/core/sdpaxos.py"
MP = "consensus/core/multipaxos.py"
RULES = "consensus/core/rules.py"
NEAR = "consensus/core/nearness.py"
BASE = "consensus/core/replica.py"
EPOCHS = "consensus/core/epochs.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    rule: str
    description: str


class AnchorError(Exception):
    """A mutant's ``old`` snippet is missing from its file or occurs more than once."""


MUTANTS: list[Mutant] = [
    Mutant(
        name="bug1-lease-promise",
        file=SDP,
        old="""\
        if not self.gate.may_vote(src, self.now):
            return  # restarted (we may have promised a lease we no longer remember), or
            # our lease promise to another sequencer still holds
        if m.view > self.view:
            self._adopt_view(m.view)
""",
        new="""\
        if m.view > self.view:
            if not self.gate.may_vote(src, self.now):
                return
            self._adopt_view(m.view)
""",
        rule="§3.5 lease: a pong promises no vote for another sequencer for lease_ticks, in every view",
        description="_on_vrequest checks the lease and restart promises only when the VRequest raises the view, "
        "so a voter that joined the candidate's view from its pings votes while its promise holds",
    ),
    Mutant(
        name="bug2-fig7-last-view",
        file=SDP,
        old="last_view = max([self.o_view] + [v.o_view for v in self.votes.values()])",
        new="last_view = self.o_view",
        rule="Fig. 7 (N=5): the last sequencer is the one of the highest o_view among the voters",
        description="_fig7 takes the last serving view from the candidate's own o_view only, "
        "so it may think the last sequencer voted and skip filling R_m's fast-committed slots",
    ),
    Mutant(
        name="bug2b-no-nocl-slot",
        file=SDP,
        old="""\
            if end == base and term < 0:
                # Nothing to re-propose: propose one no-cl slot anyway and serve only
                # once a majority took it, so that every later majority holds a
                # voter that knows this view served (its o_view, for Fig. 7).
                log[base] = NOCL
                end = base + 1
""",
        new="",
        rule="Fig. 7 precondition (N=5): a view serves only once a majority took one of its O-accepts",
        description="a new N=5 sequencer with an empty recovered suffix serves at once, "
        "so no voter of a later majority may know (o_view) that this view served",
    ),
    Mutant(
        name="bug3-mixed-ballot-acks",
        file=SDP,
        old="""\
        if ballot != self.ballot:
            self.acks = 0
        self.ballot, self.cmds = ballot, cmds
""",
        new="""\
        self.ballot, self.cmds = ballot, cmds
""",
        rule="Paxos phase 2: a value is chosen by a quorum of acceptors of one ballot",
        description="Proposal.follow keeps the acks gathered for the old ballot when the ballot changes, "
        "so a command leader commits with acks mixing two ballots",
    ),
    Mutant(
        name="bug4-reprepare-no-keys",
        file=SDP,
        old="""\
            if self.id != self.sequencer:
                for inst, p in self.unready.items():
                    self.send(self.sequencer, CRequest(self.view, self.id, inst, self._keys(p.cmds)))
""",
        new="""\
            if self.id != self.sequencer:
                for inst, p in self.unready.items():
                    self.send(self.sequencer, CRequest(self.view, self.id, inst, []))
""",
        rule="§3.5 reads: the sequencer's history table holds the last slot of every write's keys",
        description="after re-preparing its own instances, a command leader sends C-requests without keys, "
        "so the history table misses the write and a lease read returns the old value",
    ),
    Mutant(
        name="quorum-off-by-one",
        file=SDP,
        old="""\
        p.acks |= 1 << src
        if p.acks.bit_count() >= self.quorum:
            self._commit_c(self.id, m.inst, p)
""",
        new="""\
        p.acks |= 1 << src
        if p.acks.bit_count() >= self.quorum - 1:
            self._commit_c(self.id, m.inst, p)
""",
        rule="Paxos phase 2: commit only with acks from a majority",
        description="_on_cack commits a C-instance at quorum - 1 acks (the command leader alone with N=3)",
    ),
    Mutant(
        name="caccept-vs-accepted-ballot",
        file=SDP,
        old="""\
        c = log.get(m.inst)
        if m.ballot < self.promised[m.leader]:
""",
        new="""\
        c = log.get(m.inst)
        if c is not None and m.ballot < c.ballot:
""",
        rule="Paxos phase 2b: accept only a ballot not below the promise",
        description="_on_caccept compares the C-accept's ballot with the instance's accepted ballot "
        "instead of the promise, so it accepts after promising a recoverer a higher ballot",
    ),
    Mutant(
        name="recovery-first-value",
        file=SDP,
        old="""\
        best = pick_highest(rec.promises.values())
""",
        new="""\
        best = {}
        for report in rec.promises.values():
            for inst, ballot, value, committed in report:
                cur = best.get(inst)
                if cur is None or (committed and not cur[2]):
                    best[inst] = (ballot, value, committed)
""",
        rule="Paxos phase 1: re-propose the value accepted at the highest ballot",
        description="_recovery_propose keeps the first reported value per instance regardless of ballot "
        "(committed reports still win)",
    ),
    Mutant(
        name="reply-before-persist",
        file=SDP,
        old="""\
                self.c_max[m.leader] = m.inst
            self.persist(["C", m.leader, m.inst, m.ballot, m.cmds])
            self.send(src, CAck(self.view, m.leader, m.inst, m.ballot, True))
""",
        new="""\
                self.c_max[m.leader] = m.inst
            self.send(src, CAck(self.view, m.leader, m.inst, m.ballot, True))
""",
        rule="ready.py: persist before send; an acceptor's ack vouches for durable state",
        description="_on_caccept sends the C-ack without persisting the accepted C-instance, "
        "so a crash and restart forgets a value the quorum counted on",
    ),
    Mutant(
        name="lease-one-pong",
        file=SDP,
        old="granted = acks[self.quorum - 1]",
        new="granted = m.tick",
        rule="§3.5 lease: valid only with promises from a majority",
        description="_on_pong grants the lease from the single pong just received "
        "instead of the quorum-th most recent one (no effect with N=3, where one pong is a majority)",
    ),
    Mutant(
        name="lease-from-pong-arrival",
        file=SDP,
        old="self.lease_expiry = granted + int(self.cfg.lease_ticks * (1 - self.cfg.drift))",
        new="self.lease_expiry = self.now + int(self.cfg.lease_ticks * (1 - self.cfg.drift))",
        rule="§3.5 lease: count the lease from the ping's send tick (before any promise started)",
        description="_on_pong counts the lease from the pong's arrival, "
        "so the sequencer's lease outlives the voters' promises by a one-way delay",
    ),
    Mutant(
        name="oslot-out-of-order",
        file=SDP,
        old="        while self.assigned[leader] <= inst:\n",
        new="        if self.assigned[leader] <= inst:\n",
        rule="Fig. 5 line 13 (trap 1): C_n^i owns the (i+1)-th O-slot naming n; assignment fills up to it",
        description="_assign gives a C-request one slot even when earlier instances of that CL have none, "
        "so a later instance's keys land on the slot that stands for an earlier one",
    ),
    Mutant(
        name="no-noop-fill",
        file=SDP,
        old="        leaders = [log.get(j, NOCL) for j in range(base, end)]\n",
        new="""\
        leaders = [log[j] for j in sorted(log)]  # holes dropped
        end = base + len(leaders)
""",
        rule="§3.3 view change: holes in the recovered O-log are filled with no-cl, slots keep their index",
        description="_take_office drops holes from the recovered O-log, so later slots shift down",
    ),
    Mutant(
        name="fig7-off-by-one",
        file=RULES,
        old="needed = c_m + 1  # R_m may have up to C[m] + 1 ready instances (0-based C[m])",
        new="needed = c_m  # R_m may have up to C[m] + 1 ready instances (0-based C[m])",
        rule="Fig. 7 (N=5): give R_m slots until it owns C[m] + 1 of them",
        description="_fig7 gives R_m one slot too few, so R_m's last fast-committed instance loses its slot",
    ),
    Mutant(
        name="n5-ready-rule-as-n3",
        file=SDP,
        old="return ready_limit(self.n, self.id == self.sequencer, self.my_committed, self.my_in_prefix, self.my_in_majority)",
        new="return ready_limit(3 if self.n == 5 else self.n, self.id == self.sequencer, self.my_committed, self.my_in_prefix, self.my_in_majority)",
        rule="Fig. 5 (N=5): ready on the sequencer's O-accept (non-sequencer) or a majority (sequencer)",
        description="_ready_count uses the N=3 rule (committed O-slots) for N=5: safe, "
        "but every N=5 write waits for the O-commit (a latency bug)",
    ),
    Mutant(
        name="exec-uncommitted-oslot",
        file=SDP,
        old="if slot is None or not (slot.committed or (slot.fast and slot.durable and slot.leader == me and slot.view == self.view)):",
        new="if slot is None or not (slot.committed or slot.view == self.view):",
        rule="execution: only committed O-slots (or the CL's own N=5 fast slot) execute",
        description="_execute runs every O-slot accepted in the current view, committed or not",
    ),
    Mutant(
        name="multipaxos-recovery-ignores-views",
        file=MP,
        old="        best = pick_highest(reports, base)  # slot -> (view, batch, committed)\n",
        new="""\
        best = {}
        for report in reports:
            for j, view, batch, committed in report:
                cur = best.get(j)
                if j >= base and (cur is None or (committed and not cur[2])):
                    best[j] = (view, batch, committed)
""",
        rule="Paxos phase 1 (Multi-Paxos view change): keep the highest-view value per slot",
        description="Multi-Paxos _take_office keeps the first report per slot (its own first) "
        "regardless of the view it was accepted in (committed reports still win)",
    ),
    # --- beyond the required list -------------------------------------------------------
    Mutant(
        name="vote-without-joining-view",
        file=SDP,
        old="""\
        if m.view > self.view:
            self._adopt_view(m.view)
        slots = [
            [j, s.leader, s.view, s.committed] for j, s in sorted(self.oslots.items()) if j >= m.from_slot
        ]
        self.send(src, Vote(self.view, self.o_committed, slots, list(self.c_max), self.o_view, self._taken()))
""",
        new="""\
        slots = [
            [j, s.leader, s.view, s.committed] for j, s in sorted(self.oslots.items()) if j >= m.from_slot
        ]
        self.send(src, Vote(m.view, self.o_committed, slots, list(self.c_max), self.o_view, self._taken()))
""",
        rule="§3.3 view change: a vote is a promise; the voter joins the view and refuses older O-accepts",
        description="_on_vrequest votes without adopting the candidate's view, "
        "so the voter keeps accepting the old sequencer's O-accepts after reporting its log",
    ),
    Mutant(
        name="restart-forgets-lease",
        file=SDP,
        old="self.gate = ViewGate(node_id, cfg.initial_view, cfg.lease_ticks + 2)\n",
        new="self.gate = ViewGate(node_id, cfg.initial_view, 0)\n",
        rule="§3.5 lease: a restarted replica waits one lease before voting (its promise was volatile)",
        description="a restarted replica votes at once, breaking a lease promise it no longer remembers",
    ),
    Mutant(
        name="short-commit-any-ballot",
        file=SDP,
        old="        elif c is None or c.ballot != m.ballot:\n",
        new="        elif c is None:\n",
        rule="trap 6: a short C-commit names a ballot; only that ballot's value is committed",
        description="_on_ccommit marks the held value committed on a short commit of another ballot",
    ),
    Mutant(
        name="vote-below-floor",
        file=SDP,
        old="""\
        if m.from_slot < self.floor_slot:
            # We cannot report the slots we compacted; a vote without them would let
            # the candidate fill chosen slots with no-cl. Withhold it (and do not join
            # the view); the candidate catches up from our snapshot and tries again.
            self.send(src, self._compacted_notice())
            return
""",
        new="",
        rule="compaction: a VRequest below the floor gets a Compacted notice, not a vote",
        description="_on_vrequest votes from below its floor, reporting compacted (chosen) slots as empty",
    ),
    Mutant(
        name="cpromise-below-floor",
        file=SDP,
        old="""\
        if m.from_inst < self.floor_inst[m.leader]:
            # Those instances are chosen but their values are gone from our log.
""",
        new="""\
        if False:
            # Those instances are chosen but their values are gone from our log.
""",
        rule="compaction: a CPrepare below the floor gets a Compacted notice, not a promise",
        description="_on_cprepare promises below its floor, reporting compacted (chosen) instances as empty",
    ),
    Mutant(
        name="no-check-quorum",
        file=SDP,
        old="        return heard + 1 < self.quorum\n",
        new="        return False\n",
        rule="check-quorum (Raft §6.2): a sequencer cut off from a majority steps down",
        description="_lost_quorum never fires, so a sequencer nobody answers keeps pinging and holds the view",
    ),
    Mutant(
        name="multipaxos-commit-minority",
        file=MP,
        old="upto = min(sorted(self.acked, reverse=True)[self.quorum - 1], self.prefix)",
        new="upto = min(sorted(self.acked, reverse=True)[self.quorum - 2], self.prefix)",
        rule="Paxos phase 2 (Multi-Paxos): commit a slot once a majority holds it",
        description="Multi-Paxos _recompute_commit commits at quorum - 1 holders (the leader alone with N=3)",
    ),
    Mutant(
        name="recovery-below-own-promise",
        file=SDP,
        old="        if self.promised[leader] > rec.ballot:\n",
        new="        if False:\n",
        rule="Paxos phase 2: never accept below a promise (own re-prepare included)",
        description="_recovery_propose accepts its value at its ballot after promising a higher one meanwhile",
    ),
    Mutant(
        name="candidate-ignores-own-promise",
        file=SDP,
        old="            if not self.gate.may_vote(self.id, self.now):\n",
        new="            if False:\n",
        rule="§3.5 lease: the candidate's own vote is bound by its lease promise",
        description="a pre-vote that succeeds starts the election although the candidate promised its vote to the sequencer since",
    ),
    Mutant(
        name="promise-quantized",
        file=SDP,
        old="            self.gate.promise(src, self.now + self.cfg.lease_ticks + 1)\n",
        new="            self.gate.promise(src, self.now + self.cfg.lease_ticks)\n",
        rule="§3.5 lease: a promise lasts lease_ticks whole ticks after the ping arrived",
        description="a voter's promise ends up to one tick before the sequencer's lease (no skew tolerated)",
    ),
    Mutant(
        name="fast-commit-while-recovering",
        file=SDP,
        old="                if self.n == 5 and m.serving:\n",
        new="                if self.n == 5:\n",
        rule="Fig. 5 line 29 with Fig. 7: R_m commits on an O-accept alone only in a view that serves",
        description="R_m executes a recovering sequencer's Fig. 7 fill that no later voter may know of",
    ),
    Mutant(
        name="ack-without-taking-o-accepts",
        file=SDP,
        old="        return self.o_view >= self.view or self.o_prefix < self._recover_end_seen\n",
        new="        return True\n",
        rule="Fig. 7: a replica OAcks a view only after taking one of its O-accepts, so a view that serves is known to every majority",
        description="OAcks on a Compacted notice or an O-commit alone let a view serve (or raise no o_view) unseen",
    ),
    Mutant(
        name="o-view-from-o-records",
        file=SDP,
        old="                _, view, start, leaders = rec\n",
        new="                _, view, start, leaders = rec\n                self.o_view = max(self.o_view, view)\n",
        rule="Fig. 7: o_view survives a restart only as taken (AV records), not from values learned by commits",
        description="replay raises o_view from every O record, including those an O-commit wrote",
    ),
    Mutant(
        name="ready-on-recovering-view",
        file=SDP,
        old="        if self.n == 5 and self.id != self.sequencer and not self.view_serving:\n",
        new="        if False:\n",
        rule="Fig. 5 with Fig. 7 (N=5): a recovering sequencer's O-accepts make nothing ready",
        description="R_m acknowledges a command on the O-accept of a view that may never serve",
    ),
    Mutant(
        name="snapshot-past-commit",
        file=SDP,
        old="        if self.exec_slot > self.o_committed:\n            return None\n",
        new="",
        rule="a snapshot covers only committed slots (N=5 fast-executed slots stay reportable until committed)",
        description="take_snapshot compacts a fast-executed slot that no majority knows; R_m's own view hides it",
    ),
    Mutant(
        name="multipaxos-mcommit-no-ack",
        file=MP,
        old="            if len(m.batches) == SLOTS_PER_MSG_MAX or (m.batches and op_bytes(m.batches) >= MSG_BYTES_MAX):\n",
        new="            if False:\n",
        rule="liveness: a follower tells a leader that resends what it holds its prefix",
        description="a follower more than SLOTS_PER_MSG_MAX ahead of the new leader's acked never catches up",
    ),
    Mutant(
        name="serve-before-phantoms-decided",
        file=SDP,
        old="        if self.phase == \"recovering\" and prefix >= self.recover_end and not self._phantoms_pending():\n",
        new="        if self.phase == \"recovering\" and prefix >= self.recover_end:\n",
        rule="Fig. 7 with §3.4: a new sequencer serves only once every slot that may stand for an unproposed instance is decided",
        description="the new sequencer acknowledges commands while R_m's next command can still take an earlier surplus slot "
        "(equivalent since 0b91220: the commit cap at the first phantom slot, which lies inside the recovered log, "
        "already keeps the acked prefix below recover_end; kept as defence in depth)",
    ),
    Mutant(
        name="serve-only-when-majority-moves",
        file=SDP,
        old="""\
            if self.id == self.sequencer or self.n >= 7:
                self._commit_oslots(prefix)
        # On the acked prefix, not on majority_prefix: an installed snapshot raises
        # that to its floor without a single OAck of this view (_raise_floor).
        if self.phase == "recovering" and prefix >= self.recover_end and not self._phantoms_pending():
            self._start_serving()
""",
        new="""\
            if self.id == self.sequencer or self.n >= 7:
                self._commit_oslots(prefix)
            if self.phase == "recovering" and prefix >= self.recover_end and not self._phantoms_pending():
                self._start_serving()
""",
        rule="liveness: a recovering sequencer serves once a majority acked recover_end, even if a snapshot already moved majority_prefix",
        description="the serve check runs only when majority_prefix moves; a snapshot past recover_end leaves the sequencer recovering forever",
    ),
    Mutant(
        name="o-view-from-partial-recovered-log",
        file=SDP,
        old="        if m.view > self.o_view and self.o_prefix >= m.recover_end:\n",
        new="        if m.view > self.o_view:\n",
        rule="Fig. 7: o_view names a view only once the replica holds its whole recovered log",
        description="a replica that took a later chunk of a recovered log reports the view; the lost chunk's slots become holes",
    ),
    Mutant(
        name="commit-past-open-phantom",
        file=SDP,
        old="            prefix = min(prefix, self._phantom_slot)\n",
        new="            pass\n",
        rule="§3.4 with Fig. 7: nothing after a slot that may stand for an unproposed instance commits or becomes ready",
        description="a recovering sequencer acknowledges its own command after an open phantom slot",
    ),
    Mutant(
        name="ack-only-with-whole-log",
        file=SDP,
        old="        return self.o_view >= self.view or self.o_prefix < self._recover_end_seen\n",
        new="        return self.o_view >= self.view\n",
        rule="liveness: a replica that lacks part of a recovered log acks its prefix so the sequencer resends from there",
        description="a peer more than one O-accept message behind the recovered log's end never acks and never catches up",
    ),
    Mutant(
        name="no-phantoms",
        file=SDP,
        old="                self._phantoms += [(leader, k) for k in range(lo, self.assigned[leader])]\n",
        new="                pass\n",
        rule="§3.4 with Fig. 7: every slot past the instances any voter accepted from its leader is decided before it is served past",
        description="a new sequencer works out no phantom instances: a leader's next command can take a slot before acknowledged ones",
    ),
    Mutant(
        name="phantom-bound-from-c-max",
        file=SDP,
        old="                known = max([taken[leader]] + [v.c_own[leader] for v in self.votes.values()])\n",
        new="                known = max([self.c_max[leader]] + [v.c_max[leader] for v in self.votes.values()])\n",
        rule="§3.4 with Fig. 7: only an instance the leader itself took (its own ballot) or a chosen one bounds the phantoms",
        description="the phantom bound is the highest instance any voter accepted, so an unchosen recovery no-op at one voter "
        "hides a phantom from the next view (review 6)",
    ),
    Mutant(
        name="taken-counts-chosen-noop",
        file=SDP,
        old="if inst > top and (ballot_owner(c.ballot) == leader or (c.committed and c.cmds is not None)):",
        new="if inst > top and (ballot_owner(c.ballot) == leader or c.committed):",
        rule="§3.4 with Fig. 7: a chosen no-op of a recoverer says nothing about the leader's instances below it",
        description="_taken counts any chosen instance as taken by its leader, so a chosen no-op above an open phantom "
        "hides it from the next view (review 7, hole 1)",
    ),
    Mutant(
        name="restart-ballot-from-promise",
        file=SDP,
        old="""\
        mine = [c.ballot for c in own.values() if ballot_owner(c.ballot) == self.id]
        self.ballot = max([self.ballot] + mine)
""",
        new="""\
        top = max([self.ballot] + [c.ballot for c in own.values()])
        if top != self.ballot or self.promised[self.id] > self.ballot:
            self.ballot = make_ballot(ballot_round(max(top, self.promised[self.id])), self.id)
""",
        rule="Paxos phase 1: a proposer uses only a ballot it prepared (review 8)",
        description="a restarted command leader makes up a ballot from the highest promise it saw (above a lower-id "
        "recoverer's, or its own unfinished re-prepare's) and proposes there without phase 1",
    ),
    Mutant(
        name="compacted-recovery-no-backoff",
        file=SDP,
        old="            self._crec_after[m.leader] = self.now + self.cfg.resend_ticks  # not again at every ready()\n",
        new="",
        rule="liveness: a recovery dropped on a Compacted notice waits resend_ticks before it starts again",
        description="a leader's own re-prepare dropped on Compacted restarts at the next ready(), at the same simulated "
        "instant, forever (swarm seed 9203323 never ended)",
    ),
    Mutant(
        name="unknown-keys-ignored",
        file=SDP,
        old="""\
            else:  # keys known only once applied (a prefix delete, a lease expiry): every read waits
                self.unknown_keys_slot = self.next_slot - 1
""",
        new="",
        rule="§3.5 reads: a lease read waits for every earlier write that may touch its key",
        description="a write whose keys are known only once applied (ALL_KEYS) is left out of the history table, "
        "so a lease read of a key it removes is served stale",
    ),
    Mutant(
        name="fig7-keeps-stale-old-view",
        file=RULES,
        old="""\
            del log[j]  # possibly overwritten by the last view (docstring)
""",
        new="""\
            pass
""",
        rule="Fig. 7 (N=5): a slot reported only at a view older than the last serving one, not committed, may hold R_m's fast-executed slot",
        description="the new sequencer re-proposes a stale old-view value where the last view gave R_m a slot "
        "R_m already executed (steered search seed 5095, fork 136:1)",
    ),
    Mutant(
        name="handover-sent-once",
        file=SDP,
        old="""\
                if now - since >= self.cfg.election_ticks:
                    self._handover = None
                    self._step_down()
                    return
                self.broadcast(Handover(self.view, target))
""",
        new="""\
                pass
""",
        rule="liveness: a handing-over sequencer resends its Handover and steps down if no new view comes (review 9)",
        description="the Handover goes out once: lost, or its target cut off, the cluster keeps a sequencer without a lease forever",
    ),
    Mutant(
        name="handover-keeps-self-promise",
        file=SDP,
        old="        if not self._handing_over():\n            # Our own promise",
        new="        if True:\n            # Our own promise",
        rule="a sequencer that hands over must be able to vote in its target's election (review 9)",
        description="the handing-over sequencer keeps renewing its promise to itself and never votes; a new view forms "
        "without the replica that held the only durable copy of some slots",
    ),
    Mutant(
        name="propose-below-own-promise",
        file=SDP,
        old="            if self.promised[me] > self.ballot or self.next_inst in self.clog[me] or self.next_inst < self._c_unsure:\n",
        new="            if self.next_inst < self._c_unsure:\n",
        rule="Paxos: an acceptor (the command leader itself) never accepts below a promise it gave; one value per instance",
        description="a command leader proposes its next command at its old ballot over a recoverer's chosen no-op "
        "(review 7, hole 2: two values chosen for one C-instance)",
    ),
    Mutant(
        name="n3-commit-unsynced-accept",
        file=SDP,
        old="            self._commit_oslots(self.o_durable)\n        elif self.n >= 7:",
        new="            self._commit_oslots(self.o_prefix)\n        elif self.n >= 7:",
        rule="N = 3: a replica's own O-accept counts towards the majority only once durable (handover seed 302704)",
        description="a non-sequencer commits and executes on the sequencer's O-accept and its own unsynced accept; "
        "a crash before the sync leaves the incarnation having executed a value the next view replaces",
    ),
    Mutant(
        name="n5-fast-exec-unsynced",
        file=SDP,
        old="(slot.fast and slot.durable and slot.leader == me and slot.view == self.view)",
        new="(slot.fast and slot.leader == me and slot.view == self.view)",
        rule="N = 5: the command leader's fast commit (Fig. 5 line 29) waits for its own O record to be durable",
        description="R_m executes its own slot on the sequencer's O-accept before its accept is on disk",
    ),
    Mutant(
        name="sequencer-counts-unsynced-accept",
        file=SDP,
        old="        self.acked[self.id] = self.o_durable  # our own accepts count once on disk\n",
        new="        self.acked[self.id] = self.o_prefix\n",
        rule="the sequencer's own entry in its O-ack count is its durable prefix",
        description="the sequencer counts its own unsynced accepts in the majority (only an ack overtaking its sync "
        "could show it: no driver allows that, the rule test does)",
    ),
    Mutant(
        name="retry-queued-twice",
        file="consensus/core/replica.py",
        old="        if (client, seq) in table and any(c[0] == client and c[1] == seq for c in self._pending):\n",
        new="        if False:\n",
        rule="a retry of a command still queued at a replica is not queued again (steered seed 2067)",
        description="every client retry joins the queue again; under a retry storm the queue outgrows what the "
        "instances in flight drain (liveness)",
    ),
    Mutant(
        name="durable-prefix-kept-over-reproposal",
        file=SDP,
        old="        if j < self.o_durable:\n            self.o_durable = j",
        new="        if False:\n            self.o_durable = j",
        rule="a slot accepted anew (a new view's re-proposal) is not durable: the durable prefix drops to it (review 10)",
        description="a re-elected sequencer's durable prefix still covers the old view's slot objects; it counts its "
        "unsynced re-proposals in the majority",
    ),
    # --- peer order (issue 15): liveness and latency rules, not safety ---------------
    Mutant(
        name="near-ignores-echoes",
        file=NEAR,
        old="""\
        self.rtt[peer] = float(sample) if old == INF else (3 * old + sample) / 4
        self._reorder()
""",
        new="""\
        self.rtt[peer] = float(sample) if old == INF else (3 * old + sample) / 4
""",
        rule="issue 15: thrifty accepts go to the nearest peers as measured, not to a configured order",
        description="echoes update the round trips but the order stays the prior (ring) order",
    ),
    Mutant(
        name="near-no-hysteresis",
        file=NEAR,
        old="""\
    return a + max(HYSTERESIS_TICKS, HYSTERESIS_FRACTION * b) < b
""",
        new="""\
    return a < b
""",
        rule="issue 15: peers within the hysteresis margin keep their places (no quorum flapping)",
        description="any smaller average moves a peer ahead, so near-equal peers swap on every sample",
    ),
    Mutant(
        name="slow-ignores-alternatives",
        file=NEAR,
        old="""\
        return _clearly_nearer(alternative, lag)
""",
        new="""\
        return True
""",
        rule="issue 15: a peer is skipped as slow only when another healthy peer would answer sooner",
        description="a slowed peer is demoted even when it is still nearer than every alternative",
    ),
    Mutant(
        name="echo-from-before-restart",
        file=BASE,
        old="""\
        if 0 <= m.stamp and 0 <= sample:  # not an echo of a probe from before a restart
""",
        new="""\
        if True:
""",
        rule="issue 15: a sample is a round trip of this incarnation's probe (stamp <= now)",
        description="an echo stamped ahead of our clock (a probe from before a restart) gives a negative sample",
    ),
    Mutant(
        name="echo-behind-sync",
        file=BASE,
        old="""\
        self.send_urgent(src, Echo(self.view, m.stamp))
""",
        new="""\
        self.send(src, Echo(self.view, m.stamp))
""",
        rule="issue 15 (review15 F1): probes and echoes vouch for nothing stored and leave without waiting for a sync",
        description="an echo waits behind its acceptor's records, so busy quorum members look far and the quorum flaps",
    ),
    Mutant(
        name="silence-is-no-sample",
        file=NEAR,
        old="""\
            if d != INF and age > 2 * d + 2:
""",
        new="""\
            if False:
""",
        rule="issue 15 (review15 F3): a probe unanswered for twice the round trip counts as a sample of its age",
        description="a peer that stops echoing (one-way cut, never suspected) keeps its place in the thrifty quorum",
    ),
    Mutant(
        name="karn-off",
        file=SDP,
        old="""\
        if p.sent_to >> src & 1 and not p.acks >> src & 1 and not p.resent:
""",
        new="""\
        if p.sent_to >> src & 1 and not p.acks >> src & 1:
""",
        rule="issue 15 (review15 F4): Karn's rule, no ack-delay sample from a resent accept",
        description="acks of resent accepts are timed from the first send, and a healthy peer looks slow",
    ),
    Mutant(
        name="slow-vs-any-peer",
        file=BASE,
        old="""\
        near, now, others = self.near, self.now, alive[k:]
""",
        new="""\
        near, now, others = self.near, self.now, alive
""",
        rule="issue 15 (review15 F2): a quorum member is slow only against the peers that would replace it",
        description="a member is judged against the other member too (N=5), and a faster peer is swapped for a slower one",
    ),
    Mutant(
        name="mp-commit-to-suspected",
        file=MP,
        old="""\
                if dst != self.id and not self.suspected(dst):
                    self._send_commit(dst)
""",
        new="""\
                if dst != self.id:
                    self._send_commit(dst)
""",
        rule="liveness (Multi-Paxos): a suspected peer gets no commits carrying its unacked slots",
        description="every commit re-sends a dead peer up to SLOTS_PER_MSG_MAX slots (failover collapse)",
    ),
    Mutant(
        name="mp-resend-to-suspected",
        file=MP,
        old="""\
                if dst == self.id or self.suspected(dst):
""",
        new="""\
                if dst == self.id:
""",
        rule="liveness (Multi-Paxos): a suspected peer gets no resends until it is heard again",
        description="every resend period re-sends a dead peer up to SLOTS_PER_MSG_MAX slots",
    ),

    Mutant(
        name="straggler-agree-one-window",
        file=SDP,
        old="""\
        if self._doubts >= self.cfg.straggler_agree_strikes and not self._fresh_vote(self.id):
""",
        new="""\
        if self._doubts >= 1 and not self._fresh_vote(self.id):
""",
        rule="paper §4 straggler: a replica confirms a peer's request only after doubtful windows of its own in a row",
        description="one noisy window of a healthy replica confirms a slowed replica's complaint (healthy sequencer deposed)",
    ),
    Mutant(
        name="straggler-agree-without-evidence",
        file=SDP,
        old="""\
        if self._doubts >= self.cfg.straggler_agree_strikes and not self._fresh_vote(self.id):
""",
        new="""\
        if not self._fresh_vote(self.id):
""",
        rule="paper §4 straggler: a replica that sees nothing wrong never confirms",
        description="every request is confirmed: one slowed replica deposes a healthy sequencer",
    ),
    Mutant(
        name="straggler-votes-never-expire",
        file=SDP,
        old="""\
        return heard is not None and self.now - heard <= 2 * self.cfg.straggler_window_ticks
""",
        new="""\
        return heard is not None
""",
        rule="paper §4 straggler: a vote counts for two windows",
        description="complaints heard at different times add up to a majority nobody holds at once",
    ),
    Mutant(
        name="straggler-best-zero",
        file=SDP,
        old="""\
        best = max(self._best_ready, 1, self.cfg.straggler_floor_ticks)
""",
        new="""\
        best = max(self._best_ready, self.cfg.straggler_floor_ticks - 1)
""",
        rule="paper §4 straggler: an instance answered within its tick took up to one tick",
        description="with a best of 0 ticks, two ticks of queueing on a busy machine make a slow window",
    ),
    Mutant(
        name="straggler-served-without-lateness",
        file=SDP,
        old="""\
            return late(times_best) or (demand and served * served_den < base * served_num and late(1))
""",
        new="""\
            return late(times_best) or (demand and served * served_den < base * served_num)
""",
        rule="paper §4 straggler: fewer O-slots than the healthy rate counts only when my instances are late",
        description="a replica whose demand falls (clients gone, bigger batches under load) blames a healthy "
                    "sequencer: view changes under load alone",
    ),
    Mutant(
        name="straggler-floor-ignored",
        file=SDP,
        old="""\
        best = max(self._best_ready, 1, self.cfg.straggler_floor_ticks)
""",
        new="""\
        best = max(self._best_ready, 1)
""",
        rule="paper §4 straggler: queueing every replica suffers (below the configured floor) is no slow sequencer",
        description="on loopback the best is 0-1 tick: a saturated machine's 50-120 ms of queueing deposes a "
                    "healthy sequencer under load alone",
    ),
    Mutant(
        name="early-self-count-before-durable",
        file=SDP,
        old="""\
        p = Proposal(c, 0 if early else 1 << self.id, self.now, self.now)
""",
        new="""\
        p = Proposal(c, 1 << self.id, self.now, self.now)
""",
        rule="early send: a command leader's own accept counts towards a quorum only once its record is durable",
        description="an early-sent instance commits on one peer's ack and the leader's unsynced record: a crash "
                    "before the sync leaves one accept of three",
    ),
    Mutant(
        name="early-restart-ignores-reservation",
        file=SDP,
        old="""\
        if self.c_reserved > self.next_inst:
            self._c_unsure = self.c_reserved
""",
        new="""\
        pass
""",
        rule="early send: a restart re-prepares the reserved instances its log lacks before proposing",
        description="a restarted leader proposes a new value at an instance a peer accepted from its early send, "
                    "at the same round-0 ballot",
    ),
    Mutant(
        name="early-beyond-reservation",
        file=SDP,
        old="""\
        early = self.cfg.early_send and inst < self.c_reserved
""",
        new="""\
        early = self.cfg.early_send
""",
        rule="early send: only instances below a durable reservation leave before their record",
        description="an instance no durable record reserves is sent early: a restart does not know to re-prepare it",
    ),
    Mutant(
        name="fetch-after-every-progress",
        file=SDP,
        old="""\
                    fetch_now = progressed and self._fetching
""",
        new="""\
                    fetch_now = progressed and self._blocked_on is not None
""",
        rule="Fetch is for loss: a block that cleared without a fetch starts no pipeline",
        description="every new block after a step of progress sends a Fetch, as before issue 16: duplicate CCommits without loss",
    ),
    Mutant(
        name="fetch-pipeline-off",
        file=SDP,
        old="""\
        self._fetching = True
        self.send(dst, Fetch(self.view, leader, inst))
""",
        new="""\
        self.send(dst, Fetch(self.view, leader, inst))
""",
        rule="catching up, the next missing instance is fetched at once (a pipeline)",
        description="after a fetch is answered the next block waits resend_ticks/2: a replica thousands of slots behind never catches up",
    ),
    Mutant(
        name="mp-vote-uncapped",
        file=MP,
        old="""\
            if slots and (used >= VOTE_BYTES_MAX or len(slots) >= VOTE_SLOTS_MAX):
""",
        new="""\
            if False:
""",
        rule="issue 15 (Multi-Paxos): a vote carries at most VOTE_BYTES_MAX of the voter's slots, under a peer frame",
        description="a vote carries every slot from the candidate's commit point: a lagging candidate's is over the frame, never sent",
    ),
    Mutant(
        name="mp-vote-part-counts",
        file=MP,
        old="""\
        if upto == -1:
            report = self._vote_parts.pop(src)
""",
        new="""\
        if True:
            report = self._vote_parts.pop(src)
""",
        rule="Paxos phase 1 (Multi-Paxos, issue 15): a voter counts only once its report is whole from vote_base",
        description="the candidate takes office on a voter's first chunk: slots past it keep the candidate's older values or no-ops",
    ),
    Mutant(
        name="mp-vote-chunk-skips-a-slot",
        file=MP,
        old="""\
                upto = j
                break
""",
        new="""\
                upto = j + 1
                break
""",
        rule="Paxos phase 1 (Multi-Paxos, issue 15): a chunk [start, upto) reports every slot the voter holds below upto",
        description="the voter claims the slot it cut at: the candidate asks from the one after and never learns it",
    ),
    Mutant(
        name="mp-vote-deadline-fixed",
        file=MP,
        old="""\
        self.election_due = max(self.election_due, self._election_deadline())
        self.send(src, VRequest(self.view, upto))
""",
        new="""\
        self.send(src, VRequest(self.view, upto))
""",
        rule="liveness (Multi-Paxos, issue 15): the candidate's election deadline moves on with its vote exchange",
        description="a candidate whose vote exchange outlasts an election timeout stands again and starts over, for ever",
    ),
    Mutant(
        name="mp-voter-stands-meanwhile",
        file=MP,
        old="""\
        elif src == self.leader:
            self._heard_from_leader()  # its candidacy goes on (asking for our next chunk)
""",
        new="""\
""",
        rule="liveness (Multi-Paxos, issue 15): a voter asked again by its view's candidate waits for it",
        description="a voter stands for a view of its own in the middle of a long vote exchange, and the candidate starts over",
    ),

    Mutant(
        name="mp-vote-chunk-resent-every-ask",
        file=MP,
        old="""\
            return  # that big chunk is on its way
""",
        new="""\
            pass
""",
        rule="liveness (Multi-Paxos, issue 15): a voter re-asked within resend_ticks does not rebuild a big chunk",
        description="every heartbeat re-ask queues another megabyte chunk to the candidate (send queues overflow, pings dropped)",
    ),
    Mutant(
        name="mp-forward-uncut",
        file=MP,
        old="""\
            part = take_batch(cmds, len(cmds), self.cfg.batch_bytes_max)
""",
        new="""\
            part = cmds[:]
            del cmds[:]
""",
        rule="liveness (Multi-Paxos, issue 15): a Forward carries at most batch_bytes_max, under a peer frame",
        description="a follower hands its pending commands to a new leader in one Forward: 9 MB under overload, never sent",
    ),
    Mutant(
        name="mp-handover-to-candidate",
        file=MP,
        old="""\
            self._handover = list(handover.values())
            self._serving = False
""",
        new="""\
            self._handover = []
            self._forward(view, list(handover.values()))
""",
        rule="liveness (Multi-Paxos, issue 15): a follower hands its pending commands to a new leader once it serves",
        description="every view change hands the pending commands to the candidate at once: megabytes per view under churn",
    ),
    Mutant(
        name="mp-take-office-one-record",
        file=MP,
        old="""\
                self.persist(["M", self.view, base + lo, batches[lo : lo + k]])
""",
        new="""\
                if lo == 0:
                    self.persist(["M", self.view, base, batches])
""",
        rule="liveness (Multi-Paxos, issue 15): a new leader writes its re-proposal in records of at most MSG_BYTES_MAX",
        description="a lagging candidate that wins writes every slot from its commit point in one record: over the WAL segment, it exits",
    ),
    Mutant(
        name="mp-whole-voter-not-asked",
        file=MP,
        old="""\
                    if dst != self.id and now - self._vote_asked[dst] >= self.cfg.heartbeat_ticks:
""",
        new="""\
                    if dst != self.id and dst not in self.votes and now - self._vote_asked[dst] >= self.cfg.heartbeat_ticks:
""",
        rule="liveness (Multi-Paxos, issue 15): a voter whose report is whole is still asked, so it waits for the others' chunks",
        description="N=5: a voter done early stands after an election timeout while another's chunks still come in, for ever",
    ),
    Mutant(
        name="end-assign-while-closing",
        file=SDP,
        old="""\
        if self.end_slot >= 0 or self.executor.reconfig is not None:
            # S1 (docs/membership.md): this epoch is closing; what is not ordered yet
            # never is in this epoch (its commands were never ready: unfinished()).
            return
""",
        new="",
        rule="S1 (docs/membership.md): a closing sequencer orders nothing new; nothing after END is chosen",
        description="_assign goes on ordering C-instances after the reconfiguration, also after END: "
        "commands ordered (and acknowledged) past END are never executed",
    ),
    Mutant(
        name="end-lease-read-while-closing",
        file=SDP,
        old="""\
        if (self.phase != "normal" or self.now >= self.lease_expiry or self.end_slot >= 0
                or self.executor.reconfig is not None):""",
        new="""\
        if self.phase != "normal" or self.now >= self.lease_expiry:""",
        rule="S2 (docs/membership.md): a closing sequencer hands out no lease read",
        description="a closing sequencer serves lease reads, which can miss the next epoch's writes",
    ),
    Mutant(
        name="end-never-terminal",
        file=SDP,
        old="""\
            if committed or (v_end >= last_view and all(best[k][0] <= v_end for k in best if k > j)):
                return j
""",
        new="""\
            if False:
                return j
""",
        rule="V (docs/membership.md): a view change keeps an END that may be chosen",
        description="a new sequencer replaces every END it recovers by a no-op: a chosen END is lost, "
        "replicas end the epoch at different slots",
    ),
    Mutant(
        name="end-always-terminal",
        file=SDP,
        old="""\
            if committed or (v_end >= last_view and all(best[k][0] <= v_end for k in best if k > j)):
                return j""",
        new="""\
            if True:
                return j""",
        rule="V (docs/membership.md): an END older than the last serving view, or than a value after it, was not chosen",
        description="a new sequencer keeps any END it recovers and drops the slots after it, "
        "even ones a later view made chosen",
    ),
    Mutant(
        name="end-ignores-last-view",
        file=SDP,
        old="""\
            if committed or (v_end >= last_view and all(best[k][0] <= v_end for k in best if k > j)):""",
        new="""\
            if committed or all(best[k][0] <= v_end for k in best if k > j):""",
        rule="V (docs/membership.md): an END older than the last serving view was not chosen",
        description="a stale END is kept when a later view served but no voter reports its slots after it "
        "(N = 5: the slots a later view made ready may be unseen)",
    ),
    Mutant(
        name="end-no-truncate",
        file=SDP,
        old="""\
            end = max(base, term + 1)  # nothing after a chosen END is chosen (Fig. 7 fills included)
""",
        new="""\
            pass
""",
        rule="V (docs/membership.md): a kept END ends the recovered log",
        description="a new sequencer re-proposes values after a kept END (stale reports, Fig. 7 fills): "
        "they are chosen past END",
    ),
    Mutant(
        name="end-candidate-forgets-own-end",
        file=SDP,
        old="""\
        term = self._end_below(base)
        if term < 0:
            term = self._judge_end(best, log, last_view)""",
        new="""\
        term = self._judge_end(best, log, last_view)""",
        rule="V (docs/membership.md): a candidate that knows END chosen (executed, or committed below its vote base) keeps it",
        description="a candidate with END in its committed prefix (which no vote reports) serves after it: "
        "a second END, or, not closing yet, new commands ordered and acknowledged past END",
    ),
    Mutant(
        name="end-after-installed-end",
        file=SDP,
        old="self.end_slot < 0 and self.ended < 0 and self.phase",
        new="self.end_slot < 0 and self.phase",
        rule="X (docs/membership.md): a replica past END (a snapshot after it installed) closes no second time",
        description="a sequencer that installed a snapshot taken after END proposes another END after it",
    ),
    Mutant(
        name="epoch-drops-unfinished",
        file=EPOCHS,
        old="""\
        for client, seq, op, needs_result in owed:
            self.inner.propose(client, seq, op, needs_result)
""",
        new="""\
        pass
""",
        rule="docs/membership.md part 2: what the old epoch's replica owed is proposed again in the new one",
        description="commands not ordered before END are dropped at the epoch change: never answered",
    ),
    Mutant(
        name="epoch-base-keeps-reconfig",
        file="consensus/core/executor.py",
        old="""\
        pending, self.reconfig = self.reconfig, None
""",
        new="""\
        pending = self.reconfig
""",
        rule="docs/membership.md part 2: the next epoch starts without the old epoch's pending reconfiguration",
        description="the base carries the pending reconfiguration: the new epoch closes at once (an END of the wrong epoch)",
    ),
    Mutant(
        name="epoch-ignores-newer",
        file=EPOCHS,
        old="""\
            self.want_base = src  # we are behind: the driver fetches src's base
""",
        new="""\
            pass
""",
        rule="docs/membership.md part 2: a message of a newer epoch makes its receiver fetch the sender's base",
        description="a new member, or one that missed END, never learns the epoch it is in",
    ),
    Mutant(
        name="epoch-no-notice",
        file=EPOCHS,
        old="""\
            self._notices.append((src, self.epoch, [EpochNotice(-1, self.epoch)]))
""",
        new="""\
            pass
""",
        rule="docs/membership.md part 2: a message of an older epoch is answered with a notice",
        description="a member that missed END (a removed one restarted in the old epoch) never learns it moved on",
    ),
    Mutant(
        name="end-committed-judged-by-view",
        file=SDP,
        old="if committed or (v_end >= last_view and all(best[k][0] <= v_end for k in best if k > j)):",
        new="if v_end >= last_view and all(best[k][0] <= v_end for k in best if k > j):",
        rule="V (docs/membership.md): a committed END is chosen, whatever view it is reported at",
        description="a committed END whose holder kept its old view while a later view re-proposed it is judged stale "
        "and replaced (review D1)",
    ),
    Mutant(
        name="epoch-no-newcomer-notice",
        file=EPOCHS,
        old="""\
                    self._notices.append((dst, base.epoch, [EpochNotice(-1, base.epoch)]))
""",
        new="""\
                    pass
""",
        rule="docs/membership.md part 2: a member entering the new epoch tells the newcomers",
        description="newcomers that know nobody never learn their epoch when every old member leaves",
    ),
    Mutant(
        name="epoch-restart-taken-fresh",
        file=EPOCHS,
        old="""\
        if fresh and snapshot is not None and not records and base.epoch > 0:
""",
        new="""\
        if snapshot is not None and base.epoch > 0:
""",
        rule="docs/membership.md part 3: only an epoch's first start in a process is fresh; a restart "
             "replays its records (the snapshot path and its restart rules)",
        description="a member restarted inside an epoch is built fresh from the base: its promises and "
                    "accepts are forgotten and a second value can be chosen",
    ),
    Mutant(
        name="execute-before-send",
        file=BASE,
        old="""\
        if self.cfg.defer_execution and not self._executing:
""",
        new="""\
        if False:
""",
        rule="docs/runtime.md, execution after send: with defer_execution a commit only marks execution "
             "due; the Ready that carries the commit's messages carries no execution",
        description="the replica applies a batch inside the step that commits it, before the commit's "
                    "messages leave: the peers apply after it rather than beside it",
    ),
    Mutant(
        name="execution-due-never-set",
        file=BASE,
        old="""\
            if not self.execute_due and self._would_execute():
""",
        new="""\
            if False:
""",
        rule="docs/runtime.md, execution after send: what the immediate path would execute, the deferred "
             "path executes once the driver calls execute()",
        description="execution is deferred but never marked due: the driver never calls execute() and "
                    "nothing committed is applied or answered",
    ),
    Mutant(
        name="execution-due-ignores-blocked",
        file=SDP,
        old="""\
        return (c is not None and c.committed) or self._blocked_on != (leader, inst)
""",
        new="""\
        return c is not None and c.committed
""",
        rule="docs/runtime.md, execution after send: execution is due when the executor would block on a "
             "C-instance it was not blocked on yet (that starts the fetch of a missing instance)",
        description="a deferred executor that meets a missing C-instance never records it as blocked, so "
                    "it never fetches it and execution stalls for good",
    ),
    Mutant(
        name="execution-due-ignores-stale-block",
        file=SDP,
        old="""\
            return self._blocked_on is not None or self._blocked_since != -1 or self._fetching
""",
        new="""\
            return False
""",
        rule="docs/runtime.md, execution after send: execution is due when the next slot stopped being "
             "executable and a blocked executor's state is left to clear, as the immediate path clears it",
        description="after a view change makes a fast slot unexecutable, a deferred executor keeps its "
                    "stale block and goes on fetching the command leader's own instance",
    ),
    Mutant(
        name="blocked-tick-ignores-commit",
        file=SDP,
        old="""\
        if c is not None and c.committed:
            # Committed since we blocked on it: the block is stale until the deferred
""",
        new="""\
        if False:
            # Committed since we blocked on it: the block is stale until the deferred
""",
        rule="docs/runtime.md, execution after send: a blocked executor neither fetches nor recovers a "
             "C-instance it holds committed while its deferred execution is pending (review 65)",
        description="between a commit and the deferred execute(), a tick fetches the instance again and may "
                    "start a C-recovery at a higher ballot of an instance held committed, disrupting its leader",
    ),
]

BY_NAME = {m.name: m for m in MUTANTS}


def count(text: str, old: str) -> int:
    """Occurrences of ``old`` in ``text``, overlapping ones included."""
    n, start = 0, 0
    while True:
        k = text.find(old, start)
        if k < 0:
            return n
        n += 1
        start = k + 1


def patched(text: str, m: Mutant) -> str:
    """``text`` with ``m`` applied; AnchorError unless ``m.old`` occurs exactly once."""
    if not m.old:
        raise AnchorError(f"{m.name}: empty anchor in {m.file}")
    k = count(text, m.old)
    if k != 1:
        what = "missing" if k == 0 else f"found {k} times"
        first = m.old.strip().splitlines()[0].strip()
        raise AnchorError(f"{m.name}: anchor {what} in {m.file}: {first!r}")
    return text.replace(m.old, m.new, 1)


def apply(root: str | Path, m: Mutant) -> None:
    """Patch ``root / m.file`` in place (``root`` is a copy of the repo, never the tree)."""
    path = Path(root) / m.file
    try:
        text = path.read_text()
    except OSError as e:
        raise AnchorError(f"{m.name}: cannot read {m.file}: {e.strerror}") from None
    path.write_text(patched(text, m))


def check(root: str | Path, m: Mutant) -> None:
    """AnchorError if ``m`` does not apply cleanly to the files under ``root``."""
    path = Path(root) / m.file
    try:
        text = path.read_text()
    except OSError as e:
        raise AnchorError(f"{m.name}: cannot read {m.file}: {e.strerror}") from None
    patched(text, m)
