"""Membership change, part 1 (docs/membership.md): a reconfiguration command closes the
epoch with an END O-slot. The rules and the schedules that break them:

- S1: a sequencer that executed the reconfiguration orders nothing new and then
  places END; nothing after END is chosen or acknowledged
  (``test_a_reconfiguration_closes_the_epoch_at_one_end_slot``, mutant
  ``end-assign-while-closing``).
- S2: a closing sequencer hands out no lease read
  (``test_a_closing_sequencer_serves_no_lease_read``, mutant ``end-lease-read-while-closing``).
- X: execution stops at END and reports it once (``Ready.epoch_end``).
- V: a view change keeps a chosen END and truncates its recovered log there
  (``test_a_chosen_end_survives_its_sequencer``, mutants ``end-never-terminal``,
  ``end-no-truncate``); an END that cannot be chosen becomes a no-op (the swarm
  search with ``--reconfig``).
"""

from __future__ import annotations

import pytest

from consensus.core.config import END
from consensus.core.executor import RECONFIG, Executor, check_reconfig
from consensus.sim import SimConfig, Simulation
from consensus.sim.search import judge, swarm_config
from store.kv_machine import KVStateMachine

from .test_snapshot import assert_safe


def _admin_results(sim):
    return [c.history[-1][3] for c in sim.clients.values() if c.admin and c.history]


def _assert_closed(sim):
    """Every live replica ended the epoch at one END slot, nothing above it committed,
    nothing acknowledged lost, the history linearizable."""
    ends = sim.ended()
    live = [i for i, r in enumerate(sim.nodes) if r is not None]
    assert sorted(ends) == live, f"not every live replica ended: {ends}"
    assert len(set(ends.values())) == 1, ends
    checks = sim.check()
    assert checks["agreement"] and checks["past_end"] == 0, checks
    assert_safe(sim)
    assert sim.linearizable() is True
    return next(iter(ends.values()))


@pytest.mark.parametrize("n", [3, 5])
def test_a_reconfiguration_closes_the_epoch_at_one_end_slot(n):
    """Under load (two clients per site), the reconfiguration asked at 60 ms closes the
    epoch: one END slot everywhere, every slot below it executed, the admin's answer
    names the next epoch, and the commands still owed an answer were never
    acknowledged (they are what the epoch layer re-proposes)."""
    sim = Simulation(SimConfig(replicas=n, rtt="lan", seconds=0.12, seed=7, clients_per_site=2,
                               faults=[(60, "reconfig", 1)]))
    sim.run()
    end = _assert_closed(sim)
    assert end > 50  # the load ran before the close
    (result,) = _admin_results(sim)
    assert result["ok"] and result["epoch"] == 1, result
    seq = sim.nodes[sim.nodes[0].sequencer]
    assert seq.oslots[end].leader == END and max(seq.oslots) == end
    owed = [tuple(c[:2]) for r in sim.nodes for c in r.unfinished()]
    assert owed, "clients were sending when the epoch closed"
    assert not set(owed) & sim.acked


def test_a_second_reconfiguration_is_refused():
    sim = Simulation(SimConfig(replicas=3, rtt="lan", seconds=0.4, seed=3,
                               faults=[(100, "reconfig", 0), (100.5, "reconfig", 2, ["a", "b", "c"])]))
    sim.run()
    _assert_closed(sim)
    results = _admin_results(sim)
    assert sum(1 for r in results if r["ok"]) == 1, results
    assert all("already ends" in r["error"] for r in results if not r["ok"])


def test_the_reconfiguration_command_is_checked_the_same_everywhere():
    assert check_reconfig([RECONFIG, 0, ["a", "b", "c"], "a"], 0) is None
    assert "epoch" in check_reconfig([RECONFIG, 1, ["a", "b", "c"], "a"], 0)
    assert "odd" in check_reconfig([RECONFIG, 0, ["a", "b"], "a"], 0)
    assert "distinct" in check_reconfig([RECONFIG, 0, ["a", "a", "b"], "a"], 0)
    assert "not a member" in check_reconfig([RECONFIG, 0, ["a", "b", "c"], "d"], 0)
    assert "names" in check_reconfig([RECONFIG, 0, ["a", "", "c"], "a"], 0)
    ex = Executor(KVStateMachine())
    out = []
    ex.run([["c", 1, [RECONFIG, 0, ["a", "b", "c"], "b"]], ["c", 2, [RECONFIG, 0, ["x", "y", "z"], "x"]]], out)
    assert out[0][2]["ok"] and not out[1][2]["ok"]
    assert ex.reconfig == [0, ["a", "b", "c"], "b"]
    # The pending reconfiguration is replicated state: in the snapshot, and only there
    # when there is one (a snapshot without it is byte-identical to before).
    again = Executor(KVStateMachine())
    again.restore(ex.snapshot())
    assert again.reconfig == ex.reconfig and again.snapshot() == ex.snapshot()
    plain = Executor(KVStateMachine())
    assert len(__import__("msgpack").unpackb(plain.snapshot())) == 3


def test_a_closing_sequencer_serves_no_lease_read():
    """S2: reads that reach the sequencer after it executed the reconfiguration get no
    lease slot (a read answered then could miss a write of the next epoch); they stay
    owed, for the next epoch."""
    sim = Simulation(SimConfig(replicas=3, rtt="lan", seconds=0.3, seed=5, read_fraction=0.5,
                               faults=[(100, "reconfig", 0)]))
    seq = sim.nodes[0]
    closed_at = None
    t = 0
    while t < 300:
        t += 1
        sim.run(until_ms=t)
        if closed_at is None and seq.executor.reconfig is not None:
            closed_at = seq.stats["lease_reads"]
            seq.read("late", 1, ["get", "k1"], "k1")  # a read arriving now
            sim._drain(0)
    assert closed_at is not None
    assert seq.stats["lease_reads"] == closed_at
    assert ["late", 1, ["get", "k1"], True] in seq.unfinished()


@pytest.mark.parametrize("n", [3, 5])
def test_a_chosen_end_survives_its_sequencer(n):
    """V: the sequencer's END reaches a bare majority (itself and 1 or 2 peers), no
    commit of it goes out, and the sequencer crashes. The next view finds END in its
    votes and keeps it: the epoch ends at that same slot everywhere, the old sequencer
    (restarted, it executed END before it crashed) included. A view change that
    replaced it by a no-op would end the others one slot later."""
    sim = Simulation(SimConfig(replicas=n, rtt="lan", seconds=0.6, seed=11, heartbeat_ms=60, ping_ms=12,
                               lease_ms=60, recovery_ms=60, resend_ms=60, tick_ms=3,
                               faults=[(100, "reconfig", 1)]))
    seq = sim.nodes[0]
    reach = set(range(1, (n + 1) // 2))  # with the sequencer: a bare majority

    def keep(src, dst, m):
        if src == 0 and seq.end_slot >= 0:
            name = type(m).__name__
            if name == "OCommit":
                return False
            if name == "OAccept" and END in m.leaders:
                return dst in reach
        return True

    sim.msg_filter = keep
    t = 0
    while t < 400 and not (seq.ended >= 0 and all(sim.nodes[r].oslots.get(seq.end_slot) for r in reach)):
        t += 1
        sim.run(until_ms=t)
    assert seq.ended >= 0, "the sequencer never executed its END"
    end = seq.ended
    sim.crash(0)
    sim.msg_filter = None
    sim.run(until_ms=t + 300)
    sim.restart(0)
    sim.run()
    assert _assert_closed(sim) == end


@pytest.mark.parametrize("seed", [100452, 100739, 14])
def test_swarm_runs_with_a_reconfiguration_close_safely(seed):
    """Seeds of ``cellar sim search --reconfig`` (view changes, crashes and drops around
    the close): safe, linearizable, and every live replica past one END. The search
    found 100452 and 100739: a candidate whose committed prefix (which no vote
    reports) held END served after it (a second END; not closing yet, it would have
    ordered new commands there). Mutant ``end-candidate-forgets-own-end``."""
    result = judge(swarm_config(seed, reconfig=True))
    assert result["failures"] == [], result["failures"]
    assert result.get("epoch_end"), "the epoch did not close"


def test_a_sequencer_that_installs_a_snapshot_past_end_places_no_second_end():
    """X: a snapshot taken after END carries it (meta ``ended``); a sequencer that
    installs one has ended the epoch, and closes no second time (it would put an END
    after the chosen one). Mutant ``end-after-installed-end``."""
    from consensus.core.config import ProtocolConfig
    from consensus.core.sdpaxos import SDPaxosReplica

    done = Executor(KVStateMachine())
    done.run([["admin", 1, [RECONFIG, 0, ["a", "b", "c"], "a"]]], [])
    meta = {"protocol": "sdpaxos", "n": 3, "slot": 5, "exec_inst": [1, 0, 0], "view": 0, "ended": 4}
    seq = SDPaxosReplica(0, ProtocolConfig(n=3), KVStateMachine())
    assert seq.id == seq.sequencer and seq.phase == "normal"
    assert seq.install_snapshot(meta, done.snapshot())
    rd = seq.ready(sync=True)
    assert rd.epoch_end == (4, [0, ["a", "b", "c"], "a"])
    sent = [m for _dst, msgs in rd.messages for m in msgs if type(m).__name__ == "OAccept"]
    assert not sent and seq.next_slot <= 5 and seq.status()["ended"] == 4


def test_multipaxos_refuses_a_reconfiguration_instead_of_pretending():
    """Multi-Paxos has no END: its executor answers a reconfiguration with an error
    (acknowledging it would promise a change that never happens)."""
    from consensus.core.config import ProtocolConfig
    from consensus.core.multipaxos import MultiPaxosReplica

    rep = MultiPaxosReplica(0, ProtocolConfig(n=3), KVStateMachine())
    out = []
    rep.executor.run([["admin", 1, [RECONFIG, 0, ["a", "b", "c"], "a"]]], out)
    assert out[0][2]["ok"] is False and "does not change membership" in out[0][2]["error"]
    assert rep.executor.reconfig is None


def test_a_committed_end_is_kept_whatever_view_it_is_reported_at():
    """V, review D1: a replica that holds END committed keeps the view it took it in when
    a later view re-proposes it (committed slots are skipped), while its o_view moves on
    to that later view. A candidate that sees END committed at view 0.0 with last_view
    1.2 must keep it: committed means chosen. Judged by its view alone, it would become
    a no-op and the epoch would end at two different slots. Mutant
    ``end-committed-judged-by-view``."""
    from consensus.core.config import NOCL, ProtocolConfig, make_ballot
    from consensus.core.sdpaxos import SDPaxosReplica

    rep = SDPaxosReplica(0, ProtocolConfig(n=5), KVStateMachine())
    v0, w = make_ballot(0, 0), make_ballot(1, 2)
    best = {3: (v0, 1, True), 4: (v0, END, True)}
    log = {j: e[1] for j, e in best.items()}
    assert rep._judge_end(best, dict(log), last_view=w) == 4
    # Not committed, older than the last serving view: not chosen, a no-op.
    best[4] = (v0, END, False)
    stale = dict(log)
    assert rep._judge_end(best, stale, last_view=w) == -1 and stale[4] == NOCL


@pytest.mark.slow
def test_reconfiguration_search_campaign():
    """``cellar sim search --reconfig`` as a test: ``CELLAR_RECONFIG_EXAMPLES`` seeds from
    ``CELLAR_RECONFIG_SEED`` (300 from 400000)."""
    import os

    first = int(os.environ.get("CELLAR_RECONFIG_SEED", "400000"))
    for seed in range(first, first + int(os.environ.get("CELLAR_RECONFIG_EXAMPLES", "300"))):
        result = judge(swarm_config(seed, reconfig=True))
        assert result["failures"] == [], (seed, result["failures"])
