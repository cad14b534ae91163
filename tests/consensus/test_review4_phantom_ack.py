"""Review 4 of a850b8f (N=5): "serve only once the phantom instances are decided" does
not stop acknowledgements while a phantom slot is open. See
docs/reviews/core-fixes-review-4.md.

a850b8f's argument: after the Fig. 7 fill, an R_m slot past its C[m]+1-th may stand for
an instance R_m has not proposed; the new sequencer decides those instances before it
serves, "so nothing is acknowledged while such a slot is open". But a *recovering*
sequencer already commits the recovered log as OAcks come in (``_recompute_majority``
commits on the acked prefix in any phase), and its own readiness is the Fig. 5
sequencer rule (``my_in_majority``, no serving gate). So a command of the new
sequencer ordered after the phantom slot becomes ready and is acknowledged (a blind
put answers at readiness) while the phantom instance is still open. (The same holds
for a voter's command: the recovering sequencer's OCommits raise its ``my_committed``.)
R_m's next command, invoked after that acknowledgement, takes the phantom instance and
so the earlier slot: it is ordered before a command that completed before it began.

Fixed: while a phantom is open, the sequencer commits (and so acknowledges) nothing at
or after its slot (_recompute_majority caps at _phantom_slot).
"""


from .schedules import NEVER, RuleBroken, exec_order, hole_then_writes, quiet, step_until


def test_a_recovering_sequencer_acknowledges_a_command_after_an_open_phantom_slot():
    """N=5, LAN. R0 serves view 0; R4 = R_m; R1 stands, R2 and R3 vote. At most two
    replicas cut off (R0 and R4, then R0 only); the other faults are lost messages.

    1. R0 writes H; its O-accepts from H's slot h on are lost (a hole at h that only R0
       holds). R4 writes W (C_4^0, seen by the voters; slot j = h+1), R1 writes Z on
       key a (slot z = h+2). Nothing is ready: every voter lacks h.
    2. R0 and R4 are cut off. R1 wins view 1 with R2, R3. Fig. 7: C[4] = 0, needed 1,
       h goes to R4, so j is R4's second slot: a phantom (C_4^1, which R4 never
       proposed). R1's CPrepares are lost for now, so the phantom stays open.
    3. R2 and R3 ack the recovered log; R1 commits h, j, z and Z is ready: R1
       acknowledges Z while recovering, with C_4^1 undecided.
    4. R4 comes back and writes X on key a, after Z's acknowledgement. X is C_4^1: slot
       j, before Z. Its commit decides the phantom and R1 serves. Every replica
       executes X, then Z: key a ends as Z although put X followed the completed put Z.
    """
    sim, replies = quiet(seconds=8.0)
    acked_at: dict = {}
    on_reply = sim._on_reply

    def record(cid, seq, result):
        acked_at.setdefault((cid, seq), sim.now)
        on_reply(cid, seq, result)

    sim._on_reply = record
    phase = {"p": "warm", "h": None}

    def keep(src, dst, m):
        name = type(m).__name__
        if phase["p"] == "hide" and src == 0 and name == "OAccept" and m.start <= phase["h"]:
            return False  # the hole at h: R0's slot reaches nobody
        if phase["p"] == "office" and src == 1 and name == "CPrepare":
            return False  # the phantom's recovery does not get through yet
        return True

    sim.msg_filter = keep
    sim.run(until_ms=1100)
    r0, r1, r4 = sim.nodes[0], sim.nodes[1], sim.nodes[4]
    assert r0.sequencer == 0 and r0.phase == "normal"
    h = hole_then_writes(sim, phase, z_node=1)
    assert [getattr(r0.oslots.get(h + k), "leader", None) for k in range(3)] == [0, 4, 1]
    assert all(h not in sim.nodes[r].oslots and sim.nodes[r].oslots[h + 2].leader == 1 for r in (1, 2, 3))
    assert all(sim.nodes[r].c_max[4] == 0 for r in (1, 2, 3)) and not acked_at
    sim.net.isolate(0)
    sim.net.isolate(4)
    for r in (2, 3):
        sim.nodes[r].election_due = NEVER
    phase["p"] = "office"
    t = step_until(sim, lambda: r1.sequencer == 1 and r1.phase in ("recovering", "normal"), 1140, 6000, step_ms=2)
    assert t is not None and r1.phase == "recovering", "R1 took office"
    assert r1._phantoms == [(4, 1)] and r1.oslots[h].leader == 4 and r1.oslots[h + 1].leader == 4
    t = step_until(sim, lambda: (101, 1) in acked_at, t, t + 400, step_ms=2)
    z_acked = acked_at.get((101, 1))
    z_while_open = z_acked is not None and r1.phase == "recovering" and not getattr(r1.clog[4].get(1), "committed", False)
    sim.net.heal()
    sim.net.isolate(0)
    t = step_until(sim, lambda: r4.view == r1.view, t or sim.now / 1000, sim.now / 1000 + 2000, step_ms=2)
    assert t is not None, "R4 joined view 1"
    x_invoked = sim.now
    r4.propose(104, 2, ["put", "a", "X"])
    sim._drain(4)
    phase["p"] = "heal"
    t = step_until(sim, lambda: r1.phase == "normal", t, t + 3000, step_ms=2)
    assert t is not None, "R1 serves"
    sim.msg_filter = None
    sim.net.heal()
    for r in (2, 3):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.run()
    pos = exec_order(sim, {(101, 1), (104, 2)})
    assert (101, 1) in pos and (104, 2) in pos, "both writes executed"
    values = {sim.nodes[r].executor.sm.data.get("a") for r in range(5) if sim.nodes[r] is not None}
    if z_while_open and z_acked < x_invoked and pos[(104, 2)] < pos[(101, 1)]:
        raise RuleBroken(
            f"R1 acknowledged put a=Z at {z_acked} us while recovering with phantom C_4^1 open; "
            f"R4's put a=X, invoked at {x_invoked} us, became C_4^1 and executes before Z "
            f"(log positions X {pos[(104, 2)]}, Z {pos[(101, 1)]}); key a ends as {values}"
        )
