"""etcd as a second target of the harness: the *db* role for etcd members, and the client.

``EtcdDB`` starts ``n`` etcd members (the ``etcd`` on PATH; Debian's 3.4) on 127.0.0.1,
each with its data dir under the run's folder (``--data-dir``), and has the interface
the runner and ``jepsen_like.nemesis.ProcessNemesis`` drive on ``CellarDB``: start,
kill (SIGKILL), pause (SIGSTOP), resume (SIGCONT), teardown, all by pid, logs, and the
*sequencer* (here the Raft leader, from ``/v3/maintenance/status``). A restarted member
keeps its data dir (``--initial-cluster-state new`` is ignored once it has one).

**Partitions.** etcd dials its peers from 127.0.0.1 whatever it listens on, so iptables
rules naming source addresses cannot tell members apart. Instead each member
advertises a peer URL that is a fault proxy in front of its real peer port
(``jepsen_like.proxy.ProxyNet.node``); the proxy tells who dialed by which member's
process owns the connecting socket (``loopback_owner``), and cuts that pair's gates.
Every member's peer traffic (Raft streams and pipeline, probes, version checks) goes
through the proxies; client traffic goes straight to each member.

``EtcdKV``: ``jepsen_like.client.HttpKV`` on etcd's v3 JSON gateway (same paths and
bodies), with one difference: proto3's JSON leaves out a false ``succeeded``, so a 200
txn answer with a header and no ``succeeded`` is a definite compare failure.

``converge``: every member answers ``/v3/maintenance/status`` with the same revision
and applied Raft index, and ``/v3/maintenance/hash`` the same hash (the runner's
"digests").
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

from store.server import stop_processes

from .client import HttpKV, Outcome
from .db import Pausable
from .history import FAIL, INFO

__all__ = ["EtcdDB", "EtcdKV", "converge", "etcd_command", "etcd_missing", "statuses"]


def etcd_missing(binary: str = "etcd") -> str | None:
    """None if ``binary`` runs here, else why not (one line)."""
    if shutil.which(binary) is None:
        return f"{binary} is not on PATH (Debian: apt-get install etcd-server)"
    return None


def etcd_command(binary: str, i: int, data_dir: str, client_port: int, peer_port: int,
                 advertise: dict[int, tuple[str, int]], token: str) -> list[str]:
    """Member ``m<i>``'s command line: clients and peers on 127.0.0.1, the cluster as
    ``advertise`` says the members reach each other (their peer ports, or proxies)."""
    cluster = ",".join(f"m{j}=http://{h}:{p}" for j, (h, p) in sorted(advertise.items()))
    client = f"http://127.0.0.1:{client_port}"
    h, p = advertise[i]
    return [binary, "--name", f"m{i}", "--data-dir", data_dir,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://{h}:{p}",
            "--initial-cluster", cluster, "--initial-cluster-token", token,
            "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn"]


class EtcdDB(Pausable):
    def __init__(self, root: str, nodes: int = 3, *, binary: str = "etcd") -> None:
        from store.server import free_ports

        if nodes < 3 or nodes % 2 == 0:
            raise ValueError(f"{nodes} members: an odd number from 3")
        self.root = root
        self.n = nodes
        self.binary = shutil.which(binary) or binary
        ports = free_ports(2 * nodes)
        self.client_ports, self.peer_ports = ports[:nodes], ports[nodes:]
        # where the others reach member i (a proxy, set by the runner before start_all)
        self.advertise: dict[int, tuple[str, int]] = {i: ("127.0.0.1", p) for i, p in enumerate(self.peer_ports)}
        self.token = f"cellar-jepsen-{os.getpid()}-{time.time_ns() & 0xFFFFFF:x}"
        self.procs: dict[int, subprocess.Popen] = {}
        self.clock_control = False
        self.ids: dict[str, int] = {}  # etcd member id -> node index, as the members report

    # -- what the runner and the nemeses use ------------------------------------------

    @property
    def ips(self) -> list[str]:
        return ["127.0.0.1"] * self.n

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.client_ports]

    def data_dir(self, i: int) -> str:
        return os.path.join(self.root, f"etcd{i}")

    def log_path(self, i: int) -> str:
        return os.path.join(self.root, f"node{i}.log")

    def log_tail(self, i: int, lines: int = 5) -> str:
        try:
            with open(self.log_path(i), errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])[-600:]
        except OSError:
            return ""

    def command(self, i: int) -> list[str]:
        return etcd_command(self.binary, i, self.data_dir(i), self.client_ports[i], self.peer_ports[i],
                            self.advertise, self.token)

    def start(self, i: int) -> None:
        os.makedirs(self.root, exist_ok=True)
        with open(self.log_path(i), "ab") as log:
            self.procs[i] = subprocess.Popen(self.command(i), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)

    def start_all(self) -> None:
        # etcd has no --exit-with-parent: if the harness ends without its teardown (an
        # exception it did not catch, Ctrl-C), stop the members at exit, by pid
        atexit.register(self.teardown)
        for i in range(self.n):
            self.start(i)

    def alive(self, i: int) -> bool:
        proc = self.procs.get(i)
        return proc is not None and proc.poll() is None

    def pids(self) -> dict[int, int]:
        """pid -> node, of the members running now."""
        return {p.pid: i for i, p in self.procs.items() if p.poll() is None}

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(i)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=10)

    def teardown(self, timeout_s: float = 2.0) -> None:
        """SIGTERM every member, SIGKILL past ``timeout_s`` (a leader stopping transfers its
        leadership first, which waits for members that are stopping too: a few seconds)."""
        stop_processes(self.procs.values(), timeout_s)

    def _post(self, i: int, path: str, body: dict, timeout_s: float) -> dict | None:
        req = urllib.request.Request(self.urls[i] + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                doc = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def status(self, i: int, timeout_s: float = 1.0) -> dict | None:
        doc = self._post(i, "/v3/maintenance/status", {}, timeout_s)
        if doc is not None:
            me = doc.get("header", {}).get("member_id")
            if me:
                self.ids[me] = i
        return doc

    def sequencer(self, timeout_s: float = 1.0) -> int | None:
        """The leader most reachable members name, or None."""
        votes: dict[int, int] = {}
        docs = [self.status(i, timeout_s) for i in range(self.n) if self.alive(i)]
        for doc in docs:
            leader = self.ids.get(str((doc or {}).get("leader", "")))
            if leader is not None:
                votes[leader] = votes.get(leader, 0) + 1
        return max(votes, key=lambda s: (votes[s], -s)) if votes else None

    def healthy(self, i: int, timeout_s: float = 1.0) -> bool:
        try:
            with urllib.request.urlopen(self.urls[i] + "/health", timeout=timeout_s) as r:
                return json.loads(r.read()).get("health") == "true"
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            return False

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Every member running and healthy (it has a leader), bounded."""
        deadline = time.monotonic() + timeout_s
        for i in range(self.n):
            while not self.healthy(i):
                proc = self.procs.get(i)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"etcd member {i} exited with status {proc.returncode}: {self.log_tail(i, 2)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd member {i} not healthy within {timeout_s:g} s: {self.log_tail(i, 2)}")
                time.sleep(0.1)

    async def await_ready(self, i: int | None = None, timeout_s: float = 30.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.wait_ready, timeout_s)


class EtcdKV(HttpKV):
    """``HttpKV`` on etcd's JSON gateway: a txn answered 200 without ``succeeded`` failed."""

    async def cas(self, key: str, old: str | None, new: str, node: int) -> Outcome:
        out = await super().cas(key, old, new, node)
        if out.type == INFO and out.error and out.error.startswith("200 without succeeded") and "'header'" in out.error:
            return Outcome(FAIL, error="compare failed")
        return out

    async def readyz(self) -> list[dict | None]:
        """Each member's ``/health`` as ``{"ready": bool}`` (None: no answer)."""
        import aiohttp

        out: list[dict | None] = []
        for url in self.urls:
            try:
                async with self._session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                    body = await r.json(content_type=None)
                    out.append({"ready": isinstance(body, dict) and body.get("health") == "true", "status": r.status})
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OSError, ValueError):
                out.append(None)
        return out


def statuses(db: EtcdDB) -> list[dict | None]:
    """Each member's applied index, revision and backend hash (the runner's digests)."""
    out: list[dict | None] = []
    for i in range(db.n):
        st = db.status(i, 2.0)
        h = db._post(i, "/v3/maintenance/hash", {}, 5.0)
        if st is None or h is None:
            out.append(None)
            continue
        out.append({"exec_slot": int(st.get("raftAppliedIndex", 0)),
                    "digest": f"rev {st.get('header', {}).get('revision')} hash {h.get('hash')}"})
    return out


async def converge(db: EtcdDB, timeout_s: float) -> tuple[bool, list]:
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout_s
    last: list = []
    while time.monotonic() < deadline:
        last = await loop.run_in_executor(None, statuses, db)
        if all(last) and len({(s["exec_slot"], s["digest"]) for s in last}) == 1:
            return True, last
        await asyncio.sleep(0.5)
    return False, last
