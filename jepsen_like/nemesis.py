"""Jepsen's *nemesis* role: faults on real processes.

- ``IptablesNet``: network partitions between the nodes' loopback addresses
  (``jepsen_like.db``), as DROP rules in a chain of our own (``CELLAR-NEM-<pid>``)
  jumped to from INPUT. Loopback packets pass INPUT on receipt, so a rule naming
  source and destination cuts one direction of one pair; clients (from 127.0.0.1)
  are never cut. ``heal`` flushes the chain; ``close`` removes the jump and the chain
  (also at exit, and ``sweep_stale_chains`` removes chains a killed harness left).
  Partitions: halves, isolate one node, a bridge (two halves that share one node),
  a majority ring (each node sees a majority, no two the same; 5 nodes or more), one
  way, and flapping (a partition that comes and goes every 0.2-1 s, a new shape each
  time, for the whole window: ``flap_pairs``).
- ``jepsen_like.proxy.ProxyNet``: the same partitions as cut links of a fault proxy
  in the harness, one per directed pair of nodes (no root, no iptables; etcd).
- ``ProcessNemesis``: kill (SIGKILL) and restart, pause (SIGSTOP) and resume of the
  sequencer, a minority, one node, or all nodes.
- ``ClockNemesis``: clock *rate* skew, as the simulator models it (``SimConfig.tick_skew``:
  node i ticks every ``tick_ms * (1 + skew)``), through each node's clock-control file
  (``cellar serve --clock-control``, a testing knob: consensus.runtime.clock_control).
  Skews stay within ``consensus.sim.search.SKEW_MAX`` (2.4 %), so that any two nodes'
  rates differ by less than the lease's drift bound (5 %): mixed fast and slow nodes,
  a slow sequencer among fast voters, a fast sequencer among slow voters. ``reset``
  puts every node back at rate 1.
- ``DiskNemesis`` (faults in ``jepsen_like.disk``): on a killed node before its
  restart, a torn write after the end of its WAL (recovery must truncate it) or one
  flipped byte in a durable record (the node must refuse to start with one line; the
  byte is then put back, as a disk restored from a mirror, and the node restarts);
  or, on a running node whose data dir is a tmpfs of its own, a full disk (ENOSPC:
  the node must stop by itself with one line; the filler is removed and the node
  restarts on the same data). Each fault records what the node did.
- slow links (``delay``, the fault proxy only): every link of one node, of the
  sequencer, or of all nodes delayed by 20-200 ms each way (``ProxyNet.delay``), bytes
  still in order.
- ``schedule``: a seeded list of (start, end, fault kind); the runner
  (``jepsen_like.runner``) applies them and records each interval for the report. With
  two or more nemeses, about one window in four is *combined*: a network fault
  (partition or slow links) and a process or clock fault at once, kind ``A+B``, both
  applied at the start and undone at the end in reverse order.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClockNemesis", "CLOCKS", "DISKS", "DiskNemesis", "Fault", "IptablesNet", "NemesisError", "PARTITIONS", "ProcessNemesis", "iptables_available",
           "partition_pairs", "schedule", "sweep_stale_chains"]

KINDS = ("partition", "kill", "pause", "clock", "disk", "delay")
DELAYS = ("delay-one", "delay-sequencer", "delay-all")
DELAY_MS = (20.0, 200.0)  # one way, drawn per fault
CLOCKS = ("clock-mixed", "clock-sequencer-slow", "clock-sequencer-fast")
DISKS = ("disk-torn", "disk-flip", "disk-full")


class NemesisError(RuntimeError):
    pass


def iptables_available() -> str | None:
    """None if iptables can be used here, else why not (one line)."""
    if shutil.which("iptables") is None:
        return "iptables is not installed (Debian: apt-get install iptables)"
    if os.geteuid() != 0:
        return "iptables needs root"
    try:
        out = subprocess.run(["iptables", "-w", "5", "-L", "INPUT", "-n"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"iptables does not run: {e}"
    if out.returncode != 0:
        return f"iptables does not work here: {out.stderr.strip()[:200]}"
    return None


def _ipt(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, timeout=15)
    if check and out.returncode != 0:
        raise NemesisError(f"iptables {' '.join(args)}: {out.stderr.strip()[:300]}")
    return out


def sweep_stale_chains() -> list[str]:
    """Remove CELLAR-NEM-<pid> chains whose harness process is gone; their names."""
    out = _ipt("-S", check=False)
    gone = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "-N" and parts[1].startswith("CELLAR-NEM-"):
            try:
                pid = int(parts[1].rsplit("-", 1)[1])
            except ValueError:
                continue
            if not os.path.exists(f"/proc/{pid}"):
                _drop_chain(parts[1])
                gone.append(parts[1])
    return gone


def _drop_chain(chain: str) -> None:
    while _ipt("-D", "INPUT", "-j", chain, check=False).returncode == 0:
        pass
    _ipt("-F", chain, check=False)
    _ipt("-X", chain, check=False)


class IptablesNet:
    """DROP rules between node addresses, in a chain of our own."""

    def __init__(self, ips: list[str]) -> None:
        why = iptables_available()
        if why:
            raise NemesisError(why)
        self.ips = list(ips)
        self.chain = f"CELLAR-NEM-{os.getpid()}"
        self.cut: set[tuple[int, int]] = set()  # (src, dst) node pairs dropped now
        _drop_chain(self.chain)  # a leftover of ours (same pid reused): start clean
        _ipt("-N", self.chain)
        _ipt("-I", "INPUT", "1", "-j", self.chain)
        self._open = True
        atexit.register(self.close)

    def drop(self, pairs: set[tuple[int, int]]) -> None:
        """Cut exactly ``pairs`` (src node, dst node), one direction each, healing others."""
        self.heal()
        for a, b in sorted(pairs):
            _ipt("-A", self.chain, "-s", self.ips[a], "-d", self.ips[b], "-j", "DROP")
        self.cut = set(pairs)

    def partition(self, groups: list[set[int]]) -> None:
        """Nodes talk only within their group (a node may be in several: a bridge)."""
        self.drop(_talk(groups, len(self.ips)))

    def heal(self) -> None:
        if self.cut:
            _ipt("-F", self.chain)
            self.cut = set()

    def close(self) -> None:
        if self._open:
            self._open = False
            _drop_chain(self.chain)
            self.cut = set()

    def rules(self) -> list[str]:
        return [line for line in _ipt("-S", self.chain).stdout.splitlines() if line.startswith("-A")]


def _talk(groups: list[set[int]], n: int) -> set[tuple[int, int]]:
    """Pairs (a, b) to drop so that nodes talk only within a group."""
    return {(a, b) for a in range(n) for b in range(n) if a != b and not any(a in g and b in g for g in groups)}


def partition_pairs(kind: str, n: int, rng: random.Random, sequencer: int | None = None) -> tuple[set[tuple[int, int]], str]:
    """The (src, dst) node pairs one partition of ``n`` nodes drops, and a description."""
    nodes = list(range(n))
    rng.shuffle(nodes)
    if kind == "halves":
        k = n // 2
        return _talk([set(nodes[:k]), set(nodes[k:])], n), f"halves {sorted(nodes[:k])} | {sorted(nodes[k:])}"
    if kind in ("isolate", "isolate-sequencer"):
        x = sequencer if kind == "isolate-sequencer" and sequencer is not None else nodes[0]
        return _talk([{x}, set(range(n)) - {x}], n), f"isolate {x}"
    if kind == "bridge":
        k = n // 2
        mid = nodes[k]
        left, right = set(nodes[:k]) | {mid}, set(nodes[k + 1:]) | {mid}
        return _talk([left, right], n), f"bridge through {mid}: {sorted(left)} | {sorted(right)}"
    if kind == "ring":
        # Each node hears its nearest neighbours on a ring, a majority with itself, and
        # no two nodes hear the same majority (with 3 nodes that is everybody).
        d = max(1, (n // 2 + 1) // 2)
        pos = {x: i for i, x in enumerate(nodes)}
        pairs = {(a, b) for a in range(n) for b in range(n)
                 if a != b and min((pos[a] - pos[b]) % n, (pos[b] - pos[a]) % n) > d}
        return pairs, f"majority ring {nodes}"
    if kind == "one-way":
        x = nodes[0] if sequencer is None or rng.random() < 0.5 else sequencer
        return {(y, x) for y in range(n) if y != x}, f"one way: {x} hears nobody, is heard by all"
    raise ValueError(f"unknown partition {kind!r}")


@dataclass
class Fault:
    """One fault of a schedule: ``kind`` (partition kinds, one-way, kill, pause), applied
    at ``start`` and undone at ``end`` (seconds from the run's start)."""

    start: float
    end: float
    kind: str
    detail: str = ""
    nodes: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "kind": self.kind,
                "detail": self.detail, "nodes": self.nodes}


PARTITIONS = ("halves", "isolate", "isolate-sequencer", "bridge", "ring", "one-way", "flapping")
FLAP_SHAPES = ("halves", "isolate", "one-way")  # what one flap of a flapping partition cuts
FLAP_S = (0.2, 1.0)  # each flap's cut, then its heal, lasts this long
COMBINED = 0.25  # the share of windows that combine a network fault with another
# What a fault of each nemesis may be combined with: network faults with kill, pause or
# clock faults (disk: never; its faults kill and restart a node of their own).
_PARTNERS = {"partition": ("kill", "pause", "clock"), "delay": ("kill", "pause", "clock"),
             "kill": ("partition", "delay"), "pause": ("partition", "delay"), "clock": ("partition", "delay")}


def flap_pairs(n: int, rng: random.Random) -> tuple[set[tuple[int, int]], str]:
    """One flap of a flapping partition: a shape of ``FLAP_SHAPES``, drawn anew."""
    return partition_pairs(rng.choice(FLAP_SHAPES), n, rng)


def schedule(kinds: list[str], seconds: float, rng: random.Random, *, quiet_s: float = 3.0,
             fault_s: tuple[float, float] = (2.0, 5.0), gap_s: tuple[float, float] = (1.0, 3.0),
             disk_full: bool = True, nodes: int | None = None) -> list[tuple[float, float, str]]:
    """Fault windows (start, end, kind) over ``seconds``: a quiet start, then faults of
    the chosen kinds one after another with gaps (a nemesis drawn uniformly, then one of
    its shapes), ending ``quiet_s`` before the end
    (so that the cluster heals before the final reads). With a network nemesis and one
    of kill, pause or clock among ``kinds``, a window is combined (``A+B``, module
    docstring) with probability ``COMBINED``. ``nodes``: the cluster's size, when known
    (the majority ring exists from 5 nodes)."""
    families: dict[str, list[str]] = {}
    for k in kinds:
        if k == "partition":
            families[k] = [p for p in PARTITIONS if p != "ring" or nodes is None or nodes >= 5]
        elif k in ("kill", "pause"):
            families[k] = [f"{k}-sequencer", f"{k}-minority", f"{k}-one", f"{k}-all"]
        elif k == "clock":
            families[k] = list(CLOCKS)
        elif k == "disk":
            families[k] = [d for d in DISKS if disk_full or d != "disk-full"]
        elif k == "delay":
            families[k] = list(DELAYS)
        else:
            raise ValueError(f"unknown nemesis {k!r} ({', '.join(KINDS)})")
    names = list(families)
    out = []
    t = quiet_s
    while True:
        length = rng.uniform(*fault_s)
        if t + length > seconds - quiet_s:
            break
        # each nemesis as often as the others, whatever its number of shapes
        family = names[0] if len(names) == 1 else rng.choice(names)
        kind = rng.choice(families[family])
        partners = [f for f in names if f in _PARTNERS.get(family, ())]
        if partners and rng.random() < COMBINED:
            other = rng.choice(families[rng.choice(partners)])
            kind = f"{kind}+{other}" if family in ("partition", "delay") else f"{other}+{kind}"  # network first
        out.append((t, t + length, kind))
        t += length + rng.uniform(*gap_s)
    return out


class ProcessNemesis:
    """Kill/restart and pause/resume nodes of a ``jepsen_like.db.CellarDB``."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def targets(self, what: str, rng: random.Random) -> list[int]:
        n = self.db.n
        if what == "sequencer":
            s = self.db.sequencer()
            return [s if s is not None else rng.randrange(n)]
        if what == "minority":
            return sorted(rng.sample(range(n), (n - 1) // 2))
        if what == "one":
            return [rng.randrange(n)]
        if what == "all":
            return list(range(n))
        raise ValueError(what)

    def kill(self, nodes: list[int]) -> None:
        for i in nodes:
            self.db.kill(i)

    def restart(self, nodes: list[int]) -> None:
        for i in nodes:
            self.db.start(i)

    def pause(self, nodes: list[int]) -> None:
        for i in nodes:
            self.db.pause(i)

    def resume(self, nodes: list[int]) -> None:
        for i in nodes:
            self.db.resume(i)


def skew_bound() -> float:
    """The simulator's bound on a node's clock skew (2.4 %: any two rates within 5 %)."""
    from consensus.sim.search import SKEW_MAX

    return SKEW_MAX


def clock_skews(kind: str, n: int, rng: random.Random, sequencer: int | None, bound: float | None = None) -> dict[int, float]:
    """Each node's skew (the simulator's: it ticks every ``tick_ms * (1 + skew)``; positive
    is slow) for one clock fault, every one within ``bound`` (default ``SKEW_MAX``).

    - ``clock-mixed``: every node skewed, at least one fast and one slow, the sequencer
      too (its sign drawn);
    - ``clock-sequencer-slow``: the sequencer as slow as the bound allows, the others as
      fast (the pair the lease's drift bound is about);
    - ``clock-sequencer-fast``: the other way round."""
    b = skew_bound() if bound is None else bound
    seq = sequencer if sequencer is not None else rng.randrange(n)
    if kind == "clock-sequencer-slow":
        return {i: (b if i == seq else -b) for i in range(n)}
    if kind == "clock-sequencer-fast":
        return {i: (-b if i == seq else b) for i in range(n)}
    if kind != "clock-mixed":
        raise ValueError(f"unknown clock fault {kind!r}")
    skews = {i: round(rng.uniform(b / 4, b), 4) * rng.choice((-1, 1)) for i in range(n)}
    others = [i for i in range(n) if i != seq]
    fast, slow = rng.sample(others, 2)
    skews[fast], skews[slow] = -abs(skews[fast]), abs(skews[slow])
    return skews


def rate_of(skew: float) -> float:
    """The clock-control rate of a simulator skew."""
    return 1.0 / (1.0 + skew)


class ClockNemesis:
    """Sets nodes' tick rates through their clock-control files (``CellarDB(clock_control=True)``)."""

    def __init__(self, db: Any) -> None:
        if not getattr(db, "clock_control", False):
            raise NemesisError("the clock nemesis needs nodes started with --clock-control (CellarDB(clock_control=True))")
        self.db = db
        self.skews: dict[int, float] = {}

    def set(self, skews: dict[int, float]) -> None:
        from consensus.runtime.clock_control import write_rate

        for i, skew in sorted(skews.items()):
            write_rate(self.db.clock_path(i), rate_of(skew))
        self.skews = {i: s for i, s in skews.items() if s}

    def reset(self) -> None:
        from consensus.runtime.clock_control import write_rate

        for i in range(self.db.n):
            write_rate(self.db.clock_path(i), 1.0)
        self.skews = {}


class DiskNemesis:
    """Disk faults on nodes of a ``jepsen_like.db.CellarDB`` (``disk_tmpfs=True`` for disk-full)."""

    def __init__(self, db: Any, rng: random.Random) -> None:
        self.db, self.rng = db, rng
        self.flipped: dict[int, dict[str, Any]] = {}
        self.fillers: dict[int, str] = {}
        self.marks: dict[int, int] = {}  # node -> its log's size when the disk was filled

    def _wait(self, i: int, timeout_s: float = 30.0) -> tuple[str, int | None, str]:
        """("ready" | "exited" | "timeout", exit status, the log's last line) of node i
        after a start, bounded."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            proc = self.db.procs.get(i)
            if proc is not None and proc.poll() is not None:
                return "exited", proc.returncode, self.db.log_tail(i, 1)
            if os.path.exists(self.db._ready_file(i)):
                return "ready", None, self.db.log_tail(i, 1)
            time.sleep(0.02)
        return "timeout", None, self.db.log_tail(i, 1)

    def _log_size(self, i: int) -> int:
        try:
            return os.path.getsize(self.db.log_path(i))
        except OSError:
            return 0

    def _log_since(self, i: int, offset: int) -> str:
        try:
            with open(self.db.log_path(i), "rb") as f:
                f.seek(offset)
                return f.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""

    def apply(self, kind: str, node: int) -> dict[str, Any]:
        from . import disk

        d = self.db.data_dir(node)
        if kind == "disk-full":
            filler = os.path.join(d, "nemesis-filler")
            self.fillers[node] = filler
            self.marks[node] = self._log_size(node)
            return {"filled_bytes": disk.fill(filler)}
        self.db.kill(node)
        if kind == "disk-torn":
            return {"torn": disk.tear_tail(d, self.rng)}
        if kind == "disk-flip":
            info = disk.flip_byte(d, self.rng)
            if info is not None:
                self.flipped[node] = info
            return {"flipped": info}
        raise ValueError(f"unknown disk fault {kind!r}")

    def undo(self, kind: str, node: int) -> dict[str, Any]:
        """Bring the node back; what it did (``ok`` False: the node did not behave as the
        WAL's recovery rules say)."""
        if kind == "disk-full":
            alive = self.db.alive(node)
            code = None if alive else self.db.procs[node].returncode
            line = self.db.log_tail(node, 1)
            filler = self.fillers.pop(node, None)
            if filler is not None:
                try:
                    os.unlink(filler)
                except FileNotFoundError:
                    pass
            seen: dict[str, Any] = {"stopped": not alive, "exit_status": code,
                                    "line": None if alive else line[:600]}
            if not alive:
                # crash-only: exit status 1, one line, no traceback in the log
                clean = "Traceback" not in self._log_since(node, self.marks.pop(node, 0))
                self.db.start(node)
                state, _code, _line = self._wait(node)
                seen.update(restart=state, no_traceback=clean, ok=code == 1 and clean and state == "ready")
            else:  # no write needed space while the disk was full: nothing to see
                seen["ok"] = True
            return seen
        mark = self._log_size(node)
        self.db.start(node)
        state, code, line = self._wait(node)
        if kind == "disk-torn":
            text = self._log_since(node, mark)
            truncated = "torn tail" in text
            return {"restart": state, "truncated_torn_tail": truncated, "ok": state == "ready" and truncated}
        info = self.flipped.pop(node, None)
        if info is None:  # nothing durable to flip: a plain restart
            return {"restart": state, "ok": state == "ready"}
        seen = {"first_start": state, "exit_status": code, "line": line[:600],
                "refused": state == "exited" and code == 2 and "refusing to start" in line}
        if state == "exited":
            disk_unflip(info)
            self.db.start(node)
            seen["after_unflip"] = self._wait(node)[0]
        seen["ok"] = bool(seen["refused"]) and seen.get("after_unflip") == "ready"
        return seen

    def restore_all(self) -> None:
        """Heal: every filler removed, every flipped byte put back (nodes not restarted)."""
        for filler in self.fillers.values():
            try:
                os.unlink(filler)
            except FileNotFoundError:
                pass
        self.fillers.clear()
        for info in self.flipped.values():
            disk_unflip(info)
        self.flipped.clear()


def disk_unflip(info: dict[str, Any]) -> None:
    from .disk import unflip

    unflip(info)
