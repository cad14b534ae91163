"""The pure protocol rules (consensus/core/rules.py), each on its own."""

from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.core.rules import fig7_fill, pick_highest, ready_limit

entry = st.tuples(st.integers(0, 5), st.integers(0, 9), st.integers(0, 3), st.booleans())


@settings(max_examples=300, derandomize=True)
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
