"""Reads through the sequencer lease (paper §3.5; issue 3, acceptance 3)."""

import pytest

from consensus.core.messages import RReply, RRequest
from consensus.sim import SimConfig, Simulation
from consensus.sim.scenarios import schedule
from consensus.sim.simulator import Client


def quiet_cluster(**kw):
    cfg = SimConfig(replicas=3, clients_per_site=0, seconds=3.0, **kw)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)  # leases established by pings
    return sim


def collect_replies(sim, cid=7, site=1):
    """Register a hand-driven client and record what reaches it."""
    sim.clients[cid] = Client(cid, site, active=False)
    got = []
    sim._on_reply = lambda cid, seq, result: got.append((cid, seq, result))
    return got


def test_a_lease_read_costs_two_messages_at_a_non_sequencer():
    sim = quiet_cluster()
    assert sim.nodes[0].lease_valid()
    sim.nodes[1].propose(7, 1, ["put", "k", "v1"])
    sim._drain(1)
    sim.run(until_ms=1200)
    got = collect_replies(sim)
    sim.message_counts = {}
    sim.nodes[1].read(7, 2, ["get", "k"], "k")
    sim._drain(1)
    sim.run(until_ms=1300)
    assert got == [(7, 2, "v1")]
    reads = {k: v for k, v in sim.message_counts.items() if k in (RRequest.__name__, RReply.__name__)}
    assert reads == {"RRequest": 1, "RReply": 1}
    assert sim.nodes[1].stats["lease_reads"] == 1 and sim.nodes[1].stats["log_reads"] == 0


def test_the_sequencer_reads_locally_without_messages():
    sim = quiet_cluster()
    sim.nodes[0].propose(7, 1, ["put", "k", "v1"])
    sim._drain(0)
    sim.run(until_ms=1200)
    got = collect_replies(sim, site=0)
    sim.message_counts = {}
    sim.nodes[0].read(7, 2, ["get", "k"], "k")
    sim._drain(0)
    assert got == [] and sim.message_counts == {}
    sim.run(until_ms=1210)
    assert got == [(7, 2, "v1")]


def test_without_a_lease_reads_go_through_the_log():
    sim = quiet_cluster()
    sim.msg_filter = lambda src, dst, msg: type(msg).__name__ != "Pong"  # leases lapse
    sim.nodes[0].propose(7, 1, ["put", "k", "v1"])
    sim._drain(0)
    sim.run(until_ms=1700)
    assert not sim.nodes[0].lease_valid()
    got = collect_replies(sim)
    sim.nodes[1].read(7, 2, ["get", "k"], "k")
    sim._drain(1)
    sim.run(until_ms=1900)
    assert got == [(7, 2, "v1")]
    assert sim.nodes[1].stats["log_reads"] == 1


@pytest.mark.parametrize("replicas", [3, 5])
@pytest.mark.parametrize("seed", range(4))
def test_no_stale_read_across_a_view_change_with_the_old_sequencer_cut_off(replicas, seed):
    """The old sequencer is isolated but alive: it may serve reads only while its lease
    holds, and no new sequencer (hence no newer write) exists before it expires."""
    seconds = 8.0
    cfg = SimConfig(
        replicas=replicas,
        seconds=seconds,
        seed=seed,
        clients_per_site=3,
        read_fraction=0.6,
        keys=1,
        client_timeout_ms=1000,
        # Every clock within the drift bound (5 %): the old sequencer's runs slow.
        tick_skew=(0.04,) + tuple(((-1) ** i) * 0.02 for i in range(1, replicas)),
        faults=schedule("partition-sequencer", replicas, 0, seconds),
    )
    sim = Simulation(cfg).run()
    result = sim.summary()
    assert result["view_changes"] >= 1
    assert sum(r.stats["lease_reads"] for r in sim.all_replicas) > 0
    assert result["consistent"] and result["lost_acked"] == 0
    assert sim.linearizable() is True, f"seed {seed}"


def test_a_write_with_unknown_keys_holds_back_every_lease_read():
    """A write whose keys are known only once applied (``ALL_KEYS``: a prefix delete, a
    txn with one, a lease expiry) must make every lease read wait for its slot, or a
    read of a key it removes is served stale from the lease (helper-found, issue 12)."""
    from consensus.core.config import ProtocolConfig
    from consensus.core.sdpaxos import SDPaxosReplica
    from store.kv_machine import ALL_KEYS, KVStateMachine

    r = SDPaxosReplica(0, ProtocolConfig(n=3, initial_sequencer=0), KVStateMachine())
    assert r.id == r.sequencer and r.phase == "normal"
    r.lease_expiry = r.now + 1000  # as if a majority renewed the lease
    r._assign(1, 0, ["k"])
    assert r._read_slot("k") == 0 and r._read_slot("other") == -1
    r._assign(2, 0, [ALL_KEYS])  # e.g. delete_range prefix "" at slot 1
    assert r._read_slot("other") == 1 and r._read_slot("k") == 1
