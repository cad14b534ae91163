"""Lease time for the key-value machine: who proposes expiry, and what a failover does.

The KV machine (``store.kv_machine``) never reads a clock: a lease ends only when a
replica proposes ``{"op": "lease_expire", "now_ms": T}`` and it is applied. This
service runs beside a ``Node`` that carries the KV machine (``cellar serve``,
``--machine kv``, the default) and is the only proposer of time:

- Every ``check_s`` (250 ms), the replica that is the sequencer (SDPaxos; the leader
  for Multi-Paxos) looks at its own applied state, and if some lease ended by its wall
  clock (``machine.expiry_due(now_ms)``), proposes one ``lease_expire`` stamped with it.
  Other replicas propose nothing, so skew between replicas never races two expiries.
- **Failover** (etcd's rule): a replica that becomes the sequencer first proposes
  ``{"op": "lease_extend_all", "now_ms": T}``, which gives every live lease a full TTL
  from T, and only then starts proposing expiries. A lease whose keepalives went to
  the old sequencer while it was cut off therefore does not expire at the first tick
  of the new one. The machine keeps the largest ``now_ms`` it was given, so time in
  the log never moves backwards even when the new sequencer's clock is behind.

The commands go through ``Node.submit`` under a client id of their own
(``lease/<node id>/<nonce>``) with increasing sequence numbers, so the executor's
exactly-once rule holds for them as for any client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from consensus.runtime import clientwire

log = logging.getLogger("cellar.kv")

CHECK_S = 0.25
CALL_TIMEOUT_S = 5.0


class KVLeaseService:
    def __init__(self, node: Any, check_s: float = CHECK_S) -> None:
        self.node = node
        self.check_s = check_s
        self.client = f"lease/{node.cfg.node_id}/{os.getpid()}-{time.time_ns()}"
        self.seq = 0
        self._led_view: Any = None  # the view in which we last extended every lease
        self._task: asyncio.Task | None = None
        self.stats = {"lease_expire_proposed": 0, "lease_extend_all_proposed": 0, "timeouts": 0}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    def _leading_view(self) -> Any:
        """Our view if we are the serving sequencer (leader), else None."""
        r = self.node.replica
        lead = getattr(r, "sequencer", getattr(r, "leader", None))
        if lead != self.node.cfg.node_id or getattr(r, "phase", "normal") != "normal":
            return None
        return getattr(r, "view", 0)

    async def _propose(self, op: dict) -> bool:
        node = self.node
        self.seq += 1
        fut = node.submit(clientwire.CALL, self.client, self.seq, op)
        try:
            status, result = await asyncio.wait_for(fut, CALL_TIMEOUT_S)
        except (asyncio.TimeoutError, ConnectionError):
            node.forget(self.client, self.seq)
            self.stats["timeouts"] += 1
            return False
        return status == clientwire.OK and isinstance(result, dict) and bool(result.get("ok"))

    async def _loop(self) -> None:
        node = self.node
        while not node._down:  # bounded by the node's life; each step waits check_s
            await asyncio.sleep(self.check_s)
            view = self._leading_view()
            if view is None:
                continue
            machine = node.machine
            if not hasattr(machine, "expiry_due"):
                return  # not the KV machine
            now = int(time.time() * 1000)
            if view != self._led_view:
                if await self._propose({"op": "lease_extend_all", "now_ms": now}):
                    self._led_view = view
                    self.stats["lease_extend_all_proposed"] += 1
                    log.info("sequencer in view %s: every live lease extended by its TTL", view)
                continue
            if machine.expiry_due(now) and await self._propose({"op": "lease_expire", "now_ms": now}):
                self.stats["lease_expire_proposed"] += 1
