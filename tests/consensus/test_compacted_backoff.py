"""A command leader's own re-prepare dropped on a ``Compacted`` notice starts again
only after resend_ticks (mutant ``compacted-recovery-no-backoff``). Swarm seed 9203323
(N=5, LAN, snapshots every 5 slots) once ran forever at one simulated instant: the
re-prepare restarted at the very next ready(), was refused again, and so on. That
seed no longer reaches the schedule since replicas probe each other (issue 15); this
is the schedule itself, on one replica."""

from __future__ import annotations

from consensus.core.config import ProtocolConfig, make_ballot
from consensus.core.messages import Compacted, CPrepare
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine


def _prepares(rd) -> list:
    return [m for _dst, msgs in rd.messages for m in msgs if isinstance(m, CPrepare)]


def test_a_re_prepare_dropped_on_a_compacted_notice_waits_resend_ticks():
    cfg = ProtocolConfig(n=3, resend_ticks=6)
    r = SDPaxosReplica(1, cfg, KVStateMachine())
    # R2 recovered our instances at a higher ballot: we promised it, so our next
    # proposal must re-prepare first (review 7's rule).
    high = make_ballot(3, 2)
    r.step(2, [CPrepare(r.view, 1, 0, high, 10)])
    r.ready(sync=True)
    r.propose("c", 1, ["put", "k", "v"])
    assert _prepares(r.ready(sync=True)), "the re-prepare starts"
    # A peer has compacted our instances: it answers with a Compacted notice, and the
    # re-prepare is dropped (its phase 1 cannot be answered there).
    r.step(0, [Compacted(r.view, 0, 1, 5)])
    assert 1 not in r.crec
    for _ in range(cfg.resend_ticks - 1):  # ready() after ready(), ticks passing: not yet
        assert not _prepares(r.ready(sync=True)), r.now
        r.tick()
    seen = []
    for _ in range(3):
        r.tick()
        seen += _prepares(r.ready(sync=True))
    assert seen, "the re-prepare starts again after resend_ticks"
