"""Multi-Paxos votes are cut by bytes, and a candidate counts a voter only once its
report is whole (issue 15: under overload on real processes a lagging candidate's
votes came to 9-37 MB, over the 8 MiB peer frame; the runtime does not send such a
message, so the election never ended and views churned into the thousands).

The rules, each with the schedule that breaks if it is wrong:

1. A vote carries at most ``VOTE_BYTES_MAX`` of the voter's slots (``c_max`` says
   which range ``[start, upto)`` it covers whole); the candidate asks again from
   ``upto``. Mutant ``mp-vote-uncapped``: ``test_a_lagging_candidate_gets_votes_under_a_frame``
   and the simulator schedule ``test_simulated_lagging_candidate_is_elected_...``.
2. A candidate takes office only on whole reports from a majority: a chunk that
   leaves out a chosen value must not let it keep its own older value (or a no-op)
   there. Mutant ``mp-vote-part-counts``: ``test_a_capped_vote_that_omits_a_chosen_value_does_not_overwrite_it``.
3. A chunk covers every slot the voter holds below its ``upto``. Mutant
   ``mp-vote-chunk-skips-a-slot``: the same schedule.
4. (Liveness) While the exchange moves on, the candidate's election deadline moves
   with it, and a voter asked again by its view's candidate waits for it. Mutants
   ``mp-vote-deadline-fixed``, ``mp-voter-stands-meanwhile``:
   ``test_a_vote_exchange_longer_than_an_election_timeout_completes``.

The hand-driven schedules run three replicas on a small network of our own: each
message takes ``delay`` ticks, and one that encodes to more than a frame is not sent
(as ``Node._send_split`` does).
"""

from __future__ import annotations

import msgpack
import pytest

from consensus.core import multipaxos
from consensus.core.config import ProtocolConfig, ballot_owner
from consensus.core.messages import MAccept, MCommit, Vote, VRequest, encode_message
from consensus.core.multipaxos import MultiPaxosReplica
from consensus.transport.framing import MAX_FRAME_BYTES
from store.kv_machine import KVStateMachine

from .schedules import NEVER, RuleBroken, quiet, step_until


def _size(m) -> int:
    return len(msgpack.packb(encode_message(m), use_bin_type=True))


class Net:
    """Three (or n) replicas; a message arrives ``delay`` ticks after it is sent, unless
    ``drop(src, dst, msg)`` or either end is down; one over a frame is not sent."""

    def __init__(self, reps: list, delay: int = 1) -> None:
        self.r = reps
        self.delay = delay
        self.now = 0
        self.q: list = []
        self.down: set = set()
        self.drop = lambda src, dst, m: False
        self.oversized: list = []
        self.record_max = [0] * len(reps)  # the biggest WAL record each wrote
        self.executed: dict[int, dict[int, list]] = {i: {} for i in range(len(reps))}

    def flush(self, i: int) -> None:
        rd = self.r[i].ready(sync=True)
        for rec in rd.persist:
            self.record_max[i] = max(self.record_max[i], len(msgpack.packb(rec, use_bin_type=True)))
        for ex in rd.executed:
            self.executed[i][ex.slot] = ex.cmds
        for dst, msgs in list(rd.messages) + list(rd.urgent):
            for m in msgs:
                if _size(m) > MAX_FRAME_BYTES - 64:
                    self.oversized.append((i, dst, type(m).__name__, _size(m)))
                    continue
                if i in self.down or dst in self.down or self.drop(i, dst, m):
                    continue
                self.q.append((self.now + self.delay, i, dst, m))

    def tick(self) -> None:
        self.now += 1
        for i, r in enumerate(self.r):
            if i not in self.down:
                r.tick()
                self.flush(i)
        due = [e for e in self.q if e[0] <= self.now]
        self.q = [e for e in self.q if e[0] > self.now]
        for _, src, dst, m in due:
            if dst not in self.down:
                self.r[dst].step(src, [m])
                self.flush(dst)

    def run_until(self, pred, limit: int) -> bool:
        for _ in range(limit):
            if pred():
                return True
            self.tick()
        return pred()


def _cluster(n: int = 3, **kw) -> list:
    cfg = ProtocolConfig(n=n, **kw)
    return [MultiPaxosReplica(i, cfg, KVStateMachine()) for i in range(n)]


def _batches(tag: str, count: int, value_bytes: int) -> list:
    return [[[f"c-{tag}", k + 1, ["put", f"k{k}", tag * value_bytes]]] for k in range(count)]


# --- rule 1: votes under a frame -----------------------------------------------------


def test_a_lagging_candidate_gets_votes_under_a_frame():
    """R1 holds 40 slots of 512 KiB each (20 MiB) that R2 never saw; R2 stands from
    slot 0. Uncut, R1's vote is one 20 MiB message that never leaves (the runtime
    logs "exceeds a frame: not sent") and R2 waits for it forever. Elected, R2
    re-proposes all 20 MiB: in one WAL record that was over the runtime's
    segment_bytes_max (16 MiB), and the new leader exited."""
    r0, r1, r2 = reps = _cluster(initial_sequencer=0, heartbeat_ticks=2, election_ticks=10, resend_ticks=4)
    net = Net(reps)
    view0 = r0.view
    big = _batches("x", 40, 512 << 10)
    for k in range(0, 40, 4):
        r1.step(0, [MAccept(view0, k, big[k : k + 4])])
    r1.ready(sync=True)
    assert len(r1.log) == 40
    net.down = {0}
    for r in (r1, r2):
        r.election_due = NEVER
    for _ in range(3):
        net.tick()  # past the restart wait (a heartbeat) before anyone votes
    r2._start_election()
    net.flush(2)
    took = net.run_until(lambda: r2.phase != "candidate", 200)
    if net.oversized or not took:
        raise RuleBroken(
            f"R2's election did not end (phase {r2.phase}): messages over a frame, not sent: {net.oversized[:3]}"
        )
    assert [r2.log[j].batch for j in range(40)] == big, "the new leader holds every slot R1 reported"
    if net.record_max[2] > MAX_FRAME_BYTES:
        raise RuleBroken(f"R2 wrote a record of {net.record_max[2]} bytes when it took office")
    assert net.run_until(lambda: r1.committed >= 40 and r2.committed >= 40, 200)


# --- rules 2 and 3: a partial report is not a vote ------------------------------------------


def _chosen_beyond_the_first_chunk(monkeypatch) -> tuple:
    """R2 led the first view and accepted Z0..Z9 alone (its accepts lost). R0 took over
    with R1 and got X0..X9 accepted by R1: chosen (R0 executed them; its commits to R1
    were lost, so R1 holds them uncommitted). R0 crashes; R2 stands, and R1's report
    comes in chunks of three slots."""
    monkeypatch.setattr(multipaxos, "VOTE_BYTES_MAX", 3 * 160)
    r0, r1, r2 = reps = _cluster(initial_sequencer=2, heartbeat_ticks=2, election_ticks=10, resend_ticks=4, batch_max=1)
    net = Net(reps)
    for r in reps:
        r.election_due = NEVER
    for _ in range(3):
        net.tick()
    assert r2.leader == 2 and r2.phase == "normal"
    Z = _batches("z", 10, 100)
    X = _batches("x", 10, 100)
    net.drop = lambda src, dst, m: src == 2 or dst == 2 or isinstance(m, MCommit)
    for b in Z:
        r2.propose(*b[0][:2], b[0][2])
    net.flush(2)
    assert [r2.log[j].batch for j in range(10)] == Z
    r0._start_election()
    net.flush(0)
    assert net.run_until(lambda: r0.phase == "normal" and r0.leader == 0, 50), r0.phase
    for b in X:
        r0.propose(*b[0][:2], b[0][2])
    net.flush(0)
    assert net.run_until(lambda: r0.committed >= 10, 50), r0.committed
    assert [net.executed[0][j] for j in range(10)] == X, "X0..X9 are chosen"
    assert all(not r1.log[j].committed for j in range(10)) and [r1.log[j].batch for j in range(10)] == X
    assert all(ballot_owner(r2.log[j].view) == 2 and r2.log[j].view < r1.log[j].view for j in range(10))
    net.down = {0}
    net.drop = lambda src, dst, m: False
    return net, X


def test_a_capped_vote_that_omits_a_chosen_value_does_not_overwrite_it(monkeypatch):
    net, X = _chosen_beyond_the_first_chunk(monkeypatch)
    r0, r1, r2 = net.r
    first = r1._vote_chunk(0)
    assert first.c_max[1] != -1 and len(first.slots) < 10, "R1's report comes in several chunks"
    r2._start_election()
    net.flush(2)
    assert net.run_until(lambda: r2.phase != "candidate", 100), r2.phase
    held = [r2.log[j].batch if j in r2.log else None for j in range(10)]
    if held != X:
        wrong = [j for j in range(10) if held[j] != X[j]]
        raise RuleBroken(
            f"R2 took office on part of R1's report: slots {wrong} hold {[held[j] and held[j][0][2][2][:1] for j in wrong]} "
            f"(its own older values, or no-ops) where X was chosen"
        )
    # And the cluster goes on: R2 commits X (and a new write after it) with R1.
    r2.propose("late", 1, ["put", "late", "y"])
    net.flush(2)
    assert net.run_until(lambda: r1.committed >= 11 and r2.committed >= 11, 100), (r1.committed, r2.committed)
    assert [net.executed[2][j] for j in range(10)] == X == [net.executed[0][j] for j in range(10)]


def test_a_stale_or_malformed_chunk_is_not_taken(monkeypatch):
    """Checks on what a chunk claims: an answer to an earlier request (its start is not
    where we asked from), or entries outside the range it reports whole, are ignored."""
    net, X = _chosen_beyond_the_first_chunk(monkeypatch)
    r0, r1, r2 = net.r
    r2._start_election()
    view = r2.view
    net.flush(2)
    net.q = []
    r1.step(2, [VRequest(view, 0)])
    first = next(m for dst, msgs in r1.ready(sync=True).messages for m in msgs if isinstance(m, Vote))
    upto = first.c_max[1]
    assert first.view == view and upto != -1
    # An entry past the range it claims to cover.
    r2.step(1, [Vote(view, 0, first.slots + [[9, r1.log[9].view, X[9], False]], first.c_max, 0, [])])
    assert 1 not in r2._vote_parts and r2.phase == "candidate"
    r2.step(1, [first])
    assert r2._vote_next[1] == upto
    # The same first chunk again (the answer to an earlier VRequest) adds nothing.
    r2.step(1, [first])
    assert r2._vote_next[1] == upto and len(r2._vote_parts[1]) == len(first.slots)
    # A claim to be whole from the wrong start is ignored.
    r2.step(1, [Vote(view, 0, [], [upto + 1, -1], 0, [])])
    assert r2.phase == "candidate" and 1 not in r2.votes


# --- rule 4: the exchange completes --------------------------------------------------------------


def test_a_vote_exchange_longer_than_an_election_timeout_completes(monkeypatch):
    """R1's report of 40 slots comes one slot per chunk, three ticks each way: 240
    ticks, many election timeouts (10 to 14 ticks). The candidate's deadline moves on
    with each chunk, and R1, asked again and again by its view's candidate, waits."""
    monkeypatch.setattr(multipaxos, "VOTE_BYTES_MAX", 1)
    r0, r1, r2 = reps = _cluster(initial_sequencer=0, heartbeat_ticks=2, election_ticks=10, resend_ticks=4, batch_max=1)
    net = Net(reps, delay=3)
    view0 = r0.view
    r1.step(0, [MAccept(view0, 0, _batches("x", 40, 10))])
    r1.ready(sync=True)
    net.down = {0}
    for _ in range(3):
        net.tick()
    r2._start_election()
    net.flush(2)
    view = r2.view
    took = net.run_until(lambda: r2.phase != "candidate" or r2.view != view or r1.view > view, 400)
    if not (took and r2.view == view and r1.view == view and r2.leader == 2 and r2.phase != "candidate"):
        raise RuleBroken(
            f"the vote exchange did not complete: R2 view {r2.view} (stood at {view}) phase {r2.phase}, "
            f"R1 view {r1.view}, R2 got R1's report up to slot {r2._vote_next.get(1)}"
        )
    assert net.run_until(lambda: r2.phase == "normal" and r1.committed >= 40, 200)


# --- the simulator: the collapse, reproduced ---------------------------------------------------


def _frame_filter(src, dst, m) -> bool:
    """What the runtime does with a message over a frame (Node._send_split): not sent."""
    return _size(m) <= MAX_FRAME_BYTES - 64


def test_simulated_lagging_candidate_is_elected_and_the_cluster_goes_on():
    """Seeded simulation, LAN, N = 3, the runtime's frame limit applied: R2 is cut off
    while R0 and R1 commit 12 MiB of 256 KiB values; then R0 crashes as R2 comes back.
    R2 is the one to stand (the schedule holds R1's timer back, as a voter's whose loop
    is saturated): R1's vote carries all 12 MiB. Uncut, it never leaves R1 and the cluster has no
    leader for good; cut, R2 is elected, learns every value and serves."""
    sim, replies = quiet(replicas=3, seconds=30.0, protocol="multipaxos")
    sim.msg_filter = _frame_filter
    sim.net.isolate(2)
    value = "v" * (256 << 10)
    for k in range(48):
        sim.nodes[0].propose(100, k + 1, ["put", f"k{k}", value])
        sim._drain(0)
    t = step_until(sim, lambda: sim.nodes[1].committed >= 1 and sim.nodes[0].idle(), 1000, 8000, step_ms=10)
    assert t is not None, "R0 and R1 commit the 48 writes"
    assert len([c for c in replies if c[0] == 100]) == 48
    sim.crash(0)
    sim.net.heal()
    r1, r2 = sim.nodes[1], sim.nodes[2]
    r2.election_due = r2.now

    def r2_serves() -> bool:
        r1.election_due = NEVER  # R1 never stands (joining R2's views resets its timer)
        return r2.leader == 2 and r2.phase == "normal"

    t2 = step_until(sim, r2_serves, t, t + 8000, step_ms=10)
    if t2 is None:
        raise RuleBroken(
            f"8 s after R0 crashed no leader serves: R2 view {r2.view} phase {r2.phase}, R1 view {r1.view}; "
            f"R2 started {r2.stats.get('view_changes_started')} elections"
        )
    r2.propose(102, 1, ["put", "after", "x"])
    sim._drain(2)
    assert step_until(sim, lambda: (102, 1, None) in replies, t2, t2 + 4000, step_ms=10) is not None
    assert r2.executor.snapshot() == r1.executor.snapshot() or r1.exec_slot != r2.exec_slot
    check = sim.check()
    assert check["agreement"] and check["consistent"] and check["lost_acked"] == 0, check


# --- what else the overload sent over a frame, and re-sent ---------------------------------------


def test_a_big_chunk_is_not_rebuilt_on_every_re_ask():
    """The candidate re-asks every heartbeat; on a loaded machine a megabyte chunk took
    longer than that to arrive, and each re-ask queued another (the send queue then
    dropped frames, pings among them). A voter sends the same big chunk again only
    after resend_ticks; a small vote goes again at once, as before."""
    r0, r1, r2 = _cluster(initial_sequencer=0, heartbeat_ticks=2, election_ticks=10, resend_ticks=8)
    r1.step(0, [MAccept(r0.view, 0, _batches("x", 6, 512 << 10))])
    r1.ready(sync=True)
    for r in (r1, r2):
        for _ in range(3):
            r.tick()
    r2._start_election()
    r2.ready(sync=True)
    view = r2.view

    def votes_for(start: int) -> int:
        r1.step(2, [VRequest(view, start)])
        return sum(isinstance(m, Vote) for _, msgs in r1.ready(sync=True).messages for m in msgs)

    sent = [votes_for(0)]
    for _ in range(3):
        r1.tick()
        sent.append(votes_for(0))
    if sent != [1, 0, 0, 0]:
        raise RuleBroken(f"R1 rebuilt its first 1 MiB chunk on re-asks within resend_ticks: votes sent {sent}")
    for _ in range(8):
        r1.tick()
    assert votes_for(0) == 1, "after resend_ticks the chunk goes again (it may have been lost)"
    # A small report (from slot 6 on: nothing) goes at every ask.
    assert [votes_for(6), votes_for(6)] == [1, 1]


def test_a_follower_hands_its_pending_commands_to_a_new_leader_once_it_serves_in_pieces_under_a_frame():
    """R1 took 9,000 commands of 1 KiB from its clients and forwarded them to R0, which
    never committed them. R2 stands: R1 joins its view and, once R2 serves, hands every
    one of them to it. In one Forward that was 9.4 MB, over the frame ("exceeds a frame:
    not sent", then again on every resend); and handed to every candidate at once, with
    views churning under overload, they went out again with each new view, filled the
    send queues and pushed the pings out."""
    r0, r1, r2 = _cluster(initial_sequencer=0, heartbeat_ticks=2, election_ticks=10, resend_ticks=8)
    for k in range(9000):
        r1.propose("c1", k + 1, ["put", f"k{k % 100}", "v" * 1024])
    first = [m for _, msgs in r1.ready(sync=True).messages for m in msgs]
    assert sum(len(m.cmds) for m in first) == 9000
    for _ in range(3):
        r1.tick()
        r2.tick()
    r1.ready(sync=True)
    r2._start_election()
    r2.ready(sync=True)

    def forwards() -> list:
        return [m for dst, msgs in r1.ready(sync=True).messages for m in msgs if dst == 2 and type(m).__name__ == "Forward"]

    r1.step(2, [VRequest(r2.view, 0)])
    early = forwards()
    for _ in range(3 * 8):  # resend periods go by while R2 is a candidate
        r1.election_due = NEVER  # (R1 does not stand meanwhile)
        r1.tick()
        early += forwards()
    if early:
        raise RuleBroken(f"R1 handed {sum(len(m.cmds) for m in early)} commands to R2 while R2 was only a candidate")
    r2.step(1, [Vote(r2.view, 0, [], [0, -1], 0, [])])
    assert r2.phase in ("recovering", "normal")
    pings = [m for dst, msgs in r2.ready(sync=True).messages for m in msgs if dst == 1 and type(m).__name__ == "Ping"]
    r1.step(2, pings)
    fwd = forwards()
    big = [_size(m) for m in fwd if _size(m) > MAX_FRAME_BYTES - 64]
    if big:
        raise RuleBroken(f"R1 handed its pending commands to R2 in Forwards over a frame: {big} bytes")
    assert sum(len(m.cmds) for m in fwd) == 9000 and len(fwd) > 1


def test_n5_a_voter_whose_report_is_whole_waits_while_the_others_chunks_come_in(monkeypatch):
    """N = 5, R3 and R4 down. R0 stands: R1's report is whole at once (it holds
    nothing), R2's comes one slot per chunk, three ticks each way (240 ticks). Asked no
    more once its report was whole, R1 stood after an election timeout, R0 gave up,
    and so on for ever (swarm seeds 700469, 700697, 700793 with one-slot chunks)."""
    monkeypatch.setattr(multipaxos, "VOTE_BYTES_MAX", 1)
    reps = _cluster(n=5, initial_sequencer=3, heartbeat_ticks=2, election_ticks=10, resend_ticks=4, batch_max=1)
    r0, r1, r2 = reps[:3]
    net = Net(reps, delay=3)
    r2.step(3, [MAccept(r2.view, 0, _batches("x", 40, 10))])
    r2.ready(sync=True)
    net.down = {3, 4}
    for _ in range(3):
        net.tick()
    r0._start_election()
    net.flush(0)
    view = r0.view
    took = net.run_until(lambda: r0.phase != "candidate" or r0.view != view or r1.view > view, 400)
    if not (took and r0.view == view and r1.view == view and r0.phase != "candidate"):
        raise RuleBroken(
            f"the vote exchange did not complete: R0 view {r0.view} (stood at {view}) phase {r0.phase}, "
            f"R1 view {r1.view} (stood {r1.stats.get('view_changes_started', 0)} times), R2's report up to {r0._vote_next.get(2)}"
        )
    assert [r0.log[j].batch for j in range(40)] == _batches("x", 40, 10)
