"""The simulator's workload with compare-and-set and lease reads, and its checks.

``cas_fraction`` turns some commands into ``["cas", key, expected, new]`` on the same
small key set (expected: the last value that client saw); gets go through the
sequencer's lease. The history is checked for linearizability under the jepsen_like
key-value model (a cas that answered False is a ``fail``: it did not happen), and the
executed logs for per-slot agreement.
"""

import dataclasses

import pytest

from consensus.sim import SimConfig, Simulation
from consensus.sim.scenarios import random_schedule
from jepsen_like.checker import check
from jepsen_like.history import Op
from jepsen_like.models import KV


def cas_run(protocol="sdpaxos", replicas=3, seed=1, **kw):
    cfg = SimConfig(
        protocol=protocol, replicas=replicas, seconds=3.0, seed=seed, clients_per_site=3, read_fraction=0.3,
        cas_fraction=0.4, keys=2, client_timeout_ms=1000.0, **kw,
    )
    return Simulation(cfg).run()


@pytest.mark.parametrize("protocol", ["sdpaxos", "multipaxos"])
def test_cas_workload_is_linearizable_and_every_result_matches_the_replay(protocol):
    sim = cas_run(protocol)
    result = sim.summary()
    assert result["consistent"] and result["agreement"]
    assert result["lost_acked"] == 0 and result["duplicated"] == 0 and result["wrong_results"] == 0
    cas = [h for c in sim.clients.values() for h in c.history if h[2][0] == "cas"]
    assert len(cas) > 50
    assert any(h[3] is True for h in cas) and any(h[3] is False for h in cas), "some succeed, some do not"
    ops = sim.history_ops()
    assert {op.f for op in ops} == {"get", "put", "cas"}
    assert any(op.type == "fail" and op.f == "cas" for op in ops)
    assert sim.linearizable() is True


def test_reads_go_through_the_sequencer_lease():
    sim = cas_run(replicas=5, seed=2)
    assert sum(r.stats["lease_reads"] for r in sim.all_replicas) > 20
    assert sim.linearizable() is True


def test_cas_under_faults_with_skewed_clocks():
    cfg = SimConfig(
        replicas=5, seconds=3.0, seed=9, clients_per_site=2, read_fraction=0.3, cas_fraction=0.3, keys=1,
        client_timeout_ms=1000.0, jitter=0.5, loss=0.02, tick_skew=(0.02, -0.02, 0.01, -0.01, 0.0),
        faults=random_schedule(5, 3.0, 9),
    )
    sim = Simulation(cfg).run()
    result = sim.summary()
    assert result["consistent"] and result["agreement"] and result["lost_acked"] == 0
    assert sim.quiet() and sim.linearizable() is True


def test_the_checker_refutes_a_wrong_cas_answer():
    """The check has teeth: flip one successful cas to failed (or back) in the history."""
    sim = cas_run(seed=3)
    ops = sim.history_ops()
    assert check(ops, KV()).linearizable is True
    # A cas that succeeded is now reported as failed, while later reads saw its value.
    flipped = None
    for i, op in enumerate(ops):
        if op.f == "cas" and op.type == "ok":
            later_reads = [o for o in ops[i:] if o.f == "get" and o.type == "ok" and o.value == (op.value[0], op.value[1][1])]
            if later_reads:
                flipped = i
                break
    assert flipped is not None
    bad = list(ops)
    bad[flipped] = dataclasses.replace(ops[flipped], type="fail")
    assert check(bad, KV()).linearizable is False


def test_agreement_catches_two_replicas_executing_different_batches_at_one_slot():
    sim = cas_run(seed=4)
    assert sim.check()["agreement"]
    seg = next(k for k, log in enumerate(sim.exec_logs) if len(log) > 3)
    label, ids = sim.exec_logs[seg][2]
    sim.exec_logs[seg][2] = (label, ids[:-1] + ((999, 1),))
    assert not sim.check()["agreement"]


def test_a_cas_left_unanswered_is_indeterminate():
    sim = cas_run(seed=5)
    client = next(iter(sim.clients.values()))
    client.op, client.t_send = ["cas", "k0", None, "x"], sim.now
    ops = sim.history_ops()
    assert ops[-1] == Op(ops[-1].index, sim.now, client.cid, "info", "cas", ("k0", (None, "x")))
