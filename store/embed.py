"""Embedding: a scheduler process that runs its own replica in-process.

A scheduler front-end (a Kubernetes extender, a batch system's dispatcher) can run one
Cellar replica inside its own asyncio event loop and call it directly: no HTTP, no
extra process. Every call goes through the replicated log exactly as an HTTP call does
(``store.scheduler_service``: answers only once applied here and durable; 503-style
``Unavailable`` without a majority)::

    from store.embed import EmbeddedScheduler

    sched = EmbeddedScheduler(
        node_id=0,
        peers={0: "10.0.0.1:7000", 1: "10.0.0.2:7000", 2: "10.0.0.3:7000"},
        data_dir="/var/lib/cellar/s0",
        hived_config="examples/hived-small.yaml",   # a path, YAML text, mapping or Config
    )
    await sched.start()                     # opens the WAL, joins, checks the config
    placed = await sched.allocate({"virtualCluster": "vc-a", "priority": 100,
                                   "leafCellType": "K80", "leafCellNumber": 4, "name": "job1"})
    placed["placement"]                     # [{"node": "node-0", "leaf_cells": [0, 1, 2, 3], ...}]
    await sched.release("job1")
    await sched.affinity_group("job1")      # HiveD inspect shapes; linearizable by default
    sched.is_sequencer, sched.leader_hint   # route writes to the sequencer if you like
    async for event in sched.events():      # committed events, in log order
        ...                                 # {"type": "placed", "group": ..., "position": 17, ...}
    await sched.stop()

Several replicas may share one event loop (the tests run three); each is a full
replica with its own data dir and peer port. ``http="127.0.0.1:8200"`` also serves the
HTTP API from the same loop, so the CLI and ``curl`` see the embedded replica too.

**Results and errors.** ``allocate`` returns the machine's result: placed (``ok``
true, ``placement``, ``preempted`` victims, ...) or, when it must wait, ``ok`` false
with ``waiting`` true and ``queued`` (the group joined the pending queue unless
``wait=False``). A command the scheduler refuses (unknown VC, a name already in use,
a spec that does not parse, a value nested too deep or not encodable) raises
``SchedulerError`` (definite: nothing changed). No
majority, a replica stopping, or no answer within ``call_timeout_s`` raise
``Unavailable`` (``definite`` false: a write may still commit; retrying ``allocate``
under the same name is safe, the second answers "already allocated").

**The change feed** (``events()``): an async iterator of the events of every command
this replica applies from now on (or, with ``after=POSITION``, first those after that
position, while the replica still keeps them): ``placed``, ``preempted``,
``lazy_preempted``, ``queued``, ``released``, ``cancelled``, ``expired``, ``dropped``,
``node_health``, ``initialized``, ``reconfigured`` (``scheduler_state.events``). Each
carries ``position``, the applied command's number in the log (the same on every
replica), so a consumer can resume where it stopped. A consumer that falls more than
``queue_max`` events behind, or whose replica installed a snapshot, gets ``FeedGap``:
re-read the state and subscribe again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from consensus.runtime.node import Node, NodeConfig, NodeError
from store.server import make_node
from store.scheduler_service import BadCommand, Feed, FeedGap, SchedulerService, Unavailable

__all__ = ["EmbeddedScheduler", "SchedulerError", "Unavailable", "FeedGap", "Feed"]


class SchedulerError(Exception):
    """The scheduler refused the command (definite: the state did not change)."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


def _address(value: Any, what: str) -> tuple[str, int]:
    if isinstance(value, tuple):
        return value[0], int(value[1])
    from store.server import parse_address

    return parse_address(value, what)


class EmbeddedScheduler:
    """One scheduler replica in this process's event loop (module docstring)."""

    def __init__(self, node_id: int, peers: dict[int, Any], data_dir: str | Path, hived_config: Any, *,
                 client: Any = None, http: Any = None, protocol: str = "sdpaxos", fsync: str = "batch",
                 cluster_id: str = "cellar", call_timeout_s: float = 5.0, lease_check_s: float = 1.0,
                 **node_options: Any) -> None:
        from scheduler_state.config import Config, load_config

        config = hived_config if isinstance(hived_config, Config) else load_config(
            Path(hived_config) if isinstance(hived_config, str) and "\n" not in hived_config else hived_config)
        self.config = config
        self.node_id = node_id
        peer_addrs = {int(k): _address(v, f"peer {k}") for k, v in peers.items()}
        self.cfg = NodeConfig(node_id=node_id, peers=peer_addrs,
                              client_address=_address(client, "client address") if client else ("127.0.0.1", 0),
                              data_dir=str(data_dir), cluster_id=cluster_id, protocol=protocol, fsync=fsync,
                              machine="scheduler", **node_options)
        self.http_address = _address(http, "HTTP address") if http else None
        self.call_timeout_s = call_timeout_s
        self.lease_check_s = lease_check_s
        self.node: Node | None = None
        self.service: SchedulerService | None = None
        self._api: Any = None

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self, ready_timeout_s: float | None = 30.0) -> None:
        """Open the data dir (recovering the WAL), join the peers, start the config
        check and, if asked, the HTTP API; then wait until ``ready`` (the config check
        passed) for at most ``ready_timeout_s`` (None: do not wait). Raises
        ``NodeError`` (bad data dir, another cluster's, a config that differs from
        the cluster's) or ``TimeoutError``."""
        node = make_node(self.cfg)
        node.open()
        await node.start()
        self.node = node
        where = "the embedded scheduler's hived_config"
        self.service = SchedulerService(node, self.config, where, call_timeout_s=self.call_timeout_s,
                                        lease_check_s=self.lease_check_s)
        self.service.start()
        if self.http_address is not None:
            from store.http_api import SchedulerAPI

            self._api = SchedulerAPI(self.service)
            await self._api.start(*self.http_address)
        if ready_timeout_s is not None:
            await self.wait_ready(ready_timeout_s)

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        service = self._svc()
        while not service.ready:  # bounded by the deadline
            if service.mismatch is not None:
                raise NodeError(service.mismatch)
            if self.node is not None and self.node._down:
                raise NodeError(self.node.failure or "the replica stopped")
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {self.node_id}: config not checked within {timeout_s:g} s "
                                   f"(is a majority of the peers running?)")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Stop serving, sync and close the WAL. Idempotent."""
        if self._api is not None:
            await self._api.stop()
            self._api = None
        if self.service is not None:
            await self.service.stop()
        if self.node is not None and not self.node._down:
            await self.node.stop()

    async def __aenter__(self) -> EmbeddedScheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # --- routing -------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        s = self.service
        return s is not None and s.ready and self.node is not None and not self.node._down \
            and self.node.peers_reachable() >= self.node.quorum

    @property
    def leader_hint(self) -> int | None:
        """The replica this one believes is the sequencer (leader), or None."""
        if self.node is None or self.node.replica is None:
            return None
        r = self.node.replica
        return getattr(r, "sequencer", getattr(r, "leader", None))

    @property
    def is_sequencer(self) -> bool:
        return self.leader_hint == self.node_id

    def status(self) -> dict[str, Any]:
        """This replica at a glance (the same as ``GET /v1/status``)."""
        return self._svc().status()

    # --- writes ----------------------------------------------------------------------------

    async def allocate(self, spec: dict[str, Any], *, ttl_ms: int | None = None, wait: bool = True,
                       suggested_nodes: list[str] | None = None) -> dict[str, Any]:
        """Place one affinity group (HiveD's pod scheduling spec); see the module docstring."""
        cmd: dict[str, Any] = {"op": "allocate", "group": spec}
        if not wait:
            cmd["wait"] = False
        if suggested_nodes is not None:
            cmd["suggestedNodes"] = list(suggested_nodes)
        if ttl_ms is not None:
            cmd["ttl_ms"] = ttl_ms
            cmd["now_ms"] = int(time.time() * 1000)  # stamped by the proposing replica
        result = await self._write(cmd)
        if not result.get("ok") and not result.get("waiting"):
            raise SchedulerError(str(result.get("error")), result)
        return result

    async def release(self, name: str, pods: list[int] | None = None) -> dict[str, Any]:
        """Release a group (or only ``pods`` of it), or cancel a pending one."""
        cmd: dict[str, Any] = {"op": "release", "group": name}
        if pods is not None:
            cmd["pods"] = list(pods)
        return self._checked(await self._write(cmd))

    async def set_node_health(self, node: str, healthy: bool) -> dict[str, Any]:
        return self._checked(await self._write({"op": "set_node_health", "node": node, "healthy": healthy}))

    async def renew_lease(self, name: str, ttl_ms: int) -> dict[str, Any]:
        return self._checked(await self._write({"op": "lease_renew", "group": name, "ttl_ms": ttl_ms,
                                                "now_ms": int(time.time() * 1000)}))

    # --- reads (HiveD's inspect shapes) ---------------------------------------------------------

    async def inspect(self, view: str, name: str | None = None, consistency: str = "linearizable") -> Any:
        """``view`` one of affinitygroups, affinitygroup, clusterstatus, physicalcluster,
        virtualclusters, virtualcluster. ``consistency="serializable"``: this replica's
        state, no log (possibly stale)."""
        op: dict[str, Any] = {"op": "inspect", "view": view}
        if name is not None:
            op["name"] = name
        if consistency == "serializable":
            result = self._svc().local(op)
        elif consistency == "linearizable":
            result = await self._svc().call(op, read=True)
        else:
            raise ValueError("consistency must be linearizable or serializable")
        return self._checked(result).get("result")

    async def affinity_groups(self, **kw: Any) -> list[dict[str, Any]]:
        return (await self.inspect("affinitygroups", **kw))["items"]

    async def affinity_group(self, name: str, **kw: Any) -> dict[str, Any] | None:
        """The group, or None if it does not exist."""
        try:
            return await self.inspect("affinitygroup", name, **kw)
        except SchedulerError as e:
            if isinstance(e.result, dict) and e.result.get("not_found"):
                return None
            raise

    async def cluster_status(self, **kw: Any) -> dict[str, Any]:
        return await self.inspect("clusterstatus", **kw)

    async def virtual_cluster(self, vc: str, **kw: Any) -> list[dict[str, Any]]:
        return await self.inspect("virtualcluster", vc, **kw)

    # --- the change feed ----------------------------------------------------------------------

    def events(self, after: int | None = None, queue_max: int = 10_000) -> Feed:
        """Committed scheduler events from now on (or after ``after``): module docstring."""
        return self._svc().subscribe(after=after, queue_max=queue_max)

    # --- helpers ---------------------------------------------------------------------------------

    def _svc(self) -> SchedulerService:
        if self.service is None:
            raise RuntimeError("call start() first")
        return self.service

    async def _write(self, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await self._svc().call(cmd)
        except BadCommand as e:  # not a command any replica could carry: nothing proposed
            raise SchedulerError(str(e), {"ok": False, "error": str(e)}) from None
        if not isinstance(result, dict):
            raise SchedulerError(f"unexpected result {str(result)[:200]}", result)
        if result.get("uninitialized"):
            raise Unavailable(str(result.get("error")), True)
        return result

    @staticmethod
    def _checked(result: Any) -> Any:
        if not isinstance(result, dict):
            raise SchedulerError(f"unexpected result {str(result)[:200]}", result)
        if result.get("uninitialized"):
            raise Unavailable(str(result.get("error")), True)
        if not result.get("ok"):
            raise SchedulerError(str(result.get("error")), result)
        return result
