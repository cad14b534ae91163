"""What a voter may answer to a VRequest, rule by rule on one replica: a restarted
replica votes only after one promise's length (it may have promised a lease it no
longer remembers; mutant ``restart-forgets-lease``), a replica asked for slots it
compacted answers with a Compacted notice instead of a vote (mutant
``vote-below-floor``), and a short C-commit commits only the value of its own ballot
(mutant ``short-commit-any-ballot``)."""

from consensus.core.config import ProtocolConfig, make_ballot
from consensus.core.messages import CAccept, CCommit, Compacted, Vote, VRequest
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine


def sent(r):
    return [m for _dst, msgs in r.ready().messages for m in msgs]


def test_a_restarted_replica_waits_one_promise_before_voting():
    cfg = ProtocolConfig(n=3, initial_sequencer=0)
    r = SDPaxosReplica(2, cfg, KVStateMachine(), records=[["V", 0]])  # restarted
    view = make_ballot(1, 1)
    r.step(1, [VRequest(view, 0)])
    assert not any(isinstance(m, Vote) for m in sent(r)), "voted right after a restart"
    while r.now < cfg.lease_ticks + 2:
        r.tick()
        r.ready()
    view = make_ballot(5, 1)
    r.step(1, [VRequest(view, 0)])
    assert any(isinstance(m, Vote) for m in sent(r)), "still no vote after the wait"


def test_a_vote_request_below_the_floor_gets_a_compacted_notice():
    cfg = ProtocolConfig(n=3, initial_sequencer=0)
    donor = SDPaxosReplica(0, cfg, KVStateMachine())
    meta = {"protocol": "sdpaxos", "n": 3, "slot": 10, "exec_inst": [4, 3, 3], "view": 0}
    r = SDPaxosReplica(2, cfg, KVStateMachine(), snapshot=(meta, donor.executor.snapshot()))
    assert r.floor_slot == 10
    while r.now < cfg.lease_ticks + 2:  # past the restart's wait
        r.tick()
        r.ready()
    r.step(1, [VRequest(make_ballot(5, 1), 4)])
    out = sent(r)
    assert not any(isinstance(m, Vote) for m in out), "voted without the slots it compacted"
    assert any(isinstance(m, Compacted) and m.slot == 10 for m in out)


def test_a_short_commit_of_another_ballot_commits_nothing():
    cfg = ProtocolConfig(n=3, initial_sequencer=0)
    r = SDPaxosReplica(2, cfg, KVStateMachine())
    b1, b2 = make_ballot(1, 0), make_ballot(2, 1)
    r.step(0, [CAccept(r.view, 0, 0, b1, [[900, 1, ["put", "k", "A"]]])])
    r.ready()
    r.step(1, [CCommit(r.view, 0, 0, b2, False, None)])  # chosen at b2: a value we never saw
    assert not r.clog[0][0].committed, "committed the b1 value on a short commit of b2"
