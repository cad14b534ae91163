"""Review 3 of 1bfa214 (N=5): "took one of view L's O-accepts" stands for "holds L's
recovered log" only while that log fits in one OAccept. See
docs/reviews/core-fixes-review-3.md (the residual gap review 2 called theoretical).

``_propose_slots`` cuts a recovered log at ``OSLOTS_PER_MSG_MAX`` (8192) slots per
OAccept. A replica that takes a later chunk raises ``o_view`` to L without the first
one, so a later Fig. 7 trusts it to report what L re-proposed, and it cannot.

Reaching more than 8192 recovered slots needs no exotic setting: N=5 command leaders
fast-execute their own slots on the serving sequencer's O-accept alone, so R_m can
execute thousands of slots that only it and the sequencer hold (nothing is committed:
every other replica lost those O-accepts). R_m's committed O-prefix stays where it
was, so the view R_m then leads recovers from there. A default-sized run of 8300
single-command instances does it in well under a minute of CPU. The ``small`` case
shrinks the constant to 8 (the same code path, a smaller message bound) for a fast run.

Fixed: OAccept carries the end of the recovered log; a replica raises o_view to
the view only once its O-prefix reaches it (it holds the whole recovered log).
"""


import pytest
import consensus.core.sdpaxos as sdpaxos
from consensus.core.config import NOCL
from consensus.sim import SimConfig, Simulation

from .schedules import NEVER, RuleBroken, attach_clients, step_until


def _run(chunk: int, writes: int) -> None:
    """N=5, LAN, batch 1. R0 serves view 0; R4 = R_m. At most two replicas down or
    cut off (R0 cut off, then R4 crashed); the other faults are lost messages.

    1. R4 writes ``writes`` commands (more than one OAccept chunk of slots). R0's
       O-accepts reach R4 only: R4 fast-executes them all (serving view, own slots,
       C-committed with the voters' acks), nothing is O-committed anywhere.
    2. R0 is cut off. R4 wins view L with R1, R2, R3; L's recovered log (from R4's own
       report) holds all of R4's slots, in two or more OAccepts. The first chunk (and
       every resend starting in it) is lost; the second reaches R1, R2, R3, which now
       have o_view = L but none of the first chunk's slots. L never serves.
    3. R4 crashes. R1, R2, R3 elect R1: last_view = L (any voter's o_view), last_seq =
       R4 is no voter, Fig. 7 fills for R0 only, and the first chunk's slots, which
       R4 executed, are holes: no-cl.
    """
    cfg = SimConfig(replicas=5, rtt="lan", clients_per_site=0, seconds=60.0, batch=1)
    sim = Simulation(cfg)
    sim.run(until_ms=1000)
    replies = attach_clients(sim, 5)
    for k, node in enumerate((0, 1, 3)):
        sim.nodes[node].propose(100 + node, 1, ["put", f"k{node}", "a"])
        sim._drain(node)
        sim.run(until_ms=1000 + 30 * (k + 1))
    sim.run(until_ms=1200)
    r0, r4 = sim.nodes[0], sim.nodes[4]
    base = r4.o_committed
    assert r0.sequencer == 0 and r0.phase == "normal" and r4.exec_slot == base
    phase = {"p": "fast"}
    chunk_end = {"at": None}

    def keep(src, dst, m):
        name = type(m).__name__
        if phase["p"] == "fast" and src == 0 and name == "OAccept" and dst != 4:
            return False  # R4's slots reach R4 only
        if phase["p"] == "L" and src == 4 and name == "OAccept" and m.start < chunk_end["at"]:
            return False  # L's first chunk (and every resend starting in it) is lost
        return True

    sim.msg_filter = keep
    for s in range(writes):
        r4.propose(104, s + 1, ["put", f"x{s % 7}", f"X{s}"])
    sim._drain(4)
    t = step_until(sim, lambda: r4.exec_slot >= base + writes, 1200, 60_000, step_ms=20)
    assert t is not None, "R4 fast-executed all its writes"
    assert r4.o_committed == base and all(sim.nodes[r].o_prefix <= base + 1 for r in (1, 2, 3))
    assert len(replies) > 0, "R4 acknowledged its writes"
    sim.net.isolate(0)
    for r in (1, 2, 3):
        sim.nodes[r].election_due = NEVER  # R4 stands
    chunk_end["at"] = r4.o_committed + chunk  # vote_base + one OAccept
    phase["p"] = "L"
    t = step_until(sim, lambda: r4.sequencer == 4 and r4.phase in ("recovering", "normal"), t, t + 5000, step_ms=2)
    assert t is not None and r4.phase == "recovering", "R4 took office in view L"
    view_l = r4.view
    assert r4.recover_end - max(r4.vote_base, r4.floor_slot) > chunk, "L's recovered log spans more than one OAccept"
    assert r4.oslots[base].leader == 4
    # L's later chunks reach R1, R2, R3 (today they raise o_view to L; a fix may not).
    t = step_until(sim, lambda: all(sim.nodes[r].o_view == view_l for r in (1, 2, 3)), t, t + 1000) or t + 1000
    assert all(base not in sim.nodes[r].oslots for r in (1, 2, 3)), "none holds L's first chunk"
    assert r4.phase == "recovering", "L never serves"
    sim.crash(4)
    for r in (1, 2, 3):
        sim.nodes[r].election_due = sim.nodes[r]._election_deadline()
    sim.nodes[2].election_due = sim.nodes[3].election_due = NEVER  # R1 stands
    t = step_until(sim, lambda: sim.nodes[1].sequencer == 1 and sim.nodes[1].phase == "normal" and sim.nodes[1].view > view_l, t, t + 8000, step_ms=5)
    assert t is not None, "R1, R2, R3 elected R1"
    got = getattr(sim.nodes[1].oslots.get(base), "leader", None)
    sim.msg_filter = None
    sim.run(until_ms=t + 3000)
    result = sim.summary()
    if got != 4 or not (result["consistent"] and result["agreement"]):
        raise RuleBroken(
            f"R4 executed its write at slot {base} in view 0; view {sim.nodes[1].view} (R1) put "
            f"{'no-cl' if got == NOCL else got} there; consistent={result['consistent']} agreement={result['agreement']}"
        )


def test_a_later_chunk_of_a_recovered_log_raises_o_view_small(monkeypatch):
    monkeypatch.setattr(sdpaxos, "OSLOTS_PER_MSG_MAX", 8)
    _run(chunk=8, writes=20)


@pytest.mark.slow  # the _small variant (the mutant's killer) runs by default
def test_a_later_chunk_of_a_recovered_log_raises_o_view_real_bound():
    _run(chunk=sdpaxos.OSLOTS_PER_MSG_MAX, writes=sdpaxos.OSLOTS_PER_MSG_MAX + 100)
