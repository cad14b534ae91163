"""Jepsen's *db* role: real ``cellar serve`` processes, each on its own loopback address.

Node ``i`` listens for peers, clients and HTTP on ``127.0.0.<base + i>`` (the same three
port numbers on every address), and dials its peers *from* that address, so that a
packet between two nodes names both (``jepsen_like.nemesis`` partitions them with
iptables without touching clients, which connect from 127.0.0.1).

``CellarDB`` starts, stops (SIGTERM), kills (SIGKILL), pauses (SIGSTOP) and resumes
(SIGCONT) nodes, wipes a stopped node's data, and finds the sequencer. Every process
it starts is its own child, ended by pid in ``teardown`` (and, through
``--exit-with-parent``, by the kernel if the harness itself dies).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

__all__ = ["CellarDB", "NodeAddr"]


@dataclass(frozen=True)
class NodeAddr:
    ip: str
    peer: int
    client: int
    http: int

    @property
    def client_addr(self) -> tuple[str, int]:
        return (self.ip, self.client)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.http}"


def _ports_free(ips: list[str], ports: list[int]) -> bool:
    for ip in ips:
        for port in ports:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((ip, port))
                except OSError:
                    return False
    return True


class CellarDB:
    def __init__(self, root: str, nodes: int = 3, *, base_ip: int = 20, protocol: str = "sdpaxos",
                 fsync: str = "batch", snapshot_every: int | None = None, machine: str = "kv",
                 extra_args: list[str] | None = None, log_level: str = "warning", seed: int | None = None) -> None:
        if nodes < 3 or nodes % 2 == 0:
            raise ValueError(f"{nodes} nodes: a cluster has an odd number of replicas from 3")
        if not 2 <= base_ip <= 250 - nodes:
            raise ValueError("base_ip must leave room in 127.0.0.2-250")
        self.root = root
        self.n = nodes
        self.protocol = protocol
        self.fsync = fsync
        self.snapshot_every = snapshot_every
        self.machine = machine
        self.extra_args = extra_args or []
        self.log_level = log_level
        ips = [f"127.0.0.{base_ip + i}" for i in range(nodes)]
        rng = random.Random(seed)
        for _ in range(200):  # the same three ports free on every address
            base = rng.randrange(20000, 30000)
            ports = [base, base + 1, base + 2]
            if _ports_free(ips, ports):
                break
        else:
            raise RuntimeError("no free ports for the nodes' addresses")
        self.addrs = [NodeAddr(ip, ports[0], ports[1], ports[2]) for ip in ips]
        self.procs: dict[int, subprocess.Popen] = {}

    # --- addresses ----------------------------------------------------------------------

    @property
    def ips(self) -> list[str]:
        return [a.ip for a in self.addrs]

    @property
    def client_addresses(self) -> list[tuple[str, int]]:
        return [a.client_addr for a in self.addrs]

    @property
    def urls(self) -> list[str]:
        return [a.url for a in self.addrs]

    def data_dir(self, i: int) -> str:
        return os.path.join(self.root, f"n{i}")

    def log_path(self, i: int) -> str:
        return os.path.join(self.root, f"n{i}.log")

    def _ready_file(self, i: int) -> str:
        return os.path.join(self.root, f"n{i}.ready")

    def command(self, i: int) -> list[str]:
        peers = ",".join(f"{k}={a.ip}:{a.peer}" for k, a in enumerate(self.addrs))
        a = self.addrs[i]
        cmd = [sys.executable, "-m", "store.cli", "serve", "--id", str(i), "--peers", peers,
               "--client", f"{a.ip}:{a.client}", "--http", f"{a.ip}:{a.http}", "--data-dir", self.data_dir(i),
               "--protocol", self.protocol, "--fsync", self.fsync, "--cluster-id", "jepsen",
               "--machine", self.machine, "--ready-file", self._ready_file(i),
               "--exit-with-parent", str(os.getpid()), "--log-level", self.log_level]
        if self.snapshot_every is not None:
            cmd += ["--snapshot-every", str(self.snapshot_every)]
        return cmd + self.extra_args

    # --- processes ------------------------------------------------------------------------

    def start(self, i: int) -> None:
        if self.alive(i):
            return
        os.makedirs(self.root, exist_ok=True)
        try:
            os.unlink(self._ready_file(i))
        except FileNotFoundError:
            pass
        with open(self.log_path(i), "ab") as log:
            self.procs[i] = subprocess.Popen(self.command(i), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)

    def start_all(self) -> None:
        for i in range(self.n):
            self.start(i)

    def alive(self, i: int) -> bool:
        p = self.procs.get(i)
        return p is not None and p.poll() is None

    def pid(self, i: int) -> int | None:
        p = self.procs.get(i)
        return p.pid if p is not None and p.poll() is None else None

    def _signal(self, i: int, sig: int) -> bool:
        p = self.procs.get(i)
        if p is None or p.poll() is not None:
            return False
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def kill(self, i: int) -> bool:
        """SIGKILL: no shutdown at all (what was not fsynced may be lost, per --fsync)."""
        ok = self._signal(i, signal.SIGKILL)  # a stopped process dies too
        if ok:
            self.procs[i].wait(timeout=10)
        return ok

    def stop(self, i: int, timeout_s: float = 10.0) -> None:
        """SIGTERM (resumed first if paused), SIGKILL past ``timeout_s``."""
        p = self.procs.get(i)
        if p is None or p.poll() is not None:
            return
        self._signal(i, signal.SIGCONT)
        self._signal(i, signal.SIGTERM)
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(i, signal.SIGKILL)
            p.wait(timeout=10)

    def pause(self, i: int) -> bool:
        return self._signal(i, signal.SIGSTOP)

    def resume(self, i: int) -> bool:
        return self._signal(i, signal.SIGCONT)

    def restart(self, i: int) -> None:
        self.kill(i)
        self.start(i)

    def wipe(self, i: int) -> None:
        """Delete a stopped node's data directory (it rejoins empty)."""
        if self.alive(i):
            raise RuntimeError(f"node {i} is running: stop it before wiping its data")
        shutil.rmtree(self.data_dir(i), ignore_errors=True)

    def teardown(self) -> None:
        for i in list(self.procs):
            self.stop(i, timeout_s=5.0)

    # --- readiness and roles ----------------------------------------------------------------

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        for i in range(self.n):
            while not os.path.exists(self._ready_file(i)):
                if not self.alive(i):
                    raise RuntimeError(f"node {i} exited: {self.log_tail(i)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"node {i} not ready within {timeout_s:.0f} s: {self.log_tail(i)}")
                time.sleep(0.05)

    async def await_ready(self, timeout_s: float = 30.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.wait_ready, timeout_s)

    def log_tail(self, i: int, lines: int = 3) -> str:
        try:
            with open(self.log_path(i), "rb") as f:
                text = f.read()[-4000:].decode(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def sequencer(self, timeout_s: float = 1.0) -> int | None:
        """Who the majority of reachable nodes name as sequencer (their /readyz), or None."""
        votes: dict[int, int] = {}
        for a in self.addrs:
            try:
                with urllib.request.urlopen(a.url + "/readyz", timeout=timeout_s) as r:
                    doc = json.loads(r.read())
            except Exception:
                continue
            seq = doc.get("sequencer", doc.get("leader"))
            if isinstance(seq, int):
                votes[seq] = votes.get(seq, 0) + 1
        if not votes:
            return None
        return max(votes, key=lambda s: (votes[s], -s))
