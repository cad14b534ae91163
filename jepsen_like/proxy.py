"""A delaying TCP proxy on loopback: wide-area round-trip times between local processes.

``cellar bench geo`` (bench/geo_bench.py) puts one of these in front of every peer
link and between each site's clients and their replica, so that real ``cellar serve``
processes see the RTTs of the paper's Table 1 (``consensus.sim.geo``) instead of
loopback's::

    proxy = DelayProxy(("127.0.0.1", 7001), one_way_ms=10.0, back_ms=10.0, jitter=0.1, seed=1)
    host, port = await proxy.start()        # 127.0.0.1, a free port
    ...                                     # connect to (host, port) instead of 7001
    proxy.stats.as_dict()                   # connections, bytes, lateness of the writers
    await proxy.close()

Each accepted connection gets a connection to the target and two *directions*
(client to target after ``one_way_ms``, target to client after ``back_ms``), each a
queue of timestamped chunks: a reader task stamps every chunk it reads with its due
time, ``now + delay`` (plus, with ``jitter``, up to ``jitter * delay`` more, drawn from
a ``random.Random(seed)`` per direction), and a writer task sleeps until the head
chunk is due and writes everything that is due by then. Due times never decrease, so
the bytes of a connection come out in the order they went in whatever the jitter (a
chunk drawn early waits for the one before it, as on one TCP path).

**Backpressure.** A direction holds at most ``buffer_bytes_max`` bytes not yet written
(plus the one chunk being read, at most ``read_bytes``): past that its reader stops
reading, the kernel's buffers fill and the sender's writes block, as on a slow link.

**Closing.** When either side closes (EOF) or fails, the bytes already read in that
direction are still delivered at their due time, then both connections are closed;
the other direction's undelivered bytes are dropped. A failure to reach the target
closes the accepted connection at once. ``close()`` stops listening and aborts every
connection; every wait in here is bounded by the delay, a timeout or a close.

Listens on loopback only (``ValueError`` otherwise): nothing here authenticates.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import ipaddress
import random
import socket
from dataclasses import dataclass, field

READ_BYTES = 64 * 1024
BUFFER_BYTES_MAX = 1 << 20
CONNECT_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 2.0
_EOF = b""


def check_loopback(host: str) -> None:
    """``ValueError`` unless ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"the delaying proxy listens on loopback only, not {host!r}")


def link_seed(seed: int, name: str) -> int:
    """A seed per named direction, the same in every process (``hash()`` of a str is not)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")


@dataclass
class ProxyStats:
    """What one proxy did (both directions of every connection)."""

    connections: int = 0
    connect_failures: int = 0
    bytes_forward: int = 0  # client to target
    bytes_back: int = 0  # target to client
    chunks: int = 0
    # How much later than due the writer wrote (event-loop lag; a busy machine shows here).
    lateness_ms_max: float = 0.0
    lateness_ms_total: float = 0.0
    errors: int = 0  # connection handlers that ended with an unexpected exception
    backpressure_waits: int = 0  # a reader found its direction full and waited
    buffered_bytes_peak: int = 0  # most bytes any direction held
    lateness_samples: list[float] = field(default_factory=list, repr=False)

    def reset(self) -> None:
        """Zero the traffic counters (a measurement starts); connection counts stay."""
        kept = self.connections, self.connect_failures
        self.__init__()  # type: ignore[misc]
        self.connections, self.connect_failures = kept

    def as_dict(self) -> dict:
        late = sorted(self.lateness_samples)
        p99 = late[min(len(late) - 1, int(0.99 * len(late)))] if late else 0.0
        return {
            "connections": self.connections, "connect_failures": self.connect_failures,
            "bytes_forward": self.bytes_forward, "bytes_back": self.bytes_back, "chunks": self.chunks,
            "lateness_ms_mean": round(self.lateness_ms_total / self.chunks, 3) if self.chunks else 0.0,
            "lateness_ms_p99": round(p99, 3), "lateness_ms_max": round(self.lateness_ms_max, 3),
            "errors": self.errors, "backpressure_waits": self.backpressure_waits,
            "buffered_bytes_peak": self.buffered_bytes_peak,
        }


_LATENESS_SAMPLES_MAX = 100_000


class _Direction:
    """Bytes from ``reader`` to ``writer``, each chunk held until its due time."""

    def __init__(self, proxy: DelayProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 delay_s: float, rng: random.Random, forward: bool) -> None:
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        self.delay_s = delay_s
        self.rng = rng
        self.forward = forward
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.buffered = 0
        self.last_due = 0.0
        self.ready = asyncio.Event()  # the queue has something
        self.room = asyncio.Event()  # the queue is below buffer_bytes_max
        self.room.set()

    def due(self, now: float) -> float:
        d = self.delay_s
        if self.proxy.jitter and d:
            d += self.rng.uniform(0.0, self.proxy.jitter * d)
        self.last_due = max(self.last_due, now + d)
        return self.last_due

    async def pump(self) -> None:
        """Read chunks, stamp them, queue them; ends after queueing EOF."""
        loop = asyncio.get_running_loop()
        stats = self.proxy.stats
        limit = self.proxy.buffer_bytes_max
        while True:
            while self.buffered >= limit:  # bounded: the writer drains or the connection closes
                stats.backpressure_waits += 1
                self.room.clear()
                await self.room.wait()
            try:
                chunk = await self.reader.read(self.proxy.read_bytes)
            except (ConnectionError, OSError):
                chunk = _EOF
            self.queue.append((self.due(loop.time()), chunk))
            self.ready.set()
            if not chunk:
                return
            self.buffered += len(chunk)
            stats.buffered_bytes_peak = max(stats.buffered_bytes_peak, self.buffered)
            if self.forward:
                stats.bytes_forward += len(chunk)
            else:
                stats.bytes_back += len(chunk)

    async def deliver(self) -> None:
        """Write each chunk at its due time, in order; ends at EOF or a write error."""
        loop = asyncio.get_running_loop()
        stats = self.proxy.stats
        while True:
            while not self.queue:
                self.ready.clear()
                await self.ready.wait()
            wait = self.queue[0][0] - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            now = loop.time()
            out: list[bytes] = []
            eof = False
            while self.queue and self.queue[0][0] <= now:
                due, chunk = self.queue.popleft()
                if not chunk:
                    eof = True
                    break
                late_ms = (now - due) * 1000
                stats.chunks += 1
                stats.lateness_ms_total += late_ms
                stats.lateness_ms_max = max(stats.lateness_ms_max, late_ms)
                if len(stats.lateness_samples) < _LATENESS_SAMPLES_MAX:
                    stats.lateness_samples.append(late_ms)
                out.append(chunk)
            if out:
                data = b"".join(out)
                try:
                    self.writer.write(data)
                    await self.writer.drain()
                except (ConnectionError, OSError):
                    return
                self.buffered -= len(data)
                if self.buffered < self.proxy.buffer_bytes_max:
                    self.room.set()
            if eof:
                return


class DelayProxy:
    """Listens on loopback and forwards each connection to ``target``, delaying bytes
    toward the target by ``one_way_ms`` and back by ``back_ms`` (default: the same)."""

    def __init__(self, target: tuple[str, int], one_way_ms: float, back_ms: float | None = None, *,
                 jitter: float = 0.0, seed: int = 0, name: str = "", buffer_bytes_max: int = BUFFER_BYTES_MAX,
                 read_bytes: int = READ_BYTES) -> None:
        if one_way_ms < 0 or (back_ms is not None and back_ms < 0):
            raise ValueError("delays must be >= 0 ms")
        if jitter < 0:
            raise ValueError("jitter must be >= 0 (a fraction of the one-way delay)")
        if buffer_bytes_max < 1 or read_bytes < 1:
            raise ValueError("buffer_bytes_max and read_bytes must be >= 1")
        self.target = target
        self.forward_s = one_way_ms / 1000
        self.back_s = (one_way_ms if back_ms is None else back_ms) / 1000
        self.jitter = jitter
        self.seed = seed
        self.name = name or f"proxy->{target[0]}:{target[1]}"
        self.buffer_bytes_max = buffer_bytes_max
        self.read_bytes = read_bytes
        self.stats = ProxyStats()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._accepted = 0
        self.address: tuple[str, int] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None
                    ) -> tuple[str, int]:
        if sock is None:
            check_loopback(host)
        else:
            check_loopback(sock.getsockname()[0])
        self._server = await asyncio.start_server(self._accept, None if sock else host, None if sock else port,
                                                  sock=sock)
        self.address = tuple(self._server.sockets[0].getsockname()[:2])  # type: ignore[assignment]
        return self.address  # type: ignore[return-value]

    def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        # Our own task (not the one asyncio.start_server would make of a coroutine, whose
        # cancellation at close() it would log as an error).
        task = asyncio.ensure_future(self._serve(c_reader, c_writer))
        self._conns.add(task)
        task.add_done_callback(self._served)

    def _served(self, task: asyncio.Task[None]) -> None:
        self._conns.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.stats.errors += 1

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self._writers.add(c_writer)
        index = self._accepted
        self._accepted += 1
        t_writer: asyncio.StreamWriter | None = None
        try:
            try:
                t_reader, t_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError):
                self.stats.connect_failures += 1
                return
            self._writers.add(t_writer)
            self.stats.connections += 1
            for w in (c_writer, t_writer):
                s = w.get_extra_info("socket")
                if s is not None:
                    try:
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    except OSError:
                        pass
            fwd = _Direction(self, c_reader, t_writer, self.forward_s,
                             random.Random(link_seed(self.seed, f"{self.name}#{index}>")), True)
            back = _Direction(self, t_reader, c_writer, self.back_s,
                              random.Random(link_seed(self.seed, f"{self.name}#{index}<")), False)
            tasks = [asyncio.ensure_future(x) for x in (fwd.pump(), fwd.deliver(), back.pump(), back.deliver())]
            try:
                # Either direction delivering its EOF (or failing to write) ends the connection.
                await asyncio.wait([tasks[1], tasks[3]], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for w in (c_writer, t_writer):
                if w is not None:
                    self._writers.discard(w)
                    w.close()
            for w in (c_writer, t_writer):
                if w is not None:
                    try:
                        await asyncio.wait_for(w.wait_closed(), CLOSE_TIMEOUT_S)
                    except (OSError, asyncio.TimeoutError):
                        pass

    async def close(self) -> None:
        """Stop listening, abort every connection, wait (bounded) for their tasks."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        conns = list(self._conns)
        for t in conns:
            t.cancel()
        if conns:
            await asyncio.wait(conns, timeout=CLOSE_TIMEOUT_S)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), CLOSE_TIMEOUT_S)
            except asyncio.TimeoutError:
                pass
            self._server = None
