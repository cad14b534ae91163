"""A replica counts its own acceptance of an O-slot towards a quorum only once the
record of it is durable (``Ready.token`` → ``persisted``).

Found by the handover campaign (seed 302704, N = 3, SimDisk with 20 ms syncs, unsynced
records lost in a crash): a non-sequencer took the sequencer's O-accept, counted it
with its own (a majority of three) and executed the slot in the same step, before its
own "O" record reached the disk. It crashed before the sync; the next view, formed
without the old sequencer, filled the slot otherwise. No reply had left (replies wait
for the sync), but the crashed incarnation had executed a value the cluster never
chose, and reads, watches or a snapshot of that state would have shown it. The same
holds for the N = 5 command leader's fast commit (Fig. 5 line 29) and for the
sequencer's own entry in its ack count.
"""

from consensus.core.config import ProtocolConfig
from consensus.core.messages import CAccept, CAck, CCommit, CRequest, OAccept, OAck
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine

from .test_review9_handover import handover_config, judge_handover

PUT = [[7, 1, ["put", "k", "v"]]]


def replica(n: int, me: int, seq: int) -> SDPaxosReplica:
    return SDPaxosReplica(me, ProtocolConfig(n=n, initial_sequencer=seq), KVStateMachine())


def test_n3_a_replica_executes_on_its_own_accept_only_once_it_is_durable():
    r = replica(3, me=1, seq=0)
    v = r.view
    # R2's C-instance 0 is chosen and known here; the sequencer orders it at slot 0.
    r.step(2, [CAccept(v, 2, 0, r.promised[2], PUT), CCommit(v, 2, 0, r.promised[2], True, PUT)])
    r.ready(sync=True)
    r.step(0, [OAccept(v, 0, [2], True, 0)])
    rd = r.ready()
    assert rd.token and any(rec[0] == "O" for rec in rd.persist)
    assert r.exec_slot == 0 and not r.oslots[0].committed, "executed on an accept that is not on disk yet"
    assert not rd.executed
    r.persisted(rd.token)
    rd = r.ready()
    assert r.exec_slot == 1 and r.oslots[0].committed
    assert [ex.slot for ex in rd.executed] == [0]


def test_n3_a_restart_before_the_sync_forgets_nothing_it_executed():
    r = replica(3, me=1, seq=0)
    v = r.view
    r.step(2, [CAccept(v, 2, 0, r.promised[2], PUT), CCommit(v, 2, 0, r.promised[2], True, PUT)])
    durable = list(r.ready(sync=True).persist)
    r.step(0, [OAccept(v, 0, [2], True, 0)])
    r.ready()  # the "O" record is written, not yet synced: a crash now loses it
    again = SDPaxosReplica(1, r.cfg, KVStateMachine(), records=durable)
    assert r.executor.sm.digest() == again.executor.sm.digest(), "the crashed incarnation executed state its disk cannot rebuild"


def test_n5_the_command_leader_fast_commits_only_on_a_durable_accept():
    me, seq = 1, 0
    r = replica(5, me=me, seq=seq)
    v = r.view
    r.propose(7, 1, ["put", "k", "v"])
    r.ready(sync=True)
    inst = 0
    for peer in (2, 3):
        r.step(peer, [CAck(v, me, inst, r.ballot, True)])
    r.ready(sync=True)
    assert r.clog[me][inst].committed
    r.step(seq, [OAccept(v, 0, [me], True, 0)])
    rd = r.ready()
    assert r.exec_slot == 0, "fast-committed on an O-accept whose record is not on disk"
    r.persisted(rd.token)
    rd = r.ready()
    assert r.exec_slot == 1 and [ex.slot for ex in rd.executed] == [0]


def test_the_sequencer_counts_its_own_accept_only_once_durable():
    r = replica(3, me=0, seq=0)
    v = r.view
    r.step(1, [CRequest(v, 1, 0, ["k"])])
    rd = r.ready()  # slot 0 assigned and proposed; its "O" record not yet durable
    assert r.oslots[0].leader == 1 and rd.token
    r.step(2, [OAck(v, 1)])  # no driver lets this overtake the sync; the rule still holds
    assert not r.oslots[0].committed, "committed with one durable accept of three"
    r.persisted(rd.token)
    assert r.oslots[0].committed


def test_persisted_rejects_a_token_no_ready_had():
    r = replica(3, me=1, seq=0)
    try:
        r.persisted(5)
    except ValueError as e:
        assert "no Ready has that token" in str(e)
    else:
        raise AssertionError("persisted(5) accepted")


def test_handover_campaign_seed_302704_executes_only_what_it_holds_durably():
    """The campaign's failure, replayed: consistent and agreement over every incarnation."""
    assert judge_handover(handover_config(302704)) == []


def test_a_reelected_sequencer_counts_its_reproposal_only_once_durable():
    """Review 10, hole 1: a sequencer re-elected over slots it had proposed durably
    re-proposes them in the new view as fresh, unsynced accepts; its durable prefix
    must drop to them (before, it still covered the old view's objects)."""
    from consensus.core.messages import Vote

    r = replica(3, me=0, seq=0)
    v = r.view
    r.step(1, [CRequest(v, 1, 0, ["k"])])
    r.ready(sync=True)  # slot 0 proposed in view 0, durable; no OAck yet
    assert r.oslots[0].durable and r.o_durable == 1 and r.o_committed == 0
    r._start_election()
    r.ready(sync=True)
    v2 = r.view
    r.step(2, [Vote(v2, 0, [], [-1] * 3, 0, [-1] * 3)])
    assert r.phase == "recovering" and r.oslots[0].view == v2 and not r.oslots[0].durable
    rd = r.ready()  # the re-proposal's "O" record: written, not synced
    r.step(1, [OAck(v2, 1)])
    assert not r.oslots[0].committed and r.phase == "recovering", "counted an unsynced re-proposal"
    r.persisted(rd.token)
    assert r.oslots[0].committed and r.phase == "normal"


def test_a_cluster_has_an_odd_number_of_replicas_from_three():
    """Review 10: with one replica both protocols took their own unsynced accept for a
    whole quorum (and SDPaxos never answered); even counts are not tested."""
    import pytest

    for n in (1, 2, 4, 6):
        with pytest.raises(ValueError, match="odd number of replicas"):
            ProtocolConfig(n=n)
    for n in (3, 5, 7):
        assert ProtocolConfig(n=n).quorum == n // 2 + 1
