"""The scheduler served by one replica: genesis check, calls, lease expiry, HTTP API.

``cellar serve --machine scheduler --hived-config FILE [--http HOST:PORT]`` runs a
``Node`` whose machine is ``scheduler_state.replicated.ReplicatedScheduler`` and,
beside it in the same event loop, a ``SchedulerService``:

- **Genesis.** At start it proposes ``{"op": "init", "config": <FILE, parsed>}`` and
  waits (retrying while no majority answers) for the result: the hash of the config
  the cluster holds (the first ``init`` committed). A different hash stops the replica
  with one line and exit status 2 (``ConfigMismatch``). Until the check passed,
  ``/readyz`` answers 503 and so does every API call.
- **Calls** go through ``Node.submit`` like any client's: a pool of logical sessions
  (one command in flight each, increasing ``seq``) so the executor's de-duplication
  holds; writes are ``CALL``s, answered once *applied* here; reads are ``READ``s,
  linearizable (sequencer lease, else the log). Each call waits at most
  ``call_timeout_s``; a replica connected to fewer than a majority answers 503 at once
  (nothing is proposed), and a call that times out answers 503 with ``definite:
  false`` (a write may still commit: retry it under the same name, the second
  ``allocate`` answers "already allocated").
- **Time.** ``now_ms`` is stamped from this replica's wall clock into the commands that
  need it (an ``allocate`` with ``ttl_ms``, ``lease_expire``); ``apply`` never reads a
  clock and keeps the largest ``now_ms`` it has seen. Expiry: every
  ``lease_check_s`` the replica that is the sequencer (SDPaxos) or leader (Multi-Paxos)
  looks at its local state and, if some lease ended by its clock, proposes one
  ``lease_expire``. After a failover the new sequencer does the same with its own
  clock; skew between replicas moves expiry by that skew, never backwards in the log.
- **Observation.** The service is the machine's observer
  (``ReplicatedScheduler.observer``): every applied command feeds the Prometheus
  series (``store.metrics``) and the change feed: ``scheduler_state.events`` turns the
  command and its result into events, each stamped with ``position``, the command's
  1-based number among every command the replicated machine applied (the executor's
  count: the same on every replica, carried by snapshots). The last
  ``FEED_HISTORY_MAX`` events are kept so a subscriber can resume after a position;
  each subscriber has a bounded queue (``Feed``) and is told to resynchronize
  (``FeedGap``) rather than silently miss events when it falls behind or when a
  snapshot replaced the state wholesale.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import time
from typing import Any


from consensus.runtime import clientwire
from consensus.runtime.node import Node
import scheduler_state
from scheduler_state.events import events_of
from scheduler_state.replicated import BATCH, encode_checked

log = logging.getLogger("cellar.scheduler")

CALL_TIMEOUT_S = 5.0
INIT_RETRY_S = 1.0
LEASE_CHECK_S = 1.0
SESSIONS_MAX = 4096  # concurrent calls per replica; more wait for a session
FEED_HISTORY_MAX = 10_000  # events kept for subscribers resuming after a position
FEED_QUEUE_MAX = 10_000  # events a subscriber may fall behind before it gets FeedGap
BATCH_MAX = 64  # writes coalesced into one log entry (call)
BATCH_BYTES_MAX = 256 << 10  # and their encoded size, well under clientwire.MAX_COMMAND_BYTES


class ConfigMismatch(Exception):
    """This replica's --hived-config is not the one the cluster was initialized with."""


class Unavailable(Exception):
    """No answer now: no majority reachable, node stopping, or the call timed out."""

    def __init__(self, message: str, definite: bool) -> None:
        super().__init__(message)
        self.definite = definite


class BadCommand(ValueError):
    """A command no replica may carry: nested too deep or not encodable
    (``scheduler_state.replicated.encode_checked``). Nothing entered the log."""


class FeedGap(Exception):
    """The feed cannot give every event after the subscriber's position: it fell
    behind (queue full), resumed from a position older than the kept history, or a
    snapshot replaced the state. Re-read the state (inspect) and subscribe again."""


class Feed:
    """One subscriber's view of the change feed: ``async for event in feed``.

    Events arrive in applied order, each once. The queue holds at most ``queue_max``
    events; past that the iterator raises ``FeedGap`` (after the events it still
    holds) instead of dropping silently. ``close()`` ends the iteration.
    """

    def __init__(self, service: SchedulerService, queue_max: int) -> None:
        self._service = service
        self._queue: collections.deque = collections.deque()
        self._queue_max = queue_max
        self._wake = asyncio.Event()
        self._gap: str | None = None
        self._closed = False

    def _push(self, events: list[dict]) -> None:
        if self._gap is not None or self._closed:
            return
        if len(self._queue) + len(events) > self._queue_max:
            self._gap = f"subscriber fell more than {self._queue_max} events behind"
        else:
            self._queue.extend(events)
        self._wake.set()

    def _fail(self, why: str) -> None:
        if self._gap is None:
            self._gap = why
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._service._unsubscribe(self)
        self._wake.set()

    def __aiter__(self) -> Feed:
        return self

    async def __anext__(self) -> dict:
        while not self._queue:
            if self._gap is not None:
                self._service._unsubscribe(self)
                raise FeedGap(self._gap)
            if self._closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        return self._queue.popleft()


class SchedulerService:
    def __init__(self, node: Node, config: Any, config_path: str = "--hived-config", *,
                 call_timeout_s: float = CALL_TIMEOUT_S, lease_check_s: float = LEASE_CHECK_S,
                 coalesce: bool = True) -> None:
        from scheduler_state.replicated import config_hash, init_command

        self.node = node
        self.config = config
        self.config_path = config_path
        self.config_hash = config_hash(config)
        self._init_cmd = init_command(config)
        self.call_timeout_s = call_timeout_s
        self.lease_check_s = lease_check_s
        self.ready = False  # genesis check passed
        self.mismatch: str | None = None
        self._free: list[list] = []  # [client id, last seq] sessions not in use
        self._made = 0
        self._session_sem = asyncio.Semaphore(SESSIONS_MAX)
        self._nonce = f"{os.getpid():x}.{time.time_ns() & 0xFFFFFFFFFF:x}"
        self._tasks: list[asyncio.Task] = []
        self.stats = {"calls": 0, "timeouts": 0, "refused_no_quorum": 0, "lease_expire_proposed": 0,
                      "batches": 0, "batched_commands": 0}
        self.coalesce = coalesce  # writes of one loop turn share a log entry (call)
        self._queue: list[tuple[Any, int, asyncio.Future]] = []
        self._flush_scheduled = False
        self._senders: set[asyncio.Task] = set()
        from store.metrics import SchedulerMetrics

        self.metrics = SchedulerMetrics(self)
        self._history: collections.deque = collections.deque()
        # every event of a command at position >= _history_from is in _history (None: unknown)
        self._history_from: int | None = node.replica.executor.applied + 1
        self._feeds: list[Feed] = []
        machine = node.machine
        if hasattr(machine, "observer"):
            machine.timer = time.perf_counter_ns
            machine.observer = self._observe

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._genesis()), loop.create_task(self._lease_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in list(self._senders):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._senders, return_exceptions=True)
        machine = self.node.machine
        if getattr(machine, "observer", None) == self._observe:
            machine.observer = None
        for f in list(self._feeds):
            f.close()

    # --- observation: metrics and the change feed ------------------------------------

    def _observe(self, command: Any, result: Any, apply_ns: int) -> None:
        """``ReplicatedScheduler.observer``: runs inside apply, so it must never raise."""
        try:
            self.metrics.applied(command, result, apply_ns)
            if command is None:  # a snapshot replaced the state: the history breaks here
                self._history.clear()
                self._history_from = None
                for f in list(self._feeds):
                    f._fail("a snapshot replaced this replica's state")
                return
            position = self.node.replica.executor.applied + 1  # the executor counts after apply returns
            if self._history_from is None:
                self._history_from = position
            events = events_of(command, result)
            if not events:
                return
            for e in events:
                e["position"] = position
            history = self._history
            history.extend(events)
            while len(history) > FEED_HISTORY_MAX:  # bounded; remember where it now starts
                self._history_from = history.popleft()["position"] + 1
            for f in self._feeds:
                f._push(events)
        except Exception:  # pragma: no cover - a bug here must not stop the replica
            log.exception("scheduler observer failed")

    def subscribe(self, after: int | None = None, queue_max: int = FEED_QUEUE_MAX) -> Feed:
        """A ``Feed`` of the events committed from now on, or, with ``after``, of the
        events of every command after position ``after`` first (``FeedGap`` at the
        first iteration if the kept history no longer reaches back that far)."""
        feed = Feed(self, queue_max)
        if after is not None:
            start = self._history_from
            if start is None or after + 1 < start:
                feed._fail(f"events after position {after} are no longer kept here "
                           f"(history starts at {start}); re-read the state")
            else:
                feed._push([dict(e) for e in self._history if e["position"] > after])
        self._feeds.append(feed)
        return feed

    def history(self, after: int = 0, limit: int = FEED_HISTORY_MAX) -> dict[str, Any]:
        """The kept events of commands after position ``after`` (at most ``limit``):
        ``{"from": P, "events": [...], "applied": N}``; every event of a command at
        position >= P is kept (``from`` None: unknown, a snapshot replaced the state)."""
        events = [dict(e) for e in self._history if e["position"] > after][:limit]
        return {"from": self._history_from, "events": events, "applied": self.node.replica.executor.applied}

    def _unsubscribe(self, feed: Feed) -> None:
        if feed in self._feeds:
            self._feeds.remove(feed)

    async def _genesis(self) -> None:
        """Propose our init until it is answered; compare hashes (module docstring)."""
        client = f"init/{self.node.cfg.node_id}"
        node = self.node
        while not node._down:
            fut = node.submit(clientwire.CALL, client, 1, self._init_cmd)
            try:
                status, result = await asyncio.wait_for(fut, INIT_RETRY_S * 5)
            except (asyncio.TimeoutError, ConnectionError):
                node.forget(client, 1)
                await asyncio.sleep(INIT_RETRY_S)  # no majority yet: try again (bounded by stop)
                continue
            if status != clientwire.OK or not isinstance(result, dict) or not result.get("ok"):
                # busy, or the cluster refused our config as invalid: retry / report
                if isinstance(result, dict) and str(result.get("error", "")).startswith("config:"):
                    self._refuse(f"{self.config_path}: the cluster refused it: {result['error']}")
                    return
                await asyncio.sleep(INIT_RETRY_S)
                continue
            theirs = result.get("config_hash")
            if theirs != self.config_hash:
                self._refuse(f"{self.config_path} (config hash {self.config_hash[:12]}) differs from the config this "
                             f"cluster was initialized with (hash {str(theirs)[:12]}); start every replica with "
                             f"the same file, or change the config through reconfigure")
                return
            self.ready = True
            log.info("scheduler config %s %s", self.config_hash[:12],
                     "committed by this replica" if result.get("initialized") else "matches the cluster's")
            return

    def _refuse(self, line: str) -> None:
        self.mismatch = line
        self.node._fail(line)

    async def _lease_loop(self) -> None:
        node = self.node
        while not node._down:
            await asyncio.sleep(self.lease_check_s)
            if not self.ready or not self._leads():
                continue
            now = int(time.time() * 1000)
            inner = getattr(node.machine, "inner", None)
            if inner is None or not _lease_due(inner, now):
                continue
            try:
                await self.call({"op": "lease_expire", "now_ms": now})
                self.stats["lease_expire_proposed"] += 1
            except Unavailable:
                pass

    def _leads(self) -> bool:
        r = self.node.replica
        lead = getattr(r, "sequencer", getattr(r, "leader", None))
        return lead == self.node.cfg.node_id

    # --- calls -----------------------------------------------------------------------

    def _check_serving(self) -> None:
        node = self.node
        if node._down:
            raise Unavailable("this replica is stopping", True)
        if not self.ready:
            raise Unavailable("this replica has not yet checked its config against the cluster's "
                              "(no majority reachable yet?)", True)
        if node.peers_reachable() < node.quorum:
            self.stats["refused_no_quorum"] += 1
            raise Unavailable(f"this replica reaches {node.peers_reachable()} of {len(node.cfg.peers)} replicas, "
                              f"fewer than a majority ({node.quorum}); try another replica", True)

    async def call(self, op: Any, read: bool = False) -> Any:
        """Apply ``op`` through the log (or, ``read``, a linearizable read); its result.

        Writes made in the same event-loop turn are coalesced into one log entry
        (``{"op": "batch", ...}``, ``scheduler_state.replicated``): each is still its
        own command, applied alone with its own result, and each caller is answered
        only once the entry is applied here."""
        self._check_serving()
        try:  # once per command: its size for the batch, and a refusal before anything is proposed
            size = len(encode_checked(op))
        except ValueError as e:
            raise BadCommand(str(e)) from None
        if read or not self.coalesce:
            return await self._call_one(op, read)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.append((op, size, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        """Send the writes queued in this loop turn: one log entry per run of up to
        ``BATCH_MAX`` commands and ``BATCH_BYTES_MAX`` bytes (a lone one as itself)."""
        self._flush_scheduled = False
        queue, self._queue = self._queue, []
        i = 0
        while i < len(queue):
            j = i + 1
            total = queue[i][1]
            while j < len(queue) and j - i < BATCH_MAX and total + queue[j][1] <= BATCH_BYTES_MAX:
                total += queue[j][1]
                j += 1
            chunk = queue[i:j]
            i = j
            task = asyncio.get_running_loop().create_task(self._send(chunk))
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    async def _send(self, chunk: list) -> None:
        if len(chunk) == 1:
            op = chunk[0][0]
        else:
            op = {"op": BATCH, "commands": [c[0] for c in chunk]}
            self.stats["batches"] += 1
            self.stats["batched_commands"] += len(chunk)
        try:
            result = await self._call_one(op, False)
        except Unavailable as e:
            for _, _, fut in chunk:
                if not fut.done():
                    fut.set_exception(Unavailable(str(e), e.definite))
            return
        except BaseException as e:  # noqa: BLE001 - every caller must hear of it
            for _, _, fut in chunk:
                if not fut.done():
                    fut.set_exception(Unavailable(f"internal error: {type(e).__name__}: {e}", False))
            if not isinstance(e, Exception):  # cancelled (stopping): after answering
                raise
            return
        if len(chunk) == 1:
            if not chunk[0][2].done():
                chunk[0][2].set_result(result)
            return
        results = result.get("results") if isinstance(result, dict) else None
        if not isinstance(results, list) or len(results) != len(chunk):
            # not applied as a batch (refused whole): every command had that answer
            results = [result] * len(chunk)
        for (_, _, fut), r in zip(chunk, results):
            if not fut.done():
                fut.set_result(r)

    async def _call_one(self, op: Any, read: bool) -> Any:
        """One log entry (or read) through ``Node.submit``, bounded by ``call_timeout_s``."""
        self._check_serving()
        kind = clientwire.READ if read else clientwire.CALL
        async with self._session_sem:
            session = self._free.pop() if self._free else [f"http/{self.node.cfg.node_id}/{self._nonce}/"
                                                           f"{next(_counter)}", 0]
            session[1] += 1
            client, seq = session
            self.stats["calls"] += 1
            fut = self.node.submit(kind, client, seq, op)
            # A timer on the future itself, not asyncio.wait_for: no extra Task per call
            # (wait_for wraps the future in one), which the profile of the benchmark showed.
            timer = fut.get_loop().call_later(self.call_timeout_s, _expire, fut)
            try:
                status, result = await fut
            except _CallExpired:
                self.node.forget(client, seq)
                self.stats["timeouts"] += 1
                self._free.append(session)
                raise Unavailable(f"no answer within {self.call_timeout_s:g} s (no majority, or a view change); "
                                  + ("safe to retry" if read else "the command may still take effect"),
                                  read) from None
            except ConnectionError as e:
                raise Unavailable(str(e), read) from None
            finally:
                timer.cancel()
            self._free.append(session)
        if status != clientwire.OK:
            raise Unavailable(f"replica answered: {result}", True)
        return result

    def status(self, invariants: bool = False) -> dict[str, Any]:
        """This replica at a glance (``GET /v1/status``, ``cellar scheduler status``)."""
        from store.metrics import leaf_counts

        node = self.node
        st = node.replica.status()
        lead = st.get("sequencer", st.get("leader"))
        out: dict[str, Any] = {
            "node": node.cfg.node_id, "ready": self.ready and not node._down and node.peers_reachable() >= node.quorum,
            "protocol": st.get("protocol"), "view": st.get("view"), "sequencer": lead,
            "is_sequencer": lead == node.cfg.node_id, "lease": st.get("lease"), "exec_slot": st.get("exec_slot"),
            "applied": node.replica.executor.applied, "digest": node._digest(), "config_hash": self.config_hash,
            "config_checked": self.ready, "reachable": node.peers_reachable(), "replicas": len(node.cfg.peers),
            "compiled": scheduler_state.COMPILED,  # the mypyc build of its hot modules
        }
        inner = getattr(node.machine, "inner", None)
        if inner is not None:
            used, free, bad = leaf_counts(inner)
            out.update(groups=len(inner.groups), pending=len(inner.pending), leaf_cells_used=used,
                       leaf_cells_free=free, leaf_cells_bad=bad, bad_nodes=sorted(inner.cluster.bad_nodes),
                       clock_ms=inner.clock_ms)
            if invariants:
                from scheduler_state.invariants import check

                out["invariants"] = check(inner)
        elif invariants:
            out["invariants"] = []
        return out

    def local(self, op: Any) -> Any:
        """A serializable read of this replica's state (possibly stale)."""
        if not self.ready:
            raise Unavailable("this replica has not yet checked its config against the cluster's", True)
        return self.node.local_query(op)


_counter = itertools.count()


class _CallExpired(Exception):
    """A call's timer ran out before the node answered (``SchedulerService.call``)."""


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(_CallExpired())


def _lease_due(inner: Any, now_ms: int) -> bool:
    for g in inner.groups.values():
        if g.lease_ms is not None and g.lease_ms <= now_ms:
            return True
    return any(e.lease_ms is not None and e.lease_ms <= now_ms for e in inner.pending)
