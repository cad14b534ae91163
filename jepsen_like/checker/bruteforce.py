"""Reference checkers for tests: the definition executed (``brute_force``, small histories) and
a plain memoised Wing–Gong search (``plain_wgl``, medium histories).

``brute_force(history, model) -> bool`` tries every order of the operations consistent with
real time (an operation may be placed only when no remaining ok operation returned before it
was invoked), calling ``model.step`` directly: no partitioning, no compiled transitions, no
cache. Failed operations are left out; indeterminate ones may be placed anywhere after their
invocation or left out. It shares nothing with the fast checker but the model's ``step``, which
is what makes it a useful oracle in property tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..history import FAIL, INFO, OK, Op, Operation, pair
from ..models import UNKNOWN, Model

__all__ = ["brute_force", "plain_wgl"]


def brute_force(history: Sequence[Op] | Sequence[Operation], model: Model, max_ops: int = 12) -> bool:
    ops = list(history) if history and isinstance(history[0], Operation) else pair(history)  # type: ignore[arg-type]
    ops = [o for o in ops if o.type != FAIL]
    if len(ops) > max_ops:
        raise ValueError(f"brute force is for small histories ({len(ops)} > {max_ops} operations)")
    must = frozenset(o.id for o in ops if o.type == OK)

    def extend(state: Any, placed: frozenset[int]) -> bool:
        if must <= placed:
            return True
        for o in ops:
            if o.id in placed:
                continue
            # Real time: nothing still unplaced may have completed before o was invoked.
            if any(p.type == OK and p.id not in placed and p.end < o.start for p in ops):
                continue
            result = UNKNOWN if o.type == INFO else o.result
            ok, new = model.step(state, o.f, o.value, result)
            if ok and extend(new, placed | {o.id}):
                return True
        return False

    return extend(model.init(), frozenset())


def plain_wgl(
    history: Sequence[Op] | Sequence[Operation], model: Model, max_ops: int = 80, max_states: int = 2_000_000
) -> bool:
    """A plain memoised Wing–Gong search for medium histories (tens of operations): any
    operation none of whose real-time predecessors is still pending may go next (info operations
    may also never be placed: they never happened); success once every ok operation is placed;
    memo on (placed set, state). No partitioning, no compiled transitions, no heuristics or
    reductions: slower than the real checker but simple enough to trust, and an oracle for
    histories too long to brute-force. Raises ``RuntimeError`` past ``max_states`` states."""
    ops = list(history) if history and isinstance(history[0], Operation) else pair(history)  # type: ignore[arg-type]
    ops = [o for o in ops if o.type != FAIL]
    if len(ops) > max_ops:
        raise ValueError(f"plain_wgl is for medium histories ({len(ops)} > {max_ops} operations)")
    index = {o.id: i for i, o in enumerate(ops)}
    must = 0
    for o in ops:
        if o.type == OK:
            must |= 1 << index[o.id]
    # pred[i]: ok operations that returned before operation i was invoked.
    pred = [0] * len(ops)
    for i, o in enumerate(ops):
        for p in ops:
            if p.type == OK and p.end < o.start:
                pred[i] |= 1 << index[p.id]
    seen: set[tuple[int, Any]] = set()
    stack: list[tuple[int, Any]] = [(0, model.init())]
    while stack:
        placed, state = stack.pop()
        if placed & must == must:
            return True
        if (placed, state) in seen:
            continue
        seen.add((placed, state))
        if len(seen) > max_states:
            raise RuntimeError(f"plain_wgl gave up after {max_states} states")
        for i, o in enumerate(ops):
            bit = 1 << i
            if placed & bit or pred[i] & ~placed:
                continue
            result = UNKNOWN if o.type == INFO else o.result
            ok, new = model.step(state, o.f, o.value, result)
            if ok:
                stack.append((placed | bit, new))
    return False
