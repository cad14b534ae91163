"""Each replica measures how near its peers are and asks the nearest (issue 15).

``consensus.core.nearness``: probes every heartbeat, echoes at once, a smoothed round
trip per peer, an order that changes by hysteresis, and a slow-peer rule that compares
peers with each other. The golden transcript ``nearness-n3.txt`` shows one replica
learning its order; here: the rules one by one, and the simulator, whose replicas now
learn their order from any RTT matrix (no precomputed order), ending where the
nearest-first order would put them and committing within the one-round-trip bound.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.core.config import ProtocolConfig
from consensus.core.nearness import INF, SLOW_PEER_MEMORY_TICKS, Nearness
from consensus.sim.geo import peer_order
from consensus.sim.simulator import SimConfig, Simulation


def test_a_peer_joins_the_thrifty_quorum_only_when_clearly_nearer():
    near = Nearness(0, 5, (1, 2, 3, 4), k=2)  # N=5: the thrifty quorum is two peers
    assert near.order == [1, 2, 3, 4] and near.rtt[1:] == [INF] * 4
    near.echo(3, 10)  # measured beats never measured: 3 replaces the farther member
    assert near.order == [3, 1, 2, 4]
    near.echo(4, 10)  # and so does 4
    assert near.order == [3, 4, 1, 2]
    near.echo(1, 9)  # 9 vs the farthest member's 10: within max(1.5 ticks, 10 %), stays out
    assert near.order == [3, 4, 1, 2]
    near.echo(1, 5)  # average (3 * 9 + 5) / 4 = 8: clearly nearer than 10, replaces 4
    assert near.rtt[1] == 8.0 and near.order == [1, 3, 4, 2]
    near.echo(2, 100)
    assert near.order == [1, 3, 4, 2]


def test_members_and_the_rest_are_each_sorted_by_distance():
    near = Nearness(0, 5, (1, 2, 3, 4), k=2)
    for p, d in ((1, 30), (2, 20), (3, 12), (4, 40)):
        near.echo(p, d)
    assert near.order == [3, 2, 1, 4]


def test_smoothing_absorbs_one_late_echo():
    near = Nearness(0, 3, (1, 2))
    for _ in range(8):
        near.echo(1, 2)
        near.echo(2, 6)
    assert near.order == [1, 2]
    near.echo(1, 12)  # one late echo: 2 -> 4.5, still clearly nearer than 6
    assert near.order == [1, 2]


def test_a_slowed_peer_stays_while_it_is_still_the_nearest():
    near = Nearness(0, 3, (1, 2))
    near.echo(1, 2)
    near.echo(2, 20)
    for _ in range(4):
        near.ack(1, 2, now=10)
    for _ in range(6):
        near.ack(1, 12, now=20)  # five times its best ...
    assert near.ack_ewma[1] > 3 * near.ack_best[1] + 2
    assert not near.slow(1, 20, [1, 2])  # ... but R2 would take 20: R1 stays
    for _ in range(6):
        near.ack(1, 40, now=30)
    assert near.slow(1, 30, [1, 2])  # now asking R2 is faster
    assert not near.slow(1, 30 + SLOW_PEER_MEMORY_TICKS + 1, [1, 2])  # old evidence: retried


def test_the_default_config_measures():
    cfg = ProtocolConfig(n=3)
    assert cfg.measure_rtt and cfg.peer_order == ((1, 2), (2, 0), (0, 1))


def _sim(matrix: list[list[float]], seed: int, clients: int, seconds: float) -> Simulation:
    regions = [f"S{i}" for i in range(len(matrix))]
    doc = {"regions": regions, "rtt_ms": {a: {b: matrix[i][j] for j, b in enumerate(regions)} for i, a in enumerate(regions)}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        cfg = SimConfig(replicas=len(matrix), rtt="geo", rtt_file=f.name, clients_per_site=clients, seconds=seconds, seed=seed)
        return Simulation(cfg).run()
    finally:
        Path(f.name).unlink()


def _round_trips(matrix):
    n = len(matrix)
    return [[(matrix[a][b] + matrix[b][a]) / 2 if a != b else 0.0 for b in range(n)] for a in range(n)]


# Round trips 20 ms or more apart in every row; ring order (the prior) is wrong for
# every replica; one-way delays differ by direction (a->b 30 % more than b->a).
_RTT = {(0, 1): 90, (0, 2): 50, (0, 3): 70, (0, 4): 150, (1, 2): 130, (1, 3): 30, (1, 4): 110,
        (2, 3): 170, (2, 4): 10, (3, 4): 190}
ASYMMETRIC = [[1.0 if a == b else _RTT[(a, b)] * 1.3 if a < b else _RTT[(b, a)] * 0.7 for b in range(5)]
              for a in range(5)]


def test_the_simulator_learns_the_nearest_first_order_and_commits_in_one_round_trip():
    sim = _sim(ASYMMETRIC, seed=3, clients=2, seconds=4.0)
    rtt = _round_trips(ASYMMETRIC)
    want = peer_order(rtt)
    assert [tuple(sim.nodes[r].near.order) for r in range(5)] == list(want)
    assert all(tuple(sim.nodes[r].near.order) != sim.nodes[r].cfg.peer_order[r] for r in range(5))
    report = sim.summary()
    for r, site in enumerate(report["sites"].values()):
        # One round trip to the nearest majority (the sequencer's own are ordered at once),
        # plus the site's client hop: p50 within two ticks of that.
        bound = sorted(rtt[r][p] for p in range(5) if p != r)[1] + ASYMMETRIC[r][r]
        if r != 0:
            bound = max(bound, rtt[r][0])  # the sequencer's O-accept comes from S0 (N=5)
        assert site["p50_ms"] <= bound + 2 * sim.cfg.tick_ms, (r, site, bound)


@st.composite
def matrices(draw):
    """Round trips that are distinct multiples of 20 ms (two ticks) over all pairs, each
    pair split unevenly between its two directions."""
    n = draw(st.sampled_from([3, 5]))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    rtts = draw(st.permutations(range(1, len(pairs) + 1)))
    split = draw(st.lists(st.integers(2, 8), min_size=len(pairs), max_size=len(pairs)))
    m = [[1.0] * n for _ in range(n)]
    for (a, b), k, f in zip(pairs, rtts, split):
        m[a][b] = 20.0 * k * f / 5
        m[b][a] = 20.0 * k * (10 - f) / 5
    return m


@settings(max_examples=8, deadline=None)
@given(matrices(), st.integers(0, 1 << 16))
def test_any_matrix_with_distinct_distances_is_learned(matrix, seed):
    """Whatever the round trips (two ticks or more apart) and however uneven the two
    directions: every replica ends with the nearest-first order."""
    rtt = _round_trips(matrix)
    sim = _sim(matrix, seed=seed, clients=0, seconds=3.0)
    assert [tuple(sim.nodes[r].near.order) for r in range(len(matrix))] == list(peer_order(rtt))


def test_a_replica_answers_probes_at_once_and_learns_from_echoes():
    from consensus.core.messages import Echo, Probe
    from consensus.core.multipaxos import MultiPaxosReplica
    from consensus.core.sdpaxos import SDPaxosReplica
    from store.kv_machine import KVStateMachine

    for cls in (SDPaxosReplica, MultiPaxosReplica):
        cfg = ProtocolConfig(n=3, heartbeat_ticks=2)
        r = cls(1, cfg, KVStateMachine())
        r.step(0, [Probe(0, 77)])
        rd = r.ready()
        # In this very Ready, as an urgent message: not behind any record's sync.
        assert [(dst, m) for dst, msgs in rd.urgent for m in msgs] == [(0, Echo(r.view, 77))], cls
        assert not any(isinstance(m, Echo) for _dst, msgs in rd.messages for m in msgs), cls
        while r.now < 12:
            r.tick()
            r.ready()
        r.step(2, [Echo(0, 9)])  # a probe of tick 9 back at tick 12: 3 ticks
        r.step(0, [Echo(0, 11)])
        assert (r.near.rtt[0], r.near.rtt[2]) == (1.0, 3.0) and r.near.order == [0, 2], cls
        # An echo of a probe from before a restart (its stamp is ahead of our clock), or
        # a forged negative stamp, teaches nothing.
        r.step(2, [Echo(0, 40)])
        r.step(2, [Echo(0, -5)])
        assert r.near.rtt[2] == 3.0, cls
