"""The fault proxy (jepsen_like/proxy.py, ``ProxyNet``) against a local echo server:
forwards, a one-way cut holds one direction only, a heal delivers what was held in
order, discard resets at the heal, reset refuses, close ends everything, and etcd's
members (all dialing from 127.0.0.1) are told apart by who owns the socket. Every wait
is bounded."""

from __future__ import annotations

import asyncio
import os

import pytest

from jepsen_like.proxy import ProxyNet, loopback_owner
from tests.runtime.test_geo_proxy import echo_server as echo_on_port

WAIT_S = 5.0


async def echo_server() -> tuple[asyncio.Server, tuple[str, int]]:
    srv, port = await echo_on_port()  # the geo proxy's tests' echo server
    return srv, ("127.0.0.1", port)


async def sink_server() -> tuple[asyncio.Server, tuple[str, int], asyncio.Queue]:
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def sink(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                await got.put(data)
        except ConnectionError:
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(sink, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[:2], got


async def test_forwards_both_ways_and_close_ends_connections():
    srv, target = await echo_server()
    net = ProxyNet(2)
    addr = await net.pair(0, 1, target)
    try:
        r, w = await asyncio.open_connection(*addr)
        w.write(b"hello")
        assert await asyncio.wait_for(r.readexactly(5), WAIT_S) == b"hello"
    finally:
        await asyncio.wait_for(net.aclose(), WAIT_S)
    assert await asyncio.wait_for(r.read(), WAIT_S) == b""  # closed by the proxy
    w.close()
    srv.close()


async def test_one_way_cut_holds_one_direction_and_the_heal_delivers_in_order():
    srv, target, got = await sink_server()
    net = ProxyNet(2)
    addr = await net.pair(0, 1, target)  # node 0 dials node 1
    try:
        r, w = await asyncio.open_connection(*addr)
        w.write(b"a")
        assert await asyncio.wait_for(got.get(), WAIT_S) == b"a"
        net.drop({(0, 1)})  # 0 -> 1 cut
        w.write(b"bc")
        await w.drain()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(got.get(), 0.3)  # held
        net.heal()
        data = b""
        while len(data) < 2:
            data += await asyncio.wait_for(got.get(), WAIT_S)
        assert data == b"bc"
        w.close()
    finally:
        await net.aclose()
        srv.close()


async def test_the_other_direction_flows_during_a_one_way_cut():
    srv, target = await echo_server()
    net = ProxyNet(2)
    addr = await net.pair(0, 1, target)
    try:
        r, w = await asyncio.open_connection(*addr)
        w.write(b"x")
        assert await asyncio.wait_for(r.readexactly(1), WAIT_S) == b"x"
        net.drop({(1, 0)})  # answers cut, requests flow: the echo server gets them
        w.write(b"y")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.readexactly(1), 0.3)
        assert net.gates[(0, 1)].cut is False and net.gates[(1, 0)].cut is True
        net.heal()
        assert await asyncio.wait_for(r.readexactly(1), WAIT_S) == b"y"
        w.close()
    finally:
        await net.aclose()
        srv.close()


async def test_new_connections_wait_for_the_heal_and_reset_mode_refuses_them():
    srv, target = await echo_server()
    net = ProxyNet(2)
    addr = await net.pair(0, 1, target)
    resetting = ProxyNet(2, mode="reset")
    addr2 = await resetting.pair(0, 1, target)
    try:
        net.partition([{0}, {1}])
        r, w = await asyncio.open_connection(*addr)
        w.write(b"q")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.readexactly(1), 0.3)
        net.heal()
        assert await asyncio.wait_for(r.readexactly(1), WAIT_S) == b"q"
        w.close()

        r2, w2 = await asyncio.open_connection(*addr2)
        w2.write(b"z")
        assert await asyncio.wait_for(r2.readexactly(1), WAIT_S) == b"z"
        resetting.drop({(1, 0)})  # a live connection of the pair is reset at once
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(r2.readexactly(1), WAIT_S)
        r3, w3 = await asyncio.open_connection(*addr2)  # and a new one is closed
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(r3.readexactly(1), WAIT_S)
        assert resetting.aborted == 1
    finally:
        await net.aclose()
        await resetting.aclose()
        srv.close()


async def test_discard_drops_bytes_and_the_heal_resets_the_holed_connection():
    srv, target, got = await sink_server()
    net = ProxyNet(2, mode="discard")
    addr = await net.pair(0, 1, target)
    try:
        r, w = await asyncio.open_connection(*addr)
        net.drop({(0, 1)})
        w.write(b"lost")
        await w.drain()
        async with asyncio.timeout(WAIT_S):
            while net.gates[(0, 1)].dropped_bytes < 4:
                await asyncio.sleep(0.01)
        net.heal()
        assert await asyncio.wait_for(r.read(), WAIT_S) == b""  # reset, not resumed with a hole
        assert got.empty() and net.aborted == 1 and net.stats()["dropped_bytes"] == 4
        w.close()
    finally:
        await net.aclose()
        srv.close()


async def test_a_node_listener_tells_its_callers_apart_by_their_sockets():
    """etcd's members all dial from 127.0.0.1: the socket's owner names the caller."""
    srv, target = await echo_server()
    net = ProxyNet(3)
    me = {os.getpid(): 2}  # this process plays node 2
    addr = await net.node(0, target, lambda peer: loopback_owner(peer, addr, me))
    try:
        r, w = await asyncio.open_connection(*addr)
        w.write(b"k")
        assert await asyncio.wait_for(r.readexactly(1), WAIT_S) == b"k"
        assert [c.key for c in net.proxies[0].live] == [(2, 0)]
        net.drop({(1, 0)})  # not our pair: flows
        w.write(b"l")
        assert await asyncio.wait_for(r.readexactly(1), WAIT_S) == b"l"
        net.drop({(2, 0)})
        w.write(b"m")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.readexactly(1), 0.3)
        net.heal()
        assert await asyncio.wait_for(r.readexactly(1), WAIT_S) == b"m"
        w.close()
    finally:
        await net.aclose()
        srv.close()


def test_modes_and_loopback_are_checked():
    with pytest.raises(ValueError):
        ProxyNet(3, mode="scramble")
    with pytest.raises(ValueError, match="loopback only"):
        asyncio.run(_bind_public())


async def _bind_public() -> None:
    from jepsen_like.proxy import DelayProxy

    await DelayProxy(("127.0.0.1", 1)).start("0.0.0.0")
