"""Check a whole history: partition, interleave the per-partition searches, enforce budgets.

``check(history, model, timeout_s=None, memory_bytes_max=..., workers=1) -> CheckResult``.

- The history (``Op`` events or already-paired ``Operation``s) is paired, and the model splits
  it into independent partitions (P-compositionality: the history is linearizable iff every
  partition is).
- Partitions are *interleaved*, never run one after another to completion: some refutations
  are cheap and others very expensive, and one refuted partition settles the verdict. Each round
  gives every unfinished partition a slice of ``slice_steps`` search steps, round-robin; the
  first refutation stops everything.
- Budgets: the deadline is checked after every slice (a slice is about a millisecond), and the
  memory budget is accounted from cache sizes (entries times an estimated per-entry size). A
  partition that would push the total over ``memory_bytes_max`` drops its cache and becomes
  ``unknown``; the others keep running, since a refutation elsewhere still decides the verdict.
  Running out of time makes every unfinished partition ``unknown``. Verdicts merge as in
  Jepsen: false beats unknown beats true.
- ``workers > 1`` forks that many processes (Linux ``fork``), each interleaving its share of the
  partitions (largest first, balanced by size); the parent stops them all at the first
  refutation. Measured: for the 50-client, 8-key benchmark one process is as fast or faster (see
  docs/checker.md), so the default is 1.
- On a violation the failing partition is *shrunk* while budget remains: the shortest prefix of
  it (cut at a completion; operations still running there become indeterminate) that is still
  not linearizable, found by binary search, since every extension of a non-linearizable cut is
  non-linearizable. The ``Violation`` lists the partition's operations, that cut, the longest
  linearizable prefix the search found, and the operations it could not place after it.
"""

from __future__ import annotations

import heapq
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..history import FAIL, Op, Operation, pair
from ..models import CAS, Model, _show, apply_transition
from .linear import Problem, Search, compile_problem, cut

__all__ = ["UNKNOWN_VERDICT", "CheckResult", "PartitionResult", "Violation", "check", "merge_valid"]

UNKNOWN_VERDICT = "unknown"
Valid = bool | str  # True, False or "unknown"

DEFAULT_MEMORY_BYTES_MAX = 1 << 30
DEFAULT_SLICE_STEPS = 2000


def merge_valid(verdicts: Sequence[Valid]) -> Valid:
    """Jepsen's ``merge-valid``: false beats unknown beats true."""
    if any(v is False for v in verdicts):
        return False
    if any(v == UNKNOWN_VERDICT for v in verdicts):
        return UNKNOWN_VERDICT
    return True


@dataclass(slots=True)
class PartitionResult:
    key: Any
    valid: Valid
    ops: int
    steps: int
    cache_entries: int
    reason: str | None = None  # why unknown: "timeout" or "memory"


@dataclass(slots=True)
class Violation:
    """Why a partition is not linearizable.

    ``ops``: every operation of the failing partition; ``cut``: the shortest failing prefix of it
    (``cut_end`` is the history position where it ends; ``minimized`` is False when shrinking ran
    out of budget, and then ``cut`` is the shortest failing prefix found so far, or ``ops``);
    ``longest``: the longest linearizable prefix found in the cut, in linearization order;
    ``blocked``: the ok operation whose completion no linearization could reach; ``frontier``:
    the ok operations that were candidates there and could not be linearized; ``culprit``: a
    read the search proved could never be satisfied, when it found one (with appends, the search
    can rule a read out long before it reaches it); ``state``: the model state after ``longest``.
    """

    key: Any
    ops: list[Operation]
    cut: list[Operation]
    cut_end: float
    minimized: bool
    longest: list[Operation]
    blocked: Operation | None
    frontier: list[Operation]
    state: Any
    culprit: Operation | None = None
    reason: str | None = None  # a one-line explanation, when there is a simple one

    @property
    def involved(self) -> list[Operation]:
        """The operations to look at first: the culprit, the blocked one, then the frontier."""
        out: list[Operation] = []
        for o in [self.culprit, self.blocked, *self.frontier]:
            if o is not None and all(o.id != p.id for p in out):
                out.append(o)
        return out


@dataclass(slots=True)
class CheckResult:
    valid: Valid
    ops: int
    partitions: int
    seconds: float
    model: str
    results: list[PartitionResult] = field(default_factory=list)
    violation: Violation | None = None
    reason: str | None = None
    steps: int = 0
    cache_entries_peak: int = 0
    verdict_seconds: float = 0.0  # until the verdict; ``seconds`` includes explaining a violation

    @property
    def linearizable(self) -> bool | None:
        return None if self.valid == UNKNOWN_VERDICT else bool(self.valid)

    def to_json(self) -> dict[str, Any]:
        return {
            "linearizable": self.linearizable,
            "ops": self.ops,
            "partitions": self.partitions,
            "seconds": round(self.seconds, 6),
        }


def check(
    history: Sequence[Op] | Sequence[Operation],
    model: Model,
    *,
    timeout_s: float | None = None,
    memory_bytes_max: int = DEFAULT_MEMORY_BYTES_MAX,
    workers: int = 1,
    slice_steps: int = DEFAULT_SLICE_STEPS,
    shrink: bool = True,
) -> CheckResult:
    """Decide whether ``history`` is linearizable with respect to ``model``."""
    t0 = time.monotonic()
    deadline = math.inf if timeout_s is None else t0 + timeout_s
    ops = _paired(history)
    parts = model.partition([o for o in ops if o.type != FAIL])
    problems = [compile_problem(model.for_partition(key), key, part) for key, part in parts.items()]
    if workers > 1 and len(problems) > 1 and hasattr(os, "fork"):
        outcome = _run_forked(problems, deadline, memory_bytes_max, slice_steps, workers)
    else:
        outcome = _interleave(problems, deadline, memory_bytes_max, slice_steps)
    results, failed, steps, peak = outcome
    verdict_seconds = time.monotonic() - t0
    valid = merge_valid([r.valid for r in results])
    violation = None
    if failed is not None:
        failed_problem, failed_longest, failed_culprit = failed
        violation = _explain(
            model.for_partition(failed_problem.key), failed_problem, failed_longest, failed_culprit, deadline, t0, shrink
        )
    reason = None
    if valid == UNKNOWN_VERDICT:
        reason = "memory" if any(r.reason == "memory" for r in results) else "timeout"
    return CheckResult(
        valid=valid,
        ops=len(ops),
        partitions=len(problems),
        seconds=time.monotonic() - t0,
        model=model.name,
        results=results,
        violation=violation,
        reason=reason,
        steps=steps,
        cache_entries_peak=peak,
        verdict_seconds=verdict_seconds,
    )


def _paired(history: Sequence[Op] | Sequence[Operation]) -> list[Operation]:
    if history and isinstance(history[0], Operation):
        return list(history)  # type: ignore[arg-type]
    return pair(history)  # type: ignore[arg-type]


# A refutation: the problem, the longest prefix its search found, and its culprit read (if any).
_Failed = tuple[Problem, list[int], "int | None"]
_Outcome = tuple[list[PartitionResult], "_Failed | None", int, int]


def _interleave(
    problems: list[Problem], deadline: float, memory_bytes_max: int, slice_steps: int
) -> _Outcome:
    """Round-robin slices over all unfinished searches; stop at the first refutation."""
    searches = [Search(p) for p in problems]
    verdicts: list[Valid | None] = [s.done for s in searches]
    reasons: list[str | None] = [None] * len(searches)
    active = [i for i, s in enumerate(searches) if s.done is None]
    failed: _Failed | None = None
    for s in searches:
        if s.done is False:  # refuted before any search (an impossible value)
            failed = (s.problem, s.longest, s.culprit)
            break
    peak = 0
    while active and failed is None:
        still: list[int] = []
        for i in active:
            s = searches[i]
            r = s.run(slice_steps)
            if r is None:
                still.append(i)
                continue
            verdicts[i] = r
            if r is False:
                failed = (s.problem, s.longest, s.culprit)
                break
            s.release()
        if failed is not None:
            break
        active = still
        used = sum(searches[i].memory_bytes() for i in active)
        peak = max(peak, sum(searches[i].cache_entries for i in active))
        while active and used > memory_bytes_max:
            # Give up on the hungriest search; a refutation elsewhere can still decide.
            worst = max(active, key=lambda i: searches[i].memory_bytes())
            used -= searches[worst].memory_bytes()
            searches[worst].release()
            verdicts[worst], reasons[worst] = UNKNOWN_VERDICT, "memory"
            active.remove(worst)
        if active and time.monotonic() > deadline:
            for i in active:
                verdicts[i], reasons[i] = UNKNOWN_VERDICT, "timeout"
            break
    results = []
    for i, s in enumerate(searches):
        v = verdicts[i]
        if v is None:  # stopped early by a refutation elsewhere: not decided
            v, reasons[i] = UNKNOWN_VERDICT, "stopped"
        results.append(
            PartitionResult(s.problem.key, v, s.problem.size, s.steps, s.cache_entries, reasons[i])
        )
    return results, failed, sum(s.steps for s in searches), peak


def _run_forked(
    problems: list[Problem], deadline: float, memory_bytes_max: int, slice_steps: int, workers: int
) -> _Outcome:
    """Split the partitions over forked workers; the first refutation terminates the rest."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    workers = min(workers, len(problems))
    # Largest first onto the least-loaded worker, so the shares are balanced by size.
    shares: list[list[int]] = [[] for _ in range(workers)]
    heap = [(0, w) for w in range(workers)]
    for i in sorted(range(len(problems)), key=lambda i: -problems[i].size):
        load, w = heapq.heappop(heap)
        shares[w].append(i)
        heapq.heappush(heap, (load + problems[i].size, w))
    queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(queue, [(i, problems[i]) for i in share], deadline, memory_bytes_max // workers, slice_steps),
            daemon=True,
        )
        for share in shares
    ]
    for p in procs:
        p.start()
    results: dict[int, PartitionResult] = {}
    failed: _Failed | None = None
    steps = peak = 0
    try:
        pending = len(procs)
        while pending and failed is None:
            msg = queue.get()
            if msg[0] == "done":
                pending -= 1
                steps += msg[1]
                peak = max(peak, msg[2])
                continue
            _, i, pr, longest, culprit = msg
            results[i] = pr
            if pr.valid is False:
                failed = (problems[i], longest, culprit)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join()
        queue.close()
    ordered = []
    for i, p in enumerate(problems):
        ordered.append(
            results.get(i) or PartitionResult(p.key, UNKNOWN_VERDICT, p.size, 0, 0, "stopped")
        )
    return ordered, failed, steps, peak


def _worker(
    queue: Any, share: list[tuple[int, Problem]], deadline: float, memory_bytes_max: int, slice_steps: int
) -> None:
    results, failed, steps, peak = _interleave([p for _, p in share], deadline, memory_bytes_max, slice_steps)
    for (i, _), pr in zip(share, results):
        refuted = failed is not None and pr.valid is False
        queue.put(("result", i, pr, failed[1] if refuted else [], failed[2] if refuted else None))  # type: ignore[index]
    queue.put(("done", steps, peak))


# ---------------------------------------------------------------------- explaining a violation


def _explain(
    model: Model,
    problem: Problem,
    longest_ids: list[int],
    culprit_id: int | None,
    deadline: float,
    t0: float,
    shrink: bool,
) -> Violation:
    """Shrink the failing partition to its shortest failing cut (within budget) and describe it."""
    search = Search(problem)
    search.longest, search.culprit = longest_ids, culprit_id
    cut_problem, cut_end, minimized = problem, math.inf, False
    by_id = {o.id: o for o in problem.ops}
    if shrink:
        # Spend at most as long again as the check took so far, and never past the deadline.
        spent = time.monotonic() - t0
        shrink_deadline = min(deadline, time.monotonic() + max(1.0, spent))
        blocked, _ = search.frontier()
        hint = by_id[culprit_id] if culprit_id is not None else blocked
        found = _shortest_failing_cut(problem, hint, shrink_deadline)
        if found is not None:
            search, cut_end, minimized = found
            cut_problem = search.problem
    cut_ids = {o.id for o in cut_problem.ops}
    longest = [by_id[i] for i in search.longest]
    blocked, frontier = search.frontier()
    culprit = by_id[search.culprit] if search.culprit is not None and search.culprit in cut_ids else None
    state = cut_problem.init
    trans = {op.id: t for op, t in cut_problem.main + cut_problem.info}
    for o in longest:
        _, state = apply_transition(trans[o.id], state)
    reason = None
    if problem.impossible is not None:
        culprit = problem.impossible
        t = trans.get(culprit.id) or next(t for op, t in problem.main if op.id == culprit.id)
        expected = t.arg if t.kind != CAS else t.arg[0]
        reason = f"{model.describe_op(culprit)}: no operation ever writes {_show(expected)}"
    elif culprit is not None:
        reason = f"{model.describe_op(culprit)}: no linearization can produce what it read"
    return Violation(
        key=problem.key,
        ops=problem.ops,
        cut=cut_problem.ops,
        cut_end=cut_end,
        minimized=minimized,
        longest=longest,
        blocked=blocked,
        frontier=frontier,
        state=model.describe_state(state),
        culprit=culprit,
        reason=reason,
    )


def _refute(problem: Problem, deadline: float) -> Search | bool | None:
    """The finished search if ``problem`` is refuted, False if it is linearizable, None if the
    deadline passed first."""
    s = Search(problem)
    while True:
        r = s.run(DEFAULT_SLICE_STEPS * 10)
        if r is not None:
            return s if r is False else False
        if time.monotonic() > deadline:
            return None


def _shortest_failing_cut(
    problem: Problem, hint: Operation | None, deadline: float
) -> tuple[Search, float, bool] | None:
    """The shortest non-linearizable cut, over completion positions: (its refuted search, where
    it ends, whether it is known to be the shortest). Cuts are monotone (every extension of a
    failing cut fails), so this is a binary search; but the refuting search usually points at
    the operation whose completion makes the difference (``hint``: the culprit read, or the
    blocked operation), so that cut and the one just before it are tried first: one refutation
    and one cheap success instead of log(n) refutations."""
    ends = sorted({op.end for op, _ in problem.main})
    if not ends:
        return None
    lo, hi = 0, len(ends) - 1  # invariant: the cut at ends[hi] fails; cuts before ends[lo] pass
    best: Search | None = None
    if hint is not None and hint.end in ends:
        h = ends.index(hint.end)
        r = _refute(cut(problem, ends[h]), deadline)
        if r is None:
            return None
        if isinstance(r, Search):
            hi, best = h, r
            if h == 0:
                return best, ends[0], True
            r = _refute(cut(problem, ends[h - 1]), deadline)
            if r is None:
                return best, ends[hi], False
            if r is False:
                return best, ends[hi], True
            hi, best = h - 1, r
        else:
            lo = h + 1
    if best is None:
        r = _refute(cut(problem, ends[hi]), deadline)
        if not isinstance(r, Search):
            return None  # timed out (the full cut cannot pass: info operations are optional)
        best = r
    while lo < hi:
        mid = (lo + hi) // 2
        r = _refute(cut(problem, ends[mid]), deadline)
        if r is None:
            return best, ends[hi], False
        if isinstance(r, Search):
            hi, best = mid, r
        else:
            lo = mid + 1
    return best, ends[hi], True
