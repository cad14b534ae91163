"""The pure protocol rules (consensus/core/rules.py), each on its own."""

from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.core.config import make_ballot
from consensus.core.rules import fig7, fig7_fill, pick_highest, ready_limit

entry = st.tuples(st.integers(0, 5), st.integers(0, 9), st.integers(0, 3), st.booleans())


@settings(max_examples=100, derandomize=True)
@given(st.lists(st.lists(entry, max_size=6), min_size=1, max_size=5))
def test_pick_highest_prefers_committed_then_the_highest_ballot(reports):
    # A committed value is the chosen one: every report of a committed instance agrees.
    chosen = {}
    for report in reports:
        for inst, _, value, committed in report:
            if committed:
                chosen.setdefault(inst, value)
    reports = [[(i, b, chosen.get(i, v), c) for i, b, v, c in r] for r in reports]
    best = pick_highest(reports)
    for inst, (ballot, value, committed) in best.items():
        seen = [e for r in reports for e in r if e[0] == inst]
        if any(e[3] for e in seen):
            assert committed and value == chosen[inst]
        else:
            assert ballot == max(e[1] for e in seen)
            assert (inst, ballot, value, False) in seen
    assert set(best) == {e[0] for r in reports for e in r}


def test_pick_highest_ignores_instances_below_low():
    assert pick_highest([[(1, 5, "a", False), (3, 1, "b", False)]], low=2) == {3: (1, "b", False)}


def test_ready_limit_is_fig5():
    assert ready_limit(3, False, committed=2, in_prefix=5, in_majority=4) == 2
    assert ready_limit(7, True, committed=2, in_prefix=5, in_majority=4) == 2
    assert ready_limit(5, False, committed=2, in_prefix=5, in_majority=4) == 5  # line 29
    assert ready_limit(5, True, committed=2, in_prefix=5, in_majority=4) == 4


def test_fig7_fills_the_first_holes_until_rm_owns_enough():
    log = {10: 1, 12: 2}
    fig7_fill(log, base=10, m=4, needed=2, below=0)
    assert log == {10: 1, 11: 4, 12: 2, 13: 4}
    log = {10: 4, 11: 4}
    fig7_fill(log, base=10, m=4, needed=3, below=1)
    assert log == {10: 4, 11: 4}  # already owns 3 (one below base)
    log = {}
    fig7_fill(log, base=5, m=0, needed=1, below=0)
    assert log == {5: 0}


def test_fig7_only_with_one_replica_unseen_besides_the_last_sequencer():
    """Paper Fig. 7 (appendix A), N = 5: the blind spot exists only when the last
    sequencer did not vote and exactly one other replica, R_m, did not either; R_m
    then gets the first holes until it owns C[m] + 1 slots."""
    last = make_ballot(1, 1)  # the last view that served: R1's
    reports = [[-1] * 5, [-1, -1, -1, 2, -1]]  # a voter accepted R3's C-instance 2

    def run(voters):
        log = {10: 0}
        return fig7(5, 10, log, None, voters, last, reports, lambda m: 0), log

    assert run([1, 2, 4]) == (None, {10: 0})  # the last sequencer voted: it reported all
    assert run([0, 2]) == (None, {10: 0})  # two unseen besides it: no single R_m
    assert run([0, 2, 3]) == (None, {10: 0})  # R_m = R4, of which nobody accepted anything
    assert run([0, 2, 4]) == ((3, 3), {10: 0, 11: 3, 12: 3, 13: 3})  # R_m = R3, C[3] = 2
    log = {10: 0, 11: 3}
    assert fig7(5, 10, log, None, [0, 2, 4], last, reports, lambda m: 1) == (3, 3)
    assert log == {10: 0, 11: 3, 12: 3}  # one R3 slot under the base, one above: one more


def test_fig7_treats_an_uncommitted_report_older_than_the_last_serving_view_as_a_hole():
    """A slot reported only at a view older than the last serving one may have been
    given to R_m by that view (and executed by R_m on the fast path): it is a hole."""
    old, last = make_ballot(1, 0), make_ballot(2, 1)
    best = {10: (old, 2, False), 11: (last, 0, False), 12: (old, 4, True)}
    log = {10: 2, 11: 0, 12: 4}
    got = fig7(5, 10, log, best, [0, 2, 4], last, [[-1, -1, -1, 0, -1]], lambda m: 0)
    assert got == (3, 1) and log == {10: 3, 11: 0, 12: 4}  # slot 10 went to R_m = R3
