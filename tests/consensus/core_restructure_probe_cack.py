"""Unsolicited CAck for an own record outside unready: the one input where the cores of
fe9c7b0 and 1271bbb differ (no correct peer sends it; docs/reviews/core-restructure-review.md).
Run per tree: PYTHONPATH=<tree> python3 tests/consensus/core_restructure_probe_cack.py"""
from consensus.core.config import ProtocolConfig, make_ballot
from consensus.core.messages import CAccept, CAck
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine

cfg = ProtocolConfig(n=3)
for kind in ("nack", "ok"):
    r = SDPaxosReplica(0, cfg, KVStateMachine())
    r.ready()
    b1 = make_ballot(1, 1)
    r.step(1, [CAccept(r.view, 0, 0, b1, None)])  # R1 (a recoverer) put a no-op at our instance 0
    rd = r.ready()
    assert 0 in r.clog[0] and 0 not in r.unready
    b2 = make_ballot(2, 2)
    if kind == "nack":
        r.step(2, [CAck(r.view, 0, 0, b2, False)])
    else:
        r.step(2, [CAck(r.view, 0, 0, b1, True)])
        r.step(1, [CAck(r.view, 0, 0, b1, True)])
    rd = r.ready()
    print(kind, "crec:", sorted(r.crec), "committed:", r.clog[0][0].committed,
          "sent:", sorted({type(m).__name__ for _, ms in rd.messages for m in ms}),
          "persist:", rd.persist)
