"""N = 5, Fig. 7: a filled hole must not push R_m's traced slot onto a C-instance
that does not exist yet (fault regression
"sdpaxos-n5-acked-write-reordered-after-a-later-command").

O-slots carry only the command leader; the k-th slot naming R_m stands for R_m's
k-th C-instance. Fig. 7 proposes R_m in the holes until R_m owns C[m] + 1 slots.
A slot of R_m that a voter traced *after* those holes then counts one instance
further per filled hole: it stands for a C-instance beyond C[m] that no voter saw,
i.e. one R_m may not even have received yet. When that command arrives it gets the
old slot, ahead of commands that were acknowledged in between, and the session
table then skips the earlier write of the same client as a stale duplicate.

The rule (paper §3.4, linearizability proof: "when the sequencer proposes Rn's ID in
the i-th O-instance for Rn, there must be less than j O-instances for Rm in all
preceding ones, because the request for the j-th command of Rm has not arrived"):
after a view change, an O-slot of R_m past its C[m] + 1-th stands for an instance
that may not exist yet; the new sequencer decides those C-instances (a no-op where R_m
has nothing) before it serves. (An earlier fix made such slots no-cl; review 3 showed
that changes a value the old sequencer may have committed: test_review3_fig7_surplus.)
"""

import json
from pathlib import Path

from consensus.core.config import ProtocolConfig
from consensus.core.messages import CAck, CPromise, CRequest, OAccept, OAck, Vote
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine
from consensus.sim import Simulation
from consensus.sim.search import config_from_json, judge

OLD_SEQ = 3  # the old sequencer (view 3); it neither votes nor comes back here
R_M = 2  # neither a voter nor the old sequencer: Fig. 7's R_m
ME = 1  # the candidate; R0 and R4 vote for it


def slot_of(replica, leader, inst):
    """The O-slot standing for ``leader``'s C-instance ``inst`` (numbering by position)."""
    seen = 0
    for j in sorted(replica.oslots):
        if replica.oslots[j].leader == leader:
            if seen == inst:
                return j
            seen += 1
    return None


def test_fig7_gives_r_m_no_slot_past_its_highest_accepted_instance():
    r = SDPaxosReplica(ME, ProtocolConfig(n=5, initial_sequencer=OLD_SEQ), KVStateMachine())
    old_view = r.view
    # View 3: the old sequencer ordered R0:0 at slot 0, R2:0 at slot 1, R2:1 at slot 2;
    # only the O-accept of slot 2 reached R1. No voter accepted R2's C-instance 1.
    r.step(OLD_SEQ, [OAccept(old_view, 2, [R_M], True, 0)])
    r.ready(sync=True)
    r._start_election()
    view = r.view
    r.ready(sync=True)
    c_max = [-1, -1, 0, -1, -1]  # R0 accepted R2's C-instance 0, nobody its instance 1
    for voter in (0, 4):
        r.step(voter, [Vote(view, 0, [], c_max, old_view, c_max)])
    assert r.phase == "recovering"
    # Fig. 7: slot 0 (a hole) goes to R2, which then owns C[2] + 1 = 1 slot.
    assert r.oslots[0].leader == R_M
    assert slot_of(r, R_M, 0) == 0
    log = {j: s.leader for j, s in sorted(r.oslots.items())}
    assert log[2] == R_M, "the reported slot keeps its value (it may be chosen)"
    end = r.next_slot
    r.ready(sync=True)
    for voter in (0, 4):
        r.step(voter, [OAck(view, end)])
    # Slot 2 now stands for R2's instance 1, which no voter saw: R2 may not have
    # proposed it yet. The view serves only once that instance is decided.
    assert r.phase == "recovering", "serving before R2's instance 1 is decided"
    rec = r.crec.get(R_M)
    assert rec is not None and rec.from_inst == 1, "the new sequencer recovers R2's instance 1"
    r.ready(sync=True)
    for voter in (0, 4):
        r.step(voter, [CPromise(view, R_M, rec.ballot, True, [])])
    r.ready(sync=True)
    for voter in (0, 4):
        r.step(voter, [CAck(view, R_M, 1, rec.ballot, True)])
    assert r.clog[R_M][1].committed and r.clog[R_M][1].cmds is None, "decided: a no-op"
    assert r.phase == "normal"

    # The new sequencer's own write X is acknowledged (C- and O-instance by a majority).
    r.propose(101, 1, ["put", "k0", "X"])
    inst = r.next_inst
    r.ready(sync=True)
    x_slot = slot_of(r, ME, inst)
    assert x_slot is not None and x_slot >= end
    for peer in (0, 4):
        r.step(peer, [CAck(view, ME, inst, r.ballot, True), OAck(view, r.next_slot)])
    assert any(rep.client == 101 and rep.seq == 1 for rep in r.ready(sync=True).replies), "X was acknowledged"

    # R2's next command (its instance 2, since instance 1 is a no-op) is ordered after X.
    r.step(R_M, [CRequest(view, R_M, 2, ["k0"])])
    r.ready(sync=True)
    later = slot_of(r, R_M, 2)
    assert later is not None and later > x_slot, f"R2:2 at slot {later}, before the acknowledged X at {x_slot}; recovered log {log}"


def test_recorded_schedule_keeps_the_acknowledged_put():
    """The swarm schedule itself: client 1000's put seq 2, acknowledged by R1 as
    (1, 2), executes everywhere; its cas seq 3 (retried at R2) comes after it."""
    path = Path(__file__).resolve().parents[1] / "testdata" / "fault_regressions.json"
    entry = next(e for e in json.loads(path.read_text()) if e.get("name") == "sdpaxos-n5-acked-write-reordered-after-a-later-command")
    cfg = config_from_json(entry["config"])
    sim = Simulation(cfg).run()
    assert (1000, 2) in sim.acked
    for log in sim.exec_logs:
        ids = [cmd for _label, cmds in log for cmd in cmds]
        if (1000, 3) in ids:
            assert (1000, 2) in ids and ids.index((1000, 2)) < ids.index((1000, 3)), "the cas ran before the acked put"
    result = judge(cfg)
    assert result["lost_acked"] == 0 and not result["failures"], result["failures"]
