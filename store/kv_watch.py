"""Watch: the KV machine's changes, from a revision, on a key, a prefix or a range.

One ``WatchHub`` per replica (``store.kv_http`` makes it) serves watchers from this
replica's *applied* log: it is the machine's change-feed listener
(``KVStateMachine.listener``, docs/kv.md), so every applied mutation reaches it once,
right after the machine moved to its revision, on the event loop. A replica executes a
command only once it is chosen, so nothing a watcher sees is ever taken back. The hub
keeps no replicated state and never changes the machine.

A watcher (``hub.watch(...)``) has a span (one key, ``[key, range_end)`` with etcd's
``"\\0"`` for "no end", or a prefix), a ``start_revision`` (0: from the next revision),
``prev_kv`` and the filters ``NOPUT`` / ``NODELETE``. Its consumer calls ``await
watcher.next()`` for the next batches: a list of ``Batch(revision, events)``, one per
revision, in revision order; every event of one revision (a txn, a prefix delete, a
lease expiry) is in one batch, in key order. An event is ``Event(kind, key, kv,
prev_kv)`` with the machine's kv dicts (``store.kv_machine``: ``{key, value,
create_revision, mod_revision, version, lease}``; a DELETE's kv is ``{key,
mod_revision}`` with zeros and no value).

Synced and unsynced (etcd's two watcher groups):

- A watcher whose next revision is past the store's is **synced**: live events are
  matched and queued as they are applied.
- Otherwise it is **unsynced** and reads its revisions from the machine's MVCC
  history, ``CATCHUP_REVISIONS`` at a time, when its consumer asks; live events do
  not touch it (they are in the history too). Once it reaches the store's revision it
  is synced. All of this runs on the event loop between two applies, so a watcher
  goes from history to live events with no gap and no duplicate.

A watcher starts unsynced when ``start_revision`` is at or below the store's revision
(history first). It falls back to unsynced when its queue exceeds ``QUEUE_EVENTS_MAX``
events or ``QUEUE_BYTES_MAX`` bytes (a slow consumer): the queue is dropped and
re-read from the history later, so memory stays bounded and the node never waits for
a watcher. A consumer that reads nothing at all is the transport's business
(``store.kv_http`` cancels a stream whose writes stall).

Canceled watchers (``next()`` raises ``WatchCanceled`` with ``reason`` and, for
compaction, ``compact_revision``):

- ``start_revision`` at or below the compaction point ``C``, or an unsynced watcher
  whose next revision the compaction overtook: ``compacted``. The earliest revision a
  watch can start from is ``C + 1``: compaction keeps the state *at* ``C`` (a range at
  ``C`` works) but not every change made *at* ``C`` (a key deleted at ``C`` leaves no
  record), so a watch from ``C`` could miss events. List at ``C`` or later, then watch
  from the list's revision + 1.
- A snapshot restore (catch-up by snapshot) that moves the store's revision: every
  watcher behind the new revision goes unsynced and replays the gap from the restored
  history; one whose next revision is compacted in the snapshot is canceled
  (``compacted``, the reason names the restore). A restore that moves the revision
  *back* cancels every watcher (it never happens on a healthy replica).
- ``hub.cancel(watcher)``, ``hub.close(reason)`` (the replica stops), and a hub whose
  listener was detached (it raised; a bug) cancel with their reason.

Limits: ``WATCHERS_MAX`` watchers per hub (``hub.watch`` raises ``TooManyWatchers``).

Progress: ``next(timeout)`` returns ``[]`` after ``timeout`` seconds with nothing to
deliver; ``watcher.progress_revision()`` is then the revision up to which the watcher
has seen everything (None while unsynced), what a progress notification carries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from bisect import bisect_left
from collections import deque
from operator import itemgetter
from typing import Any, NamedTuple

from store.kv_machine import _bound, _canon, _end_bound, _kbytes, _ord, _prefix_end

_log = logging.getLogger(__name__)

WATCHERS_MAX = 1024
"""Watchers one replica serves at once."""
QUEUE_EVENTS_MAX = 10_000
"""Events a synced watcher may hold undelivered before it falls back to the history."""
QUEUE_BYTES_MAX = 16 << 20
"""Key and value bytes (about) a synced watcher may hold undelivered, likewise."""
CATCHUP_REVISIONS = 1024
"""Revisions an unsynced watcher reads from the history per ``next()``."""

NOPUT, NODELETE = "NOPUT", "NODELETE"
_mod = itemgetter(0)


class Event(NamedTuple):
    kind: str  # "PUT" | "DELETE"
    key: Any
    kv: dict
    prev_kv: dict | None


class Batch(NamedTuple):
    revision: int
    events: list


class WatchCanceled(Exception):
    """The watcher is canceled: ``reason`` (one line), ``compact_revision`` (0 unless
    the cause is compaction)."""

    def __init__(self, reason: str, compact_revision: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.compact_revision = compact_revision


class TooManyWatchers(Exception):
    pass


def _kv(key: Any, rec: tuple) -> dict:
    if rec[1]:
        return {"key": key, "create_revision": rec[1], "mod_revision": rec[0], "version": rec[2],
                "lease": rec[4], "value": rec[3]}
    return {"key": key, "create_revision": 0, "mod_revision": rec[0], "version": 0, "lease": 0}


def _size(key: Any, rec: tuple, prev: tuple | None) -> int:
    n = 64 + _len(key) + _len(rec[3])
    if prev is not None:
        n += 64 + _len(prev[3])
    return n


def _len(v: Any) -> int:
    return len(v) if type(v) in (str, bytes) else 8


class Watcher:
    """One watcher (module docstring). Made by ``WatchHub.watch``."""

    def __init__(self, hub: WatchHub, wid: int, key: Any, range_end: Any, prefix: bool, next_rev: int,
                 prev_kv: bool, filters: frozenset) -> None:
        self.hub = hub
        self.id = wid
        self.key = key
        self.single = not prefix and range_end is None
        if prefix:
            pe = _prefix_end(_kbytes(key))
            self.lo, self.hi = _bound(key), (None if pe is None else (1, pe))
        elif range_end is not None:
            self.lo, self.hi = _bound(key), _end_bound(range_end)
        else:
            self.lo = self.hi = None
        self.prev_kv = prev_kv
        self.noput = NOPUT in filters
        self.nodelete = NODELETE in filters
        self.min_rev = next_rev  # events before it are not wanted (a future start revision)
        self.next_rev = next_rev  # while unsynced: the first revision not yet queued or delivered
        self.synced = False
        self.queue: deque = deque()  # Batch, oldest first
        self.queued_events = 0
        self.queued_bytes = 0
        self.canceled: WatchCanceled | None = None
        self.fallbacks = 0  # times the queue overflowed (back to the history)
        self._wake = asyncio.Event()

    # --- matching ---------------------------------------------------------------------

    def _keys(self, machine: Any) -> list:
        """The keys of the machine's history in this watcher's span, in key order."""
        if self.single:
            return [self.key] if self.key in machine.hist else []
        index = machine._sorted_index()
        i = bisect_left(index, self.lo)
        j = len(index) if self.hi is None else bisect_left(index, self.hi)
        return [e[2] for e in index[i:j]]

    def _make(self, found: list) -> list:
        """Events from ``(key, record, prev)``, in key order."""
        if len(found) > 1:
            found.sort(key=lambda e: _ord(e[0]))
        return [Event("PUT" if rec[1] else "DELETE", key, _kv(key, rec),
                      (_kv(key, prev) if prev is not None and prev[1] else None) if self.prev_kv else None)
                for key, rec, prev in found]

    # --- the hub's side ---------------------------------------------------------------

    def _live(self, rev: int, found: list) -> None:
        """Queue the ``(key, record, prev)`` of revision ``rev`` in this watcher's span
        (synced watchers only; the hub matched them)."""
        if rev < self.min_rev:  # a future start revision
            return
        if self.noput or self.nodelete:
            found = [e for e in found if not (self.noput if e[1][1] else self.nodelete)]
            if not found:
                return
        self.queue.append(Batch(rev, self._make(found)))
        self.queued_events += len(found)
        self.queued_bytes += sum(_size(k, r, p if self.prev_kv else None) for k, r, p in found)
        if self.queued_events > self.hub.queue_events_max or self.queued_bytes > self.hub.queue_bytes_max:
            # a slow consumer: drop the queue, read it again from the history later
            self.next_rev = self.queue[0].revision
            self._clear()
            self.synced = False
            self.fallbacks += 1
        self._wake.set()

    def _clear(self) -> None:
        self.queue.clear()
        self.queued_events = self.queued_bytes = 0

    def _cancel(self, reason: str, compact_revision: int = 0) -> None:
        if self.canceled is None:
            self.canceled = WatchCanceled(reason, compact_revision)
            self._clear()
            self.synced = False
        self._wake.set()

    def _catch_up(self, machine: Any) -> list:
        """Read up to ``CATCHUP_REVISIONS`` revisions from the history (unsynced)."""
        now = machine.rev
        start = self.next_rev
        if start <= machine.compact_rev:
            self.hub._drop(self)
            self.hub.stats["compacted"] += 1
            self._cancel(f"required revision {start} has been compacted (compacted at {machine.compact_rev}; "
                         f"watch from {machine.compact_rev + 1} or later)", machine.compact_rev)
            return []
        end = min(now, start + self.hub.catchup_revisions - 1)
        by_rev: dict[int, list] = {}
        if end >= start:
            hist = machine.hist
            for key in self._keys(machine):
                recs = hist[key]
                i = bisect_left(recs, start, key=_mod)
                while i < len(recs):
                    rec = recs[i]
                    r = rec[0]
                    if r > end:
                        break
                    kind_put = bool(rec[1])
                    if not ((kind_put and self.noput) or (not kind_put and self.nodelete)):
                        by_rev.setdefault(r, []).append((key, rec, recs[i - 1] if i > 0 else None))
                    i += 1
        self.next_rev = max(start, end + 1)
        if self.next_rev > now:
            self.synced = True
        return [Batch(r, self._make(by_rev[r])) for r in sorted(by_rev)]

    # --- the consumer's side ----------------------------------------------------------

    async def next(self, timeout: float | None = None) -> list:
        """The next batches, in revision order (waits for them); ``[]`` after
        ``timeout`` s with nothing new. Raises ``WatchCanceled`` once canceled."""
        while True:
            if self.canceled is not None:
                raise self.canceled
            if self.queue:
                out = list(self.queue)
                self._clear()
                return out
            if not self.synced:
                out = self._catch_up(self.hub.machine)
                if out:
                    return out
                if not self.synced:
                    await asyncio.sleep(0)  # a window without matching events: let the loop run, read on
                    continue
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                if self.canceled is not None:
                    raise self.canceled from None
                return []

    def progress_revision(self) -> int | None:
        """The revision up to which this watcher has been given every event (None
        while it is behind: unsynced or holding undelivered batches)."""
        if self.canceled is not None or not self.synced or self.queue:
            return None
        return self.hub.machine.rev

    def cancel(self, reason: str = "canceled by the client") -> None:
        self.hub.cancel(self, reason)


class WatchHub:
    """Every watcher of one replica; the KV machine's change-feed listener."""

    def __init__(self, machine: Any, *, watchers_max: int = WATCHERS_MAX, queue_events_max: int = QUEUE_EVENTS_MAX,
                 queue_bytes_max: int = QUEUE_BYTES_MAX, catchup_revisions: int = CATCHUP_REVISIONS) -> None:
        if machine.listener is not None:
            raise RuntimeError("the KV machine already has a change-feed listener")
        self.machine = machine
        self.watchers_max = watchers_max
        self.queue_events_max = queue_events_max
        self.queue_bytes_max = queue_bytes_max
        self.catchup_revisions = catchup_revisions
        self.watchers: dict[int, Watcher] = {}
        self._by_key: dict[Any, dict[int, Watcher]] = {}  # single-key watchers
        self._spans: dict[int, Watcher] = {}  # prefix and range watchers
        self.rev = machine.rev  # the last revision the hub was told about
        self._ids = itertools.count(1)
        self.closed: str | None = None
        self.stats = {"created": 0, "canceled": 0, "compacted": 0, "fallbacks": 0, "refused": 0, "restores": 0}
        machine.listener = self

    # --- the machine's listener -------------------------------------------------------

    def kv_events(self, revision: int, events: list) -> None:
        self.rev = revision
        if not self.watchers:
            return
        try:
            hits: dict[int, list] = {}
            by_key, spans = self._by_key, self._spans
            for kind, key, rec, prev in events:
                if by_key:
                    for w in by_key.get(key, {}).values():
                        hits.setdefault(w.id, []).append((key, rec, prev))
                if spans:
                    o = _ord(key)
                    for w in spans.values():
                        if w.lo <= o and (w.hi is None or o < w.hi):
                            hits.setdefault(w.id, []).append((key, rec, prev))
            watchers = self.watchers
            for wid, found in hits.items():
                w = watchers[wid]
                if w.synced:
                    w._live(revision, found)
                    if not w.synced:
                        self.stats["fallbacks"] += 1
        except Exception:  # never into the machine; but never a silent gap either
            _log.exception("watch hub failed on revision %d", revision)
            self.close(f"internal error in the watch hub at revision {revision}")

    def kv_restored(self, revision: int, compact_revision: int) -> None:
        """A snapshot replaced the machine's state (catch-up by snapshot)."""
        try:
            self._restored(revision, compact_revision)
        except Exception:  # never into the machine; but never a silent gap either
            _log.exception("watch hub failed on a restore to revision %d", revision)
            self.close(f"internal error in the watch hub at a restore to revision {revision}")

    def _restored(self, revision: int, compact_revision: int) -> None:
        self.stats["restores"] += 1
        old, self.rev = self.rev, revision
        for w in list(self.watchers.values()):
            if w.synced:
                w.next_rev = max(old + 1, w.min_rev)
            if revision < old and w.next_rev > revision + 1:
                # the store went back: what this watcher was given is not in it
                self._drop(w)
                w._cancel(f"the replica's store went back to revision {revision} (a snapshot restore); "
                          f"watch again, from revision {w.next_rev} at the latest")
            elif w.next_rev <= revision:
                w.synced = False  # replay the gap from the restored history
                if w.next_rev <= compact_revision:
                    self._drop(w)
                    self.stats["compacted"] += 1
                    w._cancel(f"a snapshot restore moved this replica to revision {revision}; the revisions "
                              f"from {w.next_rev} are compacted in it (compacted at {compact_revision}; watch "
                              f"from {compact_revision + 1} or later)", compact_revision)
                else:
                    w._wake.set()

    # --- watchers ---------------------------------------------------------------------

    def watch(self, key: Any, range_end: Any = None, *, prefix: bool = False, start_revision: int = 0,
              prev_kv: bool = False, filters: tuple | frozenset = ()) -> Watcher:
        """A new watcher (``range_end`` and ``prefix`` as in a range). A start revision
        at or below the compaction point gives a watcher that is already canceled
        (``compacted``): its ``next()`` raises at once. Raises ``TooManyWatchers``."""
        if self.closed is not None:
            raise WatchCanceled(self.closed)
        if self.machine.listener is not self:
            self.close("the watch hub lost the machine's change feed")
            raise WatchCanceled(self.closed or "")
        if len(self.watchers) >= self.watchers_max:
            self.stats["refused"] += 1
            raise TooManyWatchers(f"this replica serves {len(self.watchers)} watchers, the limit "
                                  f"({self.watchers_max}); try again later or another replica")
        bad = set(filters) - {NOPUT, NODELETE}
        if bad:
            raise ValueError(f"unknown filter(s) {sorted(bad)}")
        m = self.machine
        key = _canon(key)
        if range_end is not None:
            range_end = _canon(range_end)
        w = Watcher(self, next(self._ids), key, range_end, prefix, start_revision or m.rev + 1, prev_kv,
                    frozenset(filters))
        self.stats["created"] += 1
        if start_revision and start_revision <= m.compact_rev:
            self.stats["compacted"] += 1
            w._cancel(f"required revision {start_revision} has been compacted (compacted at {m.compact_rev}; "
                      f"watch from {m.compact_rev + 1} or later)", m.compact_rev)
            return w
        w.synced = w.next_rev > m.rev
        self.watchers[w.id] = w
        if w.single:
            self._by_key.setdefault(w.key, {})[w.id] = w
        else:
            self._spans[w.id] = w
        return w

    def _drop(self, w: Watcher) -> None:
        if w.single:
            ws = self._by_key.get(w.key)
            if ws is not None:
                ws.pop(w.id, None)
                if not ws:
                    del self._by_key[w.key]
        else:
            self._spans.pop(w.id, None)
        if self.watchers.pop(w.id, None) is not None:
            self.stats["canceled"] += 1

    def cancel(self, w: Watcher, reason: str = "canceled by the client") -> None:
        self._drop(w)
        w._cancel(reason)

    def close(self, reason: str = "the replica is stopping") -> None:
        """Cancel every watcher; no new ones."""
        self.closed = reason
        for w in list(self.watchers.values()):
            self.cancel(w, reason)
        if self.machine.listener is self:
            self.machine.listener = None

    @property
    def revision(self) -> int:
        return self.machine.rev
