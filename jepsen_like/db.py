"""Jepsen's *db* role: real ``cellar serve`` processes, each on its own loopback address.

``CellarDB`` is a ``store.server.LocalCluster`` whose node ``i`` listens for peers,
clients and HTTP on ``127.0.0.<base + i>`` (the same three ports on every address) and
dials its peers *from* that address, so that a packet between two nodes names both
(``jepsen_like.nemesis`` partitions them with iptables without touching clients, which
connect from 127.0.0.1). It adds what a nemesis needs on top of start, stop (SIGTERM)
and kill (SIGKILL): pause (SIGSTOP), resume (SIGCONT), restart, wipe a stopped node's
data, and the sequencer the nodes name. With ``clock_control`` each node ticks at the
rate in its own file (``clock_path``), which the clock nemesis sets; with ``disk_tmpfs``
each node's data dir is a tmpfs of its own (the disk nemesis fills one). Every process
is its own child, ended by pid in ``teardown`` (and, through ``--exit-with-parent``, by
the kernel if the harness itself dies).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.error
import urllib.request

from store.server import LocalCluster

__all__ = ["CellarDB"]


class Pausable:
    """SIGSTOP / SIGCONT of node ``i``, one of our own processes (``self.procs``, by PID):
    the process nemesis' pause for every db."""

    procs: dict

    def _signal(self, i: int, sig: int) -> bool:
        proc = self.procs.get(i)
        if proc is None or proc.poll() is not None:
            return False
        proc.send_signal(sig)
        return True

    def pause(self, i: int) -> bool:
        return self._signal(i, signal.SIGSTOP)

    def resume(self, i: int) -> bool:
        return self._signal(i, signal.SIGCONT)


class CellarDB(Pausable, LocalCluster):
    def __init__(self, root: str, nodes: int = 3, *, base_ip: int = 20, protocol: str = "sdpaxos",
                 fsync: str = "batch", snapshot_every: int | None = None, machine: str = "kv",
                 extra_args: list[str] | None = None, log_level: str = "warning", clock_control: bool = False,
                 disk_tmpfs: str | None = None, planted: str = "") -> None:
        if nodes < 3 or nodes % 2 == 0:
            raise ValueError(f"{nodes} nodes: a cluster has an odd number of replicas from 3")
        if not 2 <= base_ip <= 250 - nodes:
            raise ValueError("base_ip must leave room in 127.0.0.2-250")
        extra = ["--machine", machine, *(["--snapshot-every", str(snapshot_every)] if snapshot_every is not None else []),
                 *(extra_args or [])]
        super().__init__(root, nodes, protocol=protocol, fsync=fsync, cluster_id="jepsen", extra_args=extra,
                         log_level=log_level, http=True, hosts=[f"127.0.0.{base_ip + i}" for i in range(nodes)])
        # A broken state machine in every replica (jepsen_like.planted), or "": the product's.
        self.planted = planted
        # node i -> peer j -> where node i dials j (a fault proxy), or None: the peers themselves
        self.dial: dict[int, dict[int, tuple[str, int]]] | None = None
        # TESTING ONLY: node i ticks at the rate in clock_path(i) (``cellar serve
        # --clock-control``, consensus.runtime.clock_control), set by the clock nemesis.
        self.clock_control = clock_control
        # With ``disk_tmpfs`` (a size, say "64m") every node's data dir is a tmpfs of its
        # own (root only), so that the disk nemesis can fill one (ENOSPC); teardown
        # copies each aside (``node<i>.saved``) and unmounts it.
        self.tmpfs: list = []
        if disk_tmpfs:
            from .disk import Tmpfs

            try:
                for i in range(nodes):
                    self.tmpfs.append(Tmpfs(self.data_dir(i), disk_tmpfs))
            except OSError:
                self._unmount(save=False)
                raise

    def peers_spec_for(self, i: int) -> str:
        """Node ``i``'s ``--peers``: with ``dial`` set (``jepsen_like.proxy.ProxyNet``), each
        peer j at the proxy that carries i's bytes to j; node i's own entry stays its address."""
        if self.dial is None:
            return self.peers_spec
        return ",".join(f"{j}={h}:{p}" for j, (h, p) in sorted(self.dial[i].items()))

    def clock_path(self, i: int) -> str:
        return os.path.join(self.root, f"node{i}.clock")

    def command(self, i: int) -> list[str]:
        cmd = super().command(i)
        if self.planted:  # the same cellar serve, its machine swapped for a broken one
            at = cmd.index("store.cli")
            cmd[at:at + 1] = ["jepsen_like.planted", self.planted]
        if self.clock_control:
            cmd += ["--clock-control", self.clock_path(i)]
        return cmd

    @property
    def ips(self) -> list[str]:
        return list(self.hosts)

    def restart(self, i: int) -> None:
        self.kill(i)
        self.start(i)

    def wipe(self, i: int) -> None:
        """Delete a stopped node's data directory (it rejoins empty)."""
        if self.alive(i):
            raise RuntimeError(f"node {i} is running: stop it before wiping its data")
        shutil.rmtree(self.data_dir(i), ignore_errors=True)

    def teardown(self) -> None:
        self.stop_all(timeout_s=5.0)
        self._unmount(save=True)

    def _unmount(self, save: bool) -> None:
        for i, t in enumerate(self.tmpfs):
            try:
                if save and t.mounted:  # for a failed run's post-mortem (removed if valid)
                    shutil.copytree(t.path, t.path + ".saved", dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("nemesis-filler", "LOCK"))
            except OSError:
                pass
            finally:
                t.umount()
        self.tmpfs = []

    def sequencer(self, timeout_s: float = 1.0) -> int | None:
        """Who most reachable nodes name as sequencer on their ``/readyz``, or None."""
        votes: dict[int, int] = {}
        for url in self.urls:
            doc: dict = {}
            # the KV API's /readyz names the sequencer; the scheduler's names it on /v1/status
            for path in ("/readyz", "/v1/status"):
                try:
                    with urllib.request.urlopen(url + path, timeout=timeout_s) as r:
                        doc = json.loads(r.read())
                except urllib.error.HTTPError as e:  # 503 while not ready: the body still says
                    try:
                        doc = json.loads(e.read())
                    except Exception:
                        doc = {}
                except Exception:
                    doc = {}
                if isinstance(doc, dict) and ("sequencer" in doc or "leader" in doc):
                    break
            if not isinstance(doc, dict):
                continue
            seq = doc.get("sequencer", doc.get("leader"))
            if isinstance(seq, int):
                votes[seq] = votes.get(seq, 0) + 1
        if not votes:
            return None
        return max(votes, key=lambda s: (votes[s], -s))
