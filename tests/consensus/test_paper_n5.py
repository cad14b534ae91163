"""The paper's five-replica corner cases (§3.3, Fig. 6 and 7, appendix A.2, Thm A.6/A.7).

With five replicas a command leader commits its O-instance on the sequencer's
O-accept alone (Fig. 5 line 29), so a slot can be committed without a majority having
seen it. These scripted runs drop chosen messages, crash the sequencer and that leader
together, and check that the new sequencer recovers exactly what it must.
"""

from consensus.core.config import NOCL
from consensus.sim import SimConfig, Simulation
from consensus.sim.simulator import Client

SEQ, RM = 0, 4  # the old sequencer and the replica R_m that fails with it


def lan_cluster(**kw):
    cfg = SimConfig(replicas=5, rtt="lan", clients_per_site=0, seconds=6.0, **kw)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)
    acked = []
    sim._on_reply = lambda cid, seq, result: acked.append((cid, seq))
    for node in range(5):
        sim.clients[100 + node] = Client(100 + node, node, active=False)
    return sim, acked


def propose(sim, node, cid, seq, key, value):
    sim.nodes[node].propose(cid, seq, ["put", key, value])
    sim._drain(node)


def some_traffic(sim, upto_ms, start_seq=1):
    """A few ordinary commands from the survivors so the log is not trivial."""
    seq = start_seq
    for node in (1, 2, 3):
        propose(sim, node, 100 + node, seq, f"k{node}", f"v{seq}")
    sim.run(until_ms=upto_ms)


def slot_of(sim, node, leader, inst):
    """The global slot at which ``node`` orders C-instance ``inst`` of ``leader``."""
    count = 0
    for j in sorted(sim.nodes[node].oslots):
        if sim.nodes[node].oslots[j].leader == leader:
            if count == inst:
                return j
            count += 1
    return None


def test_hole_committed_only_by_a_failed_non_sequencer_replica():
    """Fig. 6: R_m's O-instance was seen only by the sequencer and R_m, which
    committed it (line 29) and answered its client; both fail. The hole must be
    given back to R_m (Fig. 7), not filled with no-cl, or the acknowledged command
    would lose its place."""
    sim, acked = lan_cluster()
    some_traffic(sim, 1100)
    # R_m's C-accept reaches a majority; its O-accept reaches only R_m.
    sim.msg_filter = lambda src, dst, m: not (
        src == SEQ and dst not in (RM,) and type(m).__name__ in ("OAccept", "OCommit")
    )
    propose(sim, RM, 104, 1, "x", "from-rm")
    sim.run(until_ms=1150)
    assert (104, 1) in acked, "R_m answered after its line-29 commit"
    hole = slot_of(sim, RM, RM, 0)
    assert all(hole not in sim.nodes[r].oslots for r in (1, 2, 3)), "no survivor saw the slot"
    sim.crash(SEQ)
    sim.crash(RM)
    sim.msg_filter = None
    some_traffic(sim, 4000, start_seq=2)
    for r in (1, 2, 3):
        assert sim.nodes[r].sequencer != SEQ
        assert sim.nodes[r].oslots[hole].leader == RM, "Fig. 7 gave the hole back to R_m"
    sim.run()
    result = sim.summary()
    assert result["consistent"] and result["lost_acked"] == 0, result
    executed = [ids for log in sim.exec_logs for _, ids in log]
    assert any((104, 1) in ids for ids in executed)


def test_o_instance_committed_by_rm_whose_c_instance_was_not():
    """R_m committed its O-instance (line 29) but its C-instance reached only the
    sequencer, so nothing is ready; both fail. The new sequencer may put no-cl there,
    and R_m, back, must accept it over its own 'committed' slot and stay consistent."""
    sim, acked = lan_cluster()
    some_traffic(sim, 1100)
    sim.msg_filter = lambda src, dst, m: not (
        (src == RM and dst != SEQ and type(m).__name__ == "CAccept")
        or (src == SEQ and dst != RM and type(m).__name__ in ("OAccept", "OCommit"))
    )
    propose(sim, RM, 104, 1, "x", "from-rm")
    sim.run(until_ms=1150)
    assert (104, 1) not in acked, "the C-instance never reached a majority: not ready"
    hole = slot_of(sim, RM, RM, 0)
    assert sim.nodes[RM].oslots[hole].fast
    sim.crash(SEQ)
    sim.crash(RM)
    sim.msg_filter = None
    some_traffic(sim, 4000, start_seq=2)
    # The slot is no longer R_m's: no-cl, or reused for new commands if it was last.
    decided = sim.nodes[1].oslots[hole].leader
    assert decided != RM and all(sim.nodes[r].oslots[hole].leader == decided for r in (1, 2, 3))
    sim.restart(RM)
    sim.restart(SEQ)
    some_traffic(sim, 8000, start_seq=3)
    sim.run()
    assert sim.nodes[RM].oslots[hole].leader == decided, "R_m accepted the new value over its fast commit"
    assert decided == NOCL or sim.nodes[RM].oslots[hole].committed
    result = sim.summary()
    assert result["consistent"] and result["lost_acked"] == 0, result


def test_view_change_during_a_view_change():
    """The first candidate wins and starts re-proposing the log, then fails before
    a majority accepted it; a second view change must still recover every ready
    command, in order, with clients writing and reading throughout."""
    for seed in range(3):
        cfg = SimConfig(replicas=5, seconds=8.0, seed=seed, clients_per_site=2, read_fraction=0.3, keys=2, client_timeout_ms=1000)
        sim = Simulation(cfg)
        sim.run(until_ms=2000)
        sim.crash(SEQ)
        first = None
        t = 2000
        while first is None and t < 6000:
            t += 5
            sim.run(until_ms=t)
            for node in sim.nodes:
                if node is not None and node.phase in ("candidate", "recovering") and node.votes is not None:
                    if node.phase == "recovering":
                        first = node.id
        assert first is not None, "someone took office"
        # Its recovery proposals reach at most one other replica before it dies.
        sim.msg_filter = lambda src, dst, m: not (src == first and type(m).__name__ == "OAccept" and dst != (first + 1) % 5)
        sim.run(until_ms=t + 1)
        sim.crash(first)
        sim.msg_filter = None
        sim.run()
        result = sim.summary()
        live = [node for node in sim.nodes if node is not None]
        assert len({node.sequencer for node in live}) == 1 and live[0].sequencer not in (SEQ, first)
        assert result["consistent"] and result["lost_acked"] == 0 and result["duplicated"] == 0, result
        assert sim.quiet()
        assert sim.linearizable() is True
