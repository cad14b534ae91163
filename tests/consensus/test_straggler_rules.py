"""Straggler detection (paper §4): who may confirm that the sequencer is slow.

A replica judges the sequencer every window by how long its own instances take to
become ready and how many O-slots are served for it; three slow windows in a row and
it asks the others, and a majority that agrees stops renewing the sequencer's lease
and elects anew. ``cellar bench straggler`` (case ``sdpaxos-replica``) found healthy
sequencers deposed when an *ordinary* replica was slowed: the slowed replica finds
its own instances late and blames the sequencer, and a healthy peer agreed on one
noisy window (its served count dipped under 70 % of its baseline once). The rules:

- a replica confirms a peer's request only after ``straggler_agree_strikes``
  doubtful windows of its own in a row (``test_one_doubtful_window_is_not_enough``);
- a replica that sees nothing wrong never confirms
  (``test_a_slowed_replica_alone_does_not_depose_a_healthy_sequencer``);
- a vote counts for two windows (``test_a_stale_vote_does_not_count``, N=5);
- an answer within the tick it was proposed in took up to one tick, so a best of 0
  ticks does not make two ticks of queueing look slow
  (``test_a_best_of_zero_ticks_is_one_tick``);
- the best is held at a configured floor (``straggler_floor_ticks``; the runtime's
  ``straggler_floor_ms``, one heartbeat): on loopback the best is about 0 and a
  saturated 2-core machine made every replica's instances wait 50-120 ms, which
  deposed healthy sequencers under load alone
  (``test_the_floor_holds_queueing_below_it_and_not_a_slow_sequencer``).

Each is a schedule over the real replica objects (``consensus.sim.transcript``'s
cluster: lockstep ticks, a FIFO network); links are cut to make one replica's
instances late, as a slow process or a slow sequencer would.
"""

from __future__ import annotations

from consensus.sim.transcript import Cluster

WINDOW = 10


def cluster(n: int = 3) -> Cluster:
    c = Cluster()
    c.run(f"cluster n={n} straggler={WINDOW}")
    for r in range(1, n):  # a healthy history: every replica learns its best time
        c.run(f"propose {r} put k{r} v")
    c.run("stabilize")
    while c.reps[1].now % WINDOW or c.reps[1].now == 0:  # a window closes on that history;
        c.run("run 1")  # every replica's clock is at the start of the next one
    return c


def judged(c: Cluster, r: int) -> dict:
    return c.reps[r].status()["straggler"]


def distrusts(c: Cluster, r: int) -> bool:
    """``r`` stopped renewing the sequencer's lease because a majority judged it slow."""
    rep = c.reps[r]
    return rep.gate.distrust_view == rep.view


def window(c: Cluster, proposers: tuple[int, ...], windows: int = 1) -> None:
    """``windows`` windows: each proposer proposes once per window; every tick, what
    is in flight is delivered (over the links not cut) and the clocks tick."""
    for _ in range(windows):
        for r in proposers:
            c.run(f"propose {r} put x{r} {c.reps[r].now}")
        for _ in range(WINDOW):
            c.run("run 1")


def test_a_slowed_replica_alone_does_not_depose_a_healthy_sequencer():
    c = cluster()
    c.run("cut 0->1")  # R1 hears nothing: its instances are late, as if R1 itself
    c.run("cut 2->1")  # were too slow to take its acks and O-accepts
    window(c, (1, 2), windows=8)
    assert judged(c, 1)["strikes"] >= 3 and 1 in judged(c, 2)["votes"], "R1 blames the sequencer and asks R2"
    assert judged(c, 2)["doubts"] == 0, "R2's own instances are served at once"
    assert not any(distrusts(c, r) for r in (1, 2)), "one replica's complaint is not a majority"


def test_a_slow_sequencer_is_judged_slow_by_a_majority():
    c = cluster()
    c.run("cut 0->1")  # the sequencer serves nobody: every instance is late
    c.run("cut 0->2")
    window(c, (1, 2), windows=4)
    assert judged(c, 1)["strikes"] >= 3 and judged(c, 2)["doubts"] >= 2
    assert distrusts(c, 1) and distrusts(c, 2)


def test_one_doubtful_window_is_not_enough():
    c = cluster()
    c.run("cut 0->1")
    c.run("cut 2->1")
    window(c, (1, 2), windows=3)  # R1: three slow windows; it asks every window from now
    assert judged(c, 1)["strikes"] == 3
    c.run("cut 0->2")  # R2's instances are late for one window
    window(c, (1, 2), windows=1)
    assert judged(c, 2)["doubts"] == 1
    assert not distrusts(c, 2), "one doubtful window of R2's own does not confirm R1's request"
    window(c, (1, 2), windows=1)  # a second one in a row does
    assert judged(c, 2)["doubts"] == 2
    assert distrusts(c, 2)


def test_a_stale_vote_does_not_count():
    """N=5: R1 asked long ago and recovered; R3 asks now and R2 agrees. R1's old vote
    must not make three."""
    c = cluster(n=5)
    for r in range(5):
        if r != 1:
            c.run(f"cut {r}->1")
    window(c, (1,), windows=3)  # R1 asks once (3 strikes)
    assert 1 in judged(c, 2)["votes"]
    c.run("heal")
    window(c, (1, 2, 3), windows=4)  # R1 recovers; its vote grows old
    assert judged(c, 1)["strikes"] == 0
    assert 1 not in judged(c, 2)["votes"], "a vote counts for two windows"
    for r in (2, 3):  # now the sequencer serves neither R2 nor R3
        c.run(f"cut 0->{r}")
    window(c, (2, 3), windows=3)  # R3 asks; R2, doubtful twice, agrees: 2 of 5
    assert judged(c, 3)["strikes"] >= 3 and judged(c, 2)["doubts"] >= 2
    assert sorted(judged(c, 2)["votes"]) == [2, 3]
    assert not distrusts(c, 2) and not distrusts(c, 3), "two fresh votes are not a majority of five"


def test_a_best_of_zero_ticks_is_one_tick():
    """Instances answered within their tick (best 0); then, for a window, each of R2's
    instances waits three ticks before anything is delivered (queueing on a busy
    machine): below 3 x 1 + 2 ticks, not a slow window."""
    c = cluster()
    rep = c.reps[2]
    assert judged(c, 2)["best_ready_ticks"] == 0
    for _ in range(2):
        c.run(f"propose 2 put y {rep.now}")
        c.run("tick 3")  # in flight, not delivered
        c.run("run 1")  # delivered: answered at once
    while rep.now % WINDOW:
        c.run("run 1")
    w = judged(c, 2)["last_window"]
    assert w["instances"] == 2 and w["ticks"] >= 6, w
    assert judged(c, 2)["strikes"] == 0


def _one_late_window(floor: int, wait: int) -> dict:
    """A healthy history (best 0), then one window in which R2's one instance waits
    ``wait`` ticks before anything is delivered; R2's judgment of that window."""
    c = Cluster()
    c.run(f"cluster n=3 straggler=40 floor={floor}")
    for r in (1, 2):
        c.run(f"propose {r} put k{r} v")
    c.run("stabilize")
    rep = c.reps[2]
    while rep.now % 40 or rep.now == 0:
        c.run("run 1")
    assert c.reps[2].status()["straggler"]["best_ready_ticks"] == 0
    c.run(f"propose 2 put y {rep.now}")
    c.run(f"tick {wait}")  # in flight, not delivered: every replica late alike
    c.run("run 1")
    while rep.now % 40:
        c.run("run 1")
    st = rep.status()["straggler"]
    assert st["last_window"]["instances"] == 1 and st["last_window"]["ticks"] >= wait, st
    return st


def test_the_floor_holds_queueing_below_it_and_not_a_slow_sequencer():
    # Without a floor (1, the clock's resolution) a 6-tick wait is slow: 6 > 3 x 1 + 2.
    assert _one_late_window(floor=1, wait=6)["strikes"] == 1
    # Held to a floor of 4 ticks it is neither slow (3 x 4 + 2) nor doubtful (2 x 4 + 2).
    st = _one_late_window(floor=4, wait=6)
    assert st["strikes"] == 0 and st["doubts"] == 0, st
    # A sequencer slower than the floor allows is still judged slow.
    assert _one_late_window(floor=4, wait=16)["strikes"] == 1


def test_served_below_the_healthy_rate_with_fast_instances_is_my_demand_falling():
    """R2 proposes 4 instances a window (its healthy rate), then 1: far fewer O-slots
    served than its baseline, while the one it asked for was ordered at once and the
    one in flight at the window's end is young. That is R2's demand falling (clients
    gone, or bigger batches on a loaded machine: fewer instances for the same
    commands), and it deposed healthy sequencers on a saturated machine when the load
    shifted; the served signal counts only when R2's instances are late at all."""
    c = cluster()
    rep = c.reps[2]
    for _ in range(6):  # the healthy rate: 4 a window
        window(c, (2, 2, 2, 2))
    assert judged(c, 2)["served_baseline"] >= 3, judged(c, 2)
    c.run(f"propose 2 put z1 {rep.now}")  # ordered at once
    while rep.now % WINDOW != WINDOW - 1:
        c.run("run 1")
    c.run(f"propose 2 put z2 {rep.now}")
    c.run("tick 1")  # in flight when the window closes: demand, one tick old
    st = judged(c, 2)
    w = st["last_window"]
    assert w["served"] * 2 < st["served_baseline"] and w["instances"] == 2, st
    assert st["strikes"] == 0 and st["doubts"] == 0, st
