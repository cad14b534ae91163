"""consensus.transport.tcp: real sockets on 127.0.0.1, every wait bounded, no sleeps
used as synchronization."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections.abc import Callable

import pytest

from consensus.transport.framing import PROTOCOL_VERSION, encode_frame, hello
from consensus.transport.tcp import PeerTransport

CLUSTER = "cellar-test"
WAIT_S = 20


_created: list[socket.socket] = []


def bound_socket() -> socket.socket:
    """A listening address known before any transport starts (the transport that
    starts on it owns it; the fixture below closes the ones nobody started on)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _created.append(s)
    return s


@pytest.fixture(autouse=True)
def _close_sockets():
    yield
    while _created:
        _created.pop().close()


class Inbox:
    """Collects delivered messages; ``wait_for(pred)`` wakes on each delivery."""

    def __init__(self) -> None:
        self.msgs: list[tuple[int, object]] = []
        self._changed = asyncio.Event()

    def __call__(self, peer_id: int, msgs: list) -> None:
        self.msgs.extend((peer_id, m) for m in msgs)
        self._changed.set()

    async def wait_for(self, pred: Callable[[list], bool]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not pred(self.msgs):  # bounded by the timeout
                self._changed.clear()
                await self._changed.wait()


def incarnation(node_id: int) -> int:
    """Fixed per node in these tests, so a replica's hello is known bytes."""
    return 1000 + node_id


def make(node_id: int, socks: dict[int, socket.socket], inbox: Inbox, **kw) -> PeerTransport:
    peers = {p: s.getsockname() for p, s in socks.items()}
    kw.setdefault("backoff_base_s", 0.01)
    kw.setdefault("backoff_max_s", 0.2)
    kw.setdefault("incarnation", incarnation(node_id))
    return PeerTransport(CLUSTER, node_id, peers, inbox, rng=random.Random(node_id), **kw)


async def test_two_transports_exchange_10000_messages_in_order():
    await exchange_in_order(10_000)


def test_exchange_on_uvloop():
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(exchange_in_order(2_000))


async def exchange_in_order(n: int) -> None:
    socks = {1: bound_socket(), 2: bound_socket()}
    in1, in2 = Inbox(), Inbox()
    t1, t2 = make(1, socks, in1), make(2, socks, in2)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        for i in range(n):  # queued before the connection exists: flushed once it does
            t1.send(2, ["a", i])
            t2.send(1, ["b", i, b"x" * (i % 50)])
        await in2.wait_for(lambda m: len(m) >= n)
        await in1.wait_for(lambda m: len(m) >= n)
        assert in2.msgs == [(1, ["a", i]) for i in range(n)]
        assert in1.msgs == [(2, ["b", i, b"x" * (i % 50)]) for i in range(n)]
        # One connection for the pair, dialed by the lower id.
        assert t1.stats["dials"] == 1 and "dials" not in t2.stats
        assert t1.stats["connections_established"] == t2.stats["connections_established"] == 1
        assert t1.stats["frames_sent"] == n and "frames_dropped" not in t1.stats
    finally:
        await t1.close()
        await t2.close()


async def raw_exchange(port: int, payload: bytes, *, half_close: bool = True) -> bytes:
    """Connect like a peer would, send ``payload``, return what the replica sent
    before it closed the connection (its hello, at most)."""
    async with asyncio.timeout(WAIT_S):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        if half_close:
            writer.write_eof()
        try:
            got = await reader.read()  # until the replica closes
        except ConnectionResetError:
            got = b""
        writer.close()
        return got


def good_hello(node: int, inc: int | None = None) -> bytes:
    return encode_frame(hello(CLUSTER, node, PROTOCOL_VERSION, incarnation(node) if inc is None else inc))


@pytest.mark.parametrize(
    "payload, reason",
    [
        pytest.param(struct.pack(">I", 3) + b"\xc1\xc1\xc1", "malformed", id="garbage-body"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", "oversized", id="http-garbage"),
        pytest.param(b"\xff\xff\xff\xff" + b"A" * 100, "oversized", id="huge-length-prefix"),
        pytest.param(encode_frame(hello("other-cluster", 1)), "wrong-cluster", id="wrong-cluster"),
        pytest.param(encode_frame(hello(CLUSTER, 99)), "unknown-node", id="unknown-node"),
        pytest.param(encode_frame(hello(CLUSTER, 1, PROTOCOL_VERSION + 1)), "version", id="version"),
        pytest.param(encode_frame(["not", "a", "hello"]), "bad-handshake", id="not-a-hello"),
        pytest.param(good_hello(1)[:-3], "truncated", id="truncated-hello"),
        pytest.param(good_hello(1) + encode_frame(["msg", 1])[:-2], "truncated", id="truncated-frame"),
    ],
)
async def test_bad_peers_are_counted_and_closed_and_the_replica_stays_up(payload, reason):
    socks = {1: bound_socket(), 2: bound_socket(), 3: bound_socket()}
    in1, in2 = Inbox(), Inbox()
    t1, t2 = make(1, socks, in1), make(2, socks, in2)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        port2 = socks[2].getsockname()[1]
        got = await raw_exchange(port2, payload)
        assert got == good_hello(2) or got == b""  # its hello, then it hung up
        assert t2.stats[reason] == 1, dict(t2.stats)
        # Still up: it keeps serving its real peer.
        t1.send(2, "ping")
        await in2.wait_for(lambda m: (1, "ping") in m)
        t2.send(1, "pong")
        await in1.wait_for(lambda m: (2, "pong") in m)
        # And it still accepts new connections (and refuses the next bad one too).
        await raw_exchange(port2, payload)
        assert t2.stats[reason] == 2
    finally:
        await t1.close()
        await t2.close()


async def test_all_the_faults_against_one_replica_in_a_row():
    socks = {1: bound_socket(), 2: bound_socket()}
    in1, in2 = Inbox(), Inbox()
    t1, t2 = make(1, socks, in1), make(2, socks, in2)
    await t2.start(sock=socks[2])
    await t1.start(sock=socks[1])
    try:
        port2 = socks[2].getsockname()[1]
        await raw_exchange(port2, b"\x00\x00\x00\x04garbage!")
        await raw_exchange(port2, b"\x7f\xff\xff\xff")
        await raw_exchange(port2, encode_frame(hello("nope", 1)))
        await raw_exchange(port2, good_hello(1)[:7])
        for i in range(100):
            t1.send(2, i)
        await in2.wait_for(lambda m: len(m) == 100)
        assert [m for _, m in in2.msgs] == list(range(100))
        assert (t2.stats["malformed"], t2.stats["oversized"], t2.stats["wrong-cluster"]) == (1, 1, 1)
        assert t2.stats["truncated"] == 1
    finally:
        await t1.close()
        await t2.close()


async def test_a_peer_that_resets_mid_frame_is_counted_and_redialed():
    """Connection reset (no FIN) in the middle of a frame still counts as truncated.
    The dialer redials only after handling the loss, which makes it observable."""
    peer_sock = bound_socket()
    connections: asyncio.Queue = asyncio.Queue(maxsize=2)

    async def resetting_peer(reader, writer):
        n = connections.qsize()
        await connections.put(writer)
        if n == 0:
            writer.write(good_hello(2) + encode_frame(["half"])[:-2])
            await writer.drain()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # RST
        else:
            writer.write(good_hello(2))

    server = await asyncio.start_server(resetting_peer, sock=peer_sock)
    t1 = PeerTransport(CLUSTER, 1, {2: peer_sock.getsockname()}, Inbox(), rng=random.Random(1),
                       backoff_base_s=0.01)
    await t1.start("127.0.0.1", 0)
    try:
        async with asyncio.timeout(WAIT_S):
            await connections.get()
            second = await connections.get()
            await t1.wait_connected(2)
        assert t1.stats["truncated"] == 1 and t1.stats["dials"] == 2
        second.close()
    finally:
        await t1.close()
        server.close()
        async with asyncio.timeout(WAIT_S):
            await server.wait_closed()


async def test_handshake_timeout_and_pending_limit():
    socks = {1: bound_socket(), 2: bound_socket()}
    t2 = make(2, socks, Inbox(), handshake_timeout_s=0.2, pending_connections_max=2)
    await t2.start(sock=socks[2])
    port2 = socks[2].getsockname()[1]
    try:
        async with asyncio.timeout(WAIT_S):
            silent = [await asyncio.open_connection("127.0.0.1", port2) for _ in range(2)]
            # A third handshake while two are pending is refused at once.
            assert await raw_exchange(port2, b"", half_close=False) == b""
            # The silent two are closed once the handshake timeout fires.
            for reader, writer in silent:
                assert await reader.read() == good_hello(2)
                writer.close()
        assert t2.stats["pending-limit"] == 1
        assert t2.stats["handshake-timeout"] == 2
    finally:
        await t2.close()


class _ClosedUnderUs:
    """A transport whose handle was closed while ``is_closing()`` still says False
    (what uvloop did to two replicas of a jepsen campaign): ``write`` raises."""

    def __init__(self, real) -> None:
        self.real = real

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

    def abort(self) -> None:
        self.real.abort()

    def __getattr__(self, name):
        return getattr(self.real, name)


async def test_a_write_on_a_handle_closed_under_us_is_a_lost_connection():
    socks = {1: bound_socket(), 2: bound_socket()}
    in1, in2 = Inbox(), Inbox()
    t1, t2 = make(1, socks, in1), make(2, socks, in2)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        t1.send(2, "before")
        await in2.wait_for(lambda m: (1, "before") in m)
        conn = t1._peers[2].conn
        conn.transport = _ClosedUnderUs(conn.transport)
        t1.send(2, "queued")
        t1.flush()  # raised RuntimeError out of the node's output step before
        assert t1.stats["write_on_closed"] == 1 and not t1.is_connected(2)
        # the frame waited in the queue and goes out on the next connection
        await in2.wait_for(lambda m: (1, "queued") in m)
        assert t1.stats["dials"] >= 2
    finally:
        await t1.close()
        await t2.close()


async def test_reconnect_after_the_peer_restarts():
    socks = {1: bound_socket(), 2: bound_socket()}
    port2 = socks[2].getsockname()[1]
    in1, in2 = Inbox(), Inbox()
    t1, t2 = make(1, socks, in1), make(2, socks, in2)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        t1.send(2, "before")
        await in2.wait_for(lambda m: (1, "before") in m)
        await t2.close()  # node 2 goes away; node 1 keeps dialing with backoff

        in2b = Inbox()
        t2b = PeerTransport(CLUSTER, 2, {1: socks[1].getsockname()}, in2b, rng=random.Random(7))
        await t2b.start("127.0.0.1", port2)  # the restarted node, same address
        try:
            t2b.send(1, "i am back")  # waits in t2b's queue until node 1 dials in
            await in1.wait_for(lambda m: (2, "i am back") in m)
            # Node 1 delivered that on the new connection, so it now sends there.
            t1.send(2, "after")
            await in2b.wait_for(lambda m: (1, "after") in m)
            assert t1.stats["dials"] >= 2 and t1.stats["disconnects"] >= 1
            async with asyncio.timeout(WAIT_S):
                await t1.wait_connected(2)
            assert t1.is_connected(2)
        finally:
            await t2b.close()
    finally:
        await t1.close()
        await t2.close()


@pytest.mark.parametrize("restarted", [True, False], ids=["new-incarnation", "same-incarnation"])
async def test_frames_queued_while_a_peer_was_away_reach_only_the_same_process(restarted):
    """Frames queued for node 2 while it was unreachable are delivered when the same
    process reconnects (a blip), and discarded when a restarted one (a new
    incarnation in its hello) connects: they were meant for the process that died."""
    socks = {1: bound_socket(), 2: bound_socket()}
    port2 = socks[2].getsockname()[1]
    in1, in2 = Inbox(), Inbox()
    t1, t2 = make(1, socks, in1), make(2, socks, in2)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        t1.send(2, "before")
        await in2.wait_for(lambda m: (1, "before") in m)
        conn = t1._peers[2].conn
        assert conn is not None
        await t2.close()
        async with asyncio.timeout(WAIT_S):
            await asyncio.shield(conn.lost)  # node 1 saw it go
        t1.send(2, "queued while away")
        assert t1.queued_bytes(2) > 0

        in2b = Inbox()
        inc = incarnation(2) + 1 if restarted else incarnation(2)
        t2b = PeerTransport(CLUSTER, 2, {1: socks[1].getsockname()}, in2b, rng=random.Random(7), incarnation=inc)
        await t2b.start("127.0.0.1", port2)
        try:
            async with asyncio.timeout(WAIT_S):
                await t1.wait_connected(2)
            t1.send(2, "after")
            await in2b.wait_for(lambda m: (1, "after") in m)
            if restarted:
                assert in2b.msgs == [(1, "after")]
                assert t1.stats["frames_discarded_restart"] == 1
            else:
                assert in2b.msgs == [(1, "queued while away"), (1, "after")]
                assert "frames_discarded_restart" not in t1.stats
        finally:
            await t2b.close()
    finally:
        await t1.close()
        await t2.close()


async def test_frames_that_waited_too_long_for_a_connection_are_dropped():
    """A peer never reached may have died and restarted meanwhile: frames older than
    queue_wait_max_s are not replayed to whoever answers (here every frame queued
    before the connection counts as too old)."""
    socks = {1: bound_socket(), 2: bound_socket()}
    in1, in2 = Inbox(), Inbox()
    t1, t2 = make(1, socks, in1, queue_wait_max_s=0.0), make(2, socks, in2)
    try:
        await t1.start(sock=socks[1])
        t1.send(2, "old")  # node 2 is not listening yet
        await t2.start(sock=socks[2])
        async with asyncio.timeout(WAIT_S):
            await t1.wait_connected(2)
        t1.send(2, "new")
        await in2.wait_for(lambda m: (1, "new") in m)
        assert in2.msgs == [(1, "new")]
        assert t1.stats["frames_expired"] == 1 and t1.queued_bytes(2) == 0
    finally:
        await t1.close()
        await t2.close()


async def test_backoff_is_capped_exponential_with_injected_jitter():
    t = PeerTransport(CLUSTER, 1, {2: ("127.0.0.1", 1)}, Inbox(), rng=random.Random(3),
                      backoff_base_s=0.1, backoff_max_s=1.0)
    delays = [t.backoff_s(a) for a in range(10)]
    for a, d in enumerate(delays):
        full = min(1.0, 0.1 * 2**a)
        assert full / 2 <= d < full
    t_again = PeerTransport(CLUSTER, 1, {2: ("127.0.0.1", 1)}, Inbox(), rng=random.Random(3),
                            backoff_base_s=0.1, backoff_max_s=1.0)
    assert [t_again.backoff_s(a) for a in range(10)] == delays  # same seed, same delays
    assert t.backoff_s(10_000) < 1.0


async def test_slow_peer_backpressure_drops_oldest_and_counts():
    """A peer that completes the handshake and then never reads: the transport's
    write buffer fills, writing pauses, the bounded queue drops its oldest frames."""
    peer_sock = bound_socket()
    # A small receive window (inherited by the accepted socket) so the kernel's
    # buffers fill long before the ~38 MiB below have been written.
    peer_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    accepted: asyncio.Queue = asyncio.Queue(maxsize=1)

    async def stalled_peer(reader, writer):
        writer.write(good_hello(2))
        await accepted.put(writer)  # keep it open, never read

    server = await asyncio.start_server(stalled_peer, sock=peer_sock)
    socks = {1: bound_socket()}
    t1 = PeerTransport(CLUSTER, 1, {2: peer_sock.getsockname()}, Inbox(), rng=random.Random(1),
                       send_queue_bytes_max=1 << 20, write_buffer_high_bytes=256 << 10)
    await t1.start(sock=socks[1])
    try:
        async with asyncio.timeout(WAIT_S):
            await t1.wait_connected(2)
            chunk = b"x" * (64 << 10)
            for i in range(600):  # ~38 MiB
                t1.send(2, [i, chunk])
                await asyncio.sleep(0)  # yield one loop turn so flushes happen
                assert t1.queued_bytes(2) <= 1 << 20
        assert t1.stats["write_pauses"] >= 1
        assert t1.stats["frames_dropped"] > 0
        assert t1.stats["bytes_dropped"] >= t1.stats["frames_dropped"] * len(chunk)
        t1.send(2, "still usable")
        with pytest.raises(ValueError):
            t1.send(9, "unknown peer")
        with pytest.raises(ValueError):
            t1.send(2, b"x" * (t1.max_frame_bytes + 1))
    finally:
        await t1.close()
        async with asyncio.timeout(WAIT_S):
            writer = await accepted.get()
            writer.close()
            server.close()
            await server.wait_closed()


async def test_a_raising_callback_is_fatal_and_reported_to_on_fatal():
    """Crash-only: an exception from on_messages (other than ProtocolError) is the
    owner's failure. The transport delivers nothing more and calls on_fatal once."""
    socks = {1: bound_socket(), 2: bound_socket()}
    got: list = []
    fatal: list = []
    reported = asyncio.Event()

    def fragile(peer_id, msgs):
        got.extend(msgs)
        if "boom" in msgs:
            raise RuntimeError("callback bug")

    def on_fatal(exc):
        fatal.append(exc)
        reported.set()

    t1 = make(1, socks, Inbox())
    t2 = make(2, socks, fragile, on_fatal=on_fatal)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        t1.send(2, "boom")
        async with asyncio.timeout(WAIT_S):
            await reported.wait()
        assert [str(e) for e in fatal] == ["callback bug"] and t2.failed is fatal[0]
        conn = t2._peers[1].conn
        t2._deliver(conn, 1, ["after", "boom"])  # what the next read would do
        assert got == ["boom"] and len(fatal) == 1 and t2.stats["callback_errors"] == 1
    finally:
        await t1.close()
        await t2.close()


async def test_a_raising_callback_without_on_fatal_closes_the_transport():
    socks = {1: bound_socket(), 2: bound_socket()}

    def fragile(peer_id, msgs):
        raise RuntimeError("callback bug")

    t1 = make(1, socks, Inbox())
    t2 = make(2, socks, fragile)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        async with asyncio.timeout(WAIT_S):
            await t1.wait_connected(2)
            conn = t1._peers[2].conn
            t1.send(2, "boom")
            await asyncio.shield(conn.lost)  # node 2 closed itself, connections included
        assert t2.stats["callback_errors"] == 1 and t2._close_task is not None
        with pytest.raises(RuntimeError):
            t2.send(1, "anything")  # closed
    finally:
        await t1.close()
        await t2.close()


# --- silent connections --------------------------------------------------------------


async def test_idle_connections_stay_up_on_keepalives():
    """Nothing to send for several dead-after periods: keepalives keep the connection,
    and they are never delivered as messages."""
    socks = {1: bound_socket(), 2: bound_socket()}
    in1, in2 = Inbox(), Inbox()
    t1 = make(1, socks, in1, keepalive_s=0.02, dead_after_s=0.1)
    t2 = make(2, socks, in2, keepalive_s=0.02, dead_after_s=0.1)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        t1.send(2, ["hello"])
        await in2.wait_for(lambda m: len(m) >= 1)
        await asyncio.sleep(0.5)  # the idle time under test: five dead-after periods
        assert t1.stats["keepalives_sent"] > 0 and t2.stats["keepalives_sent"] > 0
        assert "heartbeat-timeout" not in t1.stats and "heartbeat-timeout" not in t2.stats
        assert t1.stats["connections_established"] == 1
        t2.send(1, ["after idle"])
        await in1.wait_for(lambda m: len(m) >= 1)
        assert in1.msgs == [(2, ["after idle"])] and in2.msgs == [(1, ["hello"])]
    finally:
        await t1.close()
        await t2.close()


async def test_a_silent_connection_is_dropped_and_redialled():
    """The peer keeps the connection open but sends nothing (a half-dead connection):
    the transport gives up on it after dead_after_s and the dialer connects again."""
    socks = {1: bound_socket(), 2: bound_socket()}
    in1, in2 = Inbox(), Inbox()
    t1 = make(1, socks, in1, keepalive_s=0.02, dead_after_s=0.1)
    t2 = make(2, socks, in2)  # no keepalives: silent when idle
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        t1.send(2, ["first"])
        await in2.wait_for(lambda m: len(m) >= 1)
        async with asyncio.timeout(WAIT_S):
            while t1.stats["connections_established"] < 2:  # bounded by the timeout
                await asyncio.sleep(0.01)
        assert t1.stats["heartbeat-timeout"] >= 1 and t1.stats["dials"] >= 2
        t1.send(2, ["second"])
        await in2.wait_for(lambda m: len(m) >= 2)
        assert [m for _, m in in2.msgs] == [["first"], ["second"]]
    finally:
        await t1.close()
        await t2.close()


def test_keepalive_needs_a_longer_dead_after():
    with pytest.raises(ValueError, match="dead_after_s"):
        make(1, {1: bound_socket(), 2: bound_socket()}, Inbox(), keepalive_s=0.1, dead_after_s=0.1)


async def test_peers_dial_from_the_address_they_listen_on():
    """Each replica on its own loopback address: its outgoing connections come from it
    too, so a peer (and an iptables rule in a fault campaign) can tell replicas apart."""
    socks = {}
    for node, host in ((1, "127.0.0.2"), (2, "127.0.0.3")):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        _created.append(s)
        socks[node] = s
    in1, in2 = Inbox(), Inbox()
    t1, t2 = make(1, socks, in1), make(2, socks, in2)
    await t1.start(sock=socks[1])
    await t2.start(sock=socks[2])
    try:
        t1.send(2, ["hello"])
        await in2.wait_for(lambda m: len(m) >= 1)
        conn = t2._peer(1).conn  # node 2 accepted node 1's dial
        assert conn is not None and conn.peername[0] == "127.0.0.2", conn.peername
    finally:
        await t1.close()
        await t2.close()
