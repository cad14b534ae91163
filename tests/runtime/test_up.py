"""``cellar up`` starts a local cluster, says where it listens, and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time

from store.client import CellarClient


async def test_up_prints_addresses_serves_and_stops_on_ctrl_c(tmp_path):
    # Below the ephemeral range (32768+ on Linux), where outgoing connections of other
    # tests and processes could already hold one of our ports.
    base = random.Random().randrange(10000, 32000)
    proc = subprocess.Popen([sys.executable, "-m", "store.cli", "up", "--replicas", "3", "--dir", str(tmp_path),
                             "--base-port", str(base)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        assert "node 2:" in text and f"127.0.0.1:{base + 102}" in text, text
        async with CellarClient([("127.0.0.1", base + 100 + i) for i in range(3)], deadline_s=20) as cellar:
            s = cellar.session()
            await s.put("k", "v")
            assert await s.get("k") == "v"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        for i in range(3):
            with open(os.path.join(tmp_path, f"node{i}.ready")) as f:
                pid = int(f.read().split('"pid": ')[1].split(",")[0])
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _pids(root) -> list[int]:
    out = []
    for i in range(3):
        with open(os.path.join(root, f"node{i}.ready")) as f:
            out.append(int(f.read().split('"pid": ')[1].split(",")[0]))
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def _start_up(tmp_path):
    base = random.Random().randrange(10000, 32000)
    proc = subprocess.Popen([sys.executable, "-m", "store.cli", "up", "--replicas", "3", "--dir", str(tmp_path),
                             "--base-port", str(base)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C" in line:
            break
    assert "cellar status --endpoints" in "".join(lines), "".join(lines)
    return proc, base


async def test_up_survives_one_replica_dying_and_sigterm_stops_every_replica(tmp_path):
    proc, base = _start_up(tmp_path)
    try:
        pids = _pids(tmp_path)
        os.kill(pids[2], signal.SIGKILL)  # one replica dies: the other two keep serving
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready, "cellar up said nothing about the dead replica"
        line = proc.stdout.readline()
        assert "node 2 exited" in line, line
        async with CellarClient([("127.0.0.1", base + 100 + i) for i in range(2)], deadline_s=20) as cellar:
            s = cellar.session()
            await s.put("k", "v")
            assert await s.get("k") == "v"
        assert proc.poll() is None, "cellar up keeps running with a majority"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        for pid in pids[:2]:
            deadline = time.monotonic() + 10
            while not _gone(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _gone(pid), f"replica {pid} orphaned after SIGTERM to cellar up"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


async def test_status_and_sequencer_transfer_from_the_cli(tmp_path):
    proc, base = _start_up(tmp_path)
    endpoints = ",".join(f"127.0.0.1:{base + 100 + i}" for i in range(3))
    try:
        async with CellarClient([("127.0.0.1", base + 100 + i) for i in range(3)], deadline_s=20) as cellar:
            await cellar.session().put("k", "v")

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, timeout=60)

        st = cli("status", "--endpoints", endpoints, "--json")
        assert st.returncode == 0, st.stderr
        rows = json.loads(st.stdout)
        # Replica 0 starts as sequencer; on a busy machine a view change at start-up may
        # have moved it already. Every replica names the same one.
        seqs = {r["sequencer"] for r in rows}
        assert len(rows) == 3 and len(seqs) == 1, rows
        assert {r["role"] for r in rows} == {"sequencer", "replica"}
        target = 2 if seqs != {2} else 1
        moved = cli("sequencer", "transfer", "--to", str(target), "--endpoints", endpoints, "--json")
        assert moved.returncode == 0, moved.stderr
        assert json.loads(moved.stdout)["sequencer"] == target
        rows = json.loads(cli("status", "--endpoints", endpoints, "--json").stdout)
        assert {r["sequencer"] for r in rows} == {target}
        async with CellarClient([("127.0.0.1", base + 100 + i) for i in range(3)], deadline_s=20) as cellar:
            s = cellar.session(node=0)
            await s.put("k", "w")  # the cluster still serves under the new sequencer
            assert await s.get("k") == "w"
        bad = cli("sequencer", "transfer", "--to", "7", "--endpoints", endpoints)
        assert bad.returncode == 1 and "not one of the 3 replicas" in bad.stderr and "Traceback" not in bad.stderr
        usage = cli("status", "--endpoints", "nonsense")
        assert usage.returncode == 2 and "HOST:PORT" in usage.stderr
        down = cli("status", "--endpoints", "127.0.0.1:1", "--timeout", "0.5")
        assert down.returncode == 1 and "Traceback" not in down.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def test_sigkill_of_cellar_up_does_not_orphan_its_replicas(tmp_path):
    """``cellar up`` killed with SIGKILL (no handler runs): the kernel tells each
    replica its parent died (PR_SET_PDEATHSIG) and each stops as on SIGTERM."""
    proc, _base = _start_up(tmp_path)
    try:
        pids = _pids(tmp_path)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(p) for p in pids), f"replicas orphaned: {[p for p in pids if not _gone(p)]}"
    finally:
        for p in _pids(tmp_path):
            if not _gone(p):
                os.kill(p, signal.SIGKILL)


async def test_up_grows_and_shrinks_its_cluster_live_from_stdin(tmp_path):
    """Issue 13: ``cellar up`` adds and removes members while it serves (stdin commands)."""
    base = random.Random().randrange(10000, 32000)  # not the default 7000: other runs may hold it
    proc = subprocess.Popen([sys.executable, "-m", "store.cli", "up", "--replicas", "3", "--dir", str(tmp_path),
                             "--base-port", str(base)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # A thread reads the lines: select() on the pipe misses lines already in the text
    # reader's buffer (the next "Ctrl-C" line sat there once, and the wait timed out).
    import queue
    import threading

    out: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [out.put(line) for line in iter(proc.stdout.readline, "")] and None,
                     daemon=True).start()

    def until(marker: str) -> str:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = out.get(timeout=1.0)
            except queue.Empty:
                if proc.poll() is not None:
                    break
                continue
            lines.append(line)
            if marker in line:
                return "".join(lines)
        raise AssertionError(f"no {marker!r} in {''.join(lines)!r}")

    try:
        text = until("Ctrl-C")
        clients = [("127.0.0.1", int(p)) for p in
                   [line.split("clients 127.0.0.1:")[1].split(",")[0] for line in text.splitlines() if "clients 127" in line]]
        proc.stdin.write("grow\n")
        proc.stdin.flush()
        grown = until("epoch 1")
        assert "added 3, 4" in grown and "5 members" in grown, grown
        new = [("127.0.0.1", int(line.split("clients 127.0.0.1:")[1].split(",")[0]))
               for line in grown.splitlines() if "started" in line]
        proc.stdin.write("shrink\n")
        proc.stdin.flush()
        shrunk = until("epoch 2")
        assert "removed 3, 4" in shrunk and "3 members" in shrunk, shrunk
        async with CellarClient(clients, deadline_s=20) as cellar:
            s = cellar.session()
            await s.put("k", "v")
            assert await s.get("k") == "v"
        async with CellarClient(new[:1], deadline_s=5) as cellar:
            st = await cellar.status(0)
            assert st.get("retired") is True
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
