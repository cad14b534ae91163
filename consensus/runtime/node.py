"""One replica process: the thin asyncio shell around a protocol state machine.

Per event-loop turn the node feeds the replica what arrived (peer envelopes, client
requests, elapsed ticks), then takes one ``Ready`` and carries it out in the order
its contract demands (``consensus.core.ready``); ``Node._process`` spells the
sequence out: persist → send → reply → install a fetched snapshot.

**Crash-only.** The node has one way to handle a failure it did not plan for: stop.
An exception from the core (``step``, ``tick``, ``propose``, ``read``, ``ready``,
snapshot calls, ``status``), a failed WAL write or fsync (any ``OSError``, not only
``WALError``), a failed snapshot store, or any other exception in the driver's own
callbacks sets ``Node.failure`` (one line), writes the traceback to
``<data_dir>/crash.log``, stops the node (nothing more is sent or answered) and sets
``stopped``; ``cellar serve`` then prints that one line and exits with status 1.
Restarting recovers from the WAL and snapshots, which is the path every crash
takes anyway. Bad input from the network is not a failure of this replica: a
malformed peer frame or client request closes that connection only.

Ticks come from the monotonic clock and are never dropped: after a stall the replica
receives every tick that elapsed. That keeps the sequencer's lease honest (its lease
is counted in its own ticks, so they must not run slower than real time). TESTING ONLY:
``cellar serve --clock-control FILE`` counts them on a clock whose rate a test sets
(``consensus.runtime.clock_control``, the Jepsen clock nemesis); without it nothing
changes.

Snapshots: every ``snapshot_every`` executed slots the node asks the replica for a
snapshot and its still-needed ("live") records (``compact``), both as of WAL seq
``seq``, writes them atomically in one file (``consensus.storage.snapshot``), lets the
replica drop its old log and deletes the WAL segments that only the older retained
snapshot could still need. Recovery from such a snapshot replays its live records,
then the WAL records after ``seq``. A replica asking for a snapshot
(``Ready.snapshot_from``) pulls the peer's latest one in checksummed chunks.

Startup errors (unusable data dir, identity mismatch, corrupt WAL, port in use) raise
``NodeError`` with one line a person can act on.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import gc
import json
import logging
import os
import random
import reprlib
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack

from consensus.core.config import ProtocolConfig
from consensus.core.epochs import EpochBase
from consensus.core.executor import RECONFIG, check_reconfig
from consensus.core.messages import RemoteProtocolError, decode_message, encode_message
from consensus.core.multipaxos import MultiPaxosReplica
from consensus.core.sdpaxos import SDPaxosReplica
from consensus.runtime import clientwire, membership
from consensus.runtime.stalls import StallTracer, log_path, threshold_from_env
from consensus.transport.framing import MAX_FRAME_BYTES, FrameDecoder, ProtocolError, encode_frame
from consensus.transport.tcp import PeerTransport
from consensus.transport import tls
from consensus.core.replica import ReplicaBase
from consensus.storage.snapshot import (Chunk, ChunkError, Snapshot, SnapshotReceiver, SnapshotUnsupported, chunk_at,
                                        decode_snapshot, encode_snapshot, keep_only, load_latest, place_snapshot,
                                        write_file_synced, write_snapshot)
from consensus.storage.wal import WAL, GroupCommitter, WALCorruption, WALError, makedirs_durable

log = logging.getLogger("cellar.node")

PROTOCOLS = {"sdpaxos": SDPaxosReplica, "multipaxos": MultiPaxosReplica}
IDENTITY_FILE = "cellar-node.json"
# Peer frames: [ENVELOPE, [msg, ...]] | [SNAP_PULL, offset] | [SNAP_CHUNK, chunk] | [SNAP_NONE, 0]
ENVELOPE, SNAP_PULL, SNAP_CHUNK, SNAP_NONE = 0, 1, 2, 3
SNAPSHOT_CHUNK_BYTES = 1 << 20
SNAPSHOT_BYTES_MAX = 4 << 30
SNAPSHOT_PULL_TIMEOUT_S = 10.0
# A client may have this many commands waiting for answers at this node, all clients together.
WAITERS_MAX = 1 << 20
# Commands queued in the replica but not yet in an instance before new ones are refused.
PENDING_MAX = 200_000
# Peer envelopes kept while a snapshot is being installed (more are dropped, as a network may).
HELD_ENVELOPES_MAX = 10_000
# A snapshot child runs in the idle scheduling class this long, then at nice 10.
SNAPSHOT_IDLE_S = 5.0
try:  # prctl (Linux), for the snapshot child (snapshot_child_priority)
    import ctypes

    _LIBC: Any = ctypes.CDLL(None, use_errno=True)
except (ImportError, OSError):
    _LIBC = None
# An autogroup nice change refused for the kernel's rate limit (_set_autogroup_nice):
# tried again this much later (plus up to as much again at random, so that children
# retrying together do not keep meeting each other's window), this many times in all.
# Ten tries at a fixed 110 ms left a child at nice 0 once in nine suite runs on three
# pytest workers (every replica's snapshot child on the machine takes the window).
AUTOGROUP_RETRY_S = 0.11
AUTOGROUP_TRIES = 30

# Old log entries freed per loop turn after a compaction (Node._release_later).
RELEASE_SLICE = 256


class LoopLag:
    """How late the event loop ran the tick timer: a pause of the loop (a long
    callback, a snapshot, a GC collection) shows as lateness, and a pause longer than
    the election timeout costs a view change. Kept per second for the last minute."""

    PAUSE_MS = 50.0

    def __init__(self) -> None:
        self.max_ms = 0.0  # since start
        self.pauses = 0  # timer runs at least PAUSE_MS late
        self._second = -1
        self._window: deque = deque(maxlen=60)  # (second, max lateness that second in ms)

    def record(self, now: float, late_s: float) -> None:
        ms = max(0.0, late_s * 1000.0)
        if ms > self.max_ms:
            self.max_ms = ms
        if ms >= self.PAUSE_MS:
            self.pauses += 1
        sec = int(now)
        if sec != self._second:
            self._second = sec
            self._window.append([sec, ms])
        elif ms > self._window[-1][1]:
            self._window[-1][1] = ms

    def status(self, now: float) -> dict:
        sec = int(now)
        last = [ms for s, ms in self._window if s >= sec - 1]
        minute = [ms for s, ms in self._window if s >= sec - 60]
        return {"lag_max_ms_1s": round(max(last, default=0.0), 3), "lag_max_ms_60s": round(max(minute, default=0.0), 3),
                "lag_max_ms": round(self.max_ms, 3), "pauses_50ms": self.pauses}


class NodeError(Exception):
    """The node cannot start or must stop; the message is one actionable line."""


def _describe(exc: BaseException) -> str:
    """``Type: message`` on one line, bounded."""
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


FSYNC_WORKERS = ("loop", "process", "thread")  # NodeConfig.fsync_worker


@dataclass
class NodeConfig:
    node_id: int
    peers: dict[int, tuple[str, int]]  # every replica's peer address, this one included
    client_address: tuple[str, int]
    data_dir: str
    cluster_id: str = "cellar"
    protocol: str = "sdpaxos"
    fsync: str = "batch"
    tick_ms: float = 10.0
    heartbeat_ms: float = 100.0
    # Straggler detection holds the sequencer to the fastest ready time a replica has
    # seen, but never below this (ProtocolConfig.straggler_floor_ticks): on loopback
    # the fastest is about 0, and a saturated machine's queueing is not a slow
    # sequencer. One heartbeat: below the wide-area round trips where it matters.
    straggler_floor_ms: float = 100.0
    # The command leader's accepts leave before its own record is durable
    # (ProtocolConfig.early_send, docs/early-send.md).
    early_send: bool = True
    # fsync=batch: where each loop turn's fsync runs (docs/runtime.md, "Where batch's
    # fsync runs"): "loop", on the loop at the end of the turn (the default since
    # 2026-11-27); "process", a child process syncs while the loop goes on; "thread", a
    # worker thread (the path before).
    fsync_worker: str = "loop"
    # Execution after send (ProtocolConfig.defer_execution, docs/runtime.md): a
    # commit's messages leave before this replica applies it, so the replicas apply
    # in parallel rather than one after another.
    defer_execution: bool = True
    election_ms: float = 500.0
    lease_ms: float = 500.0
    batch_max: int = 2048
    inflight_max: int = 16
    snapshot_every: int = 5000  # executed slots between snapshots (0: never)
    initial_sequencer: int = 0
    segment_bytes_max: int = 16 << 20
    # The replicated machine's name and start config. The node does not resolve the name
    # (its caller passes the machine: ``Node``); it records it in the data dir's identity.
    machine: str = "kv"
    machine_config: Any = None
    # Client connections: at most this many; one that sent nothing and waits for no
    # answer this long is closed (clients reconnect); so is one that leaves a frame
    # unfinished this long (a half-sent frame holds a buffer).
    # Take our own snapshots in a forked child (copy-on-write: the loop never pauses
    # to encode the state); False: on the loop, as on platforms without fork.
    snapshot_fork: bool = True
    clients_max: int = 4096
    client_idle_s: float = 300.0
    client_frame_s: float = 30.0
    # TLS (consensus.transport.tls): all three, or none (plaintext, no authentication).
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # Membership (consensus/runtime/membership.py): the epoch this node serves, its
    # members (NAME=HOST:PORT, in replica order; empty: epoch 0's, named by id) and the
    # packed base it started from (None in epoch 0).
    epoch: int = 0
    members: tuple = ()
    epoch_base: bytes | None = None
    extra: dict = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None

    def protocol_config(self) -> ProtocolConfig:
        def ticks(ms: float) -> int:
            return max(1, round(ms / self.tick_ms))

        return ProtocolConfig(
            n=len(self.peers),
            initial_sequencer=self.initial_sequencer,
            tick_ms=self.tick_ms,
            batch_max=self.batch_max,
            inflight_max=self.inflight_max,
            heartbeat_ticks=ticks(self.heartbeat_ms),
            election_ticks=ticks(self.election_ms),
            lease_ticks=ticks(self.lease_ms),
            resend_ticks=ticks(self.election_ms),
            recovery_ticks=ticks(self.election_ms),
            straggler_floor_ticks=ticks(self.straggler_floor_ms),
            early_send=self.early_send,
            defer_execution=self.defer_execution,
            epoch=self.epoch,
        )

    def member_list(self) -> tuple:
        return self.members or membership.epoch0_members(self.peers)

    def cert_id(self, index: int) -> int | None:
        """TLS: the replica id the certificate of member ``index`` names: its name, a
        number (``node-<name>``); in epoch 0 its id."""
        if not self.members:
            name = str(self.extra.get("name", "")) if index == self.node_id else ""
            named = membership.tls_id(name)
            return named if named is not None else index
        return membership.tls_id(membership.member_name(self.members[index]))

    def validate(self) -> None:
        n = len(self.peers)
        if sorted(self.peers) != list(range(n)):
            raise NodeError(f"peers must be numbered 0..{n - 1}, got {sorted(self.peers)}")
        if self.node_id not in self.peers:
            raise NodeError(f"node id {self.node_id} is not among the peers {sorted(self.peers)}")
        if self.protocol not in PROTOCOLS:
            raise NodeError(f"unknown protocol {self.protocol!r} (sdpaxos or multipaxos)")
        if type(self.snapshot_every) is not int or self.snapshot_every < 0:
            raise NodeError(f"snapshot_every must be a whole number >= 0 (0: never), not {self.snapshot_every!r}")
        for name in ("batch_max", "inflight_max"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise NodeError(f"{name} must be a whole number >= 1, not {getattr(self, name)!r}")
        addresses = [tuple(a) for a in self.peers.values()]
        if len(set(addresses)) != len(addresses):
            dup = sorted({f"{h}:{p}" for h, p in addresses if addresses.count((h, p)) > 1})
            raise NodeError(f"two replicas share the peer address {', '.join(dup)}: each needs its own")
        if tuple(self.client_address) in addresses:
            h, p = self.client_address
            raise NodeError(f"the client address {h}:{p} is also a peer address")
        if type(self.clients_max) is not int or self.clients_max < 1:
            raise NodeError(f"clients_max must be a whole number >= 1, not {self.clients_max!r}")
        for name in ("client_idle_s", "client_frame_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < 1e9:
                raise NodeError(f"{name} must be a number of seconds > 0, not {value!r}")
        if not isinstance(self.straggler_floor_ms, (int, float)) or not 0 <= self.straggler_floor_ms < 1e7:
            raise NodeError(f"straggler_floor_ms must be a number of milliseconds >= 0, not {self.straggler_floor_ms!r}")
        if self.fsync not in ("always", "batch", "never"):
            raise NodeError(f"unknown fsync mode {self.fsync!r} (always, batch or never)")
        if self.fsync_worker not in FSYNC_WORKERS:
            raise NodeError(f"unknown fsync_worker {self.fsync_worker!r} ({', '.join(FSYNC_WORKERS)})")
        if not 0 <= self.initial_sequencer < n:
            raise NodeError(f"initial sequencer {self.initial_sequencer} is not a replica")
        given = [name for name in ("tls_ca", "tls_cert", "tls_key") if getattr(self, name) is not None]
        if given and len(given) != 3:
            missing = sorted({"tls_ca", "tls_cert", "tls_key"} - set(given))
            raise NodeError(f"TLS needs tls_ca, tls_cert and tls_key together: {', '.join(missing)} missing")
        if given:
            try:
                tls.check_files(self.tls_ca, self.tls_cert, self.tls_key, self.cert_id(self.node_id))
            except tls.TLSError as e:
                raise NodeError(str(e)) from None


def snapshot_child_priority(parent: int | None = None) -> None:
    """In the snapshot child: run only on CPU no one else wants. A replica and its child
    share one scheduling group (a session's autogroup, a service's cgroup), so a child
    at nice 10 still spends the group's share: a busy machine then left the replica's
    own loop runnable but unscheduled for 50-120 ms at a time, every snapshot
    (measured with ``CELLAR_STALL_TRACE_MS``, docs/runtime.md). In the idle class it
    yields at once to the loop inside the group, but its CPU time is still the group's,
    so the group (the replica) then waits behind the other groups: the child therefore
    leaves the replica's session (``setsid``: on Linux a new autogroup) and lowers that
    group to nice 19. ``Node._promote_snapshot_child`` lifts it if the machine never
    idles. Under a service's cgroup the autogroup steps do nothing.

    ``parent`` (the replica's pid): the child dies with it (Linux). It holds the
    replica's open files (the WAL's flock, the listening sockets), and orphaned in a
    session of its own at nice 19, never promoted, it kept them from a restarted
    replica for as long as it took to finish."""
    if parent is not None:
        prctl = getattr(_LIBC, "prctl", None)
        if prctl is not None and prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0 and os.getppid() != parent:
            os._exit(1)  # PR_SET_PDEATHSIG came too late: the replica is gone already
    try:
        os.setsid()  # a session of its own: on Linux, an autogroup of its own
    except OSError:
        pass
    # An unprivileged process may change an autogroup's nice once per 100 ms system-wide
    # (EAGAIN otherwise). Left at nice 0, this session's group would get a whole
    # group's share beside its replica's (the idle class yields only inside a group):
    # wait for the window instead (the snapshot starts that much later).
    for _ in range(AUTOGROUP_TRIES):
        if _set_autogroup_nice("self", 19):
            break
        time.sleep(AUTOGROUP_RETRY_S * (1 + os.urandom(1)[0] / 255))
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux: the lowest nice instead
        os.nice(19)


def _set_autogroup_nice(pid: str, nice: int) -> bool:
    """False only if the kernel said to try again (EAGAIN: its rate limit on autogroup
    nice changes without CAP_SYS_ADMIN, one per 100 ms across the machine)."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError as e:  # no autogroups (not Linux, or a cgroup-managed service), or EAGAIN
        return e.errno != errno.EAGAIN
    return True


def _exit_code(pid: int) -> int:
    """Wait for our child ``pid``; its exit status (128 + n if killed by signal n)."""
    _pid, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _read_snapshot_file(path: str) -> tuple[bytes, Snapshot]:
    with open(path, "rb") as f:
        data = f.read()
    return data, decode_snapshot(data, path)


def _served_image(snap: Snapshot) -> bytes:
    """What peers and ``cellar snapshot save`` get of ``snap``: meta and body, without
    the live records (they restate our own acceptor state, which no receiver adopts):
    a version-2 image, which builds before version 3 read too. Built in a worker
    thread when a snapshot is stored (a copy and a checksum of the whole image)."""
    return encode_snapshot(Snapshot(snap.seq, snap.meta, snap.body, slot=snap.slot))


class _ClientConn(asyncio.Protocol):
    """One client connection: frames of requests in, frames of replies out."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.decoder = FrameDecoder(MAX_FRAME_BYTES)
        self.transport: asyncio.Transport | None = None
        self.out: list = []
        self.closed = False
        self.last_rx = time.monotonic()  # when bytes last arrived
        self.partial_since = 0.0  # when the unfinished frame in the decoder began (0: none)
        self.admin = False  # TLS: the client presented the admin certificate
        self.node_cert = False  # TLS: a replica's certificate (membership notices, bases)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        node = self.node
        if node.cfg.tls:
            cert = tls.peercert_of(transport)
            self.admin = tls.is_admin(cert)
            self.node_cert = tls.node_id_of(cert) is not None
        if len(node._clients) >= node.cfg.clients_max:
            node.stats["clients_refused"] += 1
            log.warning("client connection refused: %d connections already (clients_max)", len(node._clients))
            self.abort()
            return
        node._clients.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_rx = now = time.monotonic()
        try:
            sizes: list[int] = []
            frames = self.decoder.feed(data, sizes)
            if self.decoder.buffered_bytes:
                if not self.partial_since or frames:
                    self.partial_since = now  # a new frame began
            else:
                self.partial_since = 0.0
            for frame, size in zip(frames, sizes):
                requests = clientwire.parse_requests(frame)
                if size > clientwire.MAX_COMMAND_BYTES:
                    requests = self.node._refuse_too_large(self, requests)
                self.node._on_client_frame(self, requests)
        except (ProtocolError, clientwire.BadRequest) as e:  # the client's fault: drop it
            self.node.stats["client_bad_frames"] += 1
            log.warning("client connection closed: %s", e)
            self.abort()
        except Exception as e:  # ours: crash-only
            self.node._fail(f"internal error handling a client frame: {_describe(e)}", e)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.node._clients.discard(self)

    def reply(self, item: list) -> None:
        if not self.closed:
            if not self.out:
                self.node._dirty_clients.append(self)
            self.out.append(item)

    def flush(self) -> None:
        if self.out and not self.closed and self.transport is not None:
            self.transport.write(encode_frame(self.out))
        self.out = []

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close after what is queued for it was written (idle: nothing is owed)."""
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _PlainOnTLSPort(asyncio.Protocol):
    """A plaintext client on a TLS client port: each request it sent is answered
    ``ERROR "TLSRequired: ..."`` in plaintext, then the connection is closed (a clear
    error rather than a silent close the client would retry until its deadline)."""

    MESSAGE = "TLSRequired: this node's client port speaks TLS (give the cluster CA: --cacert FILE, or tls= in CellarClient)"

    def __init__(self, node: Node) -> None:
        self.node = node
        self.decoder = FrameDecoder(MAX_FRAME_BYTES)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.node.stats["client_tls_refused"] += 1
        # Bounded: one that never finishes a frame is closed anyway (it is not a client).
        self._timer = asyncio.get_running_loop().call_later(5.0, transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            frames = self.decoder.feed(data)
            replies = [[req[1], req[2], clientwire.ERROR, self.MESSAGE]
                       for frame in frames for req in clientwire.parse_requests(frame)]
        except (ProtocolError, clientwire.BadRequest):
            self.transport.abort()
            return
        if replies:
            self.transport.write(encode_frame(replies))
            self.transport.close()


class _LocalConn:
    """An in-process caller's "connection" (``Node.submit``): replies resolve futures.

    Goes through exactly the path of a TCP client's requests, so an in-process
    answer obeys the same rules (released only after the records it depends on are
    durable)."""

    closed = False

    def __init__(self) -> None:
        self.futures: dict[tuple, asyncio.Future] = {}

    def reply(self, item: list) -> None:
        fut = self.futures.pop((item[0], item[1]), None)
        if fut is not None and not fut.done():
            fut.set_result((item[2], item[3]))

    def flush(self) -> None:
        pass

    def abort(self) -> None:
        err = ConnectionError("the node stopped")
        for fut in self.futures.values():
            if not fut.done():
                fut.set_exception(err)
        self.futures.clear()


class Node:
    """A replica process's runtime. ``open()`` (sync, may raise NodeError), then
    ``await start()``, later ``await stop()``.

    The machine it replicates is injected by the caller (``store.server.make_node``
    resolves ``cfg.machine`` through the registry ``store.machines``): ``sm_factory``
    builds a fresh ``consensus.core.statemachine.ReplicatedMachine`` (one per
    incarnation, and one to check a peer's snapshot); ``validate`` is its pure
    pre-proposal check (``op -> None | error result``): a bad command is answered with
    its error and never enters the log (a blind WRITE of it would otherwise be answered
    "done" once ready, though apply refuses it); ``stamp`` (``(op, now_ms) -> op``) puts
    this replica's time into the commands that need it. Either may be None (nothing to
    check or stamp)."""

    # After each stored snapshot, gc.freeze(): set by a process that owns its collector
    # (``cellar serve``, store.server.tune_gc), not by default (tests embed nodes).
    gc_freeze = False

    def __init__(self, cfg: NodeConfig, sm_factory: Callable[[], Any], *,
                 validate: Callable[[Any], Any] | None = None,
                 stamp: Callable[[Any, int], Any] | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.pcfg = cfg.protocol_config()
        self._validate = validate
        self._stamp = stamp
        self.sm_factory = sm_factory
        self._local = _LocalConn()
        self.stats: dict[str, int] = {
            "client_bad_frames": 0, "snapshot_forks": 0, "snapshot_child_promoted": 0, "clients_refused": 0, "client_frame_timeouts": 0, "client_idle_closed": 0, "peer_bad_messages": 0, "snapshots_taken": 0,
            "snapshots_installed": 0, "snapshots_served": 0, "refused_busy": 0,
            "refused_too_large": 0, "refused_invalid": 0, "peer_envelopes_split": 0, "peer_messages_oversized": 0,
        }
        if cfg.tls:
            self.stats.update({"admin_refused": 0, "client_tls_refused": 0})
        # Peer messages by type, both ways (status()["messages"]): what the protocol is
        # doing, say Fetch and CCommit answers where there was no loss.
        self.messages_sent: collections.Counter[type] = collections.Counter()
        self.messages_received: collections.Counter[type] = collections.Counter()
        self.replica: Any = None
        self.wal: WAL | None = None
        self.committer: GroupCommitter | None = None
        self.transport: PeerTransport | None = None
        self._client_server: asyncio.Server | None = None
        self._clients: set[_ClientConn] = set()
        self._client_sweep_due = 0.0
        self._logged_view = -1
        self._dirty_clients: list[_ClientConn] = []
        self._waiters: dict[tuple, _ClientConn] = {}
        self._outbox: deque = deque()  # (wal seq, messages, replies) awaiting durability
        self._tokens: deque = deque()  # (wal seq, Ready.token): replica.persisted once durable
        self._durable_waiting = False  # our one waiter is registered with the committer
        self._scheduled = False
        self._exec_mark: int | None = None  # defer_execution: the WAL seq of the commits' Ready
        self._stopping = False
        self._failed: BaseException | None = None
        self.failure: str | None = None  # why the node stopped on its own (one line)
        self._digest_cache: tuple | None = None
        self._stop_task: asyncio.Task | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._ticks_done = 0
        self._t0 = 0.0
        self._timer_due = 0.0
        # TESTING ONLY (--clock-control FILE): ticks on a clock whose rate a test sets
        # (consensus.runtime.clock_control); None in production: the monotonic clock.
        self._clock: Any = None
        self.loop_lag = LoopLag()
        self._stall_tracer: StallTracer | None = None
        self._snap_promote: asyncio.TimerHandle | None = None
        # Membership: the base of the next epoch once ours ended (END executed and
        # everything before it durable and answered); the driver's callbacks.
        self.epoch_ended: EpochBase | None = None
        self._end_pending: tuple | None = None
        self.on_epoch_end: Callable[[EpochBase], None] | None = None
        self.on_epoch_notice: Callable[[int, tuple], None] | None = None
        self._snap_slot = 0
        self._snap_task: asyncio.Task | None = None
        self._snap_bytes: bytes | None = None  # our latest snapshot, as served to peers (version 2)
        self._releasing = 0  # old logs being freed a slice per loop turn (_release_later)
        self._snap_child = 0  # pid of the forked child encoding our snapshot (0: none)
        self._snap_forks = 0
        self._snap_retry_at = 0.0  # the core had no snapshot to give: not before this
        # The WAL seq of each retained snapshot that carries its live records (None: an
        # older one that does not: its WAL is kept whole), oldest first.
        self._snap_seqs: deque = deque(maxlen=2)
        # Per step of the snapshot path that runs on the event loop: the longest it took
        # (ms of this thread's CPU time, so a descheduled process does not count).
        self.snapshot_loop_ms: dict[str, float] = {}
        self._pull: tuple[int, SnapshotReceiver, float] | None = None
        # A peer's snapshot, fetched, waiting for the end of a _process turn to be installed.
        self._fetched: tuple[int, Snapshot, dict] | None = None
        # Between install_snapshot and the snapshot being stored: the core gets nothing.
        self._installing = False
        self._held: deque = deque()  # (peer, msgs) that arrived meanwhile, fed afterwards
        self.stopped = asyncio.Event()

    # --- startup ------------------------------------------------------------------

    def open(self) -> None:
        """Check the data dir, recover the WAL and the latest snapshot, build the replica."""
        cfg = self.cfg
        try:
            makedirs_durable(cfg.data_dir)
            probe = os.path.join(cfg.data_dir, ".write-probe")
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.unlink(probe)
        except OSError as e:
            raise NodeError(f"data dir {cfg.data_dir} is not writable: {e.strerror or e}") from None
        self._check_identity()
        try:
            self.wal, raw = WAL.open(os.path.join(cfg.data_dir, "wal"), fsync=cfg.fsync,
                                     segment_bytes_max=cfg.segment_bytes_max, stream=True)
        except WALCorruption as e:
            raise NodeError(f"refusing to start: {e}") from None
        except WALError as e:
            raise NodeError(f"cannot open the write-ahead log: {e}") from None
        snap_dir = os.path.join(cfg.data_dir, "snapshots")
        makedirs_durable(snap_dir)
        try:
            snap = load_latest(snap_dir)
        except SnapshotUnsupported as e:
            raise NodeError(f"refusing to start: {e}; a newer build wrote it (move the file away only if "
                            f"it is damaged)") from None
        # A snapshot with live records restates every WAL record up to its seq: replay
        # those records, then the WAL after seq. Without them: the whole WAL.
        after = snap.seq if snap is not None and snap.live else 0
        self._check_wal_reaches(snap, after)
        snapshot = None
        records = []
        if snap is not None:
            meta = msgpack.unpackb(snap.meta, raw=False, strict_map_key=False)
            snapshot = (meta, snap.body)
            self._snap_bytes = _served_image(snap)
            self._snap_slot = meta.get("slot", 0)
            self._snap_seqs.append(after or None)
            if snap.live:
                try:
                    records = list(msgpack.unpackb(snap.live, raw=False, strict_map_key=False))
                except Exception as e:
                    raise NodeError(f"refusing to start: undecodable live records in the snapshot at slot "
                                    f"{self._snap_slot} in {snap_dir}: {e}") from None
        if after and self.wal.last_seq < after:
            # The WAL lost records the snapshot restates (fsync never and a power loss):
            # what it holds is all older than the snapshot. New records must come after
            # seq, or the next recovery would skip them.
            for _ in raw:  # the stream is consumed before the WAL changes
                pass
            raw = iter(())
            try:
                keep_only(snap_dir, snap)  # the older snapshots need records this drops
                self.wal.restart_at(after + 1)
            except (WALError, OSError) as e:
                raise NodeError(f"cannot open the write-ahead log: {e}") from None
        for seq, payload in raw:
            if seq <= after:
                continue  # restated by the snapshot's live records
            try:
                records.append(msgpack.unpackb(payload, raw=False, strict_map_key=False))
            except Exception as e:
                raise NodeError(f"refusing to start: undecodable WAL record {seq} in {cfg.data_dir}/wal: {e}") from None
        cls = PROTOCOLS[cfg.protocol]
        rng = random.Random(hash((cfg.cluster_id, cfg.node_id, time.time_ns())))
        kwargs = {"snapshot": snapshot} if snapshot is not None else {}
        if (cfg.extra.get("fresh_epoch") and snapshot is not None and not records and self._snap_slot == 0
                and cfg.epoch > 0):
            # The first start of an epoch this process just stored (membership.py): like a
            # new cluster's first start, from the base state. No member has promised or
            # accepted anything in this epoch yet, so the epoch's first sequencer serves
            # its view at once; built from the snapshot, it would take itself for a
            # restarted sequencer and run an election (500 ms and more without writes).
            # A process restart takes the snapshot path and its restart rules.
            self.replica = cls(cfg.node_id, self.pcfg, self.sm_factory(), records=[], rng=rng)
            self.replica.executor.restore(snapshot[1])
        else:
            self.replica = cls(cfg.node_id, self.pcfg, self.sm_factory(), records=records, rng=rng, **kwargs)
        if getattr(self.replica, "execute_due", False):  # defer_execution: the replay
            self.replica.execute()  # nothing was sent yet: execute what the log holds now, as before
        log.info("node %d recovered %d WAL records%s", cfg.node_id, len(records),
                 f" on top of a snapshot at slot {self._snap_slot}" if snapshot else "")

    def _check_wal_reaches(self, snap: Snapshot | None, after: int) -> None:
        """Refuse to start on a WAL that no longer holds the records recovery needs:
        every record after ``after`` (the snapshot's seq when it has live records;
        the WAL is compacted only up to the older retained one's seq). A WAL that
        starts later lost them: its older segments were compacted against snapshots
        that are gone or damaged, and replaying it on top of what is left would start
        a replica without acknowledged writes and promises. (A snapshot without live
        records was written by a build that appended them to the WAL after it, so the
        log may start anywhere below: nothing to check.)"""
        first = self.wal.first_seq  # last_seq + 1 when empty: where the next record goes
        if snap is not None and not snap.live:
            return
        if first > after + 1:
            where = (f"the snapshot at slot {snap.slot} restates only up to seq {after}" if snap is not None
                     else "no intact snapshot restates them")
            raise NodeError(f"refusing to start: the write-ahead log in {self.cfg.data_dir}/wal starts at seq "
                            f"{first} and {where}: records {after + 1}..{first - 1} are missing (compacted "
                            f"against a snapshot that is gone or damaged)")

    def _check_identity(self) -> None:
        cfg = self.cfg
        path = os.path.join(cfg.data_dir, IDENTITY_FILE)
        mine = {"cluster_id": cfg.cluster_id, "node_id": cfg.node_id, "replicas": len(cfg.peers), "protocol": cfg.protocol}
        if cfg.machine != "kv":  # absent means kv: data dirs made before machines existed
            mine["machine"] = cfg.machine
        if os.path.exists(path):
            try:
                with open(path) as f:
                    theirs = json.load(f)
            except (OSError, ValueError) as e:
                raise NodeError(f"{path} is unreadable: {e}") from None
            mine.setdefault("machine", "kv")
            theirs.setdefault("machine", "kv")
            for key, value in mine.items():
                if theirs.get(key) != value:
                    raise NodeError(
                        f"data dir {cfg.data_dir} belongs to {key}={theirs.get(key)!r}, not {value!r} "
                        f"(use another --data-dir or the original settings)"
                    )
            return
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(mine, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    async def start(self) -> None:
        if self.replica is None:
            self.open()
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        self.committer = GroupCommitter(self.wal, inline=cfg.fsync_worker == "loop",
                                        process=cfg.fsync_worker == "process")
        # Frames that waited longer than two election timeouts for a connection have been
        # superseded by retransmissions: not replayed (tcp module docstring).
        ssl_peers: dict[str, Any] = {}
        if cfg.tls:
            assert cfg.tls_ca and cfg.tls_cert and cfg.tls_key
            ssl_peers = {"ssl_server": tls.peer_server_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key),
                         "ssl_client": tls.peer_client_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)}
        self.transport = PeerTransport(cfg.cluster_id, cfg.node_id, cfg.peers, self._on_peer_frames, **ssl_peers,
                                       rng=random.Random(cfg.node_id * 7919 + time.time_ns()),
                                       queue_wait_max_s=max(1.0, 2 * cfg.election_ms / 1000),
                                       keepalive_s=cfg.heartbeat_ms / 1000,
                                       dead_after_s=max(2 * cfg.election_ms, 4 * cfg.heartbeat_ms) / 1000,
                                       on_fatal=lambda e: self._fail(f"internal error handling peer messages: {_describe(e)}", e),
                                       cert_ids={i: cfg.cert_id(i) for i in cfg.peers} if cfg.members else None)
        host, port = cfg.peers[cfg.node_id]
        try:
            await self.transport.start(host, port)
        except OSError as e:
            await self._close_storage()
            raise NodeError(f"cannot listen for peers on {host}:{port}: {e.strerror or e}") from None
        chost, cport = cfg.client_address
        try:
            if cfg.tls:
                listener = tls.TLSListener(self.client_ssl_context(), lambda: _ClientConn(self), self._client_tls_refused,
                                           plain_factory=lambda: _PlainOnTLSPort(self), pending_max=256)
                self._client_server = await listener.start(chost, cport)  # type: ignore[assignment]
            else:
                self._client_server = await loop.create_server(lambda: _ClientConn(self), chost, cport)
        except OSError as e:
            await self.transport.close()
            await self._close_storage()
            raise NodeError(f"cannot listen for clients on {chost}:{cport}: {e.strerror or e}") from None
        self._t0 = time.monotonic()
        self._timer_due = self._t0 + cfg.tick_ms / 1000
        if cfg.extra.get("clock_control"):
            from consensus.runtime.clock_control import ClockControl

            self._clock = ClockControl(cfg.extra["clock_control"], self._t0)
        self._tick_handle = loop.call_later(cfg.tick_ms / 1000, self._on_timer)
        stall_ms = threshold_from_env()
        if stall_ms is not None:  # a debugging aid (stalls.py)
            self._stall_tracer = StallTracer(log_path(cfg.data_dir, cfg.node_id), lambda: self._timer_due, stall_ms)
            self._stall_tracer.start()
        self._kick()
        log.info("node %d (%s) peers on %s:%d, clients on %s:%d%s", cfg.node_id, cfg.protocol, host, port, chost, cport,
                 " (TLS)" if cfg.tls else "")

    def client_ssl_context(self) -> Any:
        """The server context of the client port and the HTTP API (TLS on only)."""
        cfg = self.cfg
        assert cfg.tls_ca and cfg.tls_cert and cfg.tls_key
        return tls.client_port_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)

    def _client_tls_refused(self, peername: Any, reason: str) -> None:
        self.stats["client_tls_refused"] += 1
        log.info("client connection %s refused: %s", peername, reason)

    async def stop(self) -> None:
        """Stop serving and close everything, bounded; ``stopped`` is set even if a
        step fails (a stuck shutdown must not look like a live node)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            if self._stall_tracer is not None:
                self._stall_tracer.stop()
            if self._tick_handle is not None:
                self._tick_handle.cancel()
            if self._client_server is not None:
                self._client_server.close()
            for conn in list(self._clients):
                conn.abort()
            self._local.abort()
            if self.transport is not None:
                try:
                    await self.transport.close()
                except Exception as e:  # bounded by its own timeout; keep shutting down
                    log.info("node %d: closing the peer transport: %r", self.cfg.node_id, e)
            task = self._snap_task
            if self._snap_child:
                try:
                    os.kill(self._snap_child, 9)  # its waiter reaps it
                except ProcessLookupError:
                    pass
            if task is not None and task is not asyncio.current_task():
                await asyncio.wait([task], timeout=10)
            await self._close_storage()
        finally:
            self.stopped.set()

    async def _close_storage(self) -> None:
        if self.committer is not None:
            try:
                await asyncio.wait_for(self.committer.close(), 10)
            except Exception:  # already failed: nothing more to flush
                pass
        if self.wal is not None:
            try:
                self.wal.close()
            except (WALError, OSError, AssertionError):  # a failed WAL cannot sync any more
                pass

    # --- crash-only -------------------------------------------------------------------

    @property
    def _down(self) -> bool:
        return self._stopping or self._failed is not None

    def _fail(self, reason: str, exc: BaseException | None = None) -> None:
        """Stop because something failed that we cannot reason about (module docstring).

        Called on the loop thread. From here on nothing reaches the core and nothing
        more is sent or answered, not even output that was waiting for an fsync: not
        sending is always safe, and it is what a crash would do."""
        if self._failed is not None:
            return
        self._failed = exc if exc is not None else RuntimeError(reason)
        self.failure = reason
        report = self._write_crash_report(reason, exc)
        if report:
            self.failure = f"{reason} (traceback in {report})"
        log.info("node %d stopping: %s", self.cfg.node_id, self.failure)
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self._stop_task = asyncio.get_running_loop().create_task(self.stop())

    def _core_failed(self, call: str, exc: BaseException) -> None:
        self._fail(f"core raised {_describe(exc)} (in {call})", exc)

    def _write_crash_report(self, reason: str, exc: BaseException | None) -> str | None:
        """Best effort: the traceback goes to a file, not to stderr (one line there)."""
        path = os.path.join(self.cfg.data_dir, "crash.log")
        try:
            with open(path, "a") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} node {self.cfg.node_id}: {reason}\n")
                if exc is not None:
                    f.write("".join(traceback.format_exception(exc)))
        except OSError:
            return None
        return path

    # --- inputs ---------------------------------------------------------------------

    def _on_timer(self) -> None:
        if self._down:
            return
        now = time.monotonic()
        self.loop_lag.record(now, now - self._timer_due)
        tick_s = self.cfg.tick_ms / 1000
        clock = self._clock
        if clock is not None:  # testing only: a clock at a set rate
            clock.poll(now)
        if not self._installing:  # ticks are not dropped: they arrive after the install
            if clock is None:
                due = int((time.monotonic() - self._t0) / tick_s)
            else:
                due = int(clock.elapsed(time.monotonic()) / tick_s)
            replica = self.replica
            try:
                while self._ticks_done < due:
                    self._ticks_done += 1
                    replica.tick()
            except Exception as e:
                self._core_failed("tick", e)
                return
        try:
            self._check_pull()
            view = self.replica.view
            if view != self._logged_view:
                self._logged_view = view
                st = self.replica.status()
                log.info("node %d: view %d, sequencer %s", self.cfg.node_id, view, st.get("sequencer", st.get("leader")))
            if now >= self._client_sweep_due:
                self._client_sweep_due = now + 1.0
                self._sweep_clients(now)
        except Exception as e:
            self._fail(f"internal error in the tick timer: {_describe(e)}", e)
            return
        self._kick()
        now = time.monotonic()
        if clock is None:
            delay = max(0.0, self._t0 + (self._ticks_done + 1) * tick_s - now)
        else:
            delay = clock.real_delay((self._ticks_done + 1) * tick_s, now)
        self._timer_due = now + delay
        self._tick_handle = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _sweep_clients(self, now: float) -> None:
        """Close client connections that hold a half-sent frame for ``client_frame_s``,
        or that sent nothing for ``client_idle_s`` and wait for no answer."""
        cfg = self.cfg
        busy: set[int] | None = None
        for conn in list(self._clients):
            if conn.closed:
                continue
            if conn.partial_since and now - conn.partial_since >= cfg.client_frame_s:
                self.stats["client_frame_timeouts"] += 1
                log.warning("client connection closed: a frame unfinished for %.0f s", now - conn.partial_since)
                conn.abort()
            elif now - conn.last_rx >= cfg.client_idle_s:
                if busy is None:
                    busy = {id(c) for c in self._waiters.values()}
                if id(conn) not in busy:
                    self.stats["client_idle_closed"] += 1
                    conn.close()

    def _on_peer_frames(self, peer: int, frames: list) -> None:
        """Frames from an authenticated peer. A ``ProtocolError`` (the peer's fault)
        closes that connection; anything else raised here reaches the transport's
        ``on_fatal`` and stops the node."""
        if self._down:
            return
        for frame in frames:
            if type(frame) is not list or len(frame) != 2 or type(frame[0]) is not int:
                self.stats["peer_bad_messages"] += 1
                raise ProtocolError("malformed", "peer frame is not [kind, payload]")
            kind, payload = frame
            if kind == ENVELOPE:
                if type(payload) is not list:
                    raise ProtocolError("malformed", "envelope is not a list")
                try:
                    msgs = [decode_message(m) for m in payload]
                except RemoteProtocolError as e:
                    self.stats["peer_bad_messages"] += 1
                    raise ProtocolError("malformed", str(e)) from None
                received = self.messages_received
                for m in msgs:
                    received[type(m)] += 1
                if self._installing:
                    self._hold(peer, msgs)
                    continue
                try:
                    self.replica.step(peer, msgs)
                except Exception as e:
                    self._core_failed("step", e)
                    return
            elif kind == SNAP_PULL:
                self._serve_snapshot(peer, payload)
            elif kind == SNAP_CHUNK:
                self._on_snapshot_chunk(peer, payload)
            elif kind == SNAP_NONE:
                if self._pull is not None and self._pull[0] == peer:
                    self._pull = None
            else:
                self.stats["peer_bad_messages"] += 1
                raise ProtocolError("malformed", f"unknown peer frame kind {kind}")
        self._kick()

    def _on_client_frame(self, conn: _ClientConn, requests: list) -> None:
        if self._down:
            conn.abort()
            return
        replica = self.replica
        for kind, client, seq, op in requests:
            reconfig = False
            if kind == clientwire.STATUS:
                try:
                    st = self.status(digest=not (type(op) is dict and op.get("digest") is False))
                except Exception as e:
                    self._core_failed("status", e)
                    return
                conn.reply([client, seq, clientwire.OK, st])
                continue
            if kind == clientwire.ADMIN:
                if (self.cfg.tls and not getattr(conn, "admin", True)  # in-process callers are trusted
                        and not (getattr(conn, "node_cert", False) and type(op) is list and op
                                 and op[0] in ("epoch", "epoch_base", "epoch_notice"))):
                    self.stats["admin_refused"] += 1
                    log.warning("admin request %.60r refused: the client has no admin certificate", op)
                    conn.reply([client, seq, clientwire.ERROR, clientwire.PERMISSION_DENIED + ": admin requests need "
                                "the admin client certificate (OU=cellar-admin; --cert/--key)"])
                    continue
                if not (type(op) is list and op and op[0] == "reconfig"):
                    conn.reply(self._admin(client, seq, op))
                    continue
                op = self._reconfig_command(op)
                if type(op) is str:
                    self.stats["refused_invalid"] += 1
                    conn.reply([client, seq, clientwire.ERROR, op])
                    continue
                kind, reconfig = clientwire.CALL, True  # through the log, answered when executed
            elif type(op) is list and op and op[0] == RECONFIG:
                # Only the admin path proposes a membership change (cellar member).
                self.stats["refused_invalid"] += 1
                conn.reply([client, seq, clientwire.ERROR, "InvalidRequest: a membership change is an admin "
                            "request (cellar member add|remove)"])
                continue
            if self.epoch_ended is not None:
                conn.reply([client, seq, clientwire.ERROR,
                            f"busy: the cluster is moving to epoch {self.epoch_ended.epoch}; retry"])
                continue
            if not reconfig:
                try:
                    if self._stamp is not None:
                        op = self._stamp(op, int(time.time() * 1000))
                    error = self._validate(op) if self._validate is not None else None
                except Exception as e:  # noqa: BLE001 - the machine's check raised on a client's value
                    error = self._malformed(op, e)
                if error is not None:
                    self.stats["refused_invalid"] += 1
                    conn.reply([client, seq, clientwire.ERROR, error])
                    continue
            if self._installing or len(self._waiters) >= WAITERS_MAX or replica.backlog >= PENDING_MAX:
                self.stats["refused_busy"] += 1
                conn.reply([client, seq, clientwire.ERROR, "busy: retry later"])
                continue
            is_read = kind == clientwire.READ and hasattr(replica, "read")
            if is_read:
                try:
                    key = self._read_key(op)
                except Exception as e:  # noqa: BLE001 - as above
                    self.stats["refused_invalid"] += 1
                    conn.reply([client, seq, clientwire.ERROR, self._malformed(op, e)])
                    continue
                if key is None:
                    conn.reply([client, seq, clientwire.ERROR, "not a read-only operation: send it as a call"])
                    continue
            self._waiters[(client, seq)] = conn
            try:
                if is_read:
                    replica.read(client, seq, op, key)
                else:
                    replica.propose(client, seq, op, needs_result=kind != clientwire.WRITE)
            except Exception as e:
                self._core_failed("read" if is_read else "propose", e)
                return
        self._kick()
        if self._dirty_clients:  # status and refusals; answers to commands wait in the outbox
            self._flush_clients()

    @staticmethod
    def _malformed(op: Any, exc: Exception) -> str:
        """A client's operation on which the machine's stamper, validator or read_key
        raised: that request's error, never the replica's (one malformed request,
        retried on each replica in turn, stopped a whole cluster)."""
        log.warning("refused a malformed operation %s: %s: %s", reprlib.repr(op), type(exc).__name__, exc)
        return f"InvalidRequest: malformed operation ({type(exc).__name__}: {str(exc)[:80]})"

    def _reconfig_command(self, op: list) -> list | str:
        """``["reconfig", members, sequencer, epoch]`` (admin; ``epoch``: the one the
        members were read at, refused as stale if older than ours) -> the core's
        command, or why not."""
        if self.cfg.protocol != "sdpaxos":
            return f"InvalidRequest: {self.cfg.protocol} does not change membership (SDPaxos does)"
        if len(op) != 4:  # the epoch is required: without it a retry could undo a newer change
            return "InvalidRequest: reconfig is [\"reconfig\", [NAME=HOST:PORT, ...], SEQUENCER, EPOCH]"
        # The epoch the members were read at: a list computed from an older epoch must
        # not close a newer one (it would undo the change in between).
        if type(op[3]) is not int:
            return "InvalidRequest: reconfig's EPOCH is the epoch the members were read at (a number)"
        if op[3] < self.cfg.epoch:
            return (f"InvalidRequest: stale: the members were read at epoch {op[3]}, and the cluster is at "
                    f"epoch {self.cfg.epoch}; read them again")
        if op[3] > self.cfg.epoch:
            return f"busy: this member is at epoch {self.cfg.epoch}, behind epoch {op[3]}; ask another"
        try:
            members = membership.check_members(op[1])
        except membership.MembershipError as e:
            return f"InvalidRequest: {e}"
        if self.cfg.tls:
            bad = [m for m in members if membership.tls_id(membership.member_name(m)) is None]
            if bad:
                return (f"InvalidRequest: with TLS a member's name is the replica id its certificate names "
                        f"(node-<id>, cellar certs init; a number of at most 9 digits, no leading zero): "
                        f"{bad[0]!r:.80}")
        sequencer = op[2]
        if type(sequencer) is str and "=" not in sequencer:  # a name: its member entry
            sequencer = next((m for m in members if membership.member_name(m) == sequencer), sequencer)
        command = [RECONFIG, self.cfg.epoch, members, sequencer]
        why = check_reconfig(command, self.cfg.epoch)
        return f"InvalidRequest: {why}" if why is not None else command

    def epoch_status(self) -> dict:
        cfg = self.cfg
        members = cfg.member_list()
        st = self.replica.status()
        seq = st.get("sequencer", st.get("leader"))
        name = membership.member_name(members[cfg.node_id])
        cluster = cfg.cluster_id.rpartition("@e")[0] if cfg.epoch else cfg.cluster_id
        return {"epoch": cfg.epoch, "members": list(members), "name": name, "cluster_id": cluster,
                "protocol": cfg.protocol,
                "member": membership.member_entry(name, cfg.peers[cfg.node_id], cfg.client_address),
                "sequencer": members[seq] if type(seq) is int and 0 <= seq < len(members) else None,
                "ended": self.epoch_ended is not None}

    def _admin(self, client: Any, seq: int, op: Any) -> list:
        """An operator action (clientwire.ADMIN); the answer to send."""
        replica = self.replica
        if type(op) is list and op and op[0] in ("epoch", "epoch_base", "epoch_notice"):
            return [client, seq, *self._admin_epoch(op)]
        if type(op) is list and len(op) == 2 and op[0] == "transfer_sequencer" and type(op[1]) is int:
            if not hasattr(replica, "transfer_sequencer"):
                return [client, seq, clientwire.ERROR, f"{self.cfg.protocol} has no sequencer handover"]
            try:
                ok = replica.transfer_sequencer(op[1])
            except Exception as e:
                self._core_failed("transfer_sequencer", e)
                return [client, seq, clientwire.ERROR, "the node stopped"]
            self._kick()
            st = replica.status()
            return [client, seq, clientwire.OK, {"ok": bool(ok), "sequencer": st.get("sequencer", st.get("leader"))}]
        if type(op) is list and op and op[0] in ("snapshot_info", "snapshot_take", "snapshot_chunk"):
            return [client, seq, *self._admin_snapshot(op)]
        return [client, seq, clientwire.ERROR, f"unknown admin operation {op!r:.60}"]

    def _admin_epoch(self, op: list) -> list:
        """Membership (consensus/runtime/membership.py): ``["epoch"]`` (where we are),
        ``["epoch_base"]`` (the base of our epoch, or of the next once ours ended: a
        newcomer or a member that missed END starts from it), ``["epoch_notice", e,
        [host, port]]`` (epoch ``e`` began; that replica has its base)."""
        if op[0] == "epoch" and len(op) == 1:
            return [clientwire.OK, self.epoch_status()]
        if op[0] == "epoch_base" and len(op) == 1:
            cluster = self.cfg.cluster_id.rpartition("@e")[0] if self.cfg.epoch else self.cfg.cluster_id
            if self.epoch_ended is not None:
                return [clientwire.OK, {"epoch": self.epoch_ended.epoch, "base": self.epoch_ended.pack(),
                                        "cluster_id": cluster}]
            if self.cfg.epoch_base is None:
                return [clientwire.ERROR, "epoch 0 has no base: this cluster never changed its members"]
            return [clientwire.OK, {"epoch": self.cfg.epoch, "base": self.cfg.epoch_base, "cluster_id": cluster}]
        if (op[0] == "epoch_notice" and len(op) == 3 and type(op[1]) is int and type(op[2]) is list
                and len(op[2]) == 2 and type(op[2][0]) is str and 0 < len(op[2][0]) <= 255
                and type(op[2][1]) is int and 0 < op[2][1] < 65536):  # checked: a raise here stops the node
            if op[1] > self.cfg.epoch and self.epoch_ended is None and self.on_epoch_notice is not None:
                self.on_epoch_notice(op[1], (op[2][0], op[2][1]))
            return [clientwire.OK, {"epoch": self.cfg.epoch}]
        return [clientwire.ERROR, f"malformed epoch operation {op!r:.60}"]

    def _admin_snapshot(self, op: list) -> list:
        """``cellar snapshot save``: ``["snapshot_info"]`` (our latest stored snapshot:
        slot and size; the executed slot), ``["snapshot_take"]`` (take one now, whatever
        ``snapshot_every`` says), ``["snapshot_chunk", slot, offset]`` (up to 1 MiB of
        that snapshot's file image; an error once a newer one replaced it)."""
        replica = self.replica
        data = self._snap_bytes
        if op[0] == "snapshot_info" and len(op) == 1:
            return [clientwire.OK, {"slot": self._snap_slot if data else None, "bytes": len(data) if data else 0,
                                    "exec_slot": getattr(replica, "exec_slot", 0), "taking": self._snap_task is not None}]
        if op[0] == "snapshot_take" and len(op) == 1:
            if type(replica).take_snapshot is ReplicaBase.take_snapshot:
                return [clientwire.ERROR, f"{self.cfg.protocol} replicas keep their whole log: no snapshots"]
            if self._snap_task is not None or self._installing:
                return [clientwire.OK, {"started": False, "reason": "a snapshot is being stored: ask again"}]
            if getattr(replica, "exec_slot", 0) <= self._snap_slot and data:
                return [clientwire.OK, {"started": False, "reason": "the latest snapshot is current"}]
            self._maybe_snapshot(now=True)
            return [clientwire.OK, {"started": self._snap_task is not None}]
        if op[0] == "snapshot_chunk" and len(op) == 3 and type(op[1]) is int and type(op[2]) is int:
            if not data or op[1] != self._snap_slot:
                return [clientwire.ERROR, f"no snapshot of slot {op[1]} here any more (now: {self._snap_slot}): start again"]
            if not 0 <= op[2] <= len(data):
                return [clientwire.ERROR, f"offset {op[2]} outside the snapshot's {len(data)} bytes"]
            return [clientwire.OK, {"slot": self._snap_slot, "bytes": len(data), "offset": op[2],
                                    "data": bytes(memoryview(data)[op[2]: op[2] + (1 << 20)])}]
        return [clientwire.ERROR, f"malformed snapshot operation {op!r:.60}"]

    def _refuse_too_large(self, conn: Any, requests: list) -> list:
        """Answer the requests of a big frame whose command is over the limit; the
        others go on."""
        keep = []
        for req in requests:
            size = len(msgpack.packb(req[3], use_bin_type=True))
            if size > clientwire.MAX_COMMAND_BYTES:
                self.stats["refused_too_large"] += 1
                conn.reply([req[1], req[2], clientwire.ERROR,
                            f"{clientwire.TOO_LARGE}: a command of {size} bytes exceeds the limit of "
                            f"{clientwire.MAX_COMMAND_BYTES} bytes"])
            else:
                keep.append(req)
        return keep

    def _read_key(self, op: Any) -> Any:
        """The machine's read key for ``op`` (None: not read-only). A machine without
        ``read_key`` (a test's): the old rule, the op's second element."""
        read_key = getattr(self.replica.executor.sm, "read_key", None)
        if read_key is not None:
            return read_key(op)
        return op[1] if type(op) is list and len(op) >= 2 else None

    # --- in-process callers (the HTTP API, embedding) ----------------------------------

    def submit(self, kind: int, client: Any, seq: int, op: Any) -> asyncio.Future:
        """One request as if it came from a client connection; the future gets
        ``(status, result)`` (``clientwire.OK`` / ``ERROR``) once the node answers,
        or ConnectionError if it stops first. ``client`` must send one command at a
        time with increasing ``seq`` (the executor's sessions drop anything older)."""
        fut = asyncio.get_running_loop().create_future()
        if self._down:
            fut.set_exception(ConnectionError("the node is stopped"))
            return fut
        self._local.futures[(client, seq)] = fut
        self._on_client_frame(self._local, [[kind, client, seq, op]])  # type: ignore[arg-type]
        return fut

    def forget(self, client: Any, seq: int) -> None:
        """The in-process caller gave up on ``(client, seq)`` (a timeout)."""
        self._local.futures.pop((client, seq), None)
        if self._waiters.get((client, seq)) is self._local:
            del self._waiters[(client, seq)]

    def local_query(self, op: Any) -> Any:
        """A serializable read: ``query`` on this replica's state, no log, no lease."""
        return self.replica.executor.sm.query(op)

    @property
    def machine(self) -> Any:
        return self.replica.executor.sm

    def peers_reachable(self) -> int:
        """Replicas this one is connected to, itself included."""
        if self.transport is None:
            return 1
        return 1 + sum(1 for p in self.cfg.peers if p != self.cfg.node_id and self.transport.is_connected(p))

    @property
    def quorum(self) -> int:
        return self.pcfg.quorum

    # --- effects ----------------------------------------------------------------------

    def _kick(self) -> None:
        if not self._scheduled and not self._down:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._process)

    def _process(self) -> None:
        """The driver sequence: one ``Ready`` per loop turn, carried out in this order.

        1. **Persist**: append ``rd.persist`` to the WAL (buffered; the ``always`` mode
           fsyncs here). A failed append (any exception: ``OSError``, ``WALError``, ...)
           stops the node before anything of this Ready leaves.
        2. **Send** ``rd.messages``, then 3. **reply** ``rd.replies``, but only once
           *every record appended so far* is durable, not just this Ready's: an ack
           the core emits lazily, a turn after the accept it vouches for, must still
           wait for that accept's fsync. If everything is already durable (and
           nothing older waits) they go out now; otherwise they wait in the outbox
           for the ``GroupCommitter``'s fsync, which releases entries strictly in
           Ready order, so later output never overtakes an earlier record. Each
           release hands the messages to the transport and writes them before the
           client replies. A failed fsync stops the node; nothing waiting is sent.
        4. **Install** a fetched peer snapshot, last (``_install_fetched``):
           ``install_snapshot`` → ``compact`` (our live records at the WAL's last
           seq) → store both durably in one file, with the core frozen from the
           install to the end (no step, tick, propose or ``ready()``: peer envelopes are
           held, ticks wait, clients hear "busy"). The next ``ready()``, whose output
           may rely on the installed state, therefore runs only once that state is
           durable (``consensus.core.ready``, the simulator's ``SimDisk`` order).

        Then bookkeeping that emits nothing itself: start fetching a snapshot the
        replica asked for (``rd.snapshot_from``) and take our own snapshot when due.

        5. **Execute after send** (``defer_execution``): once the Ready that carried
           the commits has left the outbox, what the replica committed is on its way
           to the peers; only then does it apply it (``replica.execute()``), and a
           second ``_carry_out`` takes the answers. So the peers apply a batch while
           this replica does, not after.
        """
        self._scheduled = False
        if self._down or self._installing:
            return
        try:
            self._carry_out()
            if self._execution_after_send():
                self._carry_out()  # the execution's answers and what it decided
        except Exception as e:  # a bug in the driver itself: same rule as the core's
            self._fail(f"internal error in the driver: {_describe(e)}", e)

    def _execution_sent(self) -> bool:
        """defer_execution: the Ready that carried the commits (WAL seq ``_exec_mark``,
        taken by ``_carry_out``) has left the outbox. Only that one, not the whole
        outbox: under load every turn's peer frames put a new Ready in the outbox,
        and waiting for it to be empty put off execution for as long as the load
        lasted (review 62)."""
        mark = self._exec_mark
        return mark is not None and (not self._outbox or self._outbox[0][0] > mark)

    def _execution_after_send(self) -> bool:
        """ProtocolConfig.defer_execution: once the commits' messages are sent
        (``_execution_sent``; ``_release`` has flushed the transport), have the
        replica execute what it committed. True if it did. With the commits still
        waiting for an fsync, ``_on_durable`` releases them and kicks us again."""
        if self._down or self._installing or not self._execution_sent():
            return False
        self._exec_mark = None
        if not getattr(self.replica, "execute_due", False):
            return False
        try:
            self.replica.execute()
        except Exception as e:
            self._core_failed("execute", e)
            return False
        return not self._down

    def _carry_out(self) -> None:
        try:
            rd = self.replica.ready()
        except Exception as e:
            self._core_failed("ready", e)
            return
        if rd.urgent:  # probes and echoes vouch for nothing stored: out now
            self._send_messages(rd.urgent)
            self.transport.flush()
        wal = self.wal
        # 1. persist
        if rd.persist:
            try:
                wal.append_many([msgpack.packb(r, use_bin_type=True) for r in rd.persist])
            except Exception as e:
                self._fail(f"write-ahead log append failed: {_describe(e)}", e)
                return
        seq = wal.last_seq
        if rd.token:
            self._tokens.append((seq, rd.token))
        if self._exec_mark is None and getattr(self.replica, "execute_due", False):
            self._exec_mark = seq  # this Ready (or an earlier one) carries the commits
        # 2. send and 3. reply, once durable
        if rd.messages or rd.replies:
            if not self._outbox and seq <= wal.durable_seq:
                self._release([(rd.messages, rd.replies)])
            else:
                self._outbox.append((seq, rd.messages, rd.replies))
                if not self._await_durable(seq):
                    return
        elif seq > wal.durable_seq:  # nothing waits, but a failure of this sync must stop us now
            if not self._await_durable(seq):
                return
        if self._down:
            return
        if self._tokens and self._tokens[0][0] <= wal.durable_seq:
            self._report_persisted(wal.durable_seq)  # already durable (--fsync never)
            if self._down:
                return
        if rd.epoch_end is not None and self._end_pending is None:
            self._end_pending = rd.epoch_end
        if self._end_pending is not None and self.epoch_ended is None:
            self._close_epoch()
            if self._down:
                return
        # 4. install a fetched snapshot
        if self._fetched is not None:
            self._install_fetched()
            if self._down or self._installing:
                return
        wanted = rd.snapshot_from
        if wanted is not None:
            self._start_pull(wanted)
        self._maybe_snapshot()

    def _await_durable(self, seq: int) -> bool:
        """Have ``_on_durable`` called once ``seq`` is durable. One waiter of ours at a
        time: when it fires it releases everything durable by then and waits again
        for the rest (a waiter per Ready piled up 65,536 of them while a snapshot's
        fsync held the disk, and the node stopped on CommitQueueFull). False if the
        node stopped."""
        if self._durable_waiting:
            return True
        self._durable_waiting = True  # before: the callback may run at once
        try:
            self.committer.on_durable(seq, self._on_durable)
        except Exception as e:
            self._durable_waiting = False
            self._fail(f"write-ahead log sync failed: {_describe(e)}", e)
            return False
        return True

    def _report_persisted(self, durable: int) -> None:
        """Tell the core which Readys' records are durable: it counts its own accepts
        towards a quorum only then (``consensus.core.ready``), and what that decides
        comes out of the next ``ready()``. Not while a fetched snapshot is being
        installed (the core is frozen): ``_store_installed`` reports it after."""
        if self._installing:
            return
        tokens = self._tokens
        token = 0
        while tokens and tokens[0][0] <= durable:  # bounded by the Readys in flight
            token = tokens.popleft()[1]
        if token:
            try:
                self.replica.persisted(token)
            except Exception as e:
                self._core_failed("persisted", e)
                return
            self._kick()

    def _on_durable(self, exc: BaseException | None) -> None:
        self._durable_waiting = False
        if self._down:
            return
        if exc is not None:  # a bare OSError is the write before the fsync (GroupCommitter._start_sync)
            what = "write" if isinstance(exc, OSError) else "fsync"
            self._fail(f"write-ahead log {what} failed: {_describe(exc)}", exc)
            return
        try:
            durable = self.wal.durable_seq
            self._report_persisted(durable)
            if self._down:
                return
            outbox = self._outbox
            batch = []
            while outbox and outbox[0][0] <= durable:  # bounded by the outbox
                _, messages, replies = outbox.popleft()
                batch.append((messages, replies))
            if batch:
                self._release(batch)
                if self._execution_sent():
                    self._kick()  # _process executes it
            if not self._down and self.wal.last_seq > self.wal.durable_seq:
                self._await_durable(self.wal.last_seq)  # what was appended since: wait again
            elif self._end_pending is not None and not self._outbox:
                self._close_epoch()  # END executed, and now every answer before it is out
        except Exception as e:  # the committer would only log it: stop instead
            self._fail(f"internal error releasing output: {_describe(e)}", e)

    def _release(self, batch: list) -> None:
        """Send every message of ``batch`` (Ready outputs, in order), then answer its
        clients."""
        transport = self.transport
        for messages, _ in batch:
            self._send_messages(messages)
        transport.flush()
        waiters = self._waiters
        for _, replies in batch:
            for r in replies:
                conn = waiters.pop((r.client, r.seq), None)
                if conn is not None:
                    if r.ok:
                        conn.reply([r.client, r.seq, clientwire.OK, r.result])
                    else:
                        conn.reply([r.client, r.seq, clientwire.ERROR, r.error])
        self._flush_clients()

    def _send_messages(self, messages: list) -> None:
        """One envelope per ``(dst, [msg, ...])`` (the caller flushes the transport)."""
        transport = self.transport
        sent = self.messages_sent
        for dst, msgs in messages:
            for m in msgs:
                sent[type(m)] += 1
            wire = [encode_message(m) for m in msgs]
            try:
                transport.send(dst, [ENVELOPE, wire])
            except ValueError:  # over a frame: one envelope per frame's worth
                self._send_split(dst, wire)

    def _flush_clients(self) -> None:
        dirty, self._dirty_clients = self._dirty_clients, []
        for conn in dirty:
            conn.flush()

    # --- snapshots --------------------------------------------------------------------

    def _maybe_snapshot(self, now: bool = False) -> None:
        """Take a snapshot every ``snapshot_every`` executed slots, or ``now`` (the admin
        request ``snapshot_take``) if anything was executed since the last one."""
        every = self.cfg.snapshot_every
        replica = self.replica
        if self._snap_task is not None or type(replica).take_snapshot is ReplicaBase.take_snapshot:
            return
        if not now and (not every or getattr(replica, "exec_slot", 0) < self._next_snapshot_slot(every)):
            return
        if self.cfg.snapshot_fork and hasattr(os, "fork"):
            if time.monotonic() >= self._snap_retry_at:
                self._fork_snapshot()
            return
        try:
            taken = replica.take_snapshot()
        except Exception as e:
            self._core_failed("take_snapshot", e)
            return
        if taken is None:
            return
        meta, state = taken
        try:  # now, at the snapshot's seq (the previous snapshot, which it drops to, is stored)
            live = replica.compact(meta)
        except Exception as e:
            self._core_failed("compact", e)
            return
        self._snap_slot = meta["slot"]
        snap = Snapshot(self.wal.last_seq, msgpack.packb(meta, use_bin_type=True), state, slot=meta["slot"],
                        live=msgpack.packb(live, use_bin_type=True))
        self._snap_task = asyncio.get_running_loop().create_task(self._save_own_snapshot(snap, meta))

    def _next_snapshot_slot(self, every: int) -> int:
        """The executed slot at which our next snapshot is due: the first ``k * every +
        phase`` (``k >= 1``) above our last snapshot, the phase ``id * every / n``. So the
        replicas of a cluster snapshot at slots a third (a fifth) of an interval apart,
        never together: a snapshot costs its replica a few milliseconds of loop (the
        fork, the compaction), and a write that met every replica's at once waited for
        them in turn (p99.9 52-82 ms against 27 ms without snapshots, docs/runtime.md).
        At most ``every`` slots apart, and ``every + phase`` for the first."""
        n = getattr(self.replica, "n", 1) or 1
        phase = (self.cfg.node_id % n) * every // n
        k = max(1, (self._snap_slot - phase) // every + 1)
        return k * every + phase

    def _fork_snapshot(self) -> None:
        """``take_snapshot`` in a forked child, which sees the replica exactly as it is
        now (copy-on-write) while this process goes on serving: the child encodes the
        state and writes a synced temporary image, then ``_save_forked_snapshot``
        stores it as ``_save_own_snapshot`` would (after the records up to it are
        durable) and compacts. The child runs only pure code and ``os`` calls, and
        leaves with ``os._exit`` (no atexit handlers, no buffered output)."""
        directory = os.path.join(self.cfg.data_dir, "snapshots")
        makedirs_durable(directory)
        seq = self.wal.last_seq
        self._snap_forks += 1
        tmp = os.path.join(directory, f"snap-fork-{self._snap_forks}.snap.tmp")
        replica = self.replica
        t0 = time.thread_time()
        if self.gc_freeze:
            # Everything the child shares is out of the collector's reach: a young
            # collection in this process while the child runs would otherwise write
            # the headers of shared objects, copying their pages (copy-on-write).
            gc.freeze()
        self._stall_note("fork")
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                gc.disable()  # a collection would touch (copy) every page of the parent's heap
                snapshot_child_priority(parent)
                taken = replica.take_snapshot()
                if taken is None:
                    code = 3
                else:
                    meta, state = taken
                    # The live records as of seq, from this copy: the parent only drops its
                    # old log (compact(live=False)) and never writes them to its WAL.
                    live = msgpack.packb(replica.compact(meta), use_bin_type=True)
                    write_file_synced(tmp, encode_snapshot(
                        Snapshot(seq, msgpack.packb(meta, use_bin_type=True), state, slot=meta["slot"], live=live)))
                    code = 0
            except BaseException:
                try:
                    os.write(2, f"cellar snapshot child: {traceback.format_exc()}".encode(errors="replace"))
                except BaseException:
                    pass
            finally:
                os._exit(code)
        self._loop_step("fork", t0)
        self._stall_note("forked")
        self._snap_child = pid
        self.stats["snapshot_forks"] += 1
        loop = asyncio.get_running_loop()
        self._snap_task = loop.create_task(self._save_forked_snapshot(pid, tmp, directory))
        self._snap_promote = loop.call_later(SNAPSHOT_IDLE_S, self._promote_snapshot_child, pid)

    def _promote_snapshot_child(self, pid: int) -> None:
        """The idle-class child has not finished in ``SNAPSHOT_IDLE_S``: the machine has
        had no idle CPU that long. It goes on at nice 10 so that the log, which only a
        snapshot lets us drop, stays bounded under a sustained overload."""
        if self._snap_child == pid:
            try:
                os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, pid, 10)
            except (AttributeError, OSError):
                return
            self._promote_autogroup(pid, AUTOGROUP_TRIES)
            self.stats["snapshot_child_promoted"] += 1
            log.info("node %d: the snapshot child had no idle CPU for %.0f s; running it at nice 10",
                     self.cfg.node_id, SNAPSHOT_IDLE_S)

    def _promote_autogroup(self, pid: int, tries: int) -> None:
        """The child's own autogroup to nice 10, again a little later while the kernel's
        rate limit refuses it (at 19, the promotion would not lift the child at all)."""
        if self._snap_child == pid and not _set_autogroup_nice(str(pid), 10) and tries > 1:
            self._snap_promote = asyncio.get_running_loop().call_later(
                AUTOGROUP_RETRY_S, self._promote_autogroup, pid, tries - 1)

    async def _save_forked_snapshot(self, pid: int, tmp: str, directory: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            code = await loop.run_in_executor(None, _exit_code, pid)
            self._snap_child = 0
            if self._snap_promote is not None:
                self._snap_promote.cancel()
                self._snap_promote = None
            self._stall_note("snapshot child exited")
            if self._down:
                return
            if code == 3:  # nothing to snapshot yet (N = 5: a slot executed before its commit)
                self._snap_retry_at = time.monotonic() + 0.1
                return
            if code != 0:
                raise OSError(f"the snapshot process failed (exit status {code}; its error is in the log)")
            data, snap = await loop.run_in_executor(None, _read_snapshot_file, tmp)
            meta = msgpack.unpackb(snap.meta, raw=False)
            if await self._keep_snapshot(snap, meta, data, lambda: place_snapshot(directory, tmp, snap, keep=2)):
                self.stats["snapshots_taken"] += 1
                self._kick()
        except Exception as e:  # a failed write of durable state: never carry on
            if not self._down:
                self._fail(f"storing a snapshot failed: {_describe(e)}", e)
        finally:
            self._stop_snapshot_child()
            self._snap_task = None

    def _stop_snapshot_child(self) -> None:
        """End our snapshot child if it still runs (we are stopping), by its pid."""
        pid, self._snap_child = self._snap_child, 0
        if self._snap_promote is not None:
            self._snap_promote.cancel()
            self._snap_promote = None
        if pid:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    async def _save_own_snapshot(self, snap: Snapshot, meta: dict) -> None:
        """The on-loop path (``snapshot_fork = false``): ``take_snapshot`` and ``compact``
        (done, at the snapshot's seq) → store the snapshot with its live records once
        that seq is durable → drop WAL segments. The core keeps running meanwhile."""
        try:
            directory = os.path.join(self.cfg.data_dir, "snapshots")
            image = encode_snapshot(snap)
            if await self._keep_snapshot(snap, meta, image, lambda: write_snapshot(directory, snap, keep=2, image=image),
                                         compacted=True):
                self.stats["snapshots_taken"] += 1
                self._kick()
        except Exception as e:  # a failed write of durable state: never carry on
            if not self._down:
                self._fail(f"storing a snapshot failed: {_describe(e)}", e)
        finally:
            self._snap_task = None

    async def _keep_snapshot(self, snap: Snapshot, meta: dict, image: bytes, store: Callable[[], Any], *,
                             installed: bool = False, compacted: bool = False) -> bool:
        """Store a snapshot (``store`` writes ``image``, in a worker thread), let the core
        drop its old log (unless ``compacted`` already, when its live records were
        made), then delete the WAL segments no retained snapshot needs; False if we
        stopped on the way. ``snap.live`` restates every record up to ``snap.seq``, so
        nothing is appended to the WAL. Our own snapshot is stored only once every
        record up to it is durable: its state may reflect records not yet on disk (a
        slot executed on its own accept), and stored before them it could outlive them
        after a power loss (review 9). A peer's snapshot (``installed``) was durable at
        the peer, and its live records are ours, made while the core is frozen."""
        if not installed:
            await self.committer.durable(snap.seq)
            if self._down:
                return False
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, store)
        if self._down:
            return False
        served = await loop.run_in_executor(None, _served_image, snap) if snap.live else image
        if self._down:
            return False
        self._snap_bytes = served
        self._snap_slot = max(self._snap_slot, meta["slot"])
        if not compacted:
            t0 = time.thread_time()
            self._stall_note("compact")
            held = self._hold_log()
            try:
                self.replica.compact(meta, live=False)
            except Exception as e:
                self._core_failed("compact", e)
                return False
            self._loop_step("compact", t0)
            self._stall_note("compacted")
            self._release_later(held)
        t0 = time.thread_time()
        if installed:  # the only snapshot now (keep=1)
            self._snap_seqs.clear()
        self._snap_seqs.append(snap.seq if snap.live else None)
        # Keep what the older retained snapshot needs (load_latest may fall back to it):
        # the records after its seq, or the whole WAL if it has no live records.
        if len(self._snap_seqs) == 2 and self._snap_seqs[0] is not None:
            self.wal.compact(self._snap_seqs[0])
        self._loop_step("wal_compact", t0)
        self._stall_note("wal compacted")
        if self.gc_freeze:
            # What survived until now (the state, the log) is long-lived: out of the
            # collector's reach, so no collection walks it (docs/runtime.md, GC).
            t0 = time.thread_time()
            gc.freeze()
            self._loop_step("gc_freeze", t0)
        return True

    def _close_epoch(self) -> None:
        """Our replica executed END: once every record is durable and every answer out,
        the next epoch's base is ours (the same at every member) and the driver
        (``on_epoch_end``) moves this process to it. Commands still waiting were not
        executed in this epoch: their clients retry, in the next one."""
        if self._down or self.epoch_ended is not None:
            return
        if self._outbox or self.wal.last_seq > self.wal.durable_seq:
            return  # _on_durable calls again once the outbox is released
        _slot, (epoch, members, sequencer) = self._end_pending  # type: ignore[misc]
        base = EpochBase(epoch + 1, tuple(members), sequencer, self.replica.executor.base_state())
        self.epoch_ended = base
        log.info("node %d: epoch %d ended; next: %d members %s, sequencer %s", self.cfg.node_id, epoch,
                 len(members), ", ".join(members), sequencer)
        message = f"busy: the cluster is moving to epoch {base.epoch}; retry"
        for (client, seq), conn in list(self._waiters.items()):
            conn.reply([client, seq, clientwire.ERROR, message])
        self._waiters.clear()
        self._flush_clients()
        if self.on_epoch_end is not None:
            self.on_epoch_end(base)

    def _stall_note(self, label: str) -> None:
        if self._stall_tracer is not None:
            self._stall_tracer.note(label)

    def _hold_log(self) -> list:
        """References to every entry of the core's log (C-instances, O-slots), taken
        just before ``compact`` drops the old ones: freeing 5,000 slots of commands
        at once took 95-100 ms of loop CPU. The entries ``compact`` drops then live on
        here only, and ``_release_later`` frees them a slice per loop turn. Nothing
        the core sees changes (an object's lifetime is not part of its state)."""
        replica = self.replica
        held: list = []
        for log in getattr(replica, "clog", ()):
            held.extend(log.values())
        oslots = getattr(replica, "oslots", None)
        if oslots is not None:
            held.extend(oslots.values())
        return held

    def _release_later(self, held: list) -> None:
        """Drop ``held`` (``_hold_log``) ``RELEASE_SLICE`` entries per loop turn, from
        the end (the newest entries, most of them still in the core's log and cheap
        to let go of, go first; each slice is bounded either way)."""
        if held:
            self._releasing += 1
            asyncio.get_running_loop().call_soon(self._release_slice, held)

    def _release_slice(self, held: list) -> None:
        # A bound method with its list as an argument, not a closure that calls itself:
        # such a closure is a reference cycle, and the gc.freeze() right after a
        # snapshot would keep it (and its cells) out of the collector's reach for good
        # once the release is done (review 16).
        t0 = time.thread_time()
        del held[-RELEASE_SLICE:]
        self._loop_step("release", t0)
        if held:
            asyncio.get_running_loop().call_soon(self._release_slice, held)
        else:
            self._releasing -= 1
            self._stall_note("old log released")

    def _loop_step(self, name: str, t0: float) -> None:
        """Record the CPU time this thread spent in one snapshot step since ``t0``."""
        ms = (time.thread_time() - t0) * 1000.0
        if ms > self.snapshot_loop_ms.get(name, -1.0):
            self.snapshot_loop_ms[name] = round(ms, 3)

    def _install_fetched(self) -> None:
        """Step 4 of ``_process``: adopt the fetched snapshot and freeze the core until
        it is compacted and stored (``consensus.core.sdpaxos.install_snapshot``)."""
        assert self._fetched is not None
        peer, snap, meta = self._fetched
        self._fetched = None
        if self._snap_task is not None:
            return  # our own snapshot is being stored; the replica asks again
        try:
            installed = self.replica.install_snapshot(meta, snap.body)
        except Exception as e:
            self._core_failed("install_snapshot", e)
            return
        if not installed:  # we got there by ourselves meanwhile
            return
        self._installing = True
        try:  # the core is frozen from here until stored: these restate our log at last_seq
            live = self.replica.compact(meta)
        except Exception as e:
            self._core_failed("compact", e)
            return
        mine = Snapshot(self.wal.last_seq, snap.meta, snap.body, slot=meta["slot"],
                        live=msgpack.packb(live, use_bin_type=True))
        self._snap_task = asyncio.get_running_loop().create_task(self._store_installed(peer, mine, meta))

    async def _store_installed(self, peer: int, snap: Snapshot, meta: dict) -> None:
        try:
            directory = os.path.join(self.cfg.data_dir, "snapshots")
            # A peer's snapshot does not pair with our older ones (we never had the log
            # between them): keep only it.
            image = encode_snapshot(snap)
            await self._keep_snapshot(snap, meta, image, lambda: write_snapshot(directory, snap, keep=1, image=image),
                                      installed=True, compacted=True)
        except Exception as e:  # the core already moved on to state that is not durable
            if not self._down:
                self._fail(f"storing the snapshot installed from node {peer} failed: {_describe(e)}", e)
            return
        finally:
            self._snap_task = None
        if self._down:
            return
        self.stats["snapshots_installed"] += 1
        self._installing = False
        self._report_persisted(self.wal.durable_seq)
        if self._down:
            return
        self._feed_held()
        self._kick()

    def _send_split(self, dst: int, wire: list) -> None:
        """Send ``wire`` (encoded messages) as several envelopes, each under a frame.
        A single message over a frame cannot go: counted and logged (the core's batch
        limits keep C-accepts far below it; see clientwire.MAX_COMMAND_BYTES)."""
        self.stats["peer_envelopes_split"] += 1
        budget = MAX_FRAME_BYTES - 64
        part: list = []
        used = 0
        for m in wire:
            size = len(msgpack.packb(m, use_bin_type=True))
            if size > budget:
                self.stats["peer_messages_oversized"] += 1
                log.warning("a message to node %d of %d bytes exceeds a frame: not sent", dst, size)
                continue
            if part and used + size > budget:
                self.transport.send(dst, [ENVELOPE, part])
                part, used = [], 0
            part.append(m)
            used += size
        if part:
            self.transport.send(dst, [ENVELOPE, part])

    def _hold(self, peer: int, msgs: list) -> None:
        if len(self._held) < HELD_ENVELOPES_MAX:
            self._held.append((peer, msgs))
        else:  # safe: the network may lose messages
            self.stats["peer_envelopes_dropped"] += 1

    def _feed_held(self) -> None:
        held, self._held = self._held, deque()
        replica = self.replica
        while held:  # bounded by HELD_ENVELOPES_MAX
            peer, msgs = held.popleft()
            try:
                replica.step(peer, msgs)
            except Exception as e:
                self._core_failed("step", e)
                return

    def _serve_snapshot(self, peer: int, offset: Any) -> None:
        data = self._snap_bytes
        if data is None or type(offset) is not int or not 0 <= offset <= len(data):
            self.transport.send(peer, [SNAP_NONE, 0])
            return
        chunk = chunk_at(data, offset, SNAPSHOT_CHUNK_BYTES)
        self.transport.send(peer, [SNAP_CHUNK, chunk.to_wire()])
        if offset == 0:
            self.stats["snapshots_served"] += 1

    def _start_pull(self, peer: int) -> None:
        if (self._pull is not None or self._snap_task is not None or self._fetched is not None
                or peer == self.cfg.node_id):
            return
        self._pull = (peer, SnapshotReceiver(SNAPSHOT_BYTES_MAX), time.monotonic())
        self.transport.send(peer, [SNAP_PULL, 0])

    def _check_pull(self) -> None:
        if self._pull is not None and time.monotonic() - self._pull[2] > SNAPSHOT_PULL_TIMEOUT_S:
            log.warning("snapshot pull from node %d timed out", self._pull[0])
            self._pull = None

    def _on_snapshot_chunk(self, peer: int, raw: Any) -> None:
        if self._pull is None or self._pull[0] != peer:
            return
        receiver = self._pull[1]
        try:
            data = receiver.feed(Chunk.from_wire(raw))
        except ChunkError as e:
            log.warning("snapshot chunk from node %d rejected: %s", peer, e)
            if e.reason == "malformed":
                self._pull = None
                raise ProtocolError("malformed", str(e)) from None
            self.transport.send(peer, [SNAP_PULL, receiver.next_offset])
            return
        self._pull = (peer, receiver, time.monotonic())
        if data is None:
            self.transport.send(peer, [SNAP_PULL, receiver.next_offset])
            return
        self._pull = None
        try:
            snap = decode_snapshot(data, f"snapshot from node {peer}")
            meta = msgpack.unpackb(snap.meta, raw=False, strict_map_key=False)
        except Exception as e:  # the peer's bytes, not our state: drop it
            log.warning("snapshot from node %d is unusable: %s", peer, e)
            return
        if type(meta) is not dict or type(meta.get("slot")) is not int or snap.slot not in (None, meta["slot"]):
            log.warning("snapshot from node %d has unusable metadata", peer)
            return
        if self._snap_task is not None or meta["slot"] <= getattr(self.replica, "exec_slot", 0):
            return
        try:  # an unreadable state must not reach the core: install_snapshot would stop us half-restored
            type(self.replica.executor)(self.sm_factory()).restore(snap.body)
        except Exception as e:
            log.warning("snapshot from node %d has an unreadable state: %s", peer, _describe(e))
            return
        self._fetched = (peer, snap, meta)  # installed at the end of the next _process turn
        self._kick()

    # --- observability ----------------------------------------------------------------

    def _digest(self) -> str | None:
        """The state machine's digest, recomputed only when execution moved: it
        encodes the whole state, and clients poll status while waiting."""
        replica = self.replica
        sm = replica.executor.sm
        if not hasattr(sm, "digest"):
            return None
        at = (getattr(replica, "exec_slot", None), replica.executor.applied)
        if at[0] is None or self._digest_cache is None or self._digest_cache[0] != at:
            self._digest_cache = (at, sm.digest())
        return self._digest_cache[1]

    def status(self, digest: bool = True) -> dict:
        replica = self.replica
        st = dict(replica.status())
        st["digest"] = self._digest() if digest else None
        st["cluster_id"] = self.cfg.cluster_id
        if self.cfg.protocol == "sdpaxos":
            st["epoch"] = self.cfg.epoch
            st["member"] = membership.member_name(self.cfg.member_list()[self.cfg.node_id])
        st["replicas"] = len(self.cfg.peers)
        st["peers"] = {str(i): f"{h}:{p}" for i, (h, p) in sorted(self.cfg.peers.items())}
        st["fsync"] = self.cfg.fsync
        st["tls"] = self.cfg.tls
        st["wal"] = {"last_seq": self.wal.last_seq, "durable_seq": self.wal.durable_seq,
                     "first_seq": self.wal.first_seq, "fsyncs": self.wal.stats["fsyncs"]}
        st["stats"] = dict(self.stats)
        st["messages"] = {way: dict(sorted((t.__name__, k) for t, k in counts.items()))
                          for way, counts in (("sent", self.messages_sent), ("received", self.messages_received))}
        if self.transport is not None:
            st["transport"] = {k: v for k, v in sorted(self.transport.stats.items())}
            st["connected"] = [p for p in sorted(self.cfg.peers) if p != self.cfg.node_id and self.transport.is_connected(p)]
        st["snapshot_slot"] = self._snap_slot
        st["snapshot_loop_ms"] = dict(self.snapshot_loop_ms)
        st["loop"] = self.loop_lag.status(time.monotonic())
        if self._clock is not None:
            st["clock_control"] = dict(self._clock.status(), ticks=self._ticks_done)
        # Peers in the order this replica asks them (nearest first) and the round trips
        # it measured (ms, whole ticks; None: not yet), consensus.core.nearness.
        near = replica.near
        st["nearness"] = {"order": list(near.order), "live_order": replica.live_peers(),
                          "rtt_ms": {str(p): (None if near.rtt[p] == float("inf") else round(near.rtt[p] * self.cfg.tick_ms, 1))
                                     for p in near.order}}
        return st
