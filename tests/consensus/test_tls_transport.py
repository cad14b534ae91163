"""consensus.transport.tls and PeerTransport with TLS: real sockets on 127.0.0.1 in one
process (the real-process tests are tests/runtime/test_tls.py). Every wait bounded."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from consensus.transport import tls
from consensus.transport.framing import encode_frame, hello
from consensus.transport.tcp import PeerTransport
from store.certs import init_certs

CLUSTER = "cellar-tls-test"
WAIT_S = 20


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    root = tmp_path_factory.mktemp("certs")
    good = init_certs(str(root / "good"), 3)
    other = init_certs(str(root / "other"), 3)
    bundle = root / "bundle.pem"  # trusts both: gets as far as the other side checking its certificate
    bundle.write_bytes(open(other["ca"], "rb").read() + open(good["ca"], "rb").read())
    return {"good": good, "other": other, "bundle": str(bundle)}


def ports(n: int) -> dict[int, tuple[str, int]]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    out = {i: ("127.0.0.1", s.getsockname()[1]) for i, s in enumerate(socks)}
    for s in socks:
        s.close()
    return out


def contexts(ca: str, leaf: dict) -> dict:
    return {"ssl_server": tls.peer_server_context(ca, leaf["cert"], leaf["key"]),
            "ssl_client": tls.peer_client_context(ca, leaf["cert"], leaf["key"])}


async def until(pred, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not pred():
            await asyncio.sleep(0.02)


def test_identities_from_certificates(certs):
    from cryptography import x509

    def peercert(path: str) -> dict:
        c = x509.load_pem_x509_certificate(open(path, "rb").read())
        return {"subject": tuple(((a.oid._name, a.value),) for a in c.subject)}

    good = certs["good"]
    assert tls.node_id_of(peercert(good["nodes"][2]["cert"])) == 2
    assert tls.node_id_of(peercert(good["admin"]["cert"])) is None
    assert tls.is_admin(peercert(good["admin"]["cert"]))
    assert not tls.is_admin(peercert(good["client"]["cert"]))
    assert not tls.is_admin(peercert(good["nodes"][0]["cert"]))
    assert not tls.is_admin(None) and tls.node_id_of({}) is None
    with pytest.raises(tls.TLSError, match="both"):
        tls.client_context(good["ca"], good["client"]["cert"], None)
    with pytest.raises(tls.TLSError, match="CA file"):
        tls.client_context("/nonexistent/ca.pem")


async def test_mutual_tls_delivers(certs):
    good = certs["good"]
    peers = ports(2)
    got: list = []
    a = PeerTransport(CLUSTER, 0, peers, lambda p, m: got.append((0, p, m)), **contexts(good["ca"], good["nodes"][0]))
    b = PeerTransport(CLUSTER, 1, peers, lambda p, m: got.append((1, p, m)), **contexts(good["ca"], good["nodes"][1]))
    try:
        await a.start(*peers[0])
        await b.start(*peers[1])
        async with asyncio.timeout(WAIT_S):
            await a.wait_connected(1)
        a.send(1, "ping")
        b.send(0, "pong")
        await until(lambda: len(got) == 2, "both delivered")
        assert sorted(got) == [(0, 1, ["pong"]), (1, 0, ["ping"])]
        assert a.stats["tls_refused"] == 0 and b.stats["tls_refused"] == 0
    finally:
        await a.close()
        await b.close()


async def test_refused_peers_are_counted_logged_once_and_never_replace_the_real_one(certs, caplog):
    good, other = certs["good"], certs["other"]
    peers = ports(4)
    real = {i: peers[i] for i in range(3)}
    b = PeerTransport(CLUSTER, 1, real, lambda p, m: None, **contexts(good["ca"], good["nodes"][1]))
    a = PeerTransport(CLUSTER, 0, real, lambda p, m: None, **contexts(good["ca"], good["nodes"][0]))
    # Claims node 0 with another CA's certificate (trusting ours, so b checks its certificate).
    rogue_peers = {0: peers[3], 1: real[1], 2: real[2]}
    rogue = PeerTransport(CLUSTER, 0, rogue_peers, lambda p, m: None, **contexts(certs["bundle"], other["nodes"][0]))
    # Node 2's valid certificate, claiming node 0.
    thief = PeerTransport(CLUSTER, 0, {0: ("127.0.0.1", 0), 1: real[1], 2: real[2]}, lambda p, m: None,
                          **contexts(good["ca"], good["nodes"][2]))
    caplog.set_level(logging.WARNING, logger="consensus.transport.tcp")
    try:
        await b.start(*real[1])
        await a.start(*real[0])
        async with asyncio.timeout(WAIT_S):
            await a.wait_connected(1)
        await rogue.start(*peers[3])
        await until(lambda: b.stats["tls_refused"] >= 3, "three refusals of the other CA")
        await rogue.close()
        await thief.start("127.0.0.1", 0)
        before = b.stats["tls_refused"]
        await until(lambda: b.stats["tls_refused"] >= before + 3, "three refusals of the wrong identity")
        await thief.close()
        # The real node 0 is still the one connected; a plaintext hello is refused too.
        assert b.is_connected(0) and a.is_connected(1) and b.stats["connections_established"] == 1
        before = b.stats["tls_refused"]
        r, w = await asyncio.open_connection(*real[1])
        w.write(encode_frame(hello(CLUSTER, 0)))
        async with asyncio.timeout(WAIT_S):
            assert await r.read() == b""
        w.close()
        await until(lambda: b.stats["tls_refused"] == before + 1, "the plaintext peer refused")
        lines = [r.getMessage() for r in caplog.records if "tls_refused" in r.getMessage()]
        cert_lines = [m for m in lines if "certificate refused" in m]
        identity = [m for m in lines if "hello claims node 0" in m]
        assert len(cert_lines) == 1, lines  # once a minute per address and kind, however often refused
        assert len(identity) == 1 and "node-2" in identity[0], lines
    finally:
        for t in (rogue, thief, a, b):
            await t.close()


def test_works_on_uvloop(certs):
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test_mutual_tls_delivers(certs))
