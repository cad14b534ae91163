"""Small helpers for writing histories by hand in tests, and for replaying a witness."""

from __future__ import annotations

from typing import Any

from jepsen_like.checker.linear import Problem, Search
from jepsen_like.history import Op
from jepsen_like.models import apply_transition


def h(*events: tuple[Any, ...]) -> list[Op]:
    """``h((0, "invoke", "write", 1), (0, "ok", "write", 1), ...)``: time is the position."""
    return [Op(i, i, e[0], e[1], e[2], e[3] if len(e) > 3 else None) for i, e in enumerate(events)]


def seq(*ops: tuple[Any, ...], process: int = 0) -> list[tuple[Any, ...]]:
    """Sequential ops on one process: ``seq(("write", 1, 1), ("read", None, 1))`` gives each op's
    invoke and ok events (f, invoke value, ok value)."""
    out: list[tuple[Any, ...]] = []
    for f, v_in, v_out in ops:
        out += [(process, "invoke", f, v_in), (process, "ok", f, v_out)]
    return out


def replay_witness(problem: Problem, search: Search) -> str:
    """Check that a search's witness is a linearization: each step allowed by the model, every
    ok operation placed after all ok operations that returned before it was invoked, and every
    ok operation placed. Returns "ok" or a description of the first problem."""
    assert search.witness is not None
    trans = {op.id: (op, t) for op, t in problem.main + problem.info}
    state = problem.init
    placed: set[int] = set()
    for i in search.witness:
        op, t = trans[i]
        ok, state2 = apply_transition(t, state)
        if not ok:
            return f"step {op} fails in state {state!r}"
        late = [o.id for o, _ in problem.main if o.end < op.start and o.id not in placed]
        if late:
            return f"{op.id} placed before {late}"
        placed.add(i)
        state = state2
    missing = [o.id for o, _ in problem.main if o.id not in placed]
    return f"missing {missing}" if missing else "ok"
