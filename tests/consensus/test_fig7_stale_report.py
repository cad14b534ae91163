"""Fig. 7 (N = 5): a slot whose highest report is from a view older than the last
serving one, and not committed, is a hole that R_m may own.

Found by the steered search on 19ce4a0 (seed 5095, fork 136:1): a new sequencer kept
a stale view-36 report at a slot that the last serving view (67) had given R_m, and
R_m had executed it on the fast path (SafetyViolation: executed O-slot re-proposed).
That replay depends on simulator timing (5f12fd7 moved executions to the durable
point and it no longer reaches the state), so this is the rule as a fixed schedule:
the candidate's phase 1 sees R0's slot 0 only at the old view, the last serving view
is R3's (which does not vote), and a voter accepted R_m's C-instance 0.
"""

from consensus.core.config import ProtocolConfig, make_ballot
from consensus.core.messages import OAccept, Vote
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine

R_M, ME, LAST = 2, 1, 3


def test_a_stale_old_view_report_is_a_hole_that_r_m_gets():
    r = SDPaxosReplica(ME, ProtocolConfig(n=5, initial_sequencer=0), KVStateMachine())
    v_old = r.view
    v_last = make_ballot(1, LAST)
    r.step(LAST, [OAccept(v_last, 3, [LAST], True, 0)])  # the last serving view: R3's
    r.ready(sync=True)
    r._start_election()
    r.ready(sync=True)
    view = r.view
    own0 = [0, -1, -1, -1, -1]
    r.step(0, [Vote(view, 0, [[0, 0, v_old, False]], own0, v_old, own0)])  # slot 0 seen only at the old view
    c_max = [-1, -1, 0, -1, -1]  # R4 accepted R_m's C-instance 0
    r.step(4, [Vote(view, 0, [[3, LAST, v_last, False]], c_max, v_last, c_max)])
    assert r.phase == "recovering"
    log = {j: s.leader for j, s in sorted(r.oslots.items())}
    # View v_last may have given slot 0 to R_m, which may have executed it: R_m's
    # instance 0 must stay at slot 0, not move behind a stale value.
    assert log[0] == R_M, f"slot 0 kept the stale old-view value: {log}"
    assert log[3] == LAST
