"""Review 2 of 518d9d9 (a recoverer never accepts below a promise it gave meanwhile):
liveness after giving way. Passing test: it pins the nack -> re-prepare path.

When a command leader's own re-prepare gives way in ``_recovery_propose`` (it promised
a peer's higher ballot while its promises came in), nothing of its own is in flight at
a ballot anyone accepts: its instances keep their old ballot. Progress then rests on a
resend being nacked (``_on_cack``: a higher ballot, no own recovery -> re-prepare) or
on the peer's recovery finishing. Here the peer dies right after its prepare, so only
the first path is left.
"""

from consensus.sim import SimConfig, Simulation
from consensus.sim.simulator import Client
from .schedules import step_until


def test_a_command_leader_that_gave_way_still_decides_its_instance_when_the_recoverer_dies():
    """N=5, geo (the schedule of test_review_cpaxos up to L's give-way).

    1. L=R1 proposes X in (1, 0); only R2 accepts it. R=R4 recovers L's instances at 36
       (R0, R3 promise) and accepts a no-op itself; its C-accepts are lost.
    2. L's resend is nacked: L re-prepares its own instances at 65 (to R2, R3).
    3. R prepares again at 68 (to R0, L): L promises 68. R crashes for good.
    4. L's promises arrive: L gives way (promised 68 > 65). Its next resend is nacked
       by R0 (68): L re-prepares at 97 and decides (1, 0) with the live majority.
    The rule: L's instance is decided, X (reported by R2 at 1) chosen, and its client
    answered; every live replica executes the same log.
    """
    cfg = SimConfig(replicas=5, rtt="geo", clients_per_site=0, seconds=8.0)
    sim = Simulation(cfg)
    sim.run(until_ms=1500)
    replies = []
    sim._on_reply = lambda cid, seq, result: replies.append((cid, seq, result))
    for node in range(5):
        sim.clients[100 + node] = Client(100 + node, node, active=False)
    L, R = 1, 4
    phase = {"now": "x"}

    def keep(src, dst, m):
        name = type(m).__name__
        p = phase["now"]
        if p == "end":
            return True
        if src == L and name == "CCommit":
            return dst in (2, 3)
        if p == "x":
            if src == L and name in ("CAccept", "CRequest"):
                return name == "CAccept" and dst == 2
            return True
        if src == R and name == "CPrepare":
            return dst in (0, 3) if p == "r1" else dst in (0, L)
        if src == R and name == "CAccept":
            return p != "r1" and dst in (0, L)
        if src == L and name == "CPrepare":
            return dst in (2, 3)
        if src == L and name == "CAccept":
            return dst in (0, 2, 3, 4) if p == "r1" else dst in (2, 3)
        if src == L and name == "CRequest":
            return False
        return True

    sim.msg_filter = keep
    sim.nodes[L].propose(101, 1, ["put", "k", "X"])
    sim._drain(L)
    sim.run(until_ms=1700)
    phase["now"] = "r1"
    sim.nodes[R]._start_crecovery(L, 0, 0)
    sim._drain(R)
    t = step_until(sim, lambda: L in sim.nodes[L].crec, 1700, 3000)
    assert t is not None, "L re-prepares its own instances"
    b_l = sim.nodes[L].crec[L].ballot
    phase["now"] = "dual"
    sim.nodes[R]._start_crecovery(L, 0, 0)
    sim._drain(R)
    b_r = sim.nodes[R].crec[L].ballot
    assert b_r > b_l
    t = step_until(sim, lambda: sim.nodes[L].promised[L] == b_r, t, t + 1000, step_ms=0.5)
    assert t is not None, "L promised R's higher ballot"
    sim.crash(R)
    t = step_until(sim, lambda: L not in sim.nodes[L].crec, t, t + 1000)
    assert t is not None and not sim.nodes[L].clog[L][0].committed, "L gave way"
    phase["now"] = "end"
    t = step_until(sim, lambda: sim.nodes[L].clog[L][0].committed, t, t + 10000, step_ms=5)
    assert t is not None, "L decided its own instance after giving way"
    assert sim.nodes[L].clog[L][0].cmds is not None and sim.nodes[L].clog[L][0].cmds[0][2] == ["put", "k", "X"]
    t = step_until(sim, lambda: any(r[:2] == (101, 1) for r in replies), t, t + 5000, step_ms=5)
    assert t is not None, "X's client was answered"
    sim.restart(R)
    sim.run()
    result = sim.summary()
    assert result["consistent"] and result["agreement"], result
