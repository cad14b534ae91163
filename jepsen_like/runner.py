"""One Jepsen-style test against real Cellar processes: db + client + generator +
nemesis + checkers, and what a person reads afterwards.

``run_test(spec)``: start ``spec.nodes`` ``cellar serve`` processes on their own
loopback addresses (``jepsen_like.db``); run the contended KV workload
(``jepsen_like.client``: many sessions, read / write / compare-and-set on a few keys,
through the HTTP API) for ``spec.seconds`` while the nemesis applies a seeded schedule
of faults (``jepsen_like.nemesis``: partitions, kills, pauses, clock skew; partitions
through iptables or the fault proxy, ``jepsen_like.proxy``); then heal everything,
wait until the replicas hold the same state, read every key on every node, and check:

- **linearizable**: the whole history, per key, against the KV model (the final reads
  included, so a lost acknowledged write shows);
- **converged**: every replica reports the same digest at the same executed slot;
- **final reads agree**: every node returns the same value for every key;
- **availability**: the longest time without a successful operation, in all and per
  fault, and the completion rate inside each fault window beside the quiet rate.

``RunSpec(target="etcd")`` runs the same workload, nemeses (kill, pause, partition
through the proxy) and checkers against etcd members (``jepsen_like.etcd_db``).

The verdict is ``valid`` (all hold), ``invalid`` (a check failed) or ``unknown`` (the
checker gave up, or the cluster never converged). Everything lands in
``runs/<name>/<timestamp>/`` (``runs/latest`` points at it): ``results.json``,
``history.jsonl``, ``timeline.html`` (the checker's report, nemesis events included),
``latency.png`` and ``rate.png`` with fault windows shaded, and each node's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .client import HttpKV, Recorder, check_history, final_reads, run_workload
from .db import CellarDB
from .faulty_proxy import BUGS as FAULTY_PROXY_BUGS
from .planted import MACHINE_BUGS
from .nemesis import (DELAY_MS, FLAP_S, FLAP_SHAPES, flap_pairs, ClockNemesis, DiskNemesis, IptablesNet, ProcessNemesis, clock_skews, iptables_available, partition_pairs,
                      rate_of, schedule)
from .disk import can_mount
from .plots import op_points, stalls
from .proxy import ProxyNet
from .scheduler_workload import HttpScheduler, check_scheduler, default_hived_config, final_state, run_scheduler_workload

__all__ = ["RunSpec", "run_test", "VALID", "INVALID", "UNKNOWN"]

VALID, INVALID, UNKNOWN = "valid", "invalid", "unknown"
NEMESES = ("partition", "kill", "pause", "clock", "disk", "delay")
WORKLOADS = ("kv", "register", "scheduler")
# Deliberately broken pieces (RunSpec.planted): clients, faulty proxies, broken machines.
PLANTED = ("", "stale-reads", "dropped-cas", "info-as-fail", *(f"proxy-{b}" for b in FAULTY_PROXY_BUGS),
           *(f"machine-{b}" for b in MACHINE_BUGS))


@dataclass
class RunSpec:
    workload: str = "kv"  # kv: CAS registers on several keys; register: one key; scheduler: affinity groups
    nemesis: list[str] = field(default_factory=lambda: [k for k in NEMESES if k != "delay"])
    nodes: int = 3
    seconds: float = 60.0
    sessions: int = 16
    keys: int = 5
    rate: float = 0.0  # a cap on operations per second over all sessions (0: closed loop)
    seed: int = 1
    out_root: str = "runs"
    name: str = ""
    snapshot_every: int = 2000
    # A deliberately broken client between the workload and the cluster, to show the
    # checkers catch it (tests of the harness): "", "stale-reads", "dropped-cas",
    # "info-as-fail" (jepsen_like.client's wrappers); or a faulty HTTP proxy in front of
    # every node's gateway: "proxy-ack-dropped-writes", "proxy-stale-replies",
    # "proxy-swap-replies" (jepsen_like.faulty_proxy); or a broken state machine in every
    # replica: "machine-" + one of jepsen_like.planted.MACHINE_BUGS.
    planted: str = ""
    # The scheduler workload's HiveD config (default: examples/hived-small.yaml).
    hived_config: str = ""
    # How partitions are made: "iptables" (DROP rules between the nodes' addresses, root),
    # "proxy" (jepsen_like.proxy: every peer link through a fault proxy in this process),
    # or "" (iptables when it can be used here, else the proxy).
    net: str = ""
    target: str = "cellar"  # or "etcd" (jepsen_like.etcd_db)
    proxy_mode: str = "hold"  # what a cut does in the proxy: hold, discard or reset
    base_ip: int = 20  # node i on 127.0.0.<base_ip + i> (jepsen_like.db.CellarDB)

    def net_kind(self) -> str:
        """"iptables" or "proxy": what makes this run's partitions."""
        if self.net:
            return self.net
        if self.target == "etcd" or "delay" in self.nemesis:  # etcd's members all dial from
            return "proxy"  # 127.0.0.1; slow links exist only in the proxy
        return "iptables" if iptables_available() is None else "proxy"

    def validate(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r} ({', '.join(WORKLOADS)})")
        if self.planted and self.planted not in PLANTED:
            raise ValueError(f"unknown planted bug {self.planted!r} ({', '.join(p for p in PLANTED if p)})")
        if self.planted and (self.workload == "scheduler") != self.planted.startswith("machine-scheduler-"):
            raise ValueError(f"planted bug {self.planted} does not go with the {self.workload} workload "
                             "(the scheduler workload takes machine-scheduler-* bugs, kv and register the others)")
        if self.planted and self.target != "cellar":
            raise ValueError("planted bugs are tried on the cellar target")
        bad = [k for k in self.nemesis if k not in NEMESES]
        if bad:
            raise ValueError(f"unknown nemesis {', '.join(bad)} (choose from {', '.join(NEMESES)})")
        if self.nodes < 3 or self.nodes % 2 == 0:
            raise ValueError(f"{self.nodes} nodes: 3, 5, 7, ...")
        if not 5 <= self.seconds <= 3600:
            raise ValueError("seconds must be within 5-3600")
        if self.net not in ("", "iptables", "proxy"):
            raise ValueError(f"unknown net {self.net!r} (iptables, proxy)")
        if self.proxy_mode not in ("hold", "discard", "reset"):
            raise ValueError(f"unknown proxy mode {self.proxy_mode!r} (hold, discard, reset)")
        if self.target not in ("cellar", "etcd"):
            raise ValueError(f"unknown target {self.target!r} (cellar, etcd)")
        if self.target == "etcd":
            from .etcd_db import etcd_missing

            if self.workload not in ("kv", "register"):
                raise ValueError(f"the etcd target runs the kv and register workloads, not {self.workload}")
            if set(self.nemesis) - {"partition", "kill", "pause", "delay"}:
                raise ValueError("the etcd target's nemeses are partition, kill, pause and delay")
            if self.net == "iptables":
                raise ValueError("etcd's members all dial from 127.0.0.1: iptables cannot tell them apart "
                                 "(partitions go through the proxy: --net proxy)")
            why = etcd_missing()
            if why:
                raise ValueError(f"the etcd target: {why}")
        if "delay" in self.nemesis and self.net_kind() != "proxy":
            raise ValueError("the delay nemesis slows links in the fault proxy: --net proxy")
        if "partition" in self.nemesis and self.net == "iptables":
            why = iptables_available()
            if why:
                raise ValueError(f"the partition nemesis with --net iptables: {why} (or --net proxy)")


async def _in_thread(fn: Callable, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def _statuses(db: CellarDB) -> list[dict | None]:
    """Each node's status (with its digest), None for one that does not answer."""
    from store.client import CellarClient

    async with CellarClient(db.client_addresses, timeout_s=2.0, deadline_s=5.0) as cellar:
        return [None if "error" in st else st for st in await cellar.statuses()]


async def _converge(db: CellarDB, timeout_s: float) -> tuple[bool, list]:
    """Wait (bounded) until every node answers with the same executed position and
    digest. Nodes that stay at one position with different digests (three polls in a
    row) have diverged: no wait changes that, so the answer is False at once."""
    deadline = time.monotonic() + timeout_s
    last: list = []
    parted = 0
    while time.monotonic() < deadline:
        last = await _statuses(db)
        if all(last):
            seen = {(s["exec_slot"], s["digest"]) for s in last}
            if len(seen) == 1:
                return True, last
            parted = parted + 1 if len({slot for slot, _d in seen}) == 1 else 0
            if parted >= 3:
                return False, last
        await asyncio.sleep(0.5)
    return False, last


class _Nemesis:
    """Applies the schedule and records what really happened, on the history's clock."""

    def __init__(self, db: CellarDB, net: IptablesNet | ProxyNet | None, rec: Recorder, rng: random.Random) -> None:
        self.db, self.net, self.rec, self.rng = db, net, rec, rng
        self.proc = ProcessNemesis(db)
        self.clock = ClockNemesis(db) if db.clock_control else None
        self.disk = DiskNemesis(db, rng)
        self._clock_start: tuple[float, dict[int, int]] | None = None
        self.faults: list[dict] = []
        self.killed: set[int] = set()
        self.paused: set[int] = set()
        self._flapper: asyncio.Task | None = None
        self._flaps: list[str] = []  # the cuts of the running flapping partition

    async def run(self, windows: list[tuple[float, float, str]], t0: float) -> None:
        for start, end, kind in windows:
            await asyncio.sleep(max(0.0, t0 + start - time.monotonic()))
            began = self.rec.now()
            parts = []  # (kind, detail, nodes) of each fault of a combined window, in order
            for part in kind.split("+"):
                detail, nodes = await self.apply(part)
                parts.append((part, detail, nodes))
            detail = " & ".join(d for _k, d, _n in parts)
            nodes = sorted({i for _k, _d, ns in parts for i in ns})
            self.rec.nemesis(f"start {kind}", detail)
            await asyncio.sleep(max(0.0, t0 + end - time.monotonic()))
            seen: dict[str, Any] = {}
            for part, _d, ns in reversed(parts):
                seen.update(await self.observe(part) or {})
                seen.update(await self.undo(part, ns) or {})
            ended = self.rec.nemesis(f"stop {kind}", detail)
            fault = {"kind": kind, "detail": detail, "nodes": nodes, "start": began, "end": ended}
            if seen:
                fault["observed"] = seen
            self.faults.append(fault)

    async def _flap(self, n: int) -> None:
        """A flapping partition (nemesis.flap_pairs): cut, heal, cut, ... until cancelled."""
        assert self.net is not None
        try:
            while True:
                pairs, detail = flap_pairs(n, self.rng)
                await self._net(self.net.drop, pairs)
                self._flaps.append(detail)
                await asyncio.sleep(self.rng.uniform(*FLAP_S))
                await self._net(self.net.heal)
                await asyncio.sleep(self.rng.uniform(*FLAP_S))
        finally:
            await self._net(self.net.heal)

    async def _stop_flapping(self) -> None:
        if self._flapper is not None:
            self._flapper.cancel()
            await asyncio.gather(self._flapper, return_exceptions=True)  # it heals as it ends
            self._flapper = None

    async def _ticks(self) -> tuple[float, dict[int, int]]:
        """(monotonic time, each answering node's tick count) from the nodes' status."""
        try:
            statuses = await _statuses(self.db)
        except Exception:  # evidence only: a run does not fail on it
            statuses = []
        t = time.monotonic()
        return t, {i: s["clock_control"]["ticks"] for i, s in enumerate(statuses) if s and "clock_control" in s}

    async def observe(self, kind: str) -> dict[str, Any] | None:
        """Evidence that the fault took effect, from the nodes themselves (clock faults):
        the rate each node reports ticking at, and the rate it really ticked at over the
        window (its ticks counted at the start and now, against the harness's clock; a
        paused or busy loop catches up later, so this is a measurement, not a check)."""
        if not kind.startswith("clock-"):
            return None
        try:
            statuses = await _statuses(self.db)
        except Exception as e:  # evidence only: a run does not fail on it
            return {"error": f"{type(e).__name__}: {e}"}
        seen: dict[str, Any] = {"rates": {str(i): (s or {}).get("clock_control", {}).get("rate")
                                          for i, s in enumerate(statuses)}}
        if self._clock_start is not None:
            t0, before = self._clock_start
            t1, after = await self._ticks()
            tick_s = 0.01  # NodeConfig.tick_ms, which CellarDB does not change
            seen["measured_rates"] = {str(i): round((after[i] - before[i]) * tick_s / (t1 - t0), 4)
                                      for i in sorted(set(before) & set(after)) if t1 > t0}
        return seen

    async def apply(self, kind: str) -> tuple[str, list[int]]:
        n = self.db.n
        if kind.startswith(("kill-", "pause-")):
            action, what = kind.split("-", 1)
            nodes = await _in_thread(self.proc.targets, what, self.rng)
            if action == "kill":
                await _in_thread(self.proc.kill, nodes)
                self.killed |= set(nodes)
            else:
                await _in_thread(self.proc.pause, nodes)
                self.paused |= set(nodes)
            return f"{action} {nodes}", nodes
        if kind.startswith("disk-"):
            seq = await _in_thread(self.db.sequencer)
            node = seq if seq is not None and self.rng.random() < 0.3 else self.rng.randrange(n)
            what = await _in_thread(self.disk.apply, kind, node)
            return f"{kind} on node {node}{' (sequencer)' if node == seq else ''}: {json.dumps(what, default=str)}", [node]
        if kind.startswith("clock-"):
            assert self.clock is not None
            seq = await _in_thread(self.db.sequencer)
            skews = clock_skews(kind, n, self.rng, seq)
            await _in_thread(self.clock.set, skews)
            await asyncio.sleep(0.1)  # the nodes look at their files every 50 ms
            self._clock_start = await self._ticks()
            rates = ", ".join(f"{i}:{rate_of(s):.4f}" for i, s in sorted(skews.items()))
            return f"{kind} (sequencer {seq}) rates {rates}", sorted(skews)
        if kind.startswith("delay-"):
            assert isinstance(self.net, ProxyNet)
            if kind == "delay-all":
                nodes = list(range(n))
            elif kind == "delay-sequencer":
                seq = await _in_thread(self.db.sequencer)
                nodes = [seq if seq is not None else self.rng.randrange(n)]
            else:
                nodes = [self.rng.randrange(n)]
            ms = round(self.rng.uniform(*DELAY_MS), 1)
            self.net.delay(_links(nodes, n), ms)
            return f"{kind}: links of {nodes} +{ms} ms each way", nodes
        if kind == "flapping":
            self._flaps = []
            self._flapper = asyncio.create_task(self._flap(n))
            return f"flapping partition, every {FLAP_S[0]}-{FLAP_S[1]} s a new cut of {', '.join(FLAP_SHAPES)}", \
                list(range(n))
        seq = await _in_thread(self.db.sequencer) if kind in ("isolate-sequencer", "one-way") else None
        pairs, detail = partition_pairs(kind, n, self.rng, sequencer=seq)
        assert self.net is not None
        await self._net(self.net.drop, pairs)
        return detail, sorted({a for a, _ in pairs} | {b for _, b in pairs})

    async def undo(self, kind: str, nodes: list[int]) -> dict[str, Any] | None:
        if kind == "flapping" and self._flapper is not None:
            await self._stop_flapping()
            return {"flaps": len(self._flaps), "cuts": self._flaps[:20]}
        if kind.startswith("disk-"):
            return await _in_thread(self.disk.undo, kind, nodes[0])
        if kind.startswith("kill-"):
            await _in_thread(self.proc.restart, nodes)
            self.killed -= set(nodes)
        elif kind.startswith("pause-"):
            await _in_thread(self.proc.resume, nodes)
            self.paused -= set(nodes)
        elif kind.startswith("clock-"):
            assert self.clock is not None
            await _in_thread(self.clock.reset)
        elif kind.startswith("delay-"):
            assert isinstance(self.net, ProxyNet)
            self.net.delay(_links(nodes, self.db.n), 0.0)
        elif self.net is not None:
            await self._net(self.net.heal)
        return None

    async def _net(self, call: Callable, *args: Any) -> None:
        """The proxy's gates live on this loop; iptables runs commands (in a thread)."""
        if getattr(self.net, "in_loop", False):
            call(*args)
        else:
            await _in_thread(call, *args)

    async def heal_all(self) -> None:
        await self._stop_flapping()
        if self.net is not None:
            await self._net(self.net.heal)
        if isinstance(self.net, ProxyNet):
            self.net.delay(_links(list(range(self.db.n)), self.db.n), 0.0)
        if self.clock is not None:
            await _in_thread(self.clock.reset)
        await _in_thread(self.disk.restore_all)
        await _in_thread(self.proc.resume, sorted(self.paused))
        await _in_thread(self.proc.restart, [i for i in range(self.db.n) if not self.db.alive(i)])
        self.killed.clear()
        self.paused.clear()


def _links(nodes: list[int], n: int) -> set[tuple[int, int]]:
    """Every directed link to or from ``nodes``."""
    return {(a, b) for a in range(n) for b in range(n) if a != b and (a in nodes or b in nodes)}


def _planted(name: str, client: Any) -> Any:
    if not name or name.startswith(("proxy-", "machine-")):  # on the wire or in the replicas instead
        return client
    from .client import DroppedCas, InfoAsFail, StaleReads

    return {"stale-reads": StaleReads, "dropped-cas": DroppedCas, "info-as-fail": InfoAsFail}[name](client)


async def _faulty_proxies(stack: contextlib.AsyncExitStack, urls: list[str], bug: str) -> list[str]:
    """A faulty HTTP proxy in front of each URL (a planted bug); the proxies' URLs."""
    from urllib.parse import urlsplit

    from .faulty_proxy import FaultyHttpProxy

    out = []
    for url in urls:
        u = urlsplit(url)
        proxy = FaultyHttpProxy((u.hostname or "127.0.0.1", u.port or 80), bug)
        host, port = await proxy.start()
        stack.push_async_callback(proxy.close)
        out.append(f"http://{host}:{port}")
    return out


def _availability(ops: list, faults: list[dict], seconds: float) -> dict[str, Any]:
    pts = op_points(ops)
    ok_times = [t + lat / 1000.0 for t, lat, _f, typ in pts if typ == "ok"]

    def rate(a: float, b: float) -> float:
        return round(sum(1 for t in ok_times if a <= t <= b) / max(b - a, 1e-9), 1)

    inside = []
    for f in faults:
        inside.append({"kind": f["kind"], "detail": f["detail"], "start": round(f["start"], 2),
                       "end": round(f["end"], 2), "ok_per_s": rate(f["start"], f["end"]),
                       "longest_stall_s": round(stalls(ops, f["start"], f["end"]), 3)})
    busy = [(f["start"], f["end"]) for f in faults]
    quiet = [t for t in ok_times if not any(a <= t <= b for a, b in busy)]
    quiet_s = max(seconds - sum(b - a for a, b in busy), 1e-9)
    return {"longest_stall_s": round(stalls(ops, 0.5, seconds), 3), "quiet_ok_per_s": round(len(quiet) / quiet_s, 1),
            "faults": inside}


async def run_test(spec: RunSpec, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    spec.validate()
    say = progress or (lambda _m: None)
    name = spec.name or (f"{'etcd-' if spec.target == 'etcd' else ''}{spec.workload}-{'+'.join(spec.nemesis) or 'none'}"
                         f"-n{spec.nodes}{f'-planted-{spec.planted}' if spec.planted else ''}")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-s{spec.seed}"
    out = Path(spec.out_root) / name / stamp
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(spec.seed)
    keys = 1 if spec.workload == "register" else spec.keys
    disk_full = "disk" in spec.nemesis and can_mount() is None
    sched = spec.workload == "scheduler"
    machine_args = ["--hived-config", spec.hived_config or default_hived_config()] if sched else []
    etcd = spec.target == "etcd"
    db: Any
    if etcd:
        from .etcd_db import EtcdDB

        db = EtcdDB(str(out / "db"), spec.nodes)
    else:
        db = CellarDB(str(out / "db"), spec.nodes, snapshot_every=spec.snapshot_every,
                      clock_control="clock" in spec.nemesis, disk_tmpfs="256m" if disk_full else None,
                      machine="scheduler" if sched else "kv", extra_args=machine_args, base_ip=spec.base_ip,
                      planted=spec.planted.removeprefix("machine-") if spec.planted.startswith("machine-") else "")
    net: IptablesNet | ProxyNet | None = None
    net_kind = spec.net_kind() if {"partition", "delay"} & set(spec.nemesis) else ""
    result: dict[str, Any] = {"spec": asdict(spec), "name": name, "dir": str(out)}
    rec = Recorder()
    nem: _Nemesis | None = None
    try:
        if net_kind == "proxy":
            net = await _proxied(db, spec)
        db.start_all()
        await db.await_ready(timeout_s=60.0)
        if net_kind == "iptables":
            net = IptablesNet(db.ips)
        windows = schedule(spec.nemesis, spec.seconds, rng, disk_full=disk_full, nodes=spec.nodes) if spec.nemesis else []
        say(f"{spec.nodes} nodes on {', '.join(db.ips)}{f'; partitions through {net_kind}' if net_kind else ''}; {len(windows)} faults over {spec.seconds:.0f} s; output {out}")
        async with contextlib.AsyncExitStack() as stack:
            urls = db.urls
            if spec.planted.startswith("proxy-"):
                urls = await _faulty_proxies(stack, db.urls, spec.planted.removeprefix("proxy-"))
            if etcd:
                from .etcd_db import EtcdKV

                http = await stack.enter_async_context(EtcdKV(urls, timeout_s=2.0))
            else:
                http = await stack.enter_async_context(HttpKV(urls, timeout_s=2.0))
            async with asyncio.timeout(60.0):  # every replica's HTTP API answers ready
                while not all(b and b.get("ready") for b in await http.readyz()):
                    await asyncio.sleep(0.2)
            client = _planted(spec.planted, http)
            scheduler = await stack.enter_async_context(HttpScheduler(db.urls, timeout_s=3.0)) if sched else None
            nem = _Nemesis(db, net, rec, rng)
            t0 = rec.t0 = time.monotonic()  # the history's clock starts with the workload
            pause_s = 2.0 * spec.sessions / spec.rate if spec.rate > 0 else 0.0
            if scheduler is not None:
                workload = asyncio.create_task(run_scheduler_workload(scheduler, rec, sessions=spec.sessions,
                                                                      seconds=spec.seconds, seed=spec.seed,
                                                                      pause_s=pause_s))
            else:
                workload = asyncio.create_task(run_workload(client, rec, sessions=spec.sessions, keys=keys,
                                                            seconds=spec.seconds, seed=spec.seed, pause_s=pause_s))
            nemesis = asyncio.create_task(nem.run(windows, t0))

            async def ticker() -> None:
                while not workload.done():
                    await asyncio.sleep(5.0)
                    done = sum(1 for o in rec.ops if o.type != "invoke" and o.process != "nemesis")
                    say(f"  {time.monotonic() - t0:5.0f} s  {done:,} ops completed")

            tick = asyncio.create_task(ticker())
            stats = await workload
            await asyncio.wait_for(nemesis, 60.0)
            tick.cancel()
            await nem.heal_all()
            rec.nemesis("heal", "everything")
            say("healed; waiting for the replicas to converge")
            await db.await_ready(timeout_s=60.0)
            if etcd:
                from .etcd_db import converge

                converged, statuses = await converge(db, 90.0)
            else:
                converged, statuses = await _converge(db, 90.0)
            if scheduler is not None:
                final = await final_state(scheduler)
            else:
                reads = await final_reads(client, rec, keys, process=10_000_000)
        result["workload"] = {"summary": stats.summary(), "invalid_requests": stats.invalid[:20],
                              "counts": {f"{f} {t}": c for (f, t), c in sorted(stats.counts.items())}}
        digests = [None if s is None else {"exec_slot": s["exec_slot"], "digest": s["digest"]} for s in statuses]
        if scheduler is not None:
            sc = check_scheduler(rec.ops, final, spec.nodes)
            # the scheduler's history is checked by its own rules (scheduler_workload's
            # docstring), not the KV model; "linearizable" stands for all of them
            result["checks"] = {"linearizable": sc["valid"], "scheduler": sc, "converged": converged,
                                "digests": digests, "final_reads_agree": sc["final_states_agree"],
                                "final_groups": {str(n): g for n, g in final["groups"].items()}}
            check_valid, agree = sc["valid"], sc["final_states_agree"]
        else:
            check = check_history(rec.ops, timeout_s=max(60.0, spec.seconds))
            agree = all(len({json.dumps(v) for v in per_node.values()}) == 1 and len(per_node) == spec.nodes
                        for per_node in reads.values()) and len(reads) == keys
            result["checks"] = {
                "linearizable": check.valid,
                "linearizability": {"ops": check.ops, "keys": check.partitions, "seconds": round(check.seconds, 2),
                                    "violation": None if check.violation is None else str(check.violation.reason)},
                "converged": converged,
                "digests": digests,
                "final_reads_agree": agree,
                "final_reads": reads,
            }
            check_valid = check.valid
        result["faults"] = nem.faults
        disk_faults = [f for f in nem.faults if f["kind"].startswith("disk-")]
        disk_ok = all(f.get("observed", {}).get("ok") for f in disk_faults)
        if disk_faults:
            # every node behaved as the WAL's recovery rules say: a torn tail truncated,
            # a flipped durable byte refused (one line), a full disk stopped the node
            result["checks"]["disk_faults_handled"] = disk_ok
        result["availability"] = _availability(rec.ops, nem.faults, spec.seconds)
        if check_valid is False or (converged and not agree) or not disk_ok:
            verdict = INVALID
        elif check_valid is None or not converged:
            verdict = UNKNOWN
        else:
            verdict = VALID
        result["verdict"] = verdict
    finally:
        if net is not None:
            net.close()
        if isinstance(net, ProxyNet):  # the run's figures, before the nodes stop and redial
            result["net"] = {"kind": "proxy", **net.stats()}
            # the proxies serve this loop: keep it running (etcd's members talk as they stop)
            await _in_thread(db.teardown)
            await net.aclose()
        else:
            db.teardown()
            if net is not None:
                result["net"] = {"kind": "iptables"}
        _write_outputs(out, rec, result, db)
    return result


async def _proxied(db: Any, spec: RunSpec) -> ProxyNet:
    """Cellar: a fault proxy for every directed pair of nodes; node i dials peer j through
    (i, j). etcd: one in front of each member's peer port, its advertised peer URL, which
    tells its callers apart by who owns the socket."""
    net = ProxyNet(db.n, mode=spec.proxy_mode, seed=spec.seed)
    if spec.target == "etcd":
        from .proxy import loopback_owner

        for j in range(db.n):
            addr: list[tuple[str, int]] = []
            addr.append(await net.node(j, ("127.0.0.1", db.peer_ports[j]),
                                       lambda peer, a=addr: loopback_owner(peer, a[0], db.pids())))
            db.advertise[j] = addr[0]
        return net
    dial: dict[int, dict[int, tuple[str, int]]] = {}
    for i in range(db.n):
        dial[i] = {i: (db.hosts[i], db.peer_ports[i])}
        for j in range(db.n):
            if j != i:
                dial[i][j] = await net.pair(i, j, (db.hosts[j], db.peer_ports[j]))
    db.dial = dial
    return net


def _write_outputs(out: Path, rec: Recorder, result: dict[str, Any], db: CellarDB) -> None:
    from .history import write_jsonl

    with open(out / "history.jsonl", "w") as fp:
        write_jsonl(rec.ops, fp)
    for i in range(db.n):
        try:
            shutil.copy(db.log_path(i), out / f"node{i}.log")
        except OSError:
            pass
    try:
        from .models import KV
        from .report import write_report

        client_ops = [o for o in rec.ops if o.process != "nemesis"]
        if result.get("spec", {}).get("workload") == "scheduler":  # the timeline draws KV histories
            result["timeline"] = "none for the scheduler workload: its history is in history.jsonl"
        else:
            write_report(out / "timeline.html", client_ops, KV(), None,
                         title=f"{result.get('name')} ({result.get('verdict')})")
    except Exception as e:  # a report is a convenience: the verdict stands without it
        result["report_error"] = f"{type(e).__name__}: {e}"
    try:
        from .plots import write_plots

        write_plots(out, rec.ops, result.get("faults", []), title=str(result.get("name", "")))
    except ImportError:
        result["plots"] = "matplotlib is not installed: no plots (python3 -m pip install -e '.[bench]')"
    if result.get("verdict") == VALID:  # the nodes' data dirs matter only to a failure's post-mortem
        shutil.rmtree(out / "db", ignore_errors=True)
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    latest = out.parent.parent / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(os.path.relpath(out, latest.parent))
    except OSError:
        pass
