"""``cellar up`` starts a local cluster, says where it listens, and stops on Ctrl-C."""

from __future__ import annotations

import os
import random
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
