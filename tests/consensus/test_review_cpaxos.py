"""Review of ce71c3b (a proposer's tally counts acks of one ballot): a place it missed.

``accept_value`` (now ``Proposal.follow``) keeps the tally to one ballot, but a command leader that re-prepares
its *own* instances still goes on to phase 2 at its ballot after it promised a higher
one to a peer recovering the same instances: ``_on_cprepare`` drops a recovery
outranked by a higher prepare only when ``m.leader != self.id``, and
``_recovery_propose`` then accepts its own value (``accept_value`` + ``c.acks = 1 <<
self.id``, in the core of that time) below its promise. That self-acceptance completes a quorum for a value the
higher-ballot recoverer did not see: two values are chosen for one C-instance.

Fixed: ``_recovery_propose`` gives way when its replica promised a higher ballot
while the promises came in (the test fails with that check removed).
"""

from consensus.sim import SimConfig, Simulation
from consensus.sim.simulator import Client
from .schedules import RuleBroken, step_until


def test_own_re_prepare_accepts_below_its_promise():
    """N=5, geo (R0 CA sequencer, R1 OR = L, R2 OH, R3 IRE, R4 SEL = recoverer R).

    1. L proposes X in C-instance (1, 0) at ballot 1; only R2 accepts it (the other
       C-accepts and the C-request are lost).
    2. R's recovery of L's instances (ballot 36) runs phase 1 with R0, R3 (they know
       nothing) and accepts a no-op at 36 itself; its C-accepts are lost.
    3. L's resend of X is nacked (ballot 36): L re-prepares its own instances at 65,
       with R2 and R3 (its prepare to R0, R4 is lost).
    4. Meanwhile R's recovery timer fires again: phase 1 at 68 with R0 and L. L promises
       68 (reporting X at 1) but keeps its own recovery; R is then paused (SIGSTOP).
    5. L's promises from R2 (X at 1) and R3 (nothing) arrive: L proposes X at 65 and
       accepts it itself, below its promise of 68; R2, R3 accept; L commits X with
       {L, R2, R3} at 65 (its commit reaches R2, R3 only).
    6. R resumes: its quorum {R, R0, L} reports no-op at 36 (R) and X at 1 (L), so it
       proposes the no-op at 68; R0 accepts, and L acks (committed: "a higher ballot
       can only carry the same value"). R commits the no-op.

    X is chosen at 65 ({L, R2, R3}) and the no-op at 68 ({R, R0, L}): L, R2, R3 execute
    X at its slot, R0 and R4 a no-op.
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
        if src == L and name == "CCommit":
            return dst in (2, 3)  # L's commit of X never reaches R0, R4
        if p == "x":  # X at ballot 1 reaches R2 only; the sequencer never hears of it
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
            return dst in (0, 2, 3, 4) if p == "r1" else dst in (2, 3)  # resends nacked by 0, 3, 4
        if src == L and name == "CRequest":
            return p == "end"
        return True

    sim.msg_filter = keep
    sim.nodes[L].propose(101, 1, ["put", "k", "X"])
    sim._drain(L)
    sim.run(until_ms=1700)
    assert not sim.nodes[L].clog[L][0].committed and sim.nodes[2].clog[L][0].cmds is not None
    phase["now"] = "r1"
    sim.nodes[R]._start_crecovery(L, 0, 0)  # R's recovery timer (as for a blocked replica)
    sim._drain(R)
    t = step_until(sim, lambda: L in sim.nodes[L].crec, 1700, 3000)
    assert t is not None, "L's resend was nacked: it re-prepares its own instances"
    b_l = sim.nodes[L].crec[L].ballot
    assert sim.nodes[R].clog[L][0].cmds is None and sim.nodes[R].clog[L][0].ballot < b_l, "R accepted its no-op"
    phase["now"] = "dual"
    sim.nodes[R]._start_crecovery(L, 0, 0)  # R retries, with a higher ballot
    sim._drain(R)
    b_r = sim.nodes[R].crec[L].ballot
    assert b_r > b_l
    sim.pause(R)
    # L decides its instance (X at b_l, with R2 and R3) while R is paused ...
    step_until(sim, lambda: sim.nodes[L].clog[L][0].committed, t, t + 2000)
    sim.resume(R)
    t += 2000
    # ... and R, resumed, decides it too (the no-op at b_r, with R0 and L).
    step_until(sim, lambda: sim.nodes[R].clog[L][0].committed, t, t + 2000)
    t += 2000
    chosen = {r: sim.nodes[r].clog[L][0].cmds for r in range(5) if sim.nodes[r].clog[L].get(0) and sim.nodes[r].clog[L][0].committed}
    phase["now"] = "end"
    sim.run()
    result = sim.summary()
    if len({repr(v) for v in chosen.values()}) > 1 or not (result["consistent"] and result["agreement"]):
        raise RuleBroken(
            f"C-instance (1, 0) committed with different values: {chosen}; L promised "
            f"{b_r} before accepting at {b_l}; consistent={result['consistent']} agreement={result['agreement']}"
        )
