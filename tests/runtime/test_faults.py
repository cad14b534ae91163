"""Disk faults, bad peer frames and configuration errors, against real processes."""

from __future__ import annotations

import asyncio
import glob
import os
import socket
import struct
import subprocess
import sys

import msgpack

from consensus.transport.framing import encode_frame, hello
from store.client import CellarClient

from .conftest import committing, converged


def serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "store.cli", "serve", *args]


def run_serve(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(serve_cmd(*args), capture_output=True, text=True, timeout=timeout)


async def fill(cluster, writes: int = 200) -> dict:
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=20.0) as cellar:
        s = cellar.session()
        acked = {}
        for i in range(writes):
            await s.put(f"k{i % 50}", i)
            acked[f"k{i % 50}"] = i
        statuses = await converged(cellar, list(range(cluster.n)))
    # every node counts its peer messages by type (status()["messages"]): the writes were
    # C-accepted by a peer; no C-accept arrives that was not sent
    for st in statuses:  # (a replica no leader C-accepts to may see only OAccepts and CCommits)
        assert sum(st["messages"]["received"].values()) > 0 and sum(st["messages"]["sent"].values()) > 0, st
    sent = sum(st["messages"]["sent"].get("CAccept", 0) for st in statuses)
    assert sent >= sum(st["messages"]["received"].get("CAccept", 0) for st in statuses) > 0
    return acked


async def test_torn_wal_tail_is_truncated_and_the_node_rejoins(make_cluster):
    cluster = make_cluster(3)
    cluster.start_all()
    await cluster.await_ready()
    acked = await fill(cluster)
    cluster.stop_all()
    segment = sorted(glob.glob(os.path.join(cluster.data_dir(0), "wal", "*")))
    segment = [p for p in segment if not p.endswith("LOCK")][-1]
    size = os.path.getsize(segment)
    with open(segment, "ab") as f:  # a record header promising more than follows
        f.write(struct.pack(">IIQ", 4096, 0xDEADBEEF, 10**6) + b"partial")
    cluster.start_all()
    await cluster.await_ready()
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=20.0) as cellar:
        await committing(cellar, "after")
        await converged(cellar, [0, 1, 2])
        reader = cellar.session(0)
        for key, value in acked.items():
            assert await reader.get(key) == value
    assert os.path.getsize(segment) >= size
    with open(os.path.join(cluster.root, "node0.log")) as f:
        assert "torn tail" in f.read()


async def test_flipped_byte_mid_log_refuses_to_start_naming_file_and_offset(make_cluster):
    cluster = make_cluster(3)
    cluster.start_all()
    await cluster.await_ready()
    await fill(cluster)
    cluster.stop_all()
    segment = [p for p in sorted(glob.glob(os.path.join(cluster.data_dir(1), "wal", "*"))) if not p.endswith("LOCK")][0]
    size = os.path.getsize(segment)
    with open(segment, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    cmd = cluster.command(1)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert segment in err and "offset" in err, err


def _closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


async def test_bad_frames_close_the_connection_not_the_replica(make_cluster):
    cluster = make_cluster(3, cluster_id="good")
    cluster.start_all()
    await cluster.await_ready()
    port = cluster.peer_ports[2]
    loop = asyncio.get_running_loop()

    def attack(payload: bytes, half_close: bool = False) -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(payload)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            return _closed_by_peer(s)

    attacks = {
        "garbage": (b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1", False),
        "huge length prefix": (struct.pack(">I", 0xFFFFFFF0) + b"x" * 64, False),
        "wrong cluster id": (encode_frame(hello("evil", 1)), False),
        "truncated frame": (struct.pack(">I", 1000) + b"\x93" * 10, True),
        "invalid message after a valid hello": (encode_frame(hello("good", 1)) + encode_frame([0, [[999, 1]]]), False),
    }
    async with CellarClient(cluster.client_addresses, timeout_s=1.0, deadline_s=20.0) as cellar:
        for name, (payload, half) in attacks.items():
            assert await loop.run_in_executor(None, attack, payload, half), f"{name}: connection stayed open"
            assert cluster.alive(2), f"{name}: the replica died"
            await committing(cellar, f"after {name}")
        st = await cellar.status(2)
        assert st["transport"].get("malformed", 0) >= 2
        assert st["transport"].get("oversized", 0) >= 1
        assert st["transport"].get("wrong-cluster", 0) >= 1
        assert st["transport"].get("truncated", 0) >= 1
        s2 = cellar.session(2)
        await s2.put("still", "here")
        assert await s2.get("still") == "here"


def test_config_errors_are_one_clear_line(tmp_path):
    peers = "0=127.0.0.1:1,1=127.0.0.1:2,2=127.0.0.1:3"
    cases = []
    p = run_serve("--id", "5", "--peers", peers, "--data-dir", str(tmp_path / "a"))
    cases.append(("unknown peer", p, "not in the peer list"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = run_serve("--id", "0", "--peers", peers, "--data-dir", str(blocker / "sub"))
    cases.append(("unwritable data dir", p, "not writable"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = run_serve("--id", "0", "--peers", f"0=127.0.0.1:{port},1=127.0.0.1:2,2=127.0.0.1:3",
                      "--data-dir", str(tmp_path / "b"))
        cases.append(("port in use", p, "cannot listen"))
    p = run_serve("--id", "0", "--peers", "0=127.0.0.1:notaport", "--data-dir", str(tmp_path / "c"))
    cases.append(("bad address", p, "not a number"))
    bad_toml = tmp_path / "n.toml"
    bad_toml.write_text("id = 0\nwhat = 1\n")
    p = run_serve("--config", str(bad_toml))
    cases.append(("unknown setting", p, "unknown setting"))
    for name, proc, needle in cases:
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (name, proc.stderr)


async def test_mismatched_cluster_id_is_refused(make_cluster):
    cluster = make_cluster(3, cluster_id="alpha")
    cluster.start(0)
    await cluster.await_ready(0)
    cluster.stop(0)
    cmd = cluster.command(0)
    cmd[cmd.index("--cluster-id") + 1] = "beta"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "cluster_id='alpha'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
