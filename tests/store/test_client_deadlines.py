"""The client's per-connection deadline sweep (issue 16: one timer per connection
instead of an ``asyncio.wait_for`` per request): a node that never answers makes a
request fail with ``TimeoutError`` after ``timeout_s``, the session then retries on the
next node under the same seq, and answered requests leave nothing behind. Against
stand-in nodes speaking the client wire format (``consensus.runtime.clientwire``)."""

from __future__ import annotations

import asyncio
import time

from consensus.runtime import clientwire
from consensus.transport.framing import FrameDecoder, encode_frame
from store.client import CellarClient

WAIT_S = 10.0


class _StandIn(asyncio.Protocol):
    """Answers every request OK (``answer``) or never (a node that hangs)."""

    def __init__(self, answer: bool, seen: list) -> None:
        self.answer = answer
        self.seen = seen
        self.decoder = FrameDecoder()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for frame in self.decoder.feed(data):
            self.seen.extend(frame)
            if self.answer:
                self.transport.write(encode_frame([[c, s, clientwire.OK, None] for _k, c, s, _op in frame]))


async def _serve(answer: bool, seen: list):
    server = await asyncio.get_running_loop().create_server(lambda: _StandIn(answer, seen), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_silent_node_times_out_and_the_session_moves_on_with_the_same_seq():
    hung, ok = [], []
    s1, p1 = await _serve(False, hung)
    s2, p2 = await _serve(True, ok)
    try:
        async with CellarClient([("127.0.0.1", p1), ("127.0.0.1", p2)], timeout_s=0.2, deadline_s=5) as cellar:
            t = time.monotonic()
            session = cellar.session(node=0)
            async with asyncio.timeout(WAIT_S):
                await session.put("k", "v")
            took = time.monotonic() - t
            assert took >= 0.2, "answered before the silent node's timeout"
            assert [r[2] for r in hung] == [1] and [r[2] for r in ok] == [1], (hung, ok)  # same seq, twice
            assert session.retries == 1
            conn = cellar._conns[0]
            assert not conn.pending and conn._sweep is None  # the timed-out request is gone
    finally:
        s1.close()
        s2.close()


async def test_answered_requests_leave_no_deadlines_behind():
    ok: list = []
    server, port = await _serve(True, ok)
    try:
        async with CellarClient([("127.0.0.1", port)], timeout_s=5.0) as cellar:
            sessions = [cellar.session() for _ in range(20)]
            async with asyncio.timeout(WAIT_S):
                for _ in range(50):
                    await asyncio.gather(*(s.put("k", "v") for s in sessions))
            conn = cellar._conns[0]
            assert len(ok) == 1000 and not conn.pending
            assert len(conn._deadlines) <= 20  # answered ones are dropped as new ones come
    finally:
        server.close()
