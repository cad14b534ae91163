"""Review 10 of 5f12fd7: a replica counts its own acceptance of an O-slot towards a
quorum only once the record of it is durable (``Ready.token`` → ``persisted``). See
docs/reviews/core-fixes-review-10.md.

Hole 1 (latent, rule level): ``o_durable`` is not reset when a view starts. A
sequencer re-elected over slots it had proposed durably in its old view (or any
candidate whose ``o_durable`` ran ahead of its ``o_committed``) replaces those
slots in ``_take_office`` with fresh, unsynced ``OSlot``s of the new view, but
``_advance_o_prefix`` restarts its durable scan at ``min(o_durable, o_prefix)``, so
``o_durable`` still covers them and ``acked[self] = o_durable`` counts the new,
unsynced accepts. Same rule as 5f12fd7's ``sequencer-counts-unsynced-accept``
test; like that one, no driver lets the peer's OAck overtake the sync.

Hole 2 (Multi-Paxos, N = 1): the leader is its own majority and commits and
executes a slot in the step it proposes it, before its "M" record is durable. A
crash before the sync loses the slot; the restarted incarnation puts another
command there. The judge's ``consistent`` and ``agreement`` break (no client saw
it: the reply waited for the sync). SDPaxos N = 1 does not run at all (every
instance blocks; ``_fetch_missing`` divides by zero), so only Multi-Paxos shows it.

Both fixed in cbd337e: a slot accepted anew drops the durable prefix to it
(``_accepted``), and a cluster has an odd number of replicas from three. The other
tests are points that hold.
"""

from __future__ import annotations

import pytest

from consensus.core.config import ProtocolConfig
from consensus.core.messages import CAccept, CCommit, CRequest, OAccept, OAck, OCommit, Vote
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine
from consensus.sim import SimConfig, Simulation

from .schedules import RuleBroken, attach_clients

PUT = [[7, 1, ["put", "k", "v"]]]


def replica(n: int, me: int, seq: int, records=None) -> SDPaxosReplica:
    return SDPaxosReplica(me, ProtocolConfig(n=n, initial_sequencer=seq), KVStateMachine(), records=records)


# --- hole 1: o_durable survives a view change ----------------------------------------


def test_a_reelected_sequencer_counts_its_own_unsynced_reproposal_only_once_durable():
    r = replica(3, me=0, seq=0)
    v = r.view
    r.step(1, [CRequest(v, 1, 0, ["k"])])
    r.ready(sync=True)  # slot 0 (R1) proposed in view 0, durable here; no OAck yet
    assert r.oslots[0].durable and r.o_durable == 1 and r.o_committed == 0
    r._start_election()  # R0 stands again (a lost quorum, a handover back, ...)
    r.ready(sync=True)
    v2 = r.view
    r.step(2, [Vote(v2, 0, [], [-1] * 3, 0, [-1] * 3)])  # R2 holds nothing
    assert r.phase == "recovering" and r.oslots[0].view == v2, "slot 0 re-proposed in the new view"
    assert not r.oslots[0].durable, "its view-2 record is not on disk yet"
    rd = r.ready()  # the re-proposal's "O" record: written, not synced
    assert rd.token and any(rec[0] == "O" and rec[1] == v2 for rec in rd.persist)
    r.step(1, [OAck(v2, 1)])  # as in test_durable_self_count: the rule, not a driver
    assert not r.oslots[0].committed and r.phase == "recovering", (
        f"committed and serving on one durable accept of three (o_durable {r.o_durable}, acked {r.acked})")


# --- hole 2: Multi-Paxos N = 1 ----------------------------------------------------------


def test_one_replica_is_refused():
    """Holes 2 and the aside are closed by refusing N = 1 (cbd337e): a cluster has an
    odd number of replicas from three (test_durable_self_count has the config test)."""
    for protocol in ("multipaxos", "sdpaxos"):
        with pytest.raises(ValueError, match="odd number of replicas"):
            Simulation(SimConfig(protocol=protocol, replicas=1, rtt="lan", clients_per_site=0, seconds=1.0))


# --- points that hold -------------------------------------------------------------------


def _n3_accepted(me: int = 1) -> tuple[SDPaxosReplica, list, object]:
    """R1 (N = 3, R0 sequences) holds R2's chosen instance 0 durably and takes R0's
    O-accept of slot 0: returns the replica, its durable records, the Ready."""
    r = replica(3, me=me, seq=0)
    v = r.view
    r.step(2, [CAccept(v, 2, 0, r.promised[2], PUT), CCommit(v, 2, 0, r.promised[2], True, PUT)])
    durable = list(r.ready(sync=True).persist)
    r.step(0, [OAccept(v, 0, [2], True, 0)])
    rd = r.ready()
    return r, durable, rd


def test_the_lazy_commit_marker_lost_in_a_crash_is_relearned_from_the_sequencer():
    """The "OC" marker _on_persisted defers to the next tick is a hint: a crash after
    the "O" record's sync but before the marker leaves the slot accepted, not
    committed, and the sequencer's OCommit heartbeat commits it again."""
    r, durable, rd = _n3_accepted()
    durable += rd.persist
    r.persisted(rd.token)
    rd2 = r.ready()
    assert r.exec_slot == 1 and not any(rec[0] == "OC" for rec in rd2.persist), "executed; marker deferred"
    again = replica(3, me=1, seq=0, records=durable)  # crash before the next tick
    assert again.oslots[0].durable and not again.oslots[0].committed and again.exec_slot == 0
    again.step(0, [OCommit(again.view, 1, 0, [2])])
    again.ready(sync=True)
    assert again.exec_slot == 1 and again.executor.sm.digest() == r.executor.sm.digest()


def test_the_commit_marker_is_written_on_the_next_tick():
    r, _durable, rd = _n3_accepted()
    r.persisted(rd.token)
    r.ready()
    r.tick()
    assert ["OC", 1] in r.ready().persist


def test_a_view_change_between_the_write_and_the_sync_leaves_nothing_waiting():
    """Slot objects replaced by a new view while their Ready's sync is in flight:
    persisted() marks the orphans, drains _sync_wait, and the new view's accept counts
    only once its own Ready is durable."""
    r, _durable, rd = _n3_accepted()
    old = r.oslots[0]
    v2 = r.view + 2  # R2's next view
    r.step(2, [OAccept(v2, 0, [2], True, 0)])
    rd2 = r.ready()
    assert r.oslots[0] is not old and r.oslots[0].view == v2
    r.persisted(rd.token)
    r.ready()
    assert old.durable and not r.oslots[0].durable and not r.oslots[0].committed and r.exec_slot == 0
    r.persisted(rd2.token)
    r.ready()
    assert r.oslots[0].committed and r.exec_slot == 1 and r._sync_wait == []


def test_a_restart_counts_replayed_accepts_as_durable():
    r, durable, rd = _n3_accepted()
    again = replica(3, me=1, seq=0, records=durable + rd.persist)
    assert again.o_durable == again.o_prefix == 1
    again.step(0, [OAccept(again.view, 0, [2], True, 0)])  # the sequencer's resend
    again.ready()
    assert again.oslots[0].committed and again.exec_slot == 1, "no persisted() needed for replayed records"


def test_the_snapshot_store_in_the_simulator_makes_every_token_durable():
    """SimDisk: a snapshot store rewrites the log with the live records in one durable
    step; the simulator then reports the last token, so nothing waits on a sync that
    the rewrite cancelled (its epoch changed)."""
    cfg = SimConfig(replicas=3, rtt="lan", clients_per_site=1, seconds=1.0, disk_sync_ms=2.0, snapshot_every=5, seed=3)
    sim = Simulation(cfg).run()
    assert sim.snapshots_taken > 0
    assert sim.summary()["consistent"] and sim.quiet()
    for r in sim.nodes:
        assert r is not None and r.durable_token == r.token and r._sync_wait == [] and r._unsynced == []


# --- the campaign's durability check ----------------------------------------------------


class DurableCheckSim:
    """Mixin over ``HandoverSim``: whenever a replica executes a slot, that O-slot (N = 3)
    and that C-instance (every N) must be held by a majority in synced records or a
    stored snapshot. N = 5 O-slots are not checked: the fast path executes on two
    durable accepts of five by design (Fig. 7). With 5f12fd7's main mutant
    (``n3-commit-unsynced-accept``) this flags seeds 302704, 600002, 600003 and 600005
    at once, without waiting for a crash to land in the window."""

    def _durable_index(self, node):
        recs = self.disks[node]
        synced = len(recs) if self.sim_disks is None else self.sim_disks[node].synced
        st = self._idx[node]
        if st is None or st[0] is not recs or st[1] > len(recs):  # rewritten
            st = self._idx[node] = [recs, 0, {}, {}]
        o, c = st[2], st[3]
        for rec in recs[st[1]:synced]:
            if rec[0] == "O":
                for k, leader in enumerate(rec[3]):
                    o.setdefault(rec[2] + k, set()).add(leader)
            elif rec[0] == "C":
                ids = tuple((x[0], x[1]) for x in rec[4]) if rec[4] else None
                c.setdefault((rec[1], rec[2]), set()).add(ids)
        st[1] = max(st[1], synced)
        return o, c

    def _record_executed(self, node, executed):
        super()._record_executed(node, executed)
        if not hasattr(self, "_idx"):
            self._idx, self.violations = [None] * self.n, []
        q = self.n // 2 + 1
        idx = [self._durable_index(y) for y in range(self.n)]
        for ex in executed:
            leader = ex.label[0]
            if self.n == 3:
                held = sum(1 for y in range(self.n)
                           if (self.snaps[y] is not None and self.snaps[y][0]["slot"] > ex.slot)
                           or leader in idx[y][0].get(ex.slot, ()))
                if held < q:
                    self.violations.append(f"t={self.now} R{node} executed O-slot {ex.slot} ({leader}) held by {held}")
            if leader >= 0:
                inst = ex.label[1]
                ids = tuple((x[0], x[1]) for x in ex.cmds) if ex.cmds else None
                held = sum(1 for y in range(self.n)
                           if (self.snaps[y] is not None and self.snaps[y][0]["exec_inst"][leader] > inst)
                           or ids in idx[y][1].get((leader, inst), ()))
                if held < q:
                    self.violations.append(f"t={self.now} R{node} executed C {leader}:{inst} held by {held}")


def judge_durable(cfg) -> list[str]:
    """``judge_handover`` plus the durability check and, at the end, no unreported token."""
    from .test_review9_handover import HandoverSim

    class Sim(DurableCheckSim, HandoverSim):
        pass

    sim = Sim(cfg).run()
    result = sim.summary()
    failures = [name for name in ("consistent", "agreement") if not result[name]]
    failures += [f"{name}={result[name]}" for name in ("lost_acked", "duplicated", "wrong_results") if result[name]]
    if not sim.quiet():
        failures.append("not live")
    failures += getattr(sim, "violations", [])[:3]
    for r in sim.nodes:
        if r is not None and hasattr(r, "_sync_wait"):
            idle = sim.sim_disks is None or not sim.sim_disks[r.id].holds()
            if idle and (r._sync_wait or r.token != r.durable_token):
                failures.append(f"R{r.id}: token {r.token}, durable {r.durable_token}, {len(r._sync_wait)} waiting")
    return failures


@pytest.mark.parametrize("seed", [302704, 600002, 600003, 600005, 700001])
def test_durability_check_campaign_smoke(seed):
    from .test_review9_handover import handover_config

    assert judge_durable(handover_config(seed)) == []
