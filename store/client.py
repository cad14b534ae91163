"""The async client: many logical sessions multiplexed over one connection per node.

::

    async with CellarClient("127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102") as cellar:
        s = cellar.session()            # a logical client: its own id and seq numbers
        await s.put("k", "v")           # answered once it cannot be lost
        await s.get("k")                # linearizable read (sequencer lease or the log)
        await s.cas("k", "v", "w")      # True / False, with the execution result
        await cellar.status(0)          # node 0's status dict (view, digest, WAL, ...)

Addresses: ``"host:port"``, a comma-separated string of them (what ``cellar up``
prints), or a list of ``"host:port"`` strings or ``(host, port)`` pairs; IPv6 as
``"[::1]:7100"``. A bad address raises ``ValueError`` naming it.

TLS (nodes started with ``--tls-ca/--tls-cert/--tls-key``): ``tls=`` the cluster CA
file (or an ``ssl.SSLContext``); ``tls_cert=``/``tls_key=`` a client certificate, the
admin one for ADMIN requests::

    CellarClient(addrs, tls="certs/ca.pem")                                   # plain operations
    CellarClient(addrs, tls="certs/ca.pem", tls_cert="certs/admin.pem", tls_key="certs/admin-key.pem")

A TLS handshake that fails (wrong CA, not TLS on that port) raises ``TLSError``; a
client without TLS on a TLS port gets ``TLSRequired``; an ADMIN request without the
admin certificate ``PermissionDenied``. None of them is retried.

Errors are typed (all ``CellarError``): ``Unavailable`` (no node answered within
the deadline; a write may or may not have been applied), ``InvalidRequest``,
``TooLarge``, ``Compacted`` (carries ``compact_revision``), ``LeaseNotFound``, and
``CompareFailed`` (raised by ``cas(..., strict=True)`` only: a failed compare is an
outcome, not an error). Nothing the cluster refused was applied.

For scripts without asyncio: ``SyncClient`` (same methods, blocking; a loop on a
background thread)::

    with SyncClient("127.0.0.1:7100") as cellar:
        cellar.put("k", "v"); cellar.get("k")

A session sends one command at a time. On a timeout or a lost connection it resends
the *same* ``(client, seq)`` to the next node, so a command is applied at most once
(the replicas' executor drops duplicates) and at least once while the cluster is up.
Requests issued in one loop turn travel to a node as one frame.
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import threading
import time
from collections import deque
from typing import Any, Iterable

import msgpack

from consensus.runtime import clientwire
from consensus.transport.framing import MAX_FRAME_BYTES, FrameDecoder, ProtocolError, encode_frame


class CellarError(Exception):
    """The cluster answered with an error (a bad operation, say)."""


class Unavailable(CellarError):
    """No node answered within the deadline."""


class TooLarge(CellarError):
    """The command is over the node's limit (``clientwire.MAX_COMMAND_BYTES``); nothing
    was applied."""


class InvalidRequest(CellarError):
    """The command is malformed (refused before it entered the log, or not encodable);
    nothing was applied."""


class Compacted(CellarError):
    """A read at (or a compaction to) a revision below the compaction point."""

    def __init__(self, message: str, compact_revision: int | None = None) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class LeaseNotFound(CellarError):
    """The lease does not exist or has expired."""


class PermissionDenied(CellarError):
    """TLS on: an admin request without the admin client certificate; nothing changed."""


class TLSError(CellarError):
    """The TLS handshake with a node failed (its certificate is not signed by the CA
    given, the port does not speak TLS, ...) or the node's port needs TLS (``TLSRequired``)."""


class TLSRequired(TLSError):
    """A client without TLS reached a node whose client port speaks TLS."""


class CompareFailed(CellarError):
    """``cas(..., strict=True)``: the key did not hold the expected value; nothing changed."""


def parse_addresses(addresses: Any) -> list[tuple[str, int]]:
    """``"h:p"``, ``"h:p,h:p"``, or an iterable of ``"h:p"`` / ``(host, port)``."""
    if isinstance(addresses, str):
        items: Iterable = [a for a in addresses.split(",") if a.strip()]
    elif isinstance(addresses, tuple) and len(addresses) == 2 and isinstance(addresses[1], int):
        items = [addresses]  # one (host, port) pair
    else:
        try:
            items = list(addresses)
        except TypeError:
            raise ValueError(f"addresses must be 'host:port' strings or (host, port) pairs, not {type(addresses).__name__}") from None
    out = []
    for item in items:
        if isinstance(item, str):
            text = item.strip()
            host, sep, port = text.rpartition(":")
            if host.startswith("[") and host.endswith("]"):
                host = host[1:-1]
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{text!r} is not host:port")
            out.append((host, int(port)))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str) and type(item[1]) is int:
            out.append((item[0], item[1]))
        else:
            raise ValueError(f"{item!r} is not host:port nor a (host, port) pair")
    for host, port in out:
        if not 0 < port < 65536:
            raise ValueError(f"port {port} of {host} is outside 1..65535")
    if not out:
        raise ValueError("at least one node address is needed")
    return out


class _NodeConn(asyncio.Protocol):
    """One connection to one node; requests batched per loop turn, replies by (client, seq).

    Each request has a deadline; one timer per connection fails the overdue ones with
    ``TimeoutError`` (rather than an ``asyncio.wait_for`` task per request, which cost
    a tenth of the client's time per write)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(MAX_FRAME_BYTES)
        self.pending: dict[tuple, asyncio.Future] = {}
        self.queue: list = []
        self.closed = False
        self._flush_scheduled = False
        # (deadline, future) in submission order; deadlines grow with it when every
        # request of a connection has the same timeout, so the sweep stops early.
        self._deadlines: deque = deque()
        self._sweep: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except ProtocolError:
            self.transport.abort()
            return
        pending = self.pending
        for frame in frames:
            if type(frame) is not list:
                continue
            for item in frame:
                if type(item) is list and len(item) == 4:
                    fut = pending.pop((item[0], item[1]), None)
                    if fut is not None and not fut.done():
                        fut.set_result((item[2], item[3]))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._deadlines.clear()
        err: Exception = ConnectionError("connection to the node was lost")
        if isinstance(exc, ssl.SSLError):  # e.g. TLS 1.3: the node refused our certificate after the handshake
            err = TLSError(f"the node closed the TLS connection: {exc.reason or exc} (is the client certificate "
                           "signed by the cluster CA?)")
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()

    def submit(self, kind: int, client: Any, seq: int, op: Any, timeout_s: float | None = None) -> asyncio.Future:
        """Send one request (with the others of this loop turn); the future gets
        ``(status, result)``, or ``TimeoutError`` after ``timeout_s``, or
        ``ConnectionError`` if the connection is lost first."""
        if self.closed:
            raise ConnectionError("connection is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        key = (client, seq)
        old = self.pending.get(key)
        if old is not None and not old.done():
            old.cancel()
        self.pending[key] = fut
        self.queue.append([kind, client, seq, op])
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        if timeout_s is not None:
            deadlines = self._deadlines
            while deadlines and deadlines[0][2].done():  # answered: amortized O(1) per request
                deadlines.popleft()
            deadlines.append((loop.time() + timeout_s, key, fut))
            if self._sweep is None:
                self._sweep = loop.call_at(self._deadlines[0][0], self._expire)
        return fut

    def _expire(self) -> None:
        """Fail the requests past their deadline; re-arm for the next one."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadlines, pending = self._deadlines, self.pending
        while deadlines:
            due, key, fut = deadlines[0]
            if fut.done():
                deadlines.popleft()
                continue
            if due > now:
                break
            deadlines.popleft()
            if pending.get(key) is fut:
                del pending[key]
            fut.set_exception(TimeoutError())
        if deadlines and not self.closed:
            self._sweep = loop.call_at(max(deadlines[0][0], now + 0.001), self._expire)

    def _flush(self) -> None:
        self._flush_scheduled = False
        queue, self.queue = self.queue, []
        if not queue or self.closed:
            return
        try:
            self.transport.write(encode_frame(queue))
        except (ValueError, TypeError):  # over a frame, or a value msgpack cannot encode
            self._flush_one_by_one(queue)

    def _flush_one_by_one(self, queue: list) -> None:
        """Fail the requests that cannot go (too large, not encodable) and send the
        others in frames that fit."""
        budget = clientwire.MAX_COMMAND_BYTES
        part: list = []
        used = 0
        for req in queue:
            error: CellarError | None = None
            try:
                size = len(msgpack.packb(req, use_bin_type=True))
            except (TypeError, ValueError, OverflowError) as e:
                error = InvalidRequest(f"cannot encode the command: {e}")
            else:
                if size > budget + 64:
                    error = TooLarge(f"a command of {size} bytes exceeds the limit of {budget} bytes")
            if error is not None:
                fut = self.pending.pop((req[1], req[2]), None)
                if fut is not None and not fut.done():
                    fut.set_exception(error)
                continue
            if part and used + size > budget:
                self.transport.write(encode_frame(part))
                part, used = [], 0
            part.append(req)
            used += size
        if part:
            self.transport.write(encode_frame(part))


def _error(result: Any) -> CellarError:
    """The typed exception for an ERROR answer: a string, or a machine's error result
    ``{"ok": False, "code": ..., "error": ...}`` (store.kv_machine)."""
    if isinstance(result, dict):
        code, text = result.get("code"), str(result.get("error", result))
        message = f"{code}: {text}" if code else text
        if code == "Compacted":
            return Compacted(message, result.get("compact_revision"))
        kind = {"TooLarge": TooLarge, "InvalidRequest": InvalidRequest, "LeaseNotFound": LeaseNotFound}.get(code, CellarError)
        return kind(message)
    text = str(result)
    if text.startswith(clientwire.TOO_LARGE):
        return TooLarge(text)
    if text.startswith(clientwire.PERMISSION_DENIED):
        return PermissionDenied(text)
    if text.startswith("TLSRequired"):
        return TLSRequired(text)
    return CellarError(text)


class CellarClient:
    def __init__(
        self,
        addresses: Any,
        *,
        timeout_s: float = 2.0,
        deadline_s: float = 30.0,
        connect_timeout_s: float = 1.0,
        tls: Any = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        self.addresses = parse_addresses(addresses)
        self._ssl: Any = None
        if tls is not None:
            if isinstance(tls, ssl.SSLContext):
                self._ssl = tls
            else:
                from consensus.transport import tls as tlsmod

                try:
                    self._ssl = tlsmod.client_context(str(tls), tls_cert, tls_key)
                except tlsmod.TLSError as e:
                    raise ValueError(str(e)) from None
        elif tls_cert is not None or tls_key is not None:
            raise ValueError("tls_cert/tls_key need tls= (the cluster CA)")
        for name, value in (("timeout_s", timeout_s), ("deadline_s", deadline_s), ("connect_timeout_s", connect_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, not {value!r}")
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.connect_timeout_s = connect_timeout_s
        self._conns: dict[int, _NodeConn] = {}
        self._connecting: dict[int, asyncio.Task] = {}
        self._rng = random.Random()
        self._next_node = 0
        self._default: Session | None = None

    async def __aenter__(self) -> CellarClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        for conn in self._conns.values():
            if conn.transport is not None:
                conn.transport.close()
        self._conns.clear()

    def session(self, node: int | None = None, client_id: int | None = None) -> Session:
        """A new logical client, by default on the nodes in turn (spreading the load)."""
        if node is None:
            node = self._next_node
            self._next_node = (self._next_node + 1) % len(self.addresses)
        return Session(self, client_id if client_id is not None else self._rng.getrandbits(62), node)

    async def connection(self, node: int) -> _NodeConn:
        conn = self._conns.get(node)
        if conn is not None and not conn.closed:
            return conn
        task = self._connecting.get(node)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect(node))
            self._connecting[node] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._connecting.pop(node, None)

    async def _connect(self, node: int) -> _NodeConn:
        host, port = self.addresses[node]
        if self._ssl is not None:
            conn = await self._connect_tls(host, port)
        else:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await asyncio.get_running_loop().create_connection(_NodeConn, host, port)
        self._conns[node] = conn
        return conn

    async def _connect_tls(self, host: str, port: int) -> _NodeConn:
        loop = asyncio.get_running_loop()
        sock = None
        async with asyncio.timeout(self.connect_timeout_s):
            # Connect first: a refused or unreachable node stays a retryable OSError; a
            # failure of the handshake itself is TLSError, not retried.
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, (host, port))
            except BaseException:
                sock.close()
                raise
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(_NodeConn, sock=sock, ssl=self._ssl, server_hostname=host,
                                                       ssl_handshake_timeout=self.connect_timeout_s)
        except ssl.SSLCertVerificationError as e:
            raise TLSError(f"TLS handshake with {host}:{port} failed: {e.verify_message or e.reason} "
                           "(is --cacert the cluster's CA?)") from None
        except (ssl.SSLError, ConnectionResetError) as e:  # a slow handshake (TimeoutError) is retried
            raise TLSError(f"TLS handshake with {host}:{port} failed: {getattr(e, 'reason', None) or type(e).__name__} "
                           "(does that port speak TLS?)") from None
        return conn

    async def call_once(self, node: int, kind: int, client: Any, seq: int, op: Any) -> Any:
        """One attempt at one node; raises on timeout or a lost connection."""
        conn = self._conns.get(node)
        if conn is None or conn.closed:
            conn = await self.connection(node)
        status, result = await conn.submit(kind, client, seq, op, self.timeout_s)
        if status != clientwire.OK:
            raise _error(result)
        return result

    async def status(self, node: int, *, digest: bool = True) -> dict:
        """Node ``node``'s status. The digest of its state costs the node a pass over
        the whole state on its event loop: monitoring that polls should leave it out
        (``digest=False``; the answer then has ``"digest": None``)."""
        return await self.call_once(node, clientwire.STATUS, 0, 0, None if digest else {"digest": False})

    async def statuses(self, *, digest: bool = True) -> list[dict]:
        """Every node's status, asked at once, each with its ``endpoint``; a node that
        does not answer within ``timeout_s`` is ``{"endpoint": ..., "error": "..."}``."""

        async def one(i: int) -> dict:
            host, port = self.addresses[i]
            try:
                st = await self.status(i, digest=digest)
            except Exception as e:
                return {"endpoint": f"{host}:{port}", "error": f"{type(e).__name__}: {e}".rstrip(": ")}
            return {"endpoint": f"{host}:{port}", **st}

        return list(await asyncio.gather(*(one(i) for i in range(len(self.addresses)))))

    # Convenience: one default session.
    def _session(self) -> Session:
        if self._default is None:
            self._default = self.session()
        return self._default

    async def put(self, key: Any, value: Any) -> None:
        await self._session().put(key, value)

    async def get(self, key: Any) -> Any:
        return await self._session().get(key)

    async def cas(self, key: Any, expected: Any, new: Any, strict: bool = False) -> bool:
        return await self._session().cas(key, expected, new, strict=strict)

    async def delete(self, key: Any) -> bool:
        return await self._session().delete(key)

    async def call(self, op: Any) -> Any:
        """Any machine command (e.g. a KV ``{"op": "txn", ...}`` dict), through the log."""
        return await self._session().call(op)


class Session:
    """One logical client: commands one at a time, retried under the same seq."""

    def __init__(self, cellar: CellarClient, client_id: int, node: int) -> None:
        self.cellar = cellar
        self.client_id = client_id
        self.node = node
        self.seq = 0
        self.retries = 0

    async def request(self, kind: int, op: Any) -> Any:
        self.seq += 1
        seq = self.seq
        cellar = self.cellar
        deadline = time.monotonic() + cellar.deadline_s
        backoff = 0.01
        while True:
            try:
                return await cellar.call_once(self.node, kind, self.client_id, seq, op)
            except CellarError as e:
                text = str(e)
                if text.startswith("moved"):  # a removed member: the others have the cluster
                    if len(cellar.addresses) == 1:
                        raise
                    self.node = (self.node + 1) % len(cellar.addresses)
                    self.retries += 1
                elif not text.startswith("busy"):
                    raise
                await asyncio.sleep(backoff)
                backoff = min(0.5, backoff * 2)
            except (ConnectionError, OSError, TimeoutError, asyncio.TimeoutError):
                # Try the next node with the same seq: applied at most once.
                self.node = (self.node + 1) % len(cellar.addresses)
                self.retries += 1
                await asyncio.sleep(min(backoff, 0.05))
            if time.monotonic() > deadline:
                raise Unavailable(f"no node answered command {seq} within {cellar.deadline_s:g} s")

    async def put(self, key: Any, value: Any) -> None:
        await self.request(clientwire.WRITE, ["put", key, value])

    async def get(self, key: Any) -> Any:
        return await self.request(clientwire.READ, ["get", key])

    async def cas(self, key: Any, expected: Any, new: Any, strict: bool = False) -> bool:
        done = await self.request(clientwire.CALL, ["cas", key, expected, new])
        if strict and done is not True:
            raise CompareFailed(f"cas on {key!r}: the value was not {expected!r}; nothing changed")
        return done

    async def call(self, op: Any) -> Any:
        """Any machine command through the log; a machine error result raises."""
        result = await self.request(clientwire.CALL, op)
        if isinstance(result, dict) and result.get("ok") is False:
            raise _error(result)
        return result

    async def append(self, key: Any, suffix: str) -> str:
        return await self.request(clientwire.CALL, ["append", key, suffix])

    async def delete(self, key: Any) -> bool:
        return await self.request(clientwire.CALL, ["delete", key])


class SyncClient:
    """A blocking ``CellarClient`` for scripts: its own event loop on a daemon thread.

    Same constructor arguments; ``put``, ``get``, ``cas``, ``delete``, ``call``,
    ``status`` block until answered (or raise the same typed errors). Close it (or use
    ``with``) to stop the thread."""

    def __init__(self, addresses: Any, **kwargs: Any) -> None:
        self._client = CellarClient(addresses, **kwargs)  # validates first
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cellar-client", daemon=True)
        self._thread.start()
        self._closed = False

    def _run(self, coro: Any) -> Any:
        if self._closed:
            coro.close()
            raise CellarError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def put(self, key: Any, value: Any) -> None:
        return self._run(self._client.put(key, value))

    def get(self, key: Any) -> Any:
        return self._run(self._client.get(key))

    def cas(self, key: Any, expected: Any, new: Any, strict: bool = False) -> bool:
        return self._run(self._client.cas(key, expected, new, strict=strict))

    def delete(self, key: Any) -> bool:
        return self._run(self._client.delete(key))

    def call(self, op: Any) -> Any:
        return self._run(self._client.call(op))

    def status(self, node: int) -> dict:
        return self._run(self._client.status(node))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._client.close())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
