"""Phase 1 of a recovery re-proposes the value accepted at the highest ballot, not the
first one reported (Paxos; mutants ``recovery-first-value`` and
``multipaxos-recovery-ignores-views``). One replica, messages built by hand.

The schedule, N = 3 (SDPaxos C-instance (R1, 0)):

1. R2 recovers R1's instances at ballot b1 with R0's empty promise and accepts a
   no-op at b1 itself (its C-accepts are lost).
2. Meanwhile R1 re-prepared at b2 > b1 with R0 and got X accepted by R1 and R0 at b2:
   X is chosen (its commit is lost).
3. R2 recovers again at b3 > b2. Its own report (the no-op at b1) comes first, R0's
   (X at b2) second. Re-proposing the no-op would choose a second value.
"""

from consensus.core.config import ProtocolConfig, make_ballot
from consensus.core.messages import CPromise, Vote
from consensus.core.multipaxos import MultiPaxosReplica
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine

X = [[900, 1, ["put", "k", "X"]]]


def test_c_recovery_re_proposes_the_highest_ballot_value_not_its_own_first():
    r = SDPaxosReplica(2, ProtocolConfig(n=3, initial_sequencer=0), KVStateMachine())
    r._start_crecovery(1, 0, 0)
    b1 = r.crec[1].ballot
    r.step(0, [CPromise(r.view, 1, b1, True, [])])
    assert r.clog[1][0].ballot == b1 and r.clog[1][0].cmds is None, "R2 accepted a no-op at b1"
    r.ready()  # its C-accepts go nowhere
    b2 = make_ballot(2, 1)  # R1's re-prepare: above b1
    r._start_crecovery(1, 0, 0, seen_ballot=b2)
    b3 = r.crec[1].ballot
    assert b1 < b2 < b3
    r.step(0, [CPromise(r.view, 1, b3, True, [[0, b2, X, False]])])
    c = r.clog[1][0]
    assert c.ballot == b3
    assert c.cmds == X, f"re-proposed {c.cmds!r} at b3, but X was accepted at the higher ballot b2"


def test_multipaxos_take_office_re_proposes_the_highest_view_value():
    """Multi-Paxos: R2 becomes leader; its own log holds Y at an old view, R0's vote
    reports X at a higher view. X may be chosen: it must be re-proposed."""
    r = MultiPaxosReplica(2, ProtocolConfig(n=3, initial_sequencer=0), KVStateMachine())
    from consensus.core.multipaxos import MSlot

    old = r.view
    r.log[0] = MSlot(old, [[901, 1, ["put", "k", "Y"]]])
    r._start_election()
    view = r.view
    higher = make_ballot(1, 1)  # a view between R0's and R2's: R1 led it
    assert old < higher < view
    r.step(0, [Vote(view, 0, [[0, higher, X, False]], [], 0, [])])
    assert r.log[0].batch == X, f"re-proposed {r.log[0].batch!r}; X was accepted in the higher view"


def test_a_short_commit_of_another_ballot_does_not_commit_the_held_value():
    """Trap 6: a short C-commit (no value) names its ballot; a replica holding a value
    of another ballot for that instance must not mark it chosen (mutant
    ``short-commit-any-ballot``): it fetches the chosen value instead."""
    from consensus.core.messages import CAccept, CCommit

    r = SDPaxosReplica(2, ProtocolConfig(n=3, initial_sequencer=0), KVStateMachine())
    b1, b2 = make_ballot(0, 1), make_ballot(1, 0)
    r.step(1, [CAccept(r.view, 1, 0, b1, X)])
    assert r.clog[1][0].cmds == X and not r.clog[1][0].committed
    r.step(0, [CCommit(r.view, 1, 0, b2, False, None)])  # chosen at b2: maybe another value
    assert not r.clog[1][0].committed, "marked X chosen on a commit of another ballot"
    r.step(0, [CCommit(r.view, 1, 0, b1, False, None)])
    assert r.clog[1][0].committed
