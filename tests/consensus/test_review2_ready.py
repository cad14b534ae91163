"""Review 2 of 9d3922b (N=5): the fast *execution* waits for a serving view, the
*acknowledgement* does not.

9d3922b stops R_m from executing on a recovering sequencer's O-accept (``OAccept.serving``
gates ``OSlot.fast``). But R_m answers its client on the same O-accept: N=5 readiness
is ``my_in_prefix`` (``ready_limit``), and ``_advance_o_prefix`` counts every slot
accepted in the current view, serving or not. So the first schedule of
``test_review_fig7`` still acknowledges X from a view that no later majority knows; the
next view gives X's slot to no-cl, and X has no slot at all while R_m is down: a read
that starts after X's acknowledgement does not see X.

(``test_review_fig7`` replaces the simulator's reply hook, so its ``lost_acked`` does not
count this acknowledgement; here the client's reply is checked directly.)

Fixed: N=5 readiness counts a view's O-accepts only once one of them came marked
serving (``view_serving``); R4 does not answer X while view L recovers.
"""


from consensus.sim import SimConfig, Simulation
from consensus.sim.simulator import Client
from .schedules import NEVER, RuleBroken, step_until


def test_r_m_acknowledges_on_a_view_that_never_served():
    """N=5, LAN. R0 serves view 0 (the schedule of test_review_fig7's first test).

    1. R0 is cut off. R4 proposes X (put x); C-accepted by R1-R3, no O-slot yet.
    2. R1 wins view L with R2, R3 (R4's vote is lost); Fig. 7 gives R4 a slot j for X.
       R1 is recovering; its O-accepts reach R4 only (serving = False).
    3. R4 accepts slot j in its current view: ready, it answers X's client. (It does not
       execute X: 9d3922b.)
    4. R1 and R4 crash, R0 heals: R0, R2, R3 elect a sequencer; nobody reports view L, so
       Fig. 7 is skipped and j gets no-cl.
    5. R2 reads x through the log, after X's acknowledgement: it must see X.
    """
    cfg = SimConfig(replicas=5, rtt="lan", clients_per_site=0, seconds=6.0)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)
    replies = []
    sim._on_reply = lambda cid, seq, result: replies.append((cid, seq, result, sim.now))
    for node in range(5):
        sim.clients[100 + node] = Client(100 + node, node, active=False)
    for node in (1, 2, 3):
        sim.nodes[node].propose(100 + node, 1, ["put", f"k{node}", "a"])
        sim._drain(node)
    sim.run(until_ms=1100)
    drops = {"oaccept_from_1": False}

    def keep(src, dst, m):
        name = type(m).__name__
        if drops["oaccept_from_1"] and src == 1 and name == "OAccept" and dst != 4:
            return False
        if src == 1 and dst == 4 and name == "VRequest":
            return False
        return True

    sim.msg_filter = keep
    sim.net.isolate(0)
    for r in (2, 3, 4):
        sim.nodes[r].election_due = NEVER
    inst = sim.nodes[4].next_inst
    sim.nodes[4].propose(104, 1, ["put", "x", "from-r4"])
    sim._drain(4)
    t = step_until(sim, lambda: sim.nodes[4].clog[4][inst].committed, 1100, 2500)
    assert t is not None
    drops["oaccept_from_1"] = True
    t = step_until(sim, lambda: sim.nodes[1].sequencer == 1 and sim.nodes[1].phase in ("recovering", "normal"), t, t + 3000)
    assert t is not None and sim.nodes[1].phase == "recovering"
    view_l = sim.nodes[1].view
    answered = step_until(sim, lambda: any(r[:2] == (104, 1) for r in replies), t, t + 1000)
    t += 1000
    assert sim.nodes[1].phase == "recovering", "view L never served"
    if answered is None:
        return  # the rule holds: nothing became ready on a recovering view's O-accept
    acked_at = next(r[3] for r in replies if r[:2] == (104, 1))
    sim.crash(1)
    sim.crash(4)
    sim.net.heal()
    sim.msg_filter = None
    t = step_until(
        sim,
        lambda: any(n is not None and n.sequencer == n.id and n.phase == "normal" and n.view > view_l for n in sim.nodes),
        t, t + 6000, step_ms=5,
    )
    assert t is not None, "R0, R2, R3 elected a sequencer"
    read_at = t
    sim.nodes[2].propose(102, 1, ["get", "x"], needs_result=True)
    sim._drain(2)
    t = step_until(sim, lambda: any(r[:2] == (102, 1) for r in replies), t, t + 3000)
    assert t is not None, "R2's read through the log was answered"
    got = next(r[2] for r in replies if r[:2] == (102, 1))
    if got != "from-r4":
        raise RuleBroken(
            f"put x=from-r4 acknowledged at {acked_at / 1000:.1f} ms (view {view_l}, never serving); "
            f"a read through the log started at {read_at:.1f} ms returned {got!r}"
        )
