"""``cellar up``'s live membership changes, typed on its standard input (issue 13).

    grow          start two new replicas and add them (3 -> 5)
    shrink        remove two members (never the last three): their processes retire
    replace ID    SIGKILL member ID if it runs, start a fresh replica, replace ID by it
    status        cellar status of the members
    help          this list

Each change is what an operator does by hand: ``cellar serve --join`` for a newcomer,
then ``cellar member add|remove|replace`` against the live members (their output is
shown). Newcomers are named by the next free id, listen on free ports and keep their
data next to the others'; ``cellar up`` stops them with the rest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import click

from store.server import LocalCluster, free_ports

COMMANDS = "grow | shrink | replace ID | status | help"


class UpMembers:
    def __init__(self, cluster: LocalCluster, tls_dir: str | None) -> None:
        self.cluster = cluster
        self.tls_dir = tls_dir
        # name -> (peer port, client port, Popen or None); the first replicas are LocalCluster's
        self.members: dict[str, dict[str, Any]] = {
            str(i): {"peer": cluster.peer_ports[i], "client": cluster.client_ports[i], "proc": None}
            for i in range(cluster.n)}
        self.removed: set[str] = set()
        self.joiners: list[subprocess.Popen] = []

    def _tls(self, name: str | None = None) -> list[str]:
        if self.tls_dir is None:
            return []
        d = self.tls_dir
        if name is None:  # the admin client
            return ["--cacert", os.path.join(d, "ca.pem"), "--cert", os.path.join(d, "admin.pem"),
                    "--key", os.path.join(d, "admin-key.pem")]
        return ["--tls-ca", os.path.join(d, "ca.pem"), "--tls-cert", os.path.join(d, f"node{name}.pem"),
                "--tls-key", os.path.join(d, f"node{name}-key.pem")]

    def live(self) -> list[str]:
        return [n for n in self.members if n not in self.removed]

    def endpoints(self) -> str:
        return ",".join(f"127.0.0.1:{self.members[n]['client']}" for n in self.live())

    def _entry(self, name: str) -> str:
        m = self.members[name]
        return f"{name}=127.0.0.1:{m['peer']},127.0.0.1:{m['client']}"

    def _start_joiner(self) -> str:
        name = str(max(int(n) for n in self.members) + 1)
        if self.tls_dir is not None and not os.path.exists(os.path.join(self.tls_dir, f"node{name}.pem")):
            raise click.ClickException(f"no certificate for replica {name} in {self.tls_dir} (cellar up --tls makes "
                                       "certificates for 8 more)")
        peer, client = free_ports(2)
        root = self.cluster.root
        log = open(os.path.join(root, f"node{name}.log"), "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "store.cli", "serve", "--join", self.endpoints(), "--name", name,
             "--cluster-id", self.cluster.cluster_id, "--listen", f"127.0.0.1:{peer}",
             "--client", f"127.0.0.1:{client}", "--data-dir", os.path.join(root, f"node{name}"),
             "--fsync", self.cluster.fsync, "--exit-with-parent", str(os.getpid()), *self._tls(name)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.members[name] = {"peer": peer, "client": client, "proc": proc}
        self.joiners.append(proc)
        click.echo(f"  started {name}: pid {proc.pid}, clients 127.0.0.1:{client}, peers 127.0.0.1:{peer}")
        return name

    def _member(self, *args: str) -> bool:
        out = subprocess.run([sys.executable, "-m", "store.cli", "member", *args, "--endpoints", self.endpoints(),
                              *self._tls()], capture_output=True, text=True, timeout=120)
        text = (out.stdout + out.stderr).strip()
        click.echo(f"  {text}" if text else f"  (exit {out.returncode})")
        return out.returncode == 0

    def run(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        cmd, args = words[0], words[1:]
        if cmd == "help":
            click.echo(f"  {COMMANDS}")
        elif cmd == "status":
            out = subprocess.run([sys.executable, "-m", "store.cli", "member", "list", "--endpoints", self.endpoints(),
                                  *self._tls()], capture_output=True, text=True, timeout=60)
            click.echo((out.stdout + out.stderr).rstrip())
        elif cmd == "grow" and not args:
            a, b = self._start_joiner(), self._start_joiner()
            self._member("add", self._entry(a), self._entry(b))
        elif cmd == "shrink" and not args:
            live = self.live()
            if len(live) < 5:
                click.echo(f"  {len(live)} members: a cluster keeps at least 3")
                return
            gone = live[-2:]
            if self._member("remove", *gone):
                self.removed.update(gone)
        elif cmd == "replace" and len(args) == 1 and args[0] in self.live():
            old = args[0]
            m = self.members[old]
            if m["proc"] is None:
                self.cluster.kill(int(old), signal.SIGKILL)
            elif m["proc"].poll() is None:
                m["proc"].kill()
                m["proc"].wait(timeout=10)
            click.echo(f"  killed {old}")
            self.removed.add(old)  # its endpoint no longer answers
            new = self._start_joiner()
            self._member("replace", old, self._entry(new))
        else:
            click.echo(f"  unknown command {line.strip()!r:.60}: {COMMANDS}")

    def stop(self) -> None:
        for proc in self.joiners:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.joiners:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
