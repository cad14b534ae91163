"""One replica process: the thin asyncio shell around a protocol state machine.

Per event-loop turn the node feeds the replica what arrived (peer envelopes, client
requests, elapsed ticks), then takes one ``Ready`` and carries it out in the order
its contract demands (``consensus.core.ready``):

1. append ``persist`` records to the WAL (buffered);
2. hold that Ready's messages and replies until the WAL says the records are durable
   (``GroupCommitter``: one fsync in a worker thread covers every record of every
   turn since the last one). Outputs are released strictly in Ready order, so a later
   message never overtakes the durability of an earlier record;
3. send each envelope as one frame per peer (written once per turn by the transport)
   and each client connection's replies as one frame.

Ticks come from the monotonic clock and are never dropped: after a stall the replica
receives every tick that elapsed. That keeps the sequencer's lease honest (its lease
is counted in its own ticks, so they must not run slower than real time).

Snapshots: every ``snapshot_every`` executed slots the node asks the replica for a
snapshot, writes it atomically (``store.snapshot``), lets the replica compact its
log and rewrites the still-needed ("live") records into the WAL so that older
segments can be deleted. A replica asking for a snapshot (``Ready.snapshot_from``)
pulls the peer's latest one in checksummed chunks.

Startup errors (unusable data dir, identity mismatch, corrupt WAL, port in use) raise
``NodeError`` with one line a person can act on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import crc32c
import msgpack

from consensus.core.config import ProtocolConfig
from consensus.core.messages import RemoteProtocolError, decode_message, encode_message
from consensus.core.multipaxos import MultiPaxosReplica
from consensus.core.sdpaxos import SDPaxosReplica
from consensus.kv import KVStateMachine
from consensus.runtime import clientwire
from consensus.transport.framing import MAX_FRAME_BYTES, FrameDecoder, ProtocolError, encode_frame
from consensus.transport.tcp import PeerTransport
from store.snapshot import Chunk, ChunkError, Snapshot, SnapshotReceiver, decode_snapshot, encode_snapshot, load_latest, write_snapshot
from store.wal import WAL, GroupCommitter, WALCorruption, WALError

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


class NodeError(Exception):
    """The node cannot start or must stop; the message is one actionable line."""


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
    election_ms: float = 500.0
    lease_ms: float = 500.0
    batch_max: int = 2048
    inflight_max: int = 16
    snapshot_every: int = 5000  # executed slots between snapshots (0: never)
    initial_sequencer: int = 0
    segment_bytes_max: int = 16 << 20
    extra: dict = field(default_factory=dict)

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
        )

    def validate(self) -> None:
        n = len(self.peers)
        if sorted(self.peers) != list(range(n)):
            raise NodeError(f"peers must be numbered 0..{n - 1}, got {sorted(self.peers)}")
        if self.node_id not in self.peers:
            raise NodeError(f"node id {self.node_id} is not among the peers {sorted(self.peers)}")
        if self.protocol not in PROTOCOLS:
            raise NodeError(f"unknown protocol {self.protocol!r} (sdpaxos or multipaxos)")
        if self.fsync not in ("always", "batch", "never"):
            raise NodeError(f"unknown fsync mode {self.fsync!r} (always, batch or never)")
        if not 0 <= self.initial_sequencer < n:
            raise NodeError(f"initial sequencer {self.initial_sequencer} is not a replica")


class _ClientConn(asyncio.Protocol):
    """One client connection: frames of requests in, frames of replies out."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.decoder = FrameDecoder(MAX_FRAME_BYTES)
        self.transport: asyncio.Transport | None = None
        self.out: list = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.node._clients.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            for frame in self.decoder.feed(data):
                self.node._on_client_frame(self, clientwire.parse_requests(frame))
        except (ProtocolError, clientwire.BadRequest) as e:
            self.node.stats["client_bad_frames"] += 1
            log.warning("client connection closed: %s", e)
            self.abort()

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


class Node:
    """A replica process's runtime. ``open()`` (sync, may raise NodeError), then
    ``await start()``, later ``await stop()``."""

    def __init__(self, cfg: NodeConfig, sm_factory=KVStateMachine) -> None:
        cfg.validate()
        self.cfg = cfg
        self.pcfg = cfg.protocol_config()
        self.sm_factory = sm_factory
        self.stats: dict[str, int] = {
            "client_bad_frames": 0, "peer_bad_messages": 0, "snapshots_taken": 0,
            "snapshots_installed": 0, "snapshots_served": 0, "refused_busy": 0,
        }
        self.replica: Any = None
        self.wal: WAL | None = None
        self.committer: GroupCommitter | None = None
        self.transport: PeerTransport | None = None
        self._client_server: asyncio.Server | None = None
        self._clients: set[_ClientConn] = set()
        self._dirty_clients: list[_ClientConn] = []
        self._waiters: dict[tuple, _ClientConn] = {}
        self._outbox: deque = deque()  # (wal seq, messages, replies) awaiting durability
        self._scheduled = False
        self._stopping = False
        self._failed: BaseException | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._ticks_done = 0
        self._t0 = 0.0
        self._snap_slot = 0
        self._snap_task: asyncio.Task | None = None
        self._snap_bytes: bytes | None = None  # our latest snapshot, encoded (served to peers)
        self._live_starts: deque = deque(maxlen=2)  # WAL seq where each kept snapshot's live records begin
        self._pull: tuple[int, SnapshotReceiver, float] | None = None
        self.stopped = asyncio.Event()

    # --- startup ------------------------------------------------------------------

    def open(self) -> None:
        """Check the data dir, recover the WAL and the latest snapshot, build the replica."""
        cfg = self.cfg
        try:
            os.makedirs(cfg.data_dir, exist_ok=True)
            probe = os.path.join(cfg.data_dir, ".write-probe")
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.unlink(probe)
        except OSError as e:
            raise NodeError(f"data dir {cfg.data_dir} is not writable: {e.strerror or e}") from None
        self._check_identity()
        try:
            self.wal, raw = WAL.open(os.path.join(cfg.data_dir, "wal"), fsync=cfg.fsync,
                                     segment_bytes_max=cfg.segment_bytes_max)
        except WALCorruption as e:
            raise NodeError(f"refusing to start: {e}") from None
        except WALError as e:
            raise NodeError(f"cannot open the write-ahead log: {e}") from None
        snap_dir = os.path.join(cfg.data_dir, "snapshots")
        os.makedirs(snap_dir, exist_ok=True)
        snap = load_latest(snap_dir)
        snapshot = None
        if snap is not None:
            meta = msgpack.unpackb(snap.meta, raw=False, strict_map_key=False)
            snapshot = (meta, snap.body)
            self._snap_bytes = encode_snapshot(snap)
            self._snap_slot = meta.get("slot", 0)
        records = []
        for seq, payload in raw:
            try:
                records.append(msgpack.unpackb(payload, raw=False, strict_map_key=False))
            except Exception as e:
                raise NodeError(f"refusing to start: undecodable WAL record {seq} in {cfg.data_dir}/wal: {e}") from None
        cls = PROTOCOLS[cfg.protocol]
        rng = random.Random(hash((cfg.cluster_id, cfg.node_id, time.time_ns())))
        kwargs = {"snapshot": snapshot} if snapshot is not None else {}
        self.replica = cls(cfg.node_id, self.pcfg, self.sm_factory(), records=records, rng=rng, **kwargs)
        log.info("node %d recovered %d WAL records%s", cfg.node_id, len(records),
                 f" on top of a snapshot at slot {self._snap_slot}" if snapshot else "")

    def _check_identity(self) -> None:
        cfg = self.cfg
        path = os.path.join(cfg.data_dir, IDENTITY_FILE)
        mine = {"cluster_id": cfg.cluster_id, "node_id": cfg.node_id, "replicas": len(cfg.peers), "protocol": cfg.protocol}
        if os.path.exists(path):
            try:
                with open(path) as f:
                    theirs = json.load(f)
            except (OSError, ValueError) as e:
                raise NodeError(f"{path} is unreadable: {e}") from None
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
        self.committer = GroupCommitter(self.wal)
        # Frames that waited longer than two election timeouts for a connection have been
        # superseded by retransmissions: not replayed (tcp module docstring).
        self.transport = PeerTransport(cfg.cluster_id, cfg.node_id, cfg.peers, self._on_peer_frames,
                                       rng=random.Random(cfg.node_id * 7919 + time.time_ns()),
                                       queue_wait_max_s=max(1.0, 2 * cfg.election_ms / 1000))
        host, port = cfg.peers[cfg.node_id]
        try:
            await self.transport.start(host, port)
        except OSError as e:
            await self._close_storage()
            raise NodeError(f"cannot listen for peers on {host}:{port}: {e.strerror or e}") from None
        chost, cport = cfg.client_address
        try:
            self._client_server = await loop.create_server(lambda: _ClientConn(self), chost, cport)
        except OSError as e:
            await self.transport.close()
            await self._close_storage()
            raise NodeError(f"cannot listen for clients on {chost}:{cport}: {e.strerror or e}") from None
        self._t0 = time.monotonic()
        self._tick_handle = loop.call_later(cfg.tick_ms / 1000, self._on_timer)
        self._kick()
        log.info("node %d (%s) peers on %s:%d, clients on %s:%d", cfg.node_id, cfg.protocol, host, port, chost, cport)

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        if self._client_server is not None:
            self._client_server.close()
        for conn in list(self._clients):
            conn.abort()
        if self.transport is not None:
            await self.transport.close()
        if self._snap_task is not None:
            await asyncio.wait([self._snap_task], timeout=10)
        await self._close_storage()
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
            except WALError:
                pass

    def _fatal(self, exc: BaseException) -> None:
        """Persisting failed: sending anything now would break safety. Stop."""
        if self._failed is None:
            self._failed = exc
            log.error("node %d stopping: the write-ahead log failed: %r", self.cfg.node_id, exc)
            asyncio.get_running_loop().create_task(self.stop())

    # --- inputs ---------------------------------------------------------------------

    def _on_timer(self) -> None:
        tick_s = self.cfg.tick_ms / 1000
        due = int((time.monotonic() - self._t0) / tick_s)
        replica = self.replica
        while self._ticks_done < due:
            self._ticks_done += 1
            replica.tick()
        self._check_pull()
        self._kick()
        if not self._stopping:
            delay = self._t0 + (self._ticks_done + 1) * tick_s - time.monotonic()
            self._tick_handle = asyncio.get_running_loop().call_later(max(0.0, delay), self._on_timer)

    def _on_peer_frames(self, peer: int, frames: list) -> None:
        if self._stopping:
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
                self.replica.step(peer, msgs)
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
        replica = self.replica
        for kind, client, seq, op in requests:
            if kind == clientwire.STATUS:
                conn.reply([client, seq, clientwire.OK, self.status()])
                continue
            if self._stopping or len(self._waiters) >= WAITERS_MAX or replica.backlog >= PENDING_MAX:
                self.stats["refused_busy"] += 1
                conn.reply([client, seq, clientwire.ERROR, "busy: retry later"])
                continue
            self._waiters[(client, seq)] = conn
            if kind == clientwire.READ and hasattr(replica, "read"):
                key = op[1] if type(op) is list and len(op) >= 2 else None
                replica.read(client, seq, op, key)
            else:
                replica.propose(client, seq, op, needs_result=kind != clientwire.WRITE)
        self._kick()
        if self._dirty_clients:  # status and refusals; answers to commands wait in the outbox
            self._flush_clients()

    # --- effects ----------------------------------------------------------------------

    def _kick(self) -> None:
        if not self._scheduled and not self._stopping:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._process)

    def _process(self) -> None:
        self._scheduled = False
        if self._stopping or self._failed is not None:
            return
        rd = self.replica.ready()
        wal = self.wal
        if rd.persist:
            try:
                seq = wal.append_many([msgpack.packb(r, use_bin_type=True) for r in rd.persist])
            except WALError as e:
                self._fatal(e)
                return
        else:
            seq = self._outbox[-1][0] if self._outbox else 0
        if rd.messages or rd.replies:
            if not self._outbox and seq <= wal.durable_seq:
                self._release(rd.messages, rd.replies)
            else:
                self._outbox.append((seq, rd.messages, rd.replies))
                try:
                    self.committer.on_durable(seq, self._on_durable)
                except WALError as e:
                    self._fatal(e)
                    return
        elif rd.persist:
            self.committer.request_sync()
        wanted = getattr(rd, "snapshot_from", None)
        if wanted is not None:
            self._start_pull(wanted)
        self._maybe_snapshot()

    def _on_durable(self, exc: BaseException | None) -> None:
        if exc is not None:
            self._fatal(exc)
            return
        durable = self.wal.durable_seq
        outbox = self._outbox
        while outbox and outbox[0][0] <= durable:
            _, messages, replies = outbox.popleft()
            self._release(messages, replies)

    def _release(self, messages: list, replies: list) -> None:
        transport = self.transport
        for dst, msgs in messages:
            try:
                transport.send(dst, [ENVELOPE, [encode_message(m) for m in msgs]])
            except (ValueError, RuntimeError) as e:  # oversized or closing: peers resend
                log.debug("dropped envelope to %d: %s", dst, e)
        if replies:
            waiters = self._waiters
            for r in replies:
                conn = waiters.pop((r.client, r.seq), None)
                if conn is not None:
                    if r.ok:
                        conn.reply([r.client, r.seq, clientwire.OK, r.result])
                    else:
                        conn.reply([r.client, r.seq, clientwire.ERROR, r.error])
        self._flush_clients()

    def _flush_clients(self) -> None:
        dirty, self._dirty_clients = self._dirty_clients, []
        for conn in dirty:
            conn.flush()

    # --- snapshots --------------------------------------------------------------------

    def _maybe_snapshot(self) -> None:
        every = self.cfg.snapshot_every
        replica = self.replica
        if not every or self._snap_task is not None or not hasattr(replica, "take_snapshot"):
            return
        if getattr(replica, "exec_slot", 0) - self._snap_slot < every:
            return
        taken = replica.take_snapshot()
        if taken is None:
            return
        meta, state = taken
        self._snap_slot = meta["slot"]
        snap = Snapshot(self.wal.last_seq, msgpack.packb(meta, use_bin_type=True), state)
        self._snap_task = asyncio.get_running_loop().create_task(self._save_snapshot(snap, meta, installed=False))

    async def _save_snapshot(self, snap: Snapshot, meta: dict, installed: bool) -> None:
        try:
            directory = os.path.join(self.cfg.data_dir, "snapshots")
            # A peer's snapshot does not pair with our older ones (we never had the log
            # between them): keep only it.
            keep = 1 if installed else 2
            await asyncio.get_running_loop().run_in_executor(None, lambda: write_snapshot(directory, snap, keep=keep))
            if self._stopping:
                return
            if installed and not self.replica.install_snapshot(meta, snap.body):
                return
            self._snap_bytes = encode_snapshot(snap)
            self._snap_slot = max(self._snap_slot, meta["slot"])
            live = self.replica.compact(meta)
            wal = self.wal
            start = wal.last_seq + 1
            if live:
                wal.append_many([msgpack.packb(r, use_bin_type=True) for r in live])
                await self.committer.durable(wal.last_seq)
            if installed:
                self._live_starts.clear()
            self._live_starts.append(start)
            # Keep what the older retained snapshot needs (load_latest may fall back to it).
            if len(self._live_starts) == 2:
                wal.compact(self._live_starts[0] - 1)
            self.stats["snapshots_installed" if installed else "snapshots_taken"] += 1
            self._kick()
        except Exception as e:  # a failed snapshot is retried later; the WAL still has everything
            if isinstance(e, WALError):
                self._fatal(e)
            else:
                log.exception("snapshot failed: %r", e)
        finally:
            self._snap_task = None

    def _serve_snapshot(self, peer: int, offset: Any) -> None:
        data = self._snap_bytes
        if data is None or type(offset) is not int or not 0 <= offset <= len(data):
            self.transport.send(peer, [SNAP_NONE, 0])
            return
        piece = data[offset : offset + SNAPSHOT_CHUNK_BYTES]
        chunk = Chunk(offset, len(data), crc32c.crc32c(data), crc32c.crc32c(piece), piece)
        self.transport.send(peer, [SNAP_CHUNK, chunk.to_wire()])
        if offset == 0:
            self.stats["snapshots_served"] += 1

    def _start_pull(self, peer: int) -> None:
        if self._pull is not None or self._snap_task is not None or peer == self.cfg.node_id:
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
        except Exception as e:
            log.warning("snapshot from node %d is unusable: %s", peer, e)
            return
        if self._snap_task is not None or meta.get("slot", 0) <= getattr(self.replica, "exec_slot", 0):
            return
        mine = Snapshot(self.wal.last_seq, snap.meta, snap.body)
        self._snap_task = asyncio.get_running_loop().create_task(self._save_snapshot(mine, meta, installed=True))

    # --- observability ----------------------------------------------------------------

    def status(self) -> dict:
        replica = self.replica
        st = dict(replica.status())
        sm = replica.executor.sm
        st["digest"] = sm.digest() if hasattr(sm, "digest") else None
        st["cluster_id"] = self.cfg.cluster_id
        st["fsync"] = self.cfg.fsync
        st["wal"] = {"last_seq": self.wal.last_seq, "durable_seq": self.wal.durable_seq,
                     "first_seq": self.wal.first_seq, "fsyncs": self.wal.stats["fsyncs"]}
        st["stats"] = dict(self.stats)
        if self.transport is not None:
            st["transport"] = {k: v for k, v in sorted(self.transport.stats.items())}
            st["connected"] = [p for p in sorted(self.cfg.peers) if p != self.cfg.node_id and self.transport.is_connected(p)]
        st["snapshot_slot"] = self._snap_slot
        return st
