"""Peer-to-peer TCP transport: the thin asyncio shell around ``framing``.

::

    t = PeerTransport(cluster_id, node_id, peers={2: ("127.0.0.1", 7002), ...},
                      on_messages=lambda peer_id, msgs: ...)
    host, port = await t.start("127.0.0.1", 7001)   # or start(sock=a_bound_socket)
    t.send(peer_id, msg)            # encode now, written at the end of this loop turn
    t.send_many(peer_id, msgs)
    t.flush()                       # write the queues now rather than at the end of the turn
    t.is_connected(peer_id); t.stats["malformed"]; ...
    await t.close()

**One connection per peer pair.** The node with the lower id dials the higher one
(reconnecting with capped exponential backoff and jitter from the injected
``random.Random``); the higher one accepts. Both sides write a hello first
(``framing.Handshake``); a connection carries messages only after the peer's hello
checks out. The newest authenticated connection for a peer replaces an older one
(the peer restarted).

**Receiving.** ``on_messages(peer_id, msgs)`` runs on the event loop with every
message decoded from one read, in order. It must not block. A ``ProtocolError`` from
it (a well-framed but invalid message: the peer's fault) closes that connection like
a bad frame. Any other exception is the owner's failure, not the peer's, and the
transport will not guess whether the owner can go on (crash-only): it counts it
(``callback_errors``), stops delivering anything, and hands the exception to
``on_fatal(exc)``; without an ``on_fatal`` it logs it and closes itself.

**Errors.** A malformed, oversized or truncated frame or a bad hello (wrong cluster,
unknown node, wrong version) aborts that connection only, logs a warning and bumps
``stats[reason]`` (``framing.REASONS``). So do a handshake that does not finish in
``handshake_timeout_s`` (``"handshake-timeout"``) and connections beyond
``pending_connections_max`` that have not finished one (``"pending-limit"``).

**Sending and backpressure.** ``send`` encodes the frame immediately (one encode per
message) and appends it to the peer's queue; one ``loop.call_soon`` flush per loop
turn writes each peer's queue with a single ``transport.write``. While the
connection is missing, or paused by the transport (its buffer is above
``write_buffer_high_bytes``; aiohttp's ``base_protocol`` pattern), frames wait in the
queue. The queue is bounded by ``send_queue_bytes_max``: beyond it the *oldest*
frames are dropped and counted (``frames_dropped``, ``bytes_dropped``). Dropping is
safe for consensus traffic, which is retransmitted on timeouts, and the newest
messages carry the freshest state; refusing new sends would instead stall the
protocol core on one slow peer. Frames already handed to a connection that then
dies are lost the same way.

**No stale replays.** Queueing while a peer is unreachable only rides out a short
gap; it must not hand a peer a replay of the traffic it missed (up to
``send_queue_bytes_max`` of it). Such a replay would be harmless to safety but would
make what a returning replica sees depend on which peer happens to redial first (it
may or may not cover a range the others compacted). So when a connection
authenticates:

- frames queued for a *different* process of that peer are discarded
  (``frames_discarded_restart``): each transport draws an *incarnation* once
  (``incarnation=``, random by default) and sends it in its hello, so a restart is
  told apart from a reconnect of the same process;
- frames that waited longer than ``queue_wait_max_s`` are discarded
  (``frames_expired``). This covers what the incarnation cannot: frames queued for a
  peer we never reached, whose process may have died and restarted meanwhile. The
  protocol has retransmitted whatever mattered by then.

**Silent connections.** A TCP connection can die without either side hearing of it
(a partition that drops packets, a peer frozen by SIGSTOP, a NAT forgetting it):
writes still succeed into the kernel's buffer and, after the network heals, the
kernel's retransmission backoff can keep it dead for seconds. With ``keepalive_s``
set, the transport writes a tiny keepalive frame (msgpack nil, never delivered) on
every authenticated connection that wrote nothing for ``keepalive_s``, and aborts a
connection that received nothing for ``dead_after_s`` (``"heartbeat-timeout"``); the
lower id then re-dials it with its usual backoff. Off by default; the node turns it
on (heartbeat and twice the election timeout).

**Stats** (``stats``, a ``Counter``): one key per refusal reason (above), plus
``dials``, ``dial_failures``, ``connections_established``, ``disconnects``,
``frames_sent``, ``messages_received``, ``write_pauses``, ``frames_dropped``,
``bytes_dropped``, ``frames_discarded_restart``, ``frames_expired``, ``callback_errors``,
``keepalives_sent``, ``heartbeat-timeout``, ``tls_refused``.

**TLS** (``ssl_server`` and ``ssl_client``, ``consensus.transport.tls``; off by
default, and then nothing below costs anything). Mutual TLS: the accepting side
handshakes each connection itself (``tls.TLSListener``) so that a refused one is
seen; the dialing side with ``create_connection(ssl=...)``. A handshake that fails
(a certificate not signed by the cluster CA, no certificate, not TLS at all) and a
hello whose node id is not the one in the peer's certificate (``OU=cellar-node,
CN=node-<id>``) close that connection and count ``tls_refused``; each is logged at
warning level with its reason, once a minute per peer address and kind (handshake or
identity; a refused peer that keeps redialing does not flood the log).

Every wait is bounded (connect, handshake, close); every queue is bounded (send
queue by bytes, pending connections by count). Works on the default loop or uvloop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from consensus.transport import tls
from consensus.transport.framing import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Handshake,
    PeerStream,
    ProtocolError,
    encode_frame,
)

log = logging.getLogger(__name__)

_KEEPALIVE = encode_frame(None)  # a frame whose message is nil: read, never delivered

OnMessages = Callable[[int, list[Any]], None]


class _PeerState:
    __slots__ = ("peer_id", "queue", "stamps", "queued_bytes", "conn", "connected", "incarnation")

    def __init__(self, peer_id: int) -> None:
        self.peer_id = peer_id
        self.queue: collections.deque[bytes] = collections.deque()
        # [monotonic time, frames] per enqueue call, oldest first: the ages in ``queue``.
        self.stamps: collections.deque[list] = collections.deque()
        self.queued_bytes = 0
        self.conn: _PeerConnection | None = None  # the authenticated connection
        self.connected = asyncio.Event()
        self.incarnation: int | None = None  # of the last authenticated connection


class _PeerConnection(asyncio.Protocol):
    """One TCP connection, either direction. All decisions go back to the owner."""

    __slots__ = ("owner", "stream", "transport", "peer_id", "paused", "lost", "failed",
                 "eof_seen", "closing_locally", "counted_pending", "timer", "peername",
                 "last_rx", "last_tx")

    def __init__(self, owner: PeerTransport, expected_peer_id: int | None) -> None:
        self.owner = owner
        self.stream = PeerStream(owner.handshake, expected_peer_id=expected_peer_id,
                                 max_frame_bytes=owner.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.peer_id: int | None = None
        self.paused = False
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.failed = False
        self.eof_seen = False
        self.closing_locally = False
        self.counted_pending = False
        self.timer: asyncio.TimerHandle | None = None
        self.peername: Any = None
        self.last_rx = self.last_tx = time.monotonic()  # for keepalives (module docstring)

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        self.peername = transport.get_extra_info("peername")
        self.owner._connection_made(self)

    def data_received(self, data: bytes) -> None:
        if self.failed or self.closing_locally:
            return
        self.last_rx = time.monotonic()
        try:
            msgs = self.stream.receive_data(data)
        except ProtocolError as e:
            self.fail(e.reason, e.detail)
            return
        if self.peer_id is None and self.stream.peer_id is not None:
            if self.owner._tls and not self.owner._tls_identity_ok(self, self.stream.peer_id):
                return
            self.peer_id = self.stream.peer_id
            self.owner._authenticated(self)
        if msgs:
            assert self.peer_id is not None
            if None in msgs:  # keepalives
                msgs = [m for m in msgs if m is not None]
                if not msgs:
                    return
            self.owner._deliver(self, self.peer_id, msgs)

    def eof_received(self) -> bool:
        self.eof_seen = True
        if not (self.failed or self.closing_locally):
            try:
                self.stream.receive_data(b"")
            except ProtocolError as e:
                self.fail(e.reason, e.detail)
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if not (self.failed or self.closing_locally or self.eof_seen):
            # Reset by the peer: a half-sent frame is still a truncated frame.
            try:
                self.stream.receive_data(b"")
            except ProtocolError as e:
                self.failed = True
                self.owner._protocol_error(self, e.reason, e.detail)
        if self.timer is not None:
            self.timer.cancel()
        self.owner._connection_lost(self)
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True
        self.owner.stats["write_pauses"] += 1

    def resume_writing(self) -> None:
        self.paused = False
        self.owner._schedule_flush()

    # owner's controls

    def fail(self, reason: str, detail: str) -> None:
        self.failed = True
        self.owner._protocol_error(self, reason, detail)
        self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def close_locally(self) -> None:
        self.closing_locally = True
        self.abort()

    def handshake_timeout(self) -> None:
        self.timer = None
        if self.peer_id is None and not self.failed:
            self.fail("handshake-timeout", "no hello in time")


class PeerTransport:
    """Peer connections for one replica. See the module docstring."""

    def __init__(
        self,
        cluster_id: str,
        node_id: int,
        peers: Mapping[int, tuple[str, int]],
        on_messages: OnMessages,
        *,
        version: int = PROTOCOL_VERSION,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        send_queue_bytes_max: int = 16 << 20,
        write_buffer_high_bytes: int = 1 << 20,
        rng: random.Random | None = None,
        backoff_base_s: float = 0.05,
        backoff_max_s: float = 2.0,
        connect_timeout_s: float = 2.0,
        handshake_timeout_s: float = 5.0,
        pending_connections_max: int = 64,
        close_timeout_s: float = 5.0,
        incarnation: int | None = None,
        queue_wait_max_s: float = 1.0,
        on_fatal: Callable[[BaseException], None] | None = None,
        keepalive_s: float | None = None,
        dead_after_s: float | None = None,
        ssl_server: Any = None,
        ssl_client: Any = None,
        cert_ids: Mapping[int, int | None] | None = None,
    ) -> None:
        self.cluster_id = cluster_id
        # TLS: the replica id each peer's certificate must name (default: its index;
        # after a membership change the index is the member's place in the epoch's list,
        # and its certificate names the member: consensus/runtime/membership.py).
        self._cert_ids = dict(cert_ids) if cert_ids is not None else None
        self.node_id = node_id
        self._addresses = {p: a for p, a in peers.items() if p != node_id}
        self.on_messages = on_messages
        # Not from ``rng``: that one only jitters backoff, and tests replay it.
        self.incarnation = incarnation if incarnation is not None else int.from_bytes(os.urandom(7), "big")
        self.handshake = Handshake(cluster_id, node_id, self._addresses.keys(), version, self.incarnation)
        self.max_frame_bytes = max_frame_bytes
        self.send_queue_bytes_max = send_queue_bytes_max
        self.write_buffer_high_bytes = write_buffer_high_bytes
        self._rng = rng if rng is not None else random.Random(node_id)
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._connect_timeout_s = connect_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self._pending_connections_max = pending_connections_max
        self._close_timeout_s = close_timeout_s
        self.queue_wait_max_s = queue_wait_max_s
        self.on_fatal = on_fatal
        if keepalive_s is not None and (keepalive_s <= 0 or dead_after_s is None or dead_after_s <= keepalive_s):
            raise ValueError("keepalive_s needs dead_after_s > keepalive_s > 0")
        self.keepalive_s = keepalive_s
        self.dead_after_s = dead_after_s
        self._keepalive_handle: asyncio.TimerHandle | None = None
        self.failed: BaseException | None = None  # what on_messages raised, if it did
        self._close_task: asyncio.Task[None] | None = None
        self.stats: collections.Counter[str] = collections.Counter()
        self._hello = self.handshake.hello_frame()
        self._peers = {p: _PeerState(p) for p in sorted(self._addresses)}
        self._live: set[_PeerConnection] = set()
        self._pending = 0
        self._server: asyncio.Server | None = None
        self._source: tuple[str, int] | None = None  # local address for dialing (start)
        self._dialers: list[asyncio.Task[None]] = []
        self._flush_scheduled = False
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        if (ssl_server is None) != (ssl_client is None):
            raise ValueError("TLS needs both ssl_server and ssl_client")
        self._ssl_server = ssl_server
        self._ssl_client = ssl_client
        self._tls = ssl_server is not None
        self._tls_logged: dict[tuple, float] = {}  # (host, kind) -> when last logged

    # -- lifecycle --

    async def start(self, listen_host: str | None = None, listen_port: int | None = None, *,
                    sock: socket.socket | None = None) -> tuple[str, int]:
        """Listen (on ``listen_host:listen_port`` or an already bound ``sock``) and
        start dialing every peer with a higher id. Returns the listening address."""
        if self._server is not None or self._closing:
            raise RuntimeError("start() may be called once")
        self._loop = asyncio.get_running_loop()
        if self._tls:
            listener = tls.TLSListener(self._ssl_server, lambda: _PeerConnection(self, None), self._tls_accept_refused,
                                       handshake_timeout_s=self.handshake_timeout_s,
                                       pending_max=self._pending_connections_max,
                                       backlog=self._pending_connections_max)
            self._server = cast(asyncio.Server, await listener.start(listen_host, listen_port, sock=sock))
        else:
            self._server = await self._loop.create_server(
                lambda: _PeerConnection(self, None), listen_host, listen_port, sock=sock,
                backlog=self._pending_connections_max,
            )
        # Dial from the address we listen on (each replica on its own 127.0.0.x, say):
        # a peer, and a firewall rule, can then tell replicas apart by source address.
        host = self._server.sockets[0].getsockname()[0] if self._server.sockets else None
        if host and host not in ("0.0.0.0", "::"):
            self._source = (host, 0)
        for peer_id in self._peers:
            if peer_id > self.node_id:
                self._dialers.append(self._loop.create_task(self._dial_loop(peer_id), name=f"dial-{peer_id}"))
        if self.keepalive_s is not None:
            self._keepalive_handle = self._loop.call_later(self.keepalive_s / 2, self._keepalive)
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def close(self) -> None:
        """Stop listening and dialing, abort every connection (queued frames are
        dropped) and wait, bounded, for them to finish."""
        if self._closing:
            return
        self._closing = True
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
        if self._server is not None:
            self._server.close()
        for task in self._dialers:
            task.cancel()
        async with asyncio.timeout(self._close_timeout_s):
            await asyncio.gather(*self._dialers, return_exceptions=True)
            conns = list(self._live)
            for conn in conns:
                conn.close_locally()
            if conns:
                await asyncio.wait([c.lost for c in conns])
            if self._server is not None:
                await self._server.wait_closed()

    # -- sending --

    def send(self, peer_id: int, msg: Any) -> None:
        """Queue one message for ``peer_id``; raises ``ValueError`` for an unknown
        peer or a message over ``max_frame_bytes``."""
        self._enqueue(peer_id, [encode_frame(msg, self.max_frame_bytes)])

    def send_many(self, peer_id: int, msgs: Iterable[Any]) -> None:
        self._enqueue(peer_id, [encode_frame(m, self.max_frame_bytes) for m in msgs])

    def flush(self) -> None:
        """Write every queued frame now instead of at the end of this loop turn (a
        caller that must order these writes before others of its own)."""
        if not self._closing:
            self._flush()

    def is_connected(self, peer_id: int) -> bool:
        return self._peer(peer_id).conn is not None

    async def wait_connected(self, peer_id: int) -> None:
        """Until ``peer_id`` has an authenticated connection (bound it with a timeout)."""
        await self._peer(peer_id).connected.wait()

    def queued_bytes(self, peer_id: int) -> int:
        return self._peer(peer_id).queued_bytes

    def _peer(self, peer_id: int) -> _PeerState:
        try:
            return self._peers[peer_id]
        except KeyError:
            raise ValueError(f"unknown peer {peer_id}") from None

    def _enqueue(self, peer_id: int, frames: list[bytes]) -> None:
        if self._closing:
            raise RuntimeError("transport is closed")
        peer = self._peer(peer_id)
        peer.queue.extend(frames)
        peer.stamps.append([time.monotonic(), len(frames)])
        peer.queued_bytes += sum(map(len, frames))
        # Drop-oldest (see the module docstring); bounded by the queue length.
        while peer.queued_bytes > self.send_queue_bytes_max:
            self._drop_oldest(peer, "frames_dropped")
        self._schedule_flush()

    def _drop_oldest(self, peer: _PeerState, reason: str) -> None:
        dropped = peer.queue.popleft()
        peer.queued_bytes -= len(dropped)
        stamp = peer.stamps[0]
        stamp[1] -= 1
        if not stamp[1]:
            peer.stamps.popleft()
        self.stats[reason] += 1
        if reason == "frames_dropped":
            self.stats["bytes_dropped"] += len(dropped)

    def _clear_queue(self, peer: _PeerState) -> None:
        peer.queue.clear()
        peer.stamps.clear()
        peer.queued_bytes = 0

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and not self._closing:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for peer in self._peers.values():
            conn = peer.conn
            if not peer.queue or conn is None or conn.paused:
                continue
            assert conn.transport is not None
            if conn.transport.is_closing() or not self._write(conn, b"".join(peer.queue)):
                continue
            conn.last_tx = time.monotonic()
            self.stats["frames_sent"] += len(peer.queue)
            self._clear_queue(peer)

    def _write(self, conn: _PeerConnection, data: bytes) -> bool:
        """``conn.transport.write(data)``; False if the transport's handle was already
        closed under us: uvloop can close it (say when the peer resets the connection)
        while ``is_closing()`` is still False and before ``connection_lost`` runs, and
        then ``write`` raises RuntimeError. Such a connection is lost, not a failure of
        the node (a jepsen campaign stopped two replicas on it): it is detached now, as
        its ``connection_lost`` would, and what was queued waits for the next one."""
        assert conn.transport is not None
        try:
            conn.transport.write(data)
            return True
        except RuntimeError as e:
            self.stats["write_on_closed"] += 1
            log.info("peer connection %s (node %s) closed under a write: %s", conn.peername, conn.peer_id, e)
            try:
                conn.transport.abort()  # a no-op on a closed handle; else its connection_lost comes
            except Exception:  # pragma: no cover - uvloop refuses work on a closed handle
                pass
            self._connection_lost(conn)
            return False

    def _keepalive(self) -> None:
        """Every keepalive_s/2: keep idle connections talking, drop silent ones."""
        self._keepalive_handle = None
        if self._closing:
            return
        now = time.monotonic()
        for peer in self._peers.values():
            conn = peer.conn
            if conn is None or conn.transport is None or conn.transport.is_closing():
                continue
            assert self.dead_after_s is not None and self.keepalive_s is not None
            if now - conn.last_rx >= self.dead_after_s:
                self.stats["heartbeat-timeout"] += 1
                log.info("peer connection %s (node %d) closed: nothing received for %.2f s",
                         conn.peername, peer.peer_id, now - conn.last_rx)
                conn.close_locally()
            elif now - conn.last_tx >= self.keepalive_s and not conn.paused and self._write(conn, _KEEPALIVE):
                conn.last_tx = now
                self.stats["keepalives_sent"] += 1
        self._keepalive_handle = asyncio.get_running_loop().call_later(self.keepalive_s / 2, self._keepalive)

    # -- connection events (called by _PeerConnection) --

    def _connection_made(self, conn: _PeerConnection) -> None:
        assert conn.transport is not None
        if self._closing:
            conn.close_locally()
            return
        if self._pending >= self._pending_connections_max:
            self.stats["pending-limit"] += 1
            log.warning("peer connection from %s refused: %d handshakes already pending",
                        conn.peername, self._pending)
            conn.failed = True
            conn.abort()
            return
        self._live.add(conn)
        self._pending += 1
        conn.counted_pending = True
        conn.transport.set_write_buffer_limits(high=self.write_buffer_high_bytes)
        if not self._write(conn, self._hello):
            return
        conn.timer = asyncio.get_running_loop().call_later(self.handshake_timeout_s, conn.handshake_timeout)

    def _authenticated(self, conn: _PeerConnection) -> None:
        assert conn.peer_id is not None
        if conn.counted_pending:
            conn.counted_pending = False
            self._pending -= 1
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        peer = self._peers[conn.peer_id]
        old = peer.conn
        if old is not None and old is not conn:
            old.close_locally()  # the peer reconnected; its old connection is stale
        # No stale replays (module docstring).
        inc = conn.stream.peer_incarnation
        if peer.incarnation is not None and inc != peer.incarnation and peer.queue:
            self.stats["frames_discarded_restart"] += len(peer.queue)
            log.info("node %d restarted: discarding %d frames queued for its previous process",
                     conn.peer_id, len(peer.queue))
            self._clear_queue(peer)
        peer.incarnation = inc
        expired_before = time.monotonic() - self.queue_wait_max_s
        while peer.stamps and peer.stamps[0][0] < expired_before:  # bounded by the queue
            self._drop_oldest(peer, "frames_expired")
        peer.conn = conn
        peer.connected.set()
        self.stats["connections_established"] += 1
        if peer.queue:
            self._schedule_flush()

    def _connection_lost(self, conn: _PeerConnection) -> None:
        self._live.discard(conn)
        if conn.counted_pending:
            conn.counted_pending = False
            self._pending -= 1
        if conn.peer_id is not None:
            peer = self._peers[conn.peer_id]
            if peer.conn is conn:
                peer.conn = None
                peer.connected.clear()
                self.stats["disconnects"] += 1

    def _protocol_error(self, conn: _PeerConnection, reason: str, detail: str) -> None:
        self.stats[reason] += 1
        if reason == "tls_refused":
            self._log_tls_refused(conn.peername, detail)
            return
        log.warning("peer connection %s (node %s) closed: %s (%s)", conn.peername, conn.peer_id, reason, detail)

    # -- TLS (module docstring) --

    def _tls_identity_ok(self, conn: _PeerConnection, claimed: int) -> bool:
        """The node id in the peer's (CA-verified) certificate is the one its hello claims."""
        cert = tls.peercert_of(conn.transport)
        named = tls.node_id_of(cert)
        expected = claimed if self._cert_ids is None else self._cert_ids.get(claimed)
        if named is not None and named == expected:
            return True
        conn.fail("tls_refused", f"hello claims node {claimed}, certificate is {tls.describe(cert)}")
        return False

    def _tls_accept_refused(self, peername: Any, reason: str) -> None:
        if reason == "pending-limit":
            self.stats["pending-limit"] += 1
            log.warning("peer connection from %s refused: %d handshakes already pending", peername,
                        self._pending_connections_max)
            return
        self.stats["tls_refused"] += 1
        self._log_tls_refused(peername, reason)

    def _log_tls_refused(self, peername: Any, reason: str) -> None:
        host = peername[0] if isinstance(peername, tuple) else peername
        key = (host, "identity" if reason.startswith("hello claims") else "handshake")
        now = time.monotonic()
        last = self._tls_logged.get(key)
        if last is not None and now - last < 60.0:
            return
        if len(self._tls_logged) > 1024:  # bounded: forget the oldest
            self._tls_logged.pop(next(iter(self._tls_logged)))
        self._tls_logged[key] = now
        log.warning("peer connection %s refused (tls_refused): %s (logged once a minute per address)", peername, reason)

    def _deliver(self, conn: _PeerConnection, peer_id: int, msgs: list[Any]) -> None:
        if self.failed is not None:
            return
        self.stats["messages_received"] += len(msgs)
        try:
            self.on_messages(peer_id, msgs)
        except ProtocolError as e:
            # Well framed but not a valid message: the receiver's verdict closes it.
            conn.fail(e.reason, e.detail)
        except Exception as e:
            # The owner failed (module docstring): deliver nothing more, let it stop.
            self.stats["callback_errors"] += 1
            self.failed = e
            if self.on_fatal is not None:
                self.on_fatal(e)
            else:
                log.error("on_messages raised for messages from node %d; closing the transport",
                          peer_id, exc_info=e)
                self._close_task = asyncio.get_running_loop().create_task(self.close())

    # -- dialing --

    def backoff_s(self, attempt: int) -> float:
        """Delay before reconnect attempt ``attempt`` (0-based): capped exponential,
        jittered into [d/2, d)."""
        delay = min(self._backoff_max_s, self._backoff_base_s * (2 ** min(attempt, 32)))
        return delay * (0.5 + self._rng.random() / 2)

    async def _dial_loop(self, peer_id: int) -> None:
        loop = asyncio.get_running_loop()
        attempt = 0
        # Runs until close() cancels it; every await inside is bounded or ends with
        # the connection.
        while not self._closing:
            host, port = self._addresses[peer_id]
            conn: _PeerConnection | None = None
            try:
                if self._tls:
                    async with asyncio.timeout(self._connect_timeout_s + self.handshake_timeout_s):
                        _transport, conn = await loop.create_connection(
                            lambda: _PeerConnection(self, peer_id), host, port, local_addr=self._source,
                            ssl=self._ssl_client, server_hostname=host,
                            ssl_handshake_timeout=self.handshake_timeout_s)
                else:
                    async with asyncio.timeout(self._connect_timeout_s):
                        _transport, conn = await loop.create_connection(
                            lambda: _PeerConnection(self, peer_id), host, port, local_addr=self._source)
            except ssl.SSLError as e:  # an OSError too: the handshake failed (the peer's certificate)
                self.stats["dial_failures"] += 1
                self.stats["tls_refused"] += 1
                self._log_tls_refused((host, port), f"dialing node {peer_id}: {tls.handshake_failure(e)}")
            except (OSError, TimeoutError):
                self.stats["dial_failures"] += 1
            if conn is not None:
                self.stats["dials"] += 1
                await asyncio.shield(conn.lost)
                if conn.peer_id is not None:
                    attempt = 0  # it worked for a while; start the backoff over
            if self._closing:
                return
            delay = self.backoff_s(attempt)
            attempt += 1
            await asyncio.sleep(delay)
