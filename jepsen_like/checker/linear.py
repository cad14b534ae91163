"""The Wing–Gong–Lowe linearizability search for one partition, resumable in slices.

``Problem`` is one partition compiled against a model (``compile_problem``); ``Search(problem)``
runs the search: ``run(steps)`` advances it by at most ``steps`` loop iterations and returns
``True`` (linearizable), ``False`` (refuted) or ``None`` (not finished yet), so a scheduler can
interleave many partitions and stop at the first refutation (see ``checker.check``).

How the search works (Wing & Gong 1993, with Lowe's memoisation, "Testing for linearizability",
2017; Porcupine's ``checkSingle`` is the same algorithm in Go):

- Completed (``ok``) operations become a call entry and a return entry in a doubly linked list
  ordered by history position. The operations whose call precedes the first remaining return
  entry are the *minimal* ones: any of them may be linearized next. Linearizing one applies it to
  the model state and *lifts* both of its entries out of the list (O(1)); backtracking *unlifts*
  them (O(1)). The list lives in flat Python lists (``nxt``/``prv`` indexed by entry number) with
  a head and a tail sentinel, so no node objects and no ``None`` checks in the loop.
- Indeterminate (``info``) operations have no return entry: they may take effect at any time
  after their call, or never. They sit in a separate array sorted by call position and are tried
  only after every minimal ``ok`` operation at a node, and only if their call precedes the first
  remaining return. The search succeeds as soon as every ``ok`` operation is linearized: the
  ``info`` ones left over simply never happened.
- Memoisation: the set of linearized ``ok`` operations is a Python int used as a bitset (bit i
  for operation i). A node is (ok-set, info-set, state). Two nodes with the same ok-set and state
  where the first used a *subset* of the second's info operations: the second can do nothing the
  first could not (info operations are optional, so having more of them left only adds options),
  so it is pruned. The cache maps ``(ok_bits, state)`` to the info-sets seen (one int, or a list
  in the rare case of incomparable sets). With no info operations this is exactly Lowe's
  (linearized set, state) cache.
- Operations are compiled to ``models.Transition`` kinds (read / write / cas / append / generic)
  which the loop interprets inline: a Python call per step would cost more than everything else.

On refutation, ``longest`` holds the longest linearizable prefix found (operation ids in order),
and ``frontier()`` names the operations that could not be linearized after it. On success,
``witness`` is a full linearization (ok and used info operations, in order), which tests replay.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..history import FAIL, INFO, OK, Operation
from ..models import APPEND, CAS, FAILED, GENERIC, NOOP, READ, WRITE, Model, Transition

__all__ = ["Problem", "Search", "compile_problem"]


@dataclass(slots=True)
class Problem:
    """One partition ready to search: ``main`` are the ok operations and ``info`` the
    indeterminate ones (sorted by start), each with its compiled transition."""

    key: Any
    init: Any
    ops: list[Operation]  # every operation of the partition, for reports (including dropped)
    main: list[tuple[Operation, Transition]] = field(default_factory=list)
    info: list[tuple[Operation, Transition]] = field(default_factory=list)
    # Appends can fail (a string appended to an int): then they observe the state, and the
    # reductions that treat appends as blind extensions must not.
    append_observes: bool = False
    # An ok read (or cas) expecting a value no operation can produce: refuted without search.
    impossible: Operation | None = None

    @property
    def size(self) -> int:
        return len(self.main) + len(self.info)


def compile_problem(model: Model, key: Any, ops: Iterable[Operation]) -> Problem:
    """Compile a partition: failed operations did not happen, and operations whose transition is
    ``NOOP`` (e.g. indeterminate reads) can neither change nor contradict the state: both are
    dropped here, before the search pays for them."""
    ops = list(ops)
    problem = Problem(key, model.init(), ops)
    for op in ops:
        if op.type == FAIL:
            continue
        t = model.compile(op)
        if t.kind == NOOP:
            continue
        if op.type == OK:
            problem.main.append((op, t))
        elif op.type == INFO:
            problem.info.append((op, t))
    problem.info.sort(key=lambda ot: ot[0].start)
    problem.impossible = _impossible(problem)
    problem.append_observes = _mixed_appends(problem)
    if not problem.append_observes:
        _drop_invisible(problem)
    return problem


def _impossible(problem: Problem) -> Operation | None:
    """The first (by completion) ok read or cas expecting a value that is neither the initial
    state nor written by any operation, ok or info: no linearization can exist. Only for reads,
    writes and cas, where the values a state can take are exactly those."""
    everything = problem.main + problem.info
    if any(t.kind not in (READ, WRITE, CAS) for _, t in everything):
        return None
    try:
        producible = {problem.init}
        producible.update(t.arg for _, t in everything if t.kind == WRITE)
        producible.update(t.arg[1] for _, t in everything if t.kind == CAS)
        bad = [
            op
            for op, t in problem.main
            if (t.kind == READ and t.arg not in producible) or (t.kind == CAS and t.arg[0] not in producible)
        ]
    except TypeError:  # unhashable values
        return None
    return min(bad, key=lambda op: op.end) if bad else None


def _mixed_appends(problem: Problem) -> bool:
    """Could an append fail? Only if some state is not of the appended values' sequence type."""
    everything = problem.main + problem.info
    appended = {type(t.arg) for _, t in everything if t.kind == APPEND}
    if not appended:
        return False
    if len(appended) > 1:
        return True
    (seq_type,) = appended
    values = [problem.init] + [t.arg for _, t in everything if t.kind == WRITE]
    values += [t.arg[1] for _, t in everything if t.kind == CAS]
    return any(v is not None and type(v) is not seq_type for v in values)


def _drop_invisible(problem: Problem) -> None:
    """Remove mutations nobody can ever observe, when that provably changes nothing.

    A write whose value no read returns and no cas expects (with appends: no read or cas value
    even starts with it), or an append whose element appears in no read or cas value, is
    *invisible*: in any linearization the next operation must be a blind write (or there is none
    left), since anything observing the state would see it. Such an operation can be removed:
    - an info one is optional anyway;
    - an ok one, if another ok write lies strictly inside its window (in any linearization of
      the rest, put it right before that write: real time allows it, and that write hides it),
      or if nothing is invoked after it returns (put it last).
    Conversely dropping it from a linearization keeps that valid. So the verdict is unchanged,
    cuts included, while the search no longer tries every place such an operation could hide:
    unread writes are common under high concurrency and each doubled the explored sets.
    Histories with generic operations are left alone: we cannot tell what they observe."""
    everything = problem.main + problem.info
    if not everything or any(t.kind not in (READ, WRITE, CAS, APPEND) for _, t in everything):
        return
    has_append = any(t.kind == APPEND for _, t in everything)
    seen: list[Any] = [t.arg for _, t in everything if t.kind == READ]
    seen += [t.arg[0] for _, t in everything if t.kind == CAS]
    try:
        seen_set = set(seen)
    except TypeError:
        return
    # Sequences sorted per type: those starting with v form a contiguous run from bisect(v).
    by_type: dict[type, list[Any]] = {}
    for v in seen_set:
        if isinstance(v, str | tuple):
            by_type.setdefault(type(v), []).append(v)
    for vs in by_type.values():
        vs.sort()
    joined = "\x00".join(by_type.get(str, []))  # a separator inside a token only over-matches
    elements = {x for r in by_type.get(tuple, []) for x in r}

    def visible(t: Transition) -> bool:
        v = t.arg
        if t.kind == WRITE:
            if v in seen_set:
                return True
            if not has_append:
                return False
            if v is None:
                return True
            vs = by_type.get(type(v))
            if not vs or not isinstance(v, str | tuple):
                return False
            i = bisect_left(vs, v)
            return i < len(vs) and vs[i][: len(v)] == v
        if t.kind == APPEND:
            if isinstance(v, str):
                return v in joined
            return any(x in elements for x in v)
        return True

    writes = sorted((op.start, op.end) for op, t in problem.main if t.kind == WRITE)
    starts = [w[0] for w in writes]
    last_start = max(op.start for op, _ in everything)

    def hideable(op: Operation) -> bool:
        if op.end > last_start:
            return True
        i = bisect_right(starts, op.start)
        while i < len(writes) and writes[i][0] < op.end:
            if writes[i][1] < op.end:
                return True
            i += 1
        return False

    problem.info = [(op, t) for op, t in problem.info if t.kind == CAS or visible(t)]
    problem.main = [
        (op, t) for op, t in problem.main if t.kind not in (WRITE, APPEND) or visible(t) or not hideable(op)
    ]


def cut(problem: Problem, end: float) -> Problem:
    """The partition as it looked at history position ``end``: operations invoked after it are
    gone, ok operations still running at ``end`` become info. Used to shrink a violation: if a
    cut is not linearizable, neither is anything that extends it."""
    out = Problem(problem.key, problem.init, [o for o in problem.ops if o.start <= end])
    out.append_observes = problem.append_observes
    if problem.impossible is not None and problem.impossible.end <= end:
        out.impossible = problem.impossible
    for op, t in problem.main:
        if op.start > end:
            continue
        if op.end <= end:
            out.main.append((op, t))
        else:
            out.info.append((op, t))
    out.info.extend((op, t) for op, t in problem.info if op.start <= end)
    out.info.sort(key=lambda ot: ot[0].start)
    return out


# Loop phases at a node, in order: force a matching minimal read (_READS); try the ok, then the
# info candidates whose new state some pending minimal read returned (_GUIDED_*); branch over the
# remaining ok candidates (_BRANCH), then info candidates (_INFO); then backtrack. The order of
# the middle phases is only a heuristic (every candidate is still tried). Ok phases are below
# _GUIDED_INFO and info phases at or above it, which the loop relies on. A stack frame is (phase,
# j, entry, state, bits, ibits, bound, want, icands, cands, unobserved): everything needed to
# resume the node where it left off. j indexes cands (minimal ok entries) in the ok phases and
# icands (usable info operations) in the info phases; entry is the ok entry or info index tried.
_READS, _GUIDED_MAIN, _BRANCH, _GUIDED_INFO, _INFO, _BACKTRACK = 0, 1, 2, 3, 4, 5
# ``unobserved``: the state has been observed since the last info operation; not yet; not yet and
# the observation lookahead has not run for this info operation.
_SEEN, _UNSEEN, _UNSEEN_NEW = 0, 1, 2


class Search:
    """A resumable WGL search over one ``Problem``. Not thread-safe; cheap to create."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        main = problem.main
        m = len(main)
        # Entries: 0 is the head sentinel, 1..2m are calls and returns in history order, 2m+1 is
        # the tail sentinel (it behaves like a return at position +inf).
        events = sorted(
            [(op.start, i, True) for i, (op, _) in enumerate(main)]
            + [(op.end, i, False) for i, (op, _) in enumerate(main)]
        )
        n = 2 * m + 2
        tail = n - 1
        self.tail = tail
        self.nxt = list(range(1, n)) + [tail]
        self.prv = [0] + list(range(0, n - 1))
        self.is_call = [False] * n
        self.pos: list[float] = [-math.inf] * n
        self.pos[tail] = math.inf
        self.match = [0] * n
        self.opnum = [-1] * n  # entry -> index into main
        kinds = [0] * n
        args: list[Any] = [None] * n
        masks = [0] * n
        call_entry = [0] * m
        ret_kind = [NOOP] * n  # return entry -> its operation's kind (for the append lookahead)
        ret_arg: list[Any] = [None] * n
        for e, (p, i, is_call) in enumerate(events, start=1):
            self.pos[e] = p
            if is_call:
                self.is_call[e] = True
                self.opnum[e] = i
                call_entry[i] = e
                t = main[i][1]
                kinds[e] = t.kind
                args[e] = t.arg
                masks[e] = 1 << i
            else:
                self.match[call_entry[i]] = e
                self.opnum[e] = i
                ret_kind[e] = main[i][1].kind
                ret_arg[e] = main[i][1].arg
        self.ret_kind, self.ret_arg = ret_kind, ret_arg
        # call entry -> position of its return (candidates are tried earliest-return first)
        self.retpos = [self.pos[self.match[e]] if self.is_call[e] else math.inf for e in range(n)]
        # Info operations get entry numbers after the tail so the loop can share the per-entry
        # kind/arg/mask arrays; their masks index a separate bitset.
        self.info_entry: list[int] = []
        self.info_pos: list[float] = []
        for j, (op, t) in enumerate(problem.info):
            kinds.append(t.kind)
            args.append(t.arg)
            masks.append(1 << j)
            self.info_entry.append(len(kinds) - 1)
            self.info_pos.append(op.start)
        self.kinds, self.args, self.masks = kinds, args, masks
        # Identical info operations (same transition) are interchangeable once both are invoked:
        # neither ever returns, so using one or the other leaves the same options. twins[j] is
        # the mask of earlier identical ones; j is tried only when all of those are used.
        self.twins = [0] * len(problem.info)
        first_seen: dict[tuple[int, Any], int] = {}
        for j, (_, t) in enumerate(problem.info):
            try:
                sig = (t.kind, t.arg)
                hash(sig)
            except TypeError:
                continue
            self.twins[j] = first_seen.get(sig, 0)
            first_seen[sig] = self.twins[j] | (1 << j)
        all_kinds = {t.kind for _, t in problem.main} | {t.kind for _, t in problem.info}
        # An info write is worth trying only if the next operation can observe it. With only
        # reads and cas observing the state, that means a read of, or a cas from, its value.
        self.filter_info_writes = not (all_kinds & {APPEND, GENERIC})
        # Append lookahead (see _append_dead) applies when states only grow between resets.
        self.has_append = APPEND in all_kinds
        self.info_resets = [j for j, (_, t) in enumerate(problem.info) if t.kind not in (APPEND, READ)]

        # Resumable loop state.
        self.state: Any = problem.init
        self.bits = 0
        self.ibits = 0
        self.e = self.nxt[0]
        self.phase = _READS
        self.j = 0
        self.bound = math.inf
        self.icands: list[int] | None = None
        self.want: set[Any] | None = None
        self.cands: list[int] | None = None
        # Whether an info operation was linearized and nothing has observed the state since
        self.unobserved = _SEEN
        self.stack: list[tuple[Any, ...]] = []
        self.cache: dict[tuple[int, Any], Any] = {}
        self.steps = 0
        self.done: bool | None = True if m == 0 else None
        self.longest: list[int] = []  # operation ids of the longest linearizable prefix
        self._longest_frames: list[tuple[Any, ...]] = []
        # The read the append lookahead proved unsatisfiable at the deepest node it cut off.
        self.culprit: int | None = None
        self.culprit_depth = -1
        if problem.impossible is not None:
            self.done = False
            self.culprit = problem.impossible.id
        self.witness: list[int] | None = [] if m == 0 else None
        # Bytes per cache entry, for the memory budget: the key tuple, the ok-bitset int, the
        # dict slot (with load-factor slack) and a share of the state objects.
        self.entry_bytes = 56 + sys.getsizeof(1 << max(m, 1)) + 120

    # ------------------------------------------------------------------ results

    @property
    def cache_entries(self) -> int:
        return len(self.cache)

    def memory_bytes(self) -> int:
        return len(self.cache) * self.entry_bytes + len(self.stack) * 120

    def release(self) -> None:
        """Drop the cache (after a verdict, or when the memory budget is exceeded)."""
        self.cache = {}

    def _frame_op(self, frame: tuple[Any, ...]) -> Operation:
        if frame[0] >= _GUIDED_INFO:
            return self.problem.info[frame[2]][0]
        return self.problem.main[self.opnum[frame[2]]][0]

    def frontier(self) -> tuple[Operation | None, list[Operation]]:
        """After a refutation: the first ok operation (by return) not in the longest prefix (the
        one whose return could not be reached) and the ok operations that were candidates there."""
        done = set(self.longest)
        rest = [op for op, _ in self.problem.main if op.id not in done]
        if not rest:
            return None, []
        blocked = min(rest, key=lambda o: o.end)
        return blocked, [o for o in rest if o.start < blocked.end]

    # ------------------------------------------------------------------ the loop

    def run(self, steps: int) -> bool | None:
        if self.done is not None:
            return self.done
        nxt, prv, match, is_call, pos = self.nxt, self.prv, self.match, self.is_call, self.pos
        kinds, args, masks, twins = self.kinds, self.args, self.masks, self.twins
        by_return = self.retpos.__getitem__
        info_entry, info_pos = self.info_entry, self.info_pos
        n_info = len(info_entry)
        filter_info_writes, has_append = self.filter_info_writes, self.has_append
        append_observes = self.problem.append_observes
        tail = self.tail
        cache = self.cache
        setdefault = cache.setdefault
        size = len(cache)
        stack = self.stack
        push, pop = stack.append, stack.pop
        state, bits, ibits = self.state, self.bits, self.ibits
        e, phase, j, bound = self.e, self.phase, self.j, self.bound
        want, icands, cands, unobserved = self.want, self.icands, self.cands, self.unobserved
        budget = steps
        result: bool | None = None
        while budget:
            budget -= 1
            # ---------------------------------------------------------------- pick candidate c
            if phase == _READS:
                # A minimal ok read that matches the state is linearized now, without branching:
                # moving a read-only operation earlier never breaks a linearization (its real-time
                # predecessors are all placed, and it changes no state later ops see). Reads that
                # do not match are collected in ``want`` to guide the choice below; the other
                # minimal operations in ``cands``.
                if not is_call[e]:
                    bound = pos[e]
                    if unobserved and (unobserved == _UNSEEN_NEW or has_append):
                        # Without appends the state cannot change before it is observed, so
                        # once, right after the info operation, is enough.
                        if self._unobserved_dead(state, ibits, has_append):
                            phase = _BACKTRACK
                            continue
                        unobserved = _UNSEEN
                    if has_append and not (stack and stack[-1][0] == _READS):
                        # (Not after a forced read: the state is unchanged; the check only
                        # prunes, so skipping it is safe, and it is the costliest step.)
                        dead = self._append_dead(state, ibits)
                        if dead:
                            if len(stack) > self.culprit_depth:
                                # Remember the read that could not be satisfied at the deepest
                                # point: it names the culprit better than the blocked return.
                                self.culprit_depth = len(stack)
                                self.culprit = self.problem.main[self.opnum[dead]][0].id
                            phase = _BACKTRACK
                            continue
                    if cands is None:
                        cands = []
                    elif len(cands) > 1:
                        # Earliest return first: an operation with a long window is placed only
                        # once it is needed, instead of early where a later write may hide it
                        # and the mistake surface far away. (Order is a heuristic only.)
                        cands.sort(key=by_return)
                    phase = _GUIDED_MAIN if want else _BRANCH
                    j = 0
                    continue
                k = kinds[e]
                if k != READ:
                    if cands is None:
                        cands = [e]
                    else:
                        cands.append(e)
                    e = nxt[e]
                    continue
                if state != args[e]:
                    if want is None:
                        want = set()
                    want.add(args[e])
                    e = nxt[e]
                    continue
                c = e
            elif phase == _BRANCH or phase == _GUIDED_MAIN:
                if j >= len(cands):  # type: ignore[arg-type]
                    j = 0
                    phase = _GUIDED_INFO if phase == _GUIDED_MAIN else _INFO
                    if icands is None:
                        icands = self._info_cands(bound, ibits, unobserved) if n_info else []
                    continue
                c = e = cands[j]  # type: ignore[index]
                k = kinds[c]
                if k == WRITE and unobserved:
                    # A blind write would erase an info operation's effect that nothing has
                    # observed: that order is covered by the branch where it never happened.
                    j += 1
                    continue
            elif phase == _INFO or phase == _GUIDED_INFO:
                if j >= len(icands):  # type: ignore[arg-type]
                    j = 0
                    phase = _BRANCH if phase == _GUIDED_INFO else _BACKTRACK
                    continue
                e = icands[j]  # type: ignore[index]
                c = info_entry[e]
                k = kinds[c]
            else:  # _BACKTRACK: every candidate at this node failed
                if not stack:
                    result = False
                    break
                if len(stack) > len(self._longest_frames):
                    self._longest_frames = stack[:]  # ids are worked out once, at the end
                phase, j, e, state, bits, ibits, bound, want, icands, cands, unobserved = pop()
                if phase < _GUIDED_INFO:
                    r = match[e]
                    nxt[prv[r]] = r
                    prv[nxt[r]] = r
                    nxt[prv[e]] = e
                    prv[nxt[e]] = e
                    if phase == _READS:
                        phase = _BACKTRACK  # a forced read: its node has no other child
                        continue
                j += 1
                continue
            # ---------------------------------------------------------------- apply c
            if k == WRITE:
                new = args[c]
                ok = True
            elif k == READ:
                new = state
                ok = True  # only matching reads get here
            elif k == CAS:
                a = args[c]
                ok = state == a[0]
                new = a[1]
            elif k == APPEND:
                a = args[c]
                if state is None:
                    new = a
                    ok = True
                else:
                    try:
                        new = state + a
                        ok = True
                    except TypeError:
                        new = None
                        ok = False
            else:
                new = args[c](state)
                ok = new is not FAILED
            if ok and ((phase != _GUIDED_MAIN and phase != _GUIDED_INFO) or new in want):  # type: ignore[operator]
                # ------------------------------------------------------------ memoise, descend
                is_info = phase >= _GUIDED_INFO
                if is_info:
                    nb = bits
                    nib = ibits | masks[c]
                else:
                    nb = bits | masks[c]
                    nib = ibits
                key = (nb, new)
                seen = setdefault(key, nib)
                if len(cache) > size:
                    size += 1
                    fresh = True
                else:
                    fresh = self._admit(key, seen, nib)
                    size = len(cache)
                if fresh:
                    push((phase, j, e, state, bits, ibits, bound, want, icands, cands, unobserved))
                    if is_info:
                        ibits = nib
                        unobserved = _UNSEEN_NEW
                    else:
                        if k != APPEND or append_observes:  # reads, cas, generic ops observe
                            unobserved = _SEEN
                        r = match[e]
                        p = prv[e]
                        q = nxt[e]
                        nxt[p] = q
                        prv[q] = p
                        p = prv[r]
                        q = nxt[r]
                        nxt[p] = q
                        prv[q] = p
                        bits = nb
                    state = new
                    e = nxt[0]
                    phase = _READS
                    want = icands = cands = None
                    if e == tail:
                        result = True
                        break
                    continue
                if phase == _READS:
                    # The only child of this node is known to fail, so the node fails.
                    phase = _BACKTRACK
                    continue
            # ---------------------------------------------------------------- next candidate
            if phase == _READS:
                e = nxt[e]
            else:
                j += 1
        self.steps += steps - budget
        self.state, self.bits, self.ibits = state, bits, ibits
        self.e, self.phase, self.j, self.bound = e, phase, j, bound
        self.want, self.icands, self.cands, self.unobserved = want, icands, cands, unobserved
        if result is not None:
            self.done = result
            if result:
                self.witness = [self._frame_op(f).id for f in stack]
                self.longest = list(self.witness)
            else:
                if len(stack) > len(self._longest_frames):
                    self._longest_frames = stack[:]
                self.longest = [self._frame_op(f).id for f in self._longest_frames]
            self._longest_frames = []
        return result

    def _info_cands(self, bound: float, ibits: int, unobserved: bool) -> list[int]:
        """The info operations worth trying at a node: invoked before ``bound`` (the first
        remaining return), unused, not an interchangeable twin of an unused earlier one, and
        for blind writes, only if the state is observed and some minimal read or cas can see it."""
        n = bisect_right(self.info_pos, bound)
        if not n:
            return []
        masks, kinds, args, entry, twins = self.masks, self.kinds, self.args, self.info_entry, self.twins
        needed = self._needed(bound, ibits) if self.filter_info_writes and not unobserved else None
        out = []
        for j in range(n):
            c = entry[j]
            if ibits & masks[c]:
                continue
            t = twins[j]
            if t and t & ~ibits:
                continue
            if kinds[c] == WRITE and (unobserved or (needed is not None and args[c] not in needed)):
                continue
            out.append(j)
        return out

    def _needed(self, bound: float, ibits: int) -> set[Any] | None:
        """Values an info write must produce to be observed next: what the minimal ok reads
        expect and what the minimal cas operations (ok, or unused info) compare against."""
        kinds, args, nxt, is_call = self.kinds, self.args, self.nxt, self.is_call
        out: set[Any] = set()
        try:
            e = nxt[0]
            while is_call[e]:
                k = kinds[e]
                if k == READ:
                    out.add(args[e])
                elif k == CAS:
                    out.add(args[e][0])
                e = nxt[e]
            for j, c in enumerate(self.info_entry):
                if self.info_pos[j] > bound:
                    break
                if kinds[c] == CAS and not ibits & self.masks[c]:
                    out.add(args[c][0])
        except TypeError:  # unhashable values: do not filter
            return None
        return out

    def _unobserved_dead(self, state: Any, ibits: int, has_append: bool) -> bool:
        """Lookahead after an info operation: its effect must be observed (by a read, a cas or a
        generic operation checking the state) before any blind write, and before the end, or
        the branch without it covers this one. Until then the state changes only by appends, so
        some read or cas invoked before the first remaining write returns must expect the state
        (or, with appends, an extension of it). If none can, this node is dead."""
        if self.problem.append_observes:
            return False  # any append might be the observer; no lookahead
        nxt, is_call, kinds, args, ret_kind = self.nxt, self.is_call, self.kinds, self.args, self.ret_kind
        seq = has_append and isinstance(state, str | tuple)
        e = nxt[0]
        tail = self.tail
        bound = math.inf
        while e != tail:
            if is_call[e]:
                k = kinds[e]
                if k == READ or k == CAS:
                    v = args[e] if k == READ else args[e][0]
                    if v == state or state is None and has_append:
                        return False
                    if seq and type(v) is type(state) and v[: len(state)] == state:
                        return False
                elif k == GENERIC:
                    return False
            elif ret_kind[e] == WRITE:
                bound = self.pos[e]
                break
            e = nxt[e]
        masks, info_entry, info_pos = self.masks, self.info_entry, self.info_pos
        for j in self.info_resets:
            if info_pos[j] > bound:
                break
            c = info_entry[j]
            k = kinds[c]
            if not ibits & masks[c] and k != WRITE:
                if k != CAS:
                    return False
                v = args[c][0]
                if v == state or (seq and type(v) is type(state) and v[: len(state)] == state):
                    return False
        return True

    def _append_dead(self, state: Any, ibits: int) -> int:
        """Lookahead for append histories: is this node dead? Returns 0 if not, else an entry
        of the read that can no longer be satisfied.

        Each remaining ok read R (that returned v) must be linearized before anything invoked
        after R returned. Reads and appends only extend the state, so v must extend either the
        current state or the value left by some reset (an ok write or cas, or an unused info one)
        invoked before R returned. Checked for every minimal read (none matches the state here,
        or it would have been forced) and for the first read to return. To keep this one pass,
        all resets invoked before the latest of those returns count for every read: a superset
        of each read's own resets, so the check stays sound. Generic operations could do
        anything, so they switch it off."""
        nxt, is_call, kinds, args, pos = self.nxt, self.is_call, self.kinds, self.args, self.pos
        retpos, ret_kind = self.retpos, self.ret_kind
        bases = [state]
        reads: list[tuple[Any, int]] = []
        horizon = -math.inf
        e = nxt[0]
        tail = self.tail
        first_read = False
        minimal = True  # still before the first return entry
        while e != tail:
            if is_call[e]:
                k = kinds[e]
                if k == WRITE:
                    bases.append(args[e])
                elif k == CAS:
                    bases.append(args[e][1])
                elif k == GENERIC:
                    return 0
                elif k == READ and minimal:
                    reads.append((args[e], e))
                    if retpos[e] > horizon:
                        horizon = retpos[e]
            else:
                minimal = False
                if not first_read and ret_kind[e] == READ:
                    first_read = True
                    reads.append((self.ret_arg[e], e))
                    if pos[e] > horizon:
                        horizon = pos[e]
                if first_read and pos[e] >= horizon:
                    break
            e = nxt[e]
        if not reads:
            return 0
        masks, info_entry, info_pos = self.masks, self.info_entry, self.info_pos
        for j in self.info_resets:
            if info_pos[j] > horizon:
                break
            c = info_entry[j]
            if not ibits & masks[c]:
                k = kinds[c]
                if k == WRITE:
                    bases.append(args[c])
                elif k == CAS:
                    bases.append(args[c][1])
                else:
                    return 0
        for b in bases:
            if b is None or not isinstance(b, str | tuple):
                return 0  # the empty value extends to anything; non-sequences: no reasoning
        for v, r in reads:
            if v is None:
                return r  # nothing can empty a non-empty state
            if isinstance(v, str):
                for b in bases:
                    if b.__class__ is str and v.startswith(b):
                        break
                else:
                    return r
            elif not any(type(v) is type(b) and v[: len(b)] == b for b in bases):
                return r
        return 0

    def _admit(self, key: tuple[int, Any], seen: Any, nib: int) -> bool:
        """``key`` was cached with info-set(s) ``seen``: is a node using info-set ``nib`` new?
        It is not if some recorded set is a subset of ``nib`` (dominance, see module docs)."""
        cache = self.cache
        if seen.__class__ is int:
            if seen & nib == seen:
                return False
            cache[key] = nib if nib & seen == nib else [seen, nib]
            return True
        for s in seen:
            if s & nib == s:
                return False
        kept = [s for s in seen if s & nib != nib]  # drop recorded supersets of nib
        kept.append(nib)
        cache[key] = kept
        return True
