"""The sequencer's assignment (Fig. 5 line 13): C-instance i of leader n owns the
(i+1)-th O-slot naming n, so a C-request for instance i gives n slots until it owns
i + 1 of them, even if the requests for earlier instances were lost (mutant
``oslot-out-of-order``); the slots of instances whose keys it never saw make lease
reads wait (``unknown_keys_slot``)."""

from consensus.core.config import ProtocolConfig
from consensus.core.messages import CRequest
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine


def test_a_request_for_a_later_instance_assigns_the_earlier_ones_too():
    s = SDPaxosReplica(0, ProtocolConfig(n=3, initial_sequencer=0), KVStateMachine())
    start = s.next_slot
    s.step(1, [CRequest(s.view, 1, 2, ["c"])])  # the requests for instances 0 and 1 were lost
    mine = [j for j, slot in sorted(s.oslots.items()) if slot.leader == 1]
    assert mine == [start, start + 1, start + 2], "instance 2 owns the third slot naming R1"
    assert s.history["c"] == start + 2
    assert s.unknown_keys_slot == start + 1, "the keys of instances 0 and 1 are unknown"
    s.step(1, [CRequest(s.view, 1, 1, ["b"])])  # a late request: already assigned
    assert [j for j, slot in s.oslots.items() if slot.leader == 1] == mine
