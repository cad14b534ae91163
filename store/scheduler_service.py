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
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

from consensus.runtime import clientwire
from consensus.runtime.node import Node

log = logging.getLogger("cellar.scheduler")

CALL_TIMEOUT_S = 5.0
INIT_RETRY_S = 1.0
LEASE_CHECK_S = 1.0
SESSIONS_MAX = 4096  # concurrent calls per replica; more wait for a session


class ConfigMismatch(Exception):
    """This replica's --hived-config is not the one the cluster was initialized with."""


class Unavailable(Exception):
    """No answer now: no majority reachable, node stopping, or the call timed out."""

    def __init__(self, message: str, definite: bool) -> None:
        super().__init__(message)
        self.definite = definite


class SchedulerService:
    def __init__(self, node: Node, config: Any, config_path: str = "--hived-config", *,
                 call_timeout_s: float = CALL_TIMEOUT_S, lease_check_s: float = LEASE_CHECK_S) -> None:
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
        self.stats = {"calls": 0, "timeouts": 0, "refused_no_quorum": 0, "lease_expire_proposed": 0}

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._genesis()), loop.create_task(self._lease_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

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
        """Apply ``op`` through the log (or, ``read``, a linearizable read); its result."""
        self._check_serving()
        kind = clientwire.READ if read else clientwire.CALL
        async with self._session_sem:
            session = self._free.pop() if self._free else [f"http/{self.node.cfg.node_id}/{self._nonce}/"
                                                           f"{next(_counter)}", 0]
            session[1] += 1
            client, seq = session
            self.stats["calls"] += 1
            fut = self.node.submit(kind, client, seq, op)
            try:
                status, result = await asyncio.wait_for(fut, self.call_timeout_s)
            except asyncio.TimeoutError:
                self.node.forget(client, seq)
                self.stats["timeouts"] += 1
                self._free.append(session)
                raise Unavailable(f"no answer within {self.call_timeout_s:g} s (no majority, or a view change); "
                                  + ("safe to retry" if read else "the command may still take effect"),
                                  read) from None
            except ConnectionError as e:
                raise Unavailable(str(e), read) from None
            self._free.append(session)
        if status != clientwire.OK:
            raise Unavailable(f"replica answered: {result}", True)
        return result

    def local(self, op: Any) -> Any:
        """A serializable read of this replica's state (possibly stale)."""
        if not self.ready:
            raise Unavailable("this replica has not yet checked its config against the cluster's", True)
        return self.node.local_query(op)


_counter = itertools.count()


def _lease_due(inner: Any, now_ms: int) -> bool:
    for g in inner.groups.values():
        if g.lease_ms is not None and g.lease_ms <= now_ms:
            return True
    return any(e.lease_ms is not None and e.lease_ms <= now_ms for e in inner.pending)
