"""Pure protocol rules shared by the replicas: no state, no I/O, one rule per function.

Each is a decision the paper (or Paxos) states once; the replicas call these instead
of restating them, and unit tests and the mutation list aim at them directly.
"""

from __future__ import annotations

from typing import Any, Iterable


def pick_highest(reports: Iterable[Iterable[tuple[int, int, Any, bool]]], low: int = 0) -> dict[int, tuple[int, Any, bool]]:
    """Paxos phase-1 choice per instance from a quorum's reports.

    ``reports``: per reporter, ``(instance, ballot, value, committed)`` entries. For
    each instance at or above ``low``: a committed value if anyone reports one
    (it is chosen), else the value accepted at the highest ballot. Returns
    ``{instance: (ballot, value, committed)}``; an instance nobody reports is absent
    (the caller proposes a no-op there).
    """
    best: dict[int, tuple[int, Any, bool]] = {}
    for report in reports:
        for inst, ballot, value, committed in report:
            if inst < low:
                continue
            cur = best.get(inst)
            if cur is None or (committed and not cur[2]) or (not cur[2] and ballot > cur[0]):
                best[inst] = (ballot, value, committed)
    return best


def ready_limit(n: int, is_sequencer: bool, committed: int, in_prefix: int, in_majority: int) -> int:
    """SDPaxos Fig. 5: how many of a command leader's C-instances have their O-side
    satisfied, from the counts of O-slots naming it.

    N = 5: the sequencer's own slots once a majority accepted them; another command
    leader's on the sequencer's O-accept alone (line 29: both it and the sequencer
    hold the slot). N = 3 and N >= 7: committed O-slots.
    """
    if n == 5:
        return in_majority if is_sequencer else in_prefix
    return committed


def fig7_fill(log: dict[int, Any], base: int, m: Any, needed: int, below: int, empty: Any = None) -> None:
    """SDPaxos Fig. 7 lines 32-36: propose ``m`` in the first empty O-instance at or
    above ``base`` until ``m`` owns ``needed`` O-instances (``below`` of them under
    ``base``) with no empty one before the last. Mutates ``log`` ({slot: leader}).
    """
    if below >= needed:
        return
    while True:
        seen, first_empty, satisfied = below, None, False
        for j in range(base, max(log, default=base - 1) + 2):
            leader = log.get(j, empty)
            if leader is empty:
                if first_empty is None:
                    first_empty = j
                continue
            if leader == m:
                seen += 1
                if seen == needed:
                    satisfied = first_empty is None
                    break
        if satisfied:
            return
        if first_empty is None:
            first_empty = max(log, default=base - 1) + 1
        log[first_empty] = m
