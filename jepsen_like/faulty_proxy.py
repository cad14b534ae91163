"""Planted bugs on the wire: a deliberately broken HTTP proxy between the workload's
clients and a replica's JSON gateway, which the checker must catch (issue 14,
acceptance 3). Never used by a real run unless a test asks for it.

It reads one HTTP/1.1 request at a time from each client connection (the workload's
client, aiohttp, never pipelines), forwards it on a connection of its own to the
upstream, and relays the answer, except as its ``bug`` says:

- ``ack-dropped-writes``: every ``every``-th ``POST /v3/kv/put`` is answered ``200 {}``
  and never forwarded (a write acknowledged and lost);
- ``stale-replies``: every ``every``-th ``POST /v3/kv/range`` is answered with the
  answer of an earlier read of the same key, kept from before (a stale-read replica);
- ``swap-replies``: answers to reads of the same key arriving on different connections
  are swapped in pairs (replies reordered between clients).

Bytes are not what it breaks: each answer is a well-formed HTTP message; what is wrong
is which operation it answers, and only a checker of the history can tell.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .proxy import CONNECT_TIMEOUT_S, check_loopback, close_listener

__all__ = ["BUGS", "FaultyHttpProxy"]

BUGS = ("ack-dropped-writes", "stale-replies", "swap-replies")
HEAD_BYTES_MAX = 64 * 1024
BODY_BYTES_MAX = 16 << 20
SWAP_WAIT_S = 0.05  # how long a read's answer waits for a partner to swap with


async def _read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """(head, body) of one HTTP/1.1 message (Content-Length or chunked); None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    if len(head) > HEAD_BYTES_MAX:
        return None
    fields = {}
    for line in head.split(b"\r\n")[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            fields[k.strip().lower()] = v.strip()
    try:
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            parts = []
            for _ in range(100_000):  # bounded: a chunk of size 0 ends the body
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(data[:-2])
            body = b"".join(parts)
            head = head.replace(b"Transfer-Encoding: chunked", f"Content-Length: {len(body)}".encode())
            return head, body
        n = int(fields.get(b"content-length", b"0"))
        if n > BODY_BYTES_MAX:
            return None
        return head, await reader.readexactly(n)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        return None


def _ok(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def _key(body: bytes) -> Any:
    try:
        return json.loads(body).get("key")
    except (ValueError, AttributeError):
        return None


class FaultyHttpProxy:
    """A broken HTTP proxy in front of ``upstream`` (host, port); ``start()`` gives its address."""

    def __init__(self, upstream: tuple[str, int], bug: str, every: int = 3) -> None:
        if bug not in BUGS:
            raise ValueError(f"unknown bug {bug!r} ({', '.join(BUGS)})")
        self.upstream, self.bug, self.every = upstream, bug, max(1, every)
        self.calls = 0
        self.lies = 0  # answers that were wrong on purpose
        self.old: dict[Any, bytes] = {}  # key -> an earlier read's whole answer
        self.waiting: dict[Any, tuple[int, asyncio.Future]] = {}  # swap-replies: key -> (conn, its answer's slot)
        self._mine: dict[tuple[Any, int], bytes] = {}  # swap-replies: (key, conn) -> its true answer
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._conns = 0

    async def start(self, host: str = "127.0.0.1") -> tuple[str, int]:
        check_loopback(host)
        self._server = await asyncio.start_server(self._accept, host, 0)
        return self._server.sockets[0].getsockname()[:2]

    def _accept(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        t = asyncio.ensure_future(self._serve(r, w))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _serve(self, c_r: asyncio.StreamReader, c_w: asyncio.StreamWriter) -> None:
        conn = self._conns
        self._conns += 1
        self._writers.add(c_w)
        u_w: asyncio.StreamWriter | None = None
        try:
            u_r, u_w = await asyncio.wait_for(asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT_S)
            self._writers.add(u_w)
            while True:  # one request at a time, until the client closes
                req = await _read_message(c_r)
                if req is None:
                    return
                head, body = req
                path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
                self.calls += 1
                if self.bug == "ack-dropped-writes" and path == b"/v3/kv/put" and self.calls % self.every == 0:
                    self.lies += 1
                    c_w.write(_ok(b"{}"))
                    await c_w.drain()
                    continue
                u_w.write(head + body)
                await u_w.drain()
                resp = await _read_message(u_r)
                if resp is None:
                    return
                answer = resp[0] + resp[1]
                if path == b"/v3/kv/range" and resp[0].startswith(b"HTTP/1.1 200"):
                    answer = await self._bend_read(conn, _key(body), answer)
                c_w.write(answer)
                await c_w.drain()
        except (OSError, asyncio.TimeoutError):
            return
        finally:
            for w in (c_w, u_w):
                if w is not None:
                    self._writers.discard(w)
                    w.close()

    async def _bend_read(self, conn: int, key: Any, answer: bytes) -> bytes:
        if self.bug == "stale-replies":
            old = self.old.get(key)
            if old is None:
                self.old[key] = answer  # the first answer seen, kept forever
            elif self.calls % self.every == 0 and old != answer:
                self.lies += 1
                return old
            return answer
        if self.bug == "swap-replies":
            partner = self.waiting.get(key)
            if partner is not None and partner[0] != conn and not partner[1].done():
                del self.waiting[key]
                partner[1].set_result(answer)  # it gets ours, we get its
                self.lies += 1
                return self._mine.pop((key, partner[0]))
            fut: asyncio.Future = asyncio.get_running_loop().create_future()
            self.waiting[key] = (conn, fut)
            self._mine[(key, conn)] = answer
            try:
                return await asyncio.wait_for(fut, SWAP_WAIT_S)
            except asyncio.TimeoutError:  # nobody to swap with: the true answer
                if self.waiting.get(key, (None,))[0] == conn:
                    del self.waiting[key]
                return self._mine.pop((key, conn), answer)
        return answer

    async def close(self) -> None:
        await close_listener(self._server, self._writers, self._tasks)
        self._server = None
