"""Client connections are bounded (issue 12: "half-sent frames and idle connections
are kept forever"): a frame left unfinished for ``client_frame_s`` closes its
connection, a connection that sent nothing and waits for no answer for
``client_idle_s`` is closed, connections past ``clients_max`` are refused, and a
client whose idle connection was closed reconnects on its next request without an
error. Real replicas, with the limits set small in a TOML config file."""

from __future__ import annotations

import asyncio
import struct

from store.client import CellarClient

from .conftest import committing

WAIT_S = 20.0


async def _closed_by_peer(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True once the node closes the connection (EOF or reset) within ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


async def test_half_frames_idle_and_excess_client_connections_are_closed(make_cluster, tmp_path):
    cfg = tmp_path / "limits.toml"
    cfg.write_text("clients_max = 3\nclient_idle_s = 1.5\nclient_frame_s = 1.0\n")
    cluster = make_cluster(3, extra_args=["--config", str(cfg)])
    cluster.start_all()
    await cluster.await_ready()
    host, port = cluster.client_addresses[0]
    async with CellarClient(cluster.client_addresses, timeout_s=5.0, deadline_s=30.0) as cellar:
        await committing(cellar)
        # A frame header announcing 100 bytes, then 10 of them, and nothing more.
        r1, w1 = await asyncio.open_connection(host, port)
        w1.write(struct.pack(">I", 100) + b"x" * 10)
        await w1.drain()
        # An idle connection: nothing sent at all.
        r2, w2 = await asyncio.open_connection(host, port)
        # The cap: CellarClient holds one connection to node 0 and these two make
        # three, so a fourth is refused at once (not left waiting for the idle timeout).
        r3, w3 = await asyncio.open_connection(host, port)
        assert await _closed_by_peer(r3, 1.0), "a connection past clients_max was not refused at once"
        assert await _closed_by_peer(r1, WAIT_S), "a half-sent frame kept its connection open"
        assert await _closed_by_peer(r2, WAIT_S), "an idle connection was kept open"
        for w in (w1, w2, w3):
            w.close()
        # The client's own connection to node 0 went idle meanwhile and was closed too:
        # its next requests reconnect and succeed, and nothing is lost.
        s = cellar.session(node=0)
        await s.put("after-idle", "1")
        assert await s.get("after-idle") == "1"
        st = await cellar.status(0)
        stats = st["stats"]
        assert stats["client_frame_timeouts"] >= 1 and stats["client_idle_closed"] >= 2, stats
        assert stats["clients_refused"] >= 1, stats


def test_bad_client_limits_are_refused_with_one_line(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "bad.toml"
    cfg.write_text("client_idle_s = -1\n")
    out = subprocess.run([sys.executable, "-m", "store.cli", "serve", "--config", str(cfg), "--id", "0",
                          "--peers", "0=127.0.0.1:1,1=127.0.0.1:2,2=127.0.0.1:3", "--data-dir", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "client_idle_s" in lines[0], out.stderr
