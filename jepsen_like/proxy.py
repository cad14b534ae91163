"""A TCP proxy on loopback that delays bytes and, on the nemesis' command, cuts links.

One forwarding core serves two users:

- ``cellar bench geo`` (bench/geo_proxy.py re-exports ``DelayProxy``): fixed wide-area
  delays in front of every peer link and between each site's clients and its replica;
- the Jepsen harness (``ProxyNet``): partitions, one-way cuts and extra delay between
  real processes where iptables cannot be used (no root, no iptables, or processes that
  all dial from 127.0.0.1, as etcd's members do).

``DelayProxy``::

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

**Gates.** Each direction reads its delay and whether it is cut from a ``Gate``. A
``DelayProxy`` alone has two gates of its own that never close; ``ProxyNet`` shares
one gate per directed pair of nodes (a->b) between every connection that carries
bytes from a to b, whoever dialed it, and the nemesis sets them. What a cut does
(``mode``), always within what TCP can show an application:

- ``hold`` (the default; iptables DROP): a cut direction reads nothing and writes
  nothing; its bytes wait in the proxy's buffer and the kernel's, the sender's writes
  block once they are full, and everything is delivered in order after the heal
  unless an end gives up and closes first (TCP retransmitting across a partition).
  The other direction flows (a one-way cut);
- ``discard``: a cut direction reads and throws its bytes away, so the sender does not
  block; a connection that lost bytes has a hole in its stream, which TCP never shows,
  so at the heal it is aborted (both ends see a reset and reconnect) instead of
  resuming (a connection that timed out during the partition);
- ``reset`` (iptables REJECT): a cut aborts every connection of the pair at once.

A *new* connection of a pair with either direction cut cannot complete TCP's
handshake: ``hold`` and ``discard`` keep it accepted but unconnected until the heal
(at most ``HELD_MAX`` per proxy; more are closed), ``reset`` closes it at once.

**Duplication and reordering** are not what TCP delivers inside a connection (its
sequence numbers drop duplicate and reorder late segments), so the proxy never
duplicates or reorders bytes of a connection. What an application does see, and the
proxy makes: bytes of *different* connections overtaking each other (per-link delay,
``ProxyNet.delay``), and a connection reset, after which the application re-sends on
a new connection (its retries are where duplicates come from: ``reset`` and
``discard``).

**Backpressure.** A direction holds at most ``buffer_bytes_max`` bytes not yet written
(plus the one chunk being read, at most ``read_bytes``): past that its reader stops
reading, the kernel's buffers fill and the sender's writes block, as on a slow link.

**Closing.** When either side closes (EOF) or fails, the bytes already read in that
direction are still delivered at their due time, then both connections are closed;
the other direction's undelivered bytes are dropped. A failure to reach the target
closes the accepted connection at once. ``close()`` stops listening and aborts every
connection; every wait in here is bounded by the delay, a timeout, a heal or a close.

Listens on loopback only (``ValueError`` otherwise): nothing here authenticates.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import ipaddress
import random
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

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
    unplaced: int = 0  # connections whose caller the route could not name (closed)
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
            "connections": self.connections, "connect_failures": self.connect_failures, "unplaced": self.unplaced,
            "bytes_forward": self.bytes_forward, "bytes_back": self.bytes_back, "chunks": self.chunks,
            "lateness_ms_mean": round(self.lateness_ms_total / self.chunks, 3) if self.chunks else 0.0,
            "lateness_ms_p99": round(p99, 3), "lateness_ms_max": round(self.lateness_ms_max, 3),
            "errors": self.errors, "backpressure_waits": self.backpressure_waits,
            "buffered_bytes_peak": self.buffered_bytes_peak,
        }


_LATENESS_SAMPLES_MAX = 100_000
MODES = ("hold", "discard", "reset")
HELD_MAX = 64  # connections a proxy keeps accepted but unconnected during a cut


class Gate:
    """One direction of one link: its delay and whether it is cut (``ProxyNet`` sets it)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.cut = False
        self.open = asyncio.Event()  # set while not cut
        self.open.set()
        self.dropped_bytes = 0  # discarded while cut (mode discard)
        self.holds = 0  # times a direction stopped at this gate while it was cut (hold)

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            self.open.clear()
        else:
            self.open.set()


class _Direction:
    """Bytes from ``reader`` to ``writer``, each chunk held until its due time."""

    def __init__(self, proxy: DelayProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 gate: Gate, rng: random.Random, forward: bool, conn: _Conn) -> None:
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        self.gate = gate
        self.conn = conn
        self.rng = rng
        self.forward = forward
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.buffered = 0
        self.last_due = 0.0
        self.ready = asyncio.Event()  # the queue has something
        self.room = asyncio.Event()  # the queue is below buffer_bytes_max
        self.room.set()

    def due(self, now: float) -> float:
        d = self.gate.delay_s
        if self.proxy.jitter and d:
            d += self.rng.uniform(0.0, self.proxy.jitter * d)
        self.last_due = max(self.last_due, now + d)
        return self.last_due

    async def pump(self) -> None:
        """Read chunks, stamp them, queue them; ends after queueing EOF."""
        loop = asyncio.get_running_loop()
        stats = self.proxy.stats
        limit = self.proxy.buffer_bytes_max
        gate = self.gate
        discard = self.proxy.mode == "discard"
        while True:
            while self.buffered >= limit:  # bounded: the writer drains or the connection closes
                stats.backpressure_waits += 1
                self.room.clear()
                await self.room.wait()
            if gate.cut and not discard:
                gate.holds += 1
                await gate.open.wait()  # hold: bounded by the heal or the connection's close
            try:
                chunk = await self.reader.read(self.proxy.read_bytes)
            except (ConnectionError, OSError):
                chunk = _EOF
            if chunk and gate.cut and discard:
                gate.dropped_bytes += len(chunk)
                self.conn.holed = True  # aborted at the heal: its stream has a hole
                continue
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
            if self.gate.cut:
                self.gate.holds += 1
                await self.gate.open.wait()  # bytes read before a cut wait for the heal
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


class _Conn:
    """One accepted connection: its writers (to abort it) and whether it lost bytes."""

    __slots__ = ("writers", "holed", "key")

    def __init__(self, key: Any) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.holed = False
        self.key = key

    def abort(self) -> None:
        for w in self.writers:
            w.transport.abort()


# Picks the gates of an accepted connection from the peer's address: (key, forward gate,
# back gate), or None when the connection cannot be placed (it is closed).
Router = Callable[[tuple[str, int]], "tuple[Any, Gate, Gate] | None"]


class DelayProxy:
    """Listens on loopback and forwards each connection to ``target``, delaying bytes
    toward the target by ``one_way_ms`` and back by ``back_ms`` (default: the same).

    ``route`` (``ProxyNet``) gives each accepted connection shared gates instead of the
    proxy's own; ``mode`` says what a cut gate does (module docstring)."""

    def __init__(self, target: tuple[str, int], one_way_ms: float = 0.0, back_ms: float | None = None, *,
                 jitter: float = 0.0, seed: int = 0, name: str = "", buffer_bytes_max: int = BUFFER_BYTES_MAX,
                 read_bytes: int = READ_BYTES, route: Router | None = None, mode: str = "hold") -> None:
        if one_way_ms < 0 or (back_ms is not None and back_ms < 0):
            raise ValueError("delays must be >= 0 ms")
        if jitter < 0:
            raise ValueError("jitter must be >= 0 (a fraction of the one-way delay)")
        if buffer_bytes_max < 1 or read_bytes < 1:
            raise ValueError("buffer_bytes_max and read_bytes must be >= 1")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} ({', '.join(MODES)})")
        self.target = target
        self.forward_s = one_way_ms / 1000
        self.back_s = (one_way_ms if back_ms is None else back_ms) / 1000
        self.gates = (Gate(self.forward_s), Gate(self.back_s))
        self.route = route
        self.mode = mode
        self.jitter = jitter
        self.seed = seed
        self.name = name or f"proxy->{target[0]}:{target[1]}"
        self.buffer_bytes_max = buffer_bytes_max
        self.read_bytes = read_bytes
        self.stats = ProxyStats()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.live: set[_Conn] = set()  # connections being served (ProxyNet aborts some)
        self.held = 0  # accepted, waiting for a heal to connect
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
        conn: _Conn | None = None
        try:
            if self.route is None:
                key, fwd_gate, back_gate = None, *self.gates
            else:
                placed = self.route(c_writer.get_extra_info("peername"))
                if placed is None:
                    self.stats.unplaced += 1
                    return
                key, fwd_gate, back_gate = placed
            if fwd_gate.cut or back_gate.cut:  # no handshake across a cut
                if self.mode == "reset" or self.held >= HELD_MAX:
                    c_writer.transport.abort()
                    return
                self.held += 1
                try:
                    while fwd_gate.cut or back_gate.cut:  # bounded by a heal or close()
                        await fwd_gate.open.wait()
                        await back_gate.open.wait()
                finally:
                    self.held -= 1
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
            conn = _Conn(key)
            conn.writers = [c_writer, t_writer]
            self.live.add(conn)
            fwd = _Direction(self, c_reader, t_writer, fwd_gate,
                             random.Random(link_seed(self.seed, f"{self.name}#{index}>")), True, conn)
            back = _Direction(self, t_reader, c_writer, back_gate,
                              random.Random(link_seed(self.seed, f"{self.name}#{index}<")), False, conn)
            tasks = [asyncio.ensure_future(x) for x in (fwd.pump(), fwd.deliver(), back.pump(), back.deliver())]
            try:
                # Either direction delivering its EOF (or failing to write) ends the connection.
                await asyncio.wait([tasks[1], tasks[3]], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            if conn is not None:
                self.live.discard(conn)
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

    def abort(self, which: Callable[[_Conn], bool]) -> int:
        """Abort the live connections ``which`` picks (both ends see a reset); how many."""
        gone = [c for c in self.live if which(c)]
        for c in gone:
            c.abort()
        return len(gone)

    async def close(self) -> None:
        """Stop listening, abort every connection, wait (bounded) for their tasks."""
        await close_listener(self._server, self._writers, self._conns)
        self._server = None


async def close_listener(server: asyncio.AbstractServer | None, writers: Any, tasks: Any) -> None:
    """Stop ``server`` listening, abort every connection's transport (``writers``), cancel
    their ``tasks`` and wait for them and the server, each wait bounded (CLOSE_TIMEOUT_S)."""
    if server is not None:
        server.close()
    for w in list(writers):
        w.transport.abort()
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
    if server is not None:
        try:
            await asyncio.wait_for(server.wait_closed(), CLOSE_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass


# --- the Jepsen harness's network: one gate per directed pair of nodes ------------------


class ProxyNet:
    """Fault proxies between ``n`` nodes, with the partition interface of
    ``jepsen_like.nemesis.IptablesNet`` (``drop``, ``partition``, ``heal``, ``close``).

    Gate (a, b) carries every byte from node a to node b: the forward direction of
    connections a dials to b, the back direction of those b dials to a. Two ways to
    put a proxy in front of a node:

    - ``pair(i, j, target)``: a listener node i dials to reach j (Cellar: node i's
      ``--peers`` entry for j), so the listener names the pair;
    - ``node(j, target, source)``: one listener in front of node j for every peer, and
      ``source(peer_address)`` names the node that dialed (etcd: members all dial from
      127.0.0.1, told apart by who owns the socket, ``loopback_owner``).

    Runs on the caller's event loop (``in_loop``: call it from there, not a thread)."""

    in_loop = True

    def __init__(self, n: int, *, mode: str = "hold", seed: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r} ({', '.join(MODES)})")
        self.n, self.mode, self.seed = n, mode, seed
        self.gates = {(a, b): Gate() for a in range(n) for b in range(n) if a != b}
        self.proxies: list[DelayProxy] = []
        self.cut: set[tuple[int, int]] = set()
        self.aborted = 0  # connections reset by a cut (reset) or a heal (discard)

    def _placed(self, i: int | None, j: int) -> tuple[Any, Gate, Gate] | None:
        if i is None or i == j or not 0 <= i < self.n:
            return None
        return (i, j), self.gates[(i, j)], self.gates[(j, i)]

    async def pair(self, i: int, j: int, target: tuple[str, int]) -> tuple[str, int]:
        proxy = DelayProxy(target, route=lambda _peer: self._placed(i, j), mode=self.mode, seed=self.seed,
                           name=f"{i}->{j}")
        self.proxies.append(proxy)
        return await proxy.start()

    async def node(self, j: int, target: tuple[str, int], source: Callable[[tuple[str, int]], int | None]
                   ) -> tuple[str, int]:
        proxy = DelayProxy(target, route=lambda peer: self._placed(source(peer), j), mode=self.mode,
                           seed=self.seed, name=f"*->{j}")
        self.proxies.append(proxy)
        return await proxy.start()

    def drop(self, pairs: set[tuple[int, int]]) -> None:
        """Cut exactly ``pairs`` (src node, dst node), one direction each, healing others."""
        self.heal()
        for p in sorted(pairs):
            self.gates[p].set_cut(True)
        self.cut = set(pairs)
        if self.mode == "reset":
            touched = self.cut | {(b, a) for a, b in self.cut}
            self.aborted += sum(p.abort(lambda c: c.key in touched) for p in self.proxies)

    def partition(self, groups: list[set[int]]) -> None:
        """Nodes talk only within their group (a node may be in several: a bridge)."""
        self.drop({(a, b) for a in range(self.n) for b in range(self.n)
                   if a != b and not any(a in g and b in g for g in groups)})

    def heal(self) -> None:
        for p in self.cut:
            self.gates[p].set_cut(False)
        self.cut = set()
        # a connection that lost bytes (discard) must not resume with a hole in its stream
        self.aborted += sum(p.abort(lambda c: c.holed) for p in self.proxies)

    def delay(self, pairs: set[tuple[int, int]], ms: float) -> None:
        """Bytes from a to b wait ``ms`` more, for every (a, b) in ``pairs`` (0: none)."""
        for p in pairs:
            self.gates[p].delay_s = ms / 1000

    def rules(self) -> list[str]:
        return [f"cut {a}->{b}" for a, b in sorted(self.cut)]

    def stats(self) -> dict[str, Any]:
        return {"mode": self.mode, "proxies": len(self.proxies), "aborted": self.aborted,
                "connections": sum(p.stats.connections for p in self.proxies),
                "target_unreachable": sum(p.stats.connect_failures for p in self.proxies),
                "unplaced": sum(p.stats.unplaced for p in self.proxies),
                "bytes": sum(p.stats.bytes_forward + p.stats.bytes_back for p in self.proxies),
                "dropped_bytes": sum(g.dropped_bytes for g in self.gates.values()),
                "holds": sum(g.holds for g in self.gates.values())}

    async def aclose(self) -> None:
        self.heal()
        for p in self.proxies:
            await p.close()
        self.proxies = []

    def close(self) -> None:
        """Heal (the proxies themselves end with ``aclose`` on the loop)."""
        self.heal()


def _proc_addr(host: str, port: int) -> str:
    return "%08X:%04X" % (int.from_bytes(socket.inet_aton(host), sys.byteorder), port)


def loopback_owner(peer: tuple[str, int], local: tuple[str, int], pids: dict[int, int]) -> int | None:
    """Which of ``pids`` (pid -> node) owns the socket that connected from ``peer`` to
    ``local`` (IPv4, Linux: /proc/net/tcp and each pid's fds); None if none does, or if
    the caller closed its socket before we looked (it dials again)."""
    want_local, want_remote = _proc_addr(*peer[:2]), _proc_addr(*local[:2])
    inode = None
    try:
        with open("/proc/net/tcp") as f:
            for line in f:
                parts = line.split()
                # inode 0: a socket already closed (TIME_WAIT of an earlier connection on the same ports)
                if len(parts) > 9 and parts[1] == want_local and parts[2] == want_remote and parts[9] != "0":
                    inode = parts[9]
                    break
    except OSError:
        return None
    if inode is None:
        return None
    link = f"socket:[{inode}]"
    for pid, node in pids.items():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:  # bounded by the process's open files
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                    return node
            except OSError:
                continue
    return None
