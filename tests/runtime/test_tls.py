"""TLS on real ``cellar serve`` processes (issue 13, "who may join and who may
administer"): mutual TLS between replicas, TLS clients, the admin credential, and
what is refused (another CA, a certificate naming another node, no TLS at all).
Every wait is bounded; every process is stopped by PID."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from store.certs import init_certs
from store.client import CellarClient, PermissionDenied, TLSError, TLSRequired
from store.server import free_ports
from tests.runtime.conftest import committing

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)}


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout, stdin=subprocess.DEVNULL)


async def acli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return await asyncio.get_running_loop().run_in_executor(None, lambda: cli(*args, timeout=timeout))


def log_lines(cluster, i: int, needle: str) -> list[str]:
    with open(os.path.join(cluster.root, f"node{i}.log"), errors="replace") as f:
        return [line for line in f if needle in line]


async def wait_for(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = await pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.1)


def test_certs_init_cli(tmp_path):
    d = tmp_path / "certs"
    p = cli("certs", "init", str(d), "--nodes", "3", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert sorted(out["nodes"]) == ["0", "1", "2"]
    for path in [out["ca_key"], out["admin"]["key"], out["client"]["key"], *(n["key"] for n in out["nodes"].values())]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    from cryptography import x509

    with open(out["nodes"]["1"]["cert"], "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    assert "CN=node-1" in cert.subject.rfc4514_string() and "OU=cellar-node" in cert.subject.rfc4514_string()
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    # Never overwrites; one line, nonzero exit.
    again = cli("certs", "init", str(d), "--nodes", "3")
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "exists" in again.stderr, again.stderr
    assert cli("certs", "init", "--help").returncode == 0


def test_serve_refuses_bad_tls_settings(tmp_path):
    good = init_certs(str(tmp_path / "good"), 3)
    other = init_certs(str(tmp_path / "other"), 3)
    base = ["serve", "--id", "1", "--peers", "0=127.0.0.1:1,1=127.0.0.1:2,2=127.0.0.1:3", "--data-dir",
            str(tmp_path / "d")]
    n1 = good["nodes"][1]
    cases = {
        "missing": (["--tls-ca", good["ca"], "--tls-cert", n1["cert"], "--tls-key", str(tmp_path / "nope.pem")],
                    "No such file"),
        "not a key": (["--tls-ca", good["ca"], "--tls-cert", n1["cert"], "--tls-key", good["ca"]], "private key"),
        "other CA": (["--tls-ca", good["ca"], "--tls-cert", other["nodes"][1]["cert"], "--tls-key",
                      other["nodes"][1]["key"]], "not signed by the CA"),
        "another node": (["--tls-ca", good["ca"], "--tls-cert", good["nodes"][2]["cert"], "--tls-key",
                          good["nodes"][2]["key"]], "not replica 1's"),
        "only one": (["--tls-ca", good["ca"]], "together"),
    }
    for name, (args, needle) in cases.items():
        p = cli(*base, *args, timeout=30)
        assert p.returncode == 2, (name, p.stderr)
        assert needle in p.stderr and p.stderr.count("\n") == 1, (name, p.stderr)


ROGUE_HELLO = """
import asyncio, sys
from consensus.transport import tls
from consensus.transport.framing import encode_frame, hello
ca, cert, key, port, cluster, claim = sys.argv[1:]
async def main():
    r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", int(port), ssl=tls.peer_client_context(ca, cert, key)), 5)
    w.write(encode_frame(hello(cluster, int(claim), incarnation=1)))
    try:
        await asyncio.wait_for(r.read(), 10)
    except Exception as e:
        pass
    print("closed")
asyncio.run(main())
"""


async def test_tls_cluster(make_cluster, tmp_path):
    t_start = time.monotonic()
    certs = init_certs(str(tmp_path / "certs"), 3)
    rogue = init_certs(str(tmp_path / "rogue"), 3)
    ca = certs["ca"]
    cluster = make_cluster(3, tls_dir=str(tmp_path / "certs"), http=True)
    cluster.start_all()
    await cluster.await_ready()
    endpoints = ",".join(f"{h}:{p}" for h, p in cluster.client_addresses)
    async with CellarClient(cluster.client_addresses, tls=ca, deadline_s=20) as cellar:
        # 1. A TLS cluster commits writes through TLS clients, on every replica.
        await committing(cellar)
        sessions = [cellar.session(node=i % 3) for i in range(6)]
        await asyncio.gather(*(s.put(f"k{i}", f"v{i}") for i, s in enumerate(sessions)))
        assert [await s.get(f"k{i}") for i, s in enumerate(sessions)] == [f"v{i}" for i in range(6)]
        st = await cellar.status(1)
        assert st["tls"] is True and sorted(st["connected"]) == [0, 2]

        # 2. A client without TLS gets a clear error at once, no hang.
        t0 = time.monotonic()
        async with CellarClient(cluster.client_addresses, deadline_s=20) as plain:
            with pytest.raises(TLSRequired, match="speaks TLS"):
                await plain.put("x", "y")
        assert time.monotonic() - t0 < 5
        p = await acli("status", "--endpoints", endpoints, "--json")
        assert p.returncode == 1 and "TLSRequired" in p.stdout, (p.stdout, p.stderr)
        # ... and a client trusting another CA refuses the replica.
        async with CellarClient(cluster.client_addresses, tls=rogue["ca"], deadline_s=20) as wrong:
            with pytest.raises(TLSError, match="certificate"):
                await wrong.put("x", "y")
        # ... and an admin certificate from another CA is refused by the replica.
        t0 = time.monotonic()
        async with CellarClient(cluster.client_addresses, tls=ca, tls_cert=rogue["admin"]["cert"],
                                tls_key=rogue["admin"]["key"], deadline_s=20) as forged:
            with pytest.raises(TLSError):
                await forged.put("x", "y")
        assert time.monotonic() - t0 < 5

        # 3. A 4th process with a certificate from another CA (a real `cellar serve`
        # claiming to be node 0) cannot connect: refused, logged, counted, cluster unaffected.
        # It trusts the cluster's CA too (a CA certificate is public), so the handshake
        # goes as far as the replica checking its certificate.
        bundle = tmp_path / "rogue-bundle.pem"
        bundle.write_bytes(open(rogue["ca"], "rb").read() + open(ca, "rb").read())
        rport, rclient = free_ports(2)
        peers = f"0=127.0.0.1:{rport},1=127.0.0.1:{cluster.peer_ports[1]},2=127.0.0.1:{cluster.peer_ports[2]}"
        rlog = open(tmp_path / "rogue.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "store.cli", "serve", "--id", "0", "--peers", peers,
                                 "--client", f"127.0.0.1:{rclient}", "--data-dir", str(tmp_path / "rogue-data"),
                                 "--cluster-id", cluster.cluster_id, "--tls-ca", str(bundle),
                                 "--tls-cert", rogue["nodes"][0]["cert"], "--tls-key", rogue["nodes"][0]["key"]],
                                env=ENV, stdout=rlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        rlog.close()
        try:
            async def refused_by_both():
                sts = [await cellar.status(i, digest=False) for i in (1, 2)]
                return all(s["transport"].get("tls_refused", 0) >= 3 for s in sts) and sts

            sts = await wait_for(refused_by_both, 20, "replicas 1 and 2 refuse the other CA's node three times")
            await asyncio.gather(*(s.put(f"during{i}", "x") for i, s in enumerate(sessions)))
            for i, st in zip((1, 2), sts):
                assert sorted(st["connected"]) == [j for j in range(3) if j != i], st["connected"]
                lines = log_lines(cluster, i, "tls_refused")
                assert len(lines) == 1 and "WARNING" in lines[0] and "certificate refused" in lines[0], lines
        finally:
            proc.terminate()
            proc.wait(timeout=15)

        # 4. A valid certificate for node 1 used by a process claiming to be node 2: refused.
        before = (await cellar.status(0, digest=False))["transport"].get("tls_refused", 0)
        p = await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
            [sys.executable, "-c", ROGUE_HELLO, ca, certs["nodes"][1]["cert"], certs["nodes"][1]["key"],
             str(cluster.peer_ports[0]), cluster.cluster_id, "2"],
            capture_output=True, text=True, env=ENV, timeout=30))
        assert p.stdout.strip() == "closed", p.stderr
        st0 = await cellar.status(0, digest=False)
        assert st0["transport"].get("tls_refused", 0) == before + 1
        assert sorted(st0["connected"]) == [1, 2]
        lines = log_lines(cluster, 0, "hello claims node 2")
        assert len(lines) == 1 and "CN=node-1" in lines[0].replace("commonName=", "CN="), lines
        # ... and `cellar serve` refuses to start with it.
        p = await acli("serve", "--id", "2", "--peers", cluster.peers_spec, "--data-dir", str(tmp_path / "x"),
                       "--tls-ca", ca, "--tls-cert", certs["nodes"][1]["cert"], "--tls-key", certs["nodes"][1]["key"])
        assert p.returncode == 2 and "not replica 2's" in p.stderr, p.stderr
        await cellar.session().put("after", "ok")

        # 5. Admin: without the admin certificate the transfer is refused and changes nothing.
        seq0 = (await cellar.status(0, digest=False))["sequencer"]
        target = (seq0 + 1) % 3
        for extra in ([], ["--cert", certs["client"]["cert"], "--key", certs["client"]["key"]]):
            p = await acli("sequencer", "transfer", "--to", str(target), "--endpoints", endpoints, "--cacert", ca,
                           *extra)
            assert p.returncode == 1 and "PermissionDenied" in p.stderr and p.stderr.count("\n") == 1, p.stderr
        from consensus.runtime import clientwire

        with pytest.raises(PermissionDenied):
            await cellar.call_once(seq0, clientwire.ADMIN, "t", 1, ["transfer_sequencer", target])
        st = await cellar.status(seq0, digest=False)
        assert st["sequencer"] == seq0 and st["stats"]["admin_refused"] == 3
        p = await acli("sequencer", "transfer", "--to", str(target), "--endpoints", endpoints, "--cacert", ca,
                       "--cert", certs["admin"]["cert"], "--key", certs["admin"]["key"], "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["sequencer"] == target
        await cellar.session().put("after-transfer", "ok")
        # Snapshot save is an admin command too; with the admin certificate it works over TLS.
        snap = tmp_path / "backup.snap"
        p = await acli("snapshot", "save", str(snap), "--endpoints", endpoints, "--cacert", ca)
        assert p.returncode == 1 and "PermissionDenied" in p.stderr and not snap.exists(), p.stderr
        p = await acli("snapshot", "save", str(snap), "--endpoints", endpoints, "--cacert", ca,
                       "--cert", certs["admin"]["cert"], "--key", certs["admin"]["key"])
        assert p.returncode == 0 and snap.stat().st_size > 0, p.stderr

    # 6. The HTTP API speaks HTTPS with the node certificate.
    import aiohttp

    from consensus.transport import tls

    ctx = tls.client_context(ca)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://127.0.0.1:{cluster.http_ports[0]}/healthz", ssl=ctx,
                            timeout=aiohttp.ClientTimeout(total=10)) as resp:
            assert resp.status == 200
    assert time.monotonic() - t_start < 120


def test_bench_tls_reports_both_and_their_ratio():
    p = cli("bench", "--tls", "--rounds", "1", "--seconds", "0.5", "--warmup", "0", "--sessions", "8", "--json",
            timeout=120)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert set(result["median"]) == {"plaintext", "tls"}
    assert all(result["median"][v]["writes_per_s"] > 0 for v in ("plaintext", "tls"))
    assert result["throughput_ratio_tls_over_plaintext"] > 0


def test_up_tls_serves_and_stops(tmp_path):
    import random
    import signal

    base = random.Random().randrange(10000, 32000)
    proc = subprocess.Popen([sys.executable, "-m", "store.cli", "up", "--tls", "--dir", str(tmp_path),
                             "--base-port", str(base)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=ENV)
    try:
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "TLS" in text and f"--cacert {tmp_path}/certs/ca.pem" in text, text
        endpoints = ",".join(f"127.0.0.1:{base + 100 + i}" for i in range(3))
        ca = f"{tmp_path}/certs/ca.pem"
        put = cli("kv", "put", "k", "v", "--cacert", ca, "--endpoints", endpoints, "--timeout", "20")
        assert put.returncode == 0, put.stderr
        get = cli("kv", "get", "k", "--endpoints", endpoints)
        assert get.returncode == 1 and "TLSRequired" in get.stderr, get.stderr
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
