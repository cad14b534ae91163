"""Pure protocol rules shared by the replicas: no state, no I/O, one rule per function.

Each is a decision the paper (or Paxos) states once; the replicas call these instead
of restating them, and unit tests and the mutation list aim at them directly.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .config import ballot_owner


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


def fig7(
    n: int,
    base: int,
    log: dict[int, int],
    best: dict[int, tuple[int, Any, bool]] | None,
    voters: list[int],
    last_view: int,
    c_max_reports: list[list[int]],
    below: Callable[[int], int],
) -> tuple[int, int] | None:
    """SDPaxos Fig. 7 (N = 5), a new sequencer's blind spot: holes may hold slots
    fast-committed by the one replica R_m that neither voted nor was the last
    sequencer; give them to R_m until it owns as many slots as C-instances a voter
    accepted from it.

    A slot whose highest report is from a view older than the last serving one
    (and not committed) is a hole too: had that old value been chosen, the last
    view's phase 1 would have found it and re-proposed it in its recovered log,
    which a voter that reports that view holds whole (so the slot would be
    reported at the last view). Not chosen, the last sequencer may have given the
    slot to R_m, and R_m may have executed it on the fast path (found by the
    steered search: a stale view-36 report at a slot view 67 gave R_m, which
    executed it).

    ``log``: {slot: leader} from phase 1 (``pick_highest``'s ``best``), mutated.
    ``voters``: the candidate and its voters. ``last_view``: the highest view any of
    them reports having taken O-accepts of (``o_view``). ``c_max_reports``: per
    reporter, its highest accepted C-instance per leader. ``below(m)``: O-slots naming
    ``m`` under ``base``. Returns ``(R_m, slots it must own)`` when there is a blind
    spot, else None.
    """
    last_seq = ballot_owner(last_view)
    if last_seq in voters:
        return None  # the last sequencer reported every slot it proposed: no blind spot
    others = [r for r in range(n) if r not in voters and r != last_seq]
    if len(others) != 1:
        return None
    m = others[0]
    if best is not None:
        for j in [j for j, (view, _leader, committed) in best.items()
                  if j >= base and view < last_view and not committed and j in log]:
            del log[j]  # possibly overwritten by the last view (docstring)
    c_m = max(report[m] for report in c_max_reports)
    if c_m < 0:
        return None
    needed = c_m + 1  # R_m may have up to C[m] + 1 ready instances (0-based C[m])
    fig7_fill(log, base, m, needed, below(m))
    return m, needed
