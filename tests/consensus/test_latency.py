"""Commit latency matches the protocols' round trips (paper §3.2, Fig. 12).

The bounds are derived from the RTT matrix, not hard-coded: SDPaxos answers a blind
write after max(RTT to the nearest quorum containing the command leader, RTT to the
sequencer); Multi-Paxos pays the hop to the leader plus the leader's quorum RTT.
"""

import pytest

from consensus.sim import SimConfig, Simulation
from consensus.sim.geo import sites_for


def nearest_quorum_rtt(matrix, site):
    n = len(matrix)
    others = sorted(matrix[site][p] for p in range(n) if p != site)
    return others[n // 2 - 1]  # a majority is me plus n // 2 peers


def run(protocol, replicas, sequencer=0, seconds=3.0):
    cfg = SimConfig(protocol=protocol, replicas=replicas, rtt="geo", sequencer=sequencer, clients_per_site=2, seconds=seconds)
    return Simulation(cfg).run().summary()


def assert_close(measured, bound, what):
    assert abs(measured - bound) <= 0.10 * bound + 2.0, f"{what}: p50 {measured} ms, bound {bound} ms"


@pytest.mark.parametrize("replicas", [3, 5])
@pytest.mark.parametrize("sequencer", [0, 1])
def test_sdpaxos_commits_in_one_round_trip(replicas, sequencer):
    names, matrix = sites_for(replicas, "geo")
    result = run("sdpaxos", replicas, sequencer)
    assert result["consistent"] and result["lost_acked"] == 0
    for site, name in enumerate(names):
        bound = max(nearest_quorum_rtt(matrix, site), matrix[site][sequencer] if site != sequencer else 0)
        assert_close(result["sites"][name]["p50_ms"], bound, f"{name} (sequencer {names[sequencer]})")


def test_paper_figures_for_three_and_five_replicas():
    three = run("sdpaxos", 3)["sites"]
    assert [round(three[s]["p50_ms"]) for s in ("CA", "OR", "OH")] == [21, 20, 53]
    five = run("sdpaxos", 5)["sites"]
    assert [round(five[s]["p50_ms"]) for s in ("CA", "OR", "OH", "IRE", "SEL")] == [53, 68, 69, 139, 147]


@pytest.mark.parametrize("replicas", [3, 5])
def test_multipaxos_pays_the_hop_to_the_leader(replicas):
    names, matrix = sites_for(replicas, "geo")
    leader = 0
    mp = run("multipaxos", replicas, leader)
    sd = run("sdpaxos", replicas, leader)
    assert mp["consistent"]
    for site, name in enumerate(names):
        own = nearest_quorum_rtt(matrix, leader)
        bound = own if site == leader else matrix[site][leader] + own
        assert_close(mp["sites"][name]["p50_ms"], bound, f"multipaxos {name}")
        if site != leader:
            assert sd["sites"][name]["p50_ms"] < mp["sites"][name]["p50_ms"]


def test_seven_replicas_commit_and_agree():
    result = run("sdpaxos", 7, seconds=2.0)
    assert result["consistent"] and result["lost_acked"] == 0 and result["committed"] > 0
