"""The delaying proxy of ``cellar bench geo`` (bench/geo_proxy.py) against a local echo
or sink server: bytes intact and in order, never early, both sides closed when one
closes, a bounded buffer, loopback only. Lower bounds on delay only; upper bounds are
loose (a shared machine) and every wait is bounded."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from bench.geo_proxy import DelayProxy, check_loopback

WAIT_S = 10.0


async def echo_server() -> tuple[asyncio.Server, int]:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(echo, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def test_bytes_arrive_intact_and_in_order_under_delay_and_jitter():
    srv, port = await echo_server()
    proxy = DelayProxy(("127.0.0.1", port), 5.0, jitter=2.0, seed=7, read_bytes=1000)
    addr = await proxy.start()
    try:
        r, w = await asyncio.open_connection(*addr)
        rng = random.Random(1)
        sent = b"".join(rng.randbytes(rng.randrange(1, 5000)) for _ in range(60))
        for k in range(0, len(sent), 3000):  # many writes, read back in many chunks
            w.write(sent[k:k + 3000])
            await asyncio.sleep(0)
        await w.drain()
        got = await asyncio.wait_for(r.readexactly(len(sent)), WAIT_S)
        assert got == sent
        assert proxy.stats.bytes_forward == len(sent) == proxy.stats.bytes_back
        assert proxy.stats.chunks > 2  # really chunked, so the order was at stake
        w.close()
    finally:
        await proxy.close()
        srv.close()


async def test_each_direction_waits_at_least_its_one_way_delay():
    srv, port = await echo_server()
    proxy = DelayProxy(("127.0.0.1", port), 30.0, 20.0)
    addr = await proxy.start()
    try:
        r, w = await asyncio.open_connection(*addr)
        rtts = []
        for _ in range(5):
            t0 = time.monotonic()
            w.write(b"ping")
            await w.drain()
            assert await asyncio.wait_for(r.readexactly(4), WAIT_S) == b"ping"
            rtts.append((time.monotonic() - t0) * 1000)
        # 30 ms there and 20 back: never less; more only by scheduling (a loose bound).
        assert min(rtts) >= 50.0 - 0.5, rtts
        assert min(rtts) < 50.0 + 1000.0, rtts
        assert proxy.stats.lateness_ms_max >= 0.0 and proxy.stats.chunks == 10
        w.close()
    finally:
        await proxy.close()
        srv.close()


async def test_client_closing_closes_the_target_side_after_its_bytes():
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def sink(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        data = await r.read()  # until EOF
        await got.put(data)
        w.close()

    srv = await asyncio.start_server(sink, "127.0.0.1", 0)
    proxy = DelayProxy(("127.0.0.1", srv.sockets[0].getsockname()[1]), 20.0)
    addr = await proxy.start()
    try:
        r, w = await asyncio.open_connection(*addr)
        w.write(b"last words")
        await w.drain()
        w.close()  # EOF travels behind the bytes
        assert await asyncio.wait_for(got.get(), WAIT_S) == b"last words"
        assert await asyncio.wait_for(r.read(), WAIT_S) == b""
        await asyncio.wait_for(_until(lambda: not proxy._conns), WAIT_S)
    finally:
        await proxy.close()
        srv.close()


async def test_target_closing_closes_the_client_side():
    async def hang_up(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"bye")
        await w.drain()
        w.close()

    srv = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    proxy = DelayProxy(("127.0.0.1", srv.sockets[0].getsockname()[1]), 5.0)
    addr = await proxy.start()
    try:
        r, w = await asyncio.open_connection(*addr)
        assert await asyncio.wait_for(r.read(), WAIT_S) == b"bye"  # then EOF: the client side closed
        await asyncio.wait_for(_until(lambda: not proxy._conns), WAIT_S)
        w.close()
    finally:
        await proxy.close()
        srv.close()


async def test_unreachable_target_closes_the_client_and_counts_it():
    srv = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    dead_port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    proxy = DelayProxy(("127.0.0.1", dead_port), 1.0)
    addr = await proxy.start()
    try:
        r, w = await asyncio.open_connection(*addr)
        assert await asyncio.wait_for(r.read(), WAIT_S) == b""
        assert proxy.stats.connect_failures == 1 and proxy.stats.connections == 0
        w.close()
    finally:
        await proxy.close()


async def test_a_slow_reader_holds_the_buffer_to_its_bound():
    """The target reads nothing: the proxy buffers at most buffer_bytes_max (+ one read)
    and then stops reading, so the sender's writes back up instead."""
    release = asyncio.Event()
    received = []

    async def stalled(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await release.wait()
        while data := await r.read(65536):
            received.append(len(data))
        w.close()

    srv = await asyncio.start_server(stalled, "127.0.0.1", 0)
    bound = 64 * 1024
    proxy = DelayProxy(("127.0.0.1", srv.sockets[0].getsockname()[1]), 1.0, buffer_bytes_max=bound, read_bytes=4096)
    addr = await proxy.start()
    try:
        r, w = await asyncio.open_connection(*addr)
        total = 16 << 20  # far more than the proxy, the kernel's buffers and ours hold
        block = b"z" * 65536
        sent = 0

        async def send() -> None:
            nonlocal sent
            while sent < total:
                w.write(block)
                sent += len(block)
                await w.drain()

        sender = asyncio.ensure_future(send())
        await asyncio.wait_for(_until(lambda: proxy.stats.backpressure_waits > 0), WAIT_S)
        await asyncio.sleep(0.3)
        assert not sender.done() and sent < total  # the sender is held back
        assert proxy.stats.buffered_bytes_peak <= bound + 4096
        release.set()  # the target reads again: everything goes through
        await asyncio.wait_for(sender, 60)
        w.close()
        await asyncio.wait_for(_until(lambda: sum(received) == total), 60)
        assert proxy.stats.buffered_bytes_peak <= bound + 4096
    finally:
        release.set()
        await proxy.close()
        srv.close()


async def test_close_aborts_open_connections():
    srv, port = await echo_server()
    proxy = DelayProxy(("127.0.0.1", port), 1000.0)  # bytes would wait a second
    addr = await proxy.start()
    r, w = await asyncio.open_connection(*addr)
    w.write(b"in flight")
    await w.drain()
    await asyncio.wait_for(_until(lambda: proxy.stats.connections == 1), WAIT_S)
    await asyncio.wait_for(proxy.close(), WAIT_S)
    assert await asyncio.wait_for(r.read(), WAIT_S) == b""
    assert not proxy._conns
    w.close()
    srv.close()


def test_listens_on_loopback_only():
    for host in ("127.0.0.1", "127.0.0.5", "::1", "localhost"):
        check_loopback(host)
    for host in ("0.0.0.0", "10.1.2.3", "example.org", "::"):
        with pytest.raises(ValueError, match="loopback only"):
            check_loopback(host)
    with pytest.raises(ValueError):
        DelayProxy(("127.0.0.1", 1), -1.0)


async def _until(cond, step_s: float = 0.01) -> None:
    """Poll ``cond`` (callers bound this with wait_for)."""
    while not cond():
        await asyncio.sleep(step_s)
