"""``cellar demo --machine scheduler``: HiveD's scheduler on 3 replicas, under a job
stream, with the sequencer SIGKILLed and restarted.

1. Start ``--replicas`` ``cellar serve --machine scheduler`` processes on 127.0.0.1
   (fsync=batch, ``--http``), with ``examples/hived-demo.yaml`` (128 V100 GPUs, 3 VCs;
   ``--hived-config`` for another).
2. Closed-loop workers send a seeded stream of jobs through the HTTP API, spread over
   the replicas (``store.scheduler_client``: the next replica on a refused connection
   or a 503): gangs of 1-4 pods x 1-8 GPUs in every VC at priorities 10/50/100 (intra-VC
   preemption) and -1 (opportunistic, preempted by any guaranteed job), some waiting in
   the queue, and releases. A node is marked bad (``health off``) at 40% and healthy
   again at 80%.
3. A third of the way in, the sequencer is SIGKILLed; it restarts a few seconds later
   and recovers from its WAL.
4. Then: wait until every replica executed the same log; check

   - **digests**: every replica's scheduler state is identical;
   - **invariants**: ``scheduler_state.invariants`` passes on every replica (``GET
     /v1/status?invariants=1``);
   - **the log's events agree**: every replica's change feed (``GET /v1/events``)
     holds the same events at the same positions where their kept histories overlap;
   - **acknowledged allocations**: every 201 (placed) has its ``placed`` event with
     the same placement, and every acknowledged release its ``released``/``cancelled``
     event: none is lost; no group is placed twice without leaving in between (none is
     doubled); and the groups each replica holds at the end are exactly those the
     events leave placed.

Exit status 0 only if all of it holds. ``--json`` prints the figures and verdicts as
one JSON object (and no progress).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from store.scheduler_client import Indefinite, SchedulerHTTP, Unreachable, short_error
from store.server import LocalCluster

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hived-demo.yaml"
VCS = (("vc-prod", 0.4), ("vc-research", 0.3), ("vc-dev", 0.2))
OPPORTUNISTIC_SHARE = 0.1
PRIORITIES = (10, 50, 100)
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 2), (4, 8))  # (pods, GPUs per pod)
LIVE_TARGET = 40  # releases grow more likely as the number of live jobs passes this
RETRY_S = 0.2
OP_DEADLINE_S = 30.0  # one operation retries (no replica can answer) at most this long


class Workload:
    """The seeded job stream and everything the clients were told (the history)."""

    def __init__(self, seed: int, nodes: list[str]) -> None:
        self.rng = random.Random(seed)
        self.nodes = nodes
        self.next_id = 0
        self.live: dict[str, str] = {}  # group -> "placed" | "queued" | "unknown" (as the client last heard)
        self.acked_placed: dict[str, dict[str, list[int]]] = {}  # group -> {node: leaves} from a 201
        self.acked_released: set[str] = set()
        self.counts: Counter = Counter()
        self.latencies_ms: list[float] = []

    def next_op(self) -> tuple[str, Any]:
        rng = self.rng
        p_release = min(0.8, 0.25 + 0.5 * len(self.live) / LIVE_TARGET)
        if self.live and rng.random() < p_release:
            return "release", rng.choice(sorted(self.live))
        self.next_id += 1
        name = f"job-{self.next_id:05d}"
        if rng.random() < OPPORTUNISTIC_SHARE:
            vc, prio = rng.choice([v for v, _ in VCS]), -1
        else:
            vc = rng.choices([v for v, _ in VCS], [w for _, w in VCS])[0]
            prio = rng.choice(PRIORITIES)
        pods, gpus = rng.choice(SHAPES)
        spec = {"virtualCluster": vc, "priority": prio, "leafCellType": "V100",
                "affinityGroup": {"name": name, "members": [{"podNumber": pods, "leafCellNumber": gpus}]}}
        return "allocate", spec


async def _write(http: SchedulerHTTP, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """Retry (bounded) while no replica can answer; ``(0, reason)`` when the outcome is
    unknown (a write sent and not answered, or no answer within the deadline)."""
    deadline = time.monotonic() + OP_DEADLINE_S
    while True:
        try:
            status, answer, _ = await http.request(method, path, body)
            return status, answer
        except Indefinite as e:
            return 0, str(e)
        except Unreachable as e:
            if time.monotonic() > deadline:
                return 0, str(e)
            await asyncio.sleep(RETRY_S)


async def worker(w: Workload, http: SchedulerHTTP, stop: asyncio.Event) -> None:
    while not stop.is_set():
        kind, arg = w.next_op()
        t0 = time.monotonic()
        if kind == "allocate":
            name = arg["affinityGroup"]["name"]
            status, answer = await _write(http, "POST", "/v1/groups", arg)
            if status == 201:
                w.live[name] = "placed"
                w.acked_placed[name] = {p["node"]: sorted(p["leaf_cells"]) for p in answer["placement"]}
                w.counts["placed"] += 1
                w.counts["preemptions"] += len(answer.get("preempted") or ())
            elif status == 202:
                w.live[name] = "queued"
                w.counts["queued"] += 1
            elif status == 409 and isinstance(answer, dict) and "already" in str(answer.get("message")):
                w.live[name] = "unknown"  # a retry after an unanswered attempt that did commit
                w.counts["retried"] += 1
            elif status == 0:
                w.live[name] = "unknown"
                w.counts["unknown"] += 1
            else:
                w.counts["refused"] += 1
        else:
            status, answer = await _write(http, "DELETE", "/v1/groups/" + quote(arg, safe=""))
            if status == 200:
                w.acked_released.add(arg)
                w.counts["released"] += 1
                w.live.pop(arg, None)
            elif status == 404:  # already gone: preempted
                w.counts["gone"] += 1
                w.live.pop(arg, None)
            elif status == 0:
                w.counts["unknown"] += 1
            else:
                w.counts["refused"] += 1
        w.counts["ops"] += 1
        w.latencies_ms.append((time.monotonic() - t0) * 1000)


def check_history(histories: dict[int, dict], finals: dict[int, set[str]], w: Workload) -> list[str]:
    """The acknowledged-allocation checks of the module docstring; [] if all hold."""
    problems: list[str] = []
    full = [i for i, h in sorted(histories.items()) if h.get("from") == 1]
    if not full:
        return ["no replica kept the whole event history (from position 1)"]
    # every replica's events agree where their histories overlap
    ref = histories[full[0]]["events"]
    by_pos: dict[int, list] = {}
    for e in ref:
        by_pos.setdefault(e["position"], []).append(e)
    for i, h in sorted(histories.items()):
        start = h.get("from")
        if start is None:
            continue
        mine: dict[int, list] = {}
        for e in h["events"]:
            mine.setdefault(e["position"], []).append(e)
        for pos in sorted(set(by_pos) | set(mine)):
            if pos >= start and by_pos.get(pos) != mine.get(pos):
                problems.append(f"replica {i}: events at position {pos} differ from replica {full[0]}'s")
                break
    # fold the reference history: which groups are placed at the end
    placed: dict[str, dict[str, list[int]] | None] = {}
    placed_events: Counter = Counter()
    left: set[str] = set()
    for e in ref:
        g, t = e.get("group"), e["type"]
        if t == "placed":
            placed_events[g] += 1
            if g in placed:
                problems.append(f"group {g} placed twice without leaving (doubled)")
            pl = e.get("placement")
            placed[g] = {p["node"]: sorted(p["leaf_cells"]) for p in pl} if pl else None
        elif t in ("preempted", "released", "expired") and not e.get("partial"):
            if g not in placed:
                problems.append(f"group {g} {t} while not placed")
            placed.pop(g, None)
            left.add(g)
        elif t == "cancelled":
            left.add(g)
    for g, nodes in sorted(w.acked_placed.items()):
        if placed_events[g] == 0:
            problems.append(f"acknowledged allocation {g} has no placed event (lost)")
        elif placed_events[g] > 1:
            problems.append(f"acknowledged allocation {g} placed {placed_events[g]} times (doubled)")
        first = next((e for e in ref if e["type"] == "placed" and e.get("group") == g), None)
        if first is not None and first.get("placement") is not None:
            got = {p["node"]: sorted(p["leaf_cells"]) for p in first["placement"]}
            if got != nodes:
                problems.append(f"acknowledged allocation {g}: placement {nodes} acknowledged, {got} committed")
    for g in sorted(w.acked_released):
        if g not in left:
            problems.append(f"acknowledged release of {g} has no released/cancelled event (lost)")
    expected = set(placed)
    for i, final in sorted(finals.items()):
        if final != expected:
            extra, missing = sorted(final - expected)[:3], sorted(expected - final)[:3]
            problems.append(f"replica {i}: holds {len(final)} groups, the events leave {len(expected)} placed "
                            f"(extra {extra}, missing {missing})")
    return problems[:20]


class HistoryCollector:
    """Every replica's change-feed history (``GET /v1/events``), read while the demo
    runs (``poll`` every half second) and once more at the end, so the check never
    depends on how many events a replica keeps (``FEED_HISTORY_MAX``): a faster run
    only means more pages. Per replica: ``from``, the first position it has all events
    of, and the events since; a replica whose kept history no longer reaches the next
    position it owes (restarted from its WAL or a snapshot) starts over from what it
    keeps, as a history that does not begin at position 1."""

    def __init__(self, replicas: int) -> None:
        self.state: dict[int, dict[str, Any]] = {i: {"from": None, "events": [], "after": 0}
                                                 for i in range(replicas)}

    async def poll(self, http: SchedulerHTTP, strict: bool = False) -> None:
        for i, ep in enumerate(http.endpoints):  # its endpoints, as it spells them (http://...)
            try:
                await self._poll_one(http, i, ep)
            except Exception:  # noqa: BLE001 - a replica down (the killed sequencer): later
                if strict:
                    raise

    async def _poll_one(self, http: SchedulerHTTP, i: int, ep: str) -> None:
        st = self.state[i]
        for _ in range(1000):  # bounded: 1000 pages of 10,000 events
            status, body = await http.one(ep, "GET", f"/v1/events?after={st['after']}&limit=10000")
            if status != 200:
                raise RuntimeError(f"{ep}/v1/events: HTTP {status}")
            start = body["from"]
            if start is None:
                return  # a snapshot replaced its state: nothing kept yet
            if st["from"] is None or start > st["after"] + 1:
                # first read, or a gap: start over from what it keeps (this page's
                # events are those from ``start`` on)
                st["from"], st["events"] = start, []
            if not body["events"]:
                return
            st["events"].extend(body["events"])
            st["after"] = body["events"][-1]["position"]
            if len(body["events"]) < 10000:
                return

    def histories(self) -> dict[int, dict]:
        return {i: {"from": st["from"], "events": st["events"]} for i, st in self.state.items()}


async def run_scheduler_demo(replicas: int, seconds: float, workers: int, seed: int, hived_config: str,
                             keep: bool, as_json: bool, echo: Callable[[str], None]) -> int:
    from scheduler_state.config import load_config

    say = (lambda s: None) if as_json else echo
    config = load_config(Path(hived_config))
    nodes = sorted(config.node_names())
    root = tempfile.mkdtemp(prefix="cellar-demo-scheduler-")
    cluster = LocalCluster(root, replicas, fsync="batch", cluster_id="demo-scheduler", http=True,
                           extra_args=["--machine", "scheduler", "--hived-config", str(hived_config)])
    endpoints = [f"127.0.0.1:{p}" for p in cluster.http_ports]
    say(f"Starting {replicas} scheduler replicas (sdpaxos, fsync=batch) with {hived_config}: "
        f"{len(nodes)} nodes; data and logs in {root}")
    cluster.start_all()
    report: dict[str, Any] = {"replicas": replicas, "seconds": seconds, "workers": workers, "seed": seed,
                              "hived_config": str(hived_config)}
    try:
        await cluster.await_ready()
        async with SchedulerHTTP(endpoints, timeout_s=5.0) as probe:
            deadline = time.monotonic() + 30
            while True:  # every replica checked its config against the cluster's
                ready = 0
                for ep in probe.endpoints:
                    try:
                        code, _ = await probe.one(ep, "GET", "/readyz")
                        ready += code == 200
                    except Exception:
                        pass
                if ready == replicas:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replicas not ready within 30 s: {cluster.log_tail(0)}")
                await asyncio.sleep(0.1)
            seq = await sequencer(probe)
        for i in range(replicas):
            say(f"  node {i}: pid {cluster.procs[i].pid}, HTTP {endpoints[i]}"
                + ("  (sequencer)" if i == seq else ""))
        w = Workload(seed, nodes)
        bad_node = random.Random(seed + 1).choice(nodes)
        stop = asyncio.Event()
        events: dict[str, float] = {}
        t0 = time.monotonic()
        clients = [SchedulerHTTP(endpoints[k % replicas:] + endpoints[:k % replicas], timeout_s=5.0)
                   for k in range(workers)]
        for c in clients:
            await c.__aenter__()
        admin = clients[0]

        async def chaos() -> None:
            kill_at, restart_after = seconds / 3, min(3.0, seconds / 5)
            await asyncio.sleep(kill_at)
            events["kill"] = time.monotonic()
            cluster.kill(seq, signal.SIGKILL)
            say(f"\n  !! SIGKILL node {seq} (the sequencer) at t={time.monotonic() - t0:.1f}s")
            await asyncio.sleep(restart_after)
            cluster.start(seq)
            await cluster.await_ready(seq)
            events["restart"] = time.monotonic()
            say(f"\n  .. node {seq} restarted at t={time.monotonic() - t0:.1f}s (recovering from its WAL)")

        async def bad_node_schedule() -> None:
            await asyncio.sleep(seconds * 0.4)
            status, _ = await _write(admin, "PUT", f"/v1/nodes/{bad_node}/health", {"healthy": False})
            say(f"\n  !! node {bad_node} marked bad at t={time.monotonic() - t0:.1f}s (HTTP {status})")
            await asyncio.sleep(seconds * 0.4)
            status, _ = await _write(admin, "PUT", f"/v1/nodes/{bad_node}/health", {"healthy": True})
            say(f"\n  .. node {bad_node} healthy again at t={time.monotonic() - t0:.1f}s (HTTP {status})")

        tty = sys.stdout.isatty()

        async def progress() -> None:
            last_ops, last_t = 0, time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.5 if tty else 1.0)
                now = time.monotonic()
                c = w.counts
                rate = (c["ops"] - last_ops) / max(1e-6, now - last_t)
                last_ops, last_t = c["ops"], now
                line = (f"  t={now - t0:5.1f}s  ops {c['ops']:>6}  {rate:>5.0f}/s  placed {c['placed']:>5}  "
                        f"queued {c['queued']:>4}  preempted {c['preemptions']:>4}  released {c['released']:>5}  "
                        f"live {len(w.live):>3}  unknown {c['unknown']}")
                if not as_json:
                    sys.stdout.write(f"\r{line}   " if tty else f"{line}\n")
                    sys.stdout.flush()

        collector = HistoryCollector(replicas)
        collect_http = SchedulerHTTP(endpoints, timeout_s=10.0)
        await collect_http.__aenter__()

        async def collect() -> None:
            while not stop.is_set():
                await collector.poll(collect_http)
                await asyncio.sleep(0.5)

        tasks = [asyncio.create_task(chaos()), asyncio.create_task(bad_node_schedule()),
                 asyncio.create_task(progress()), asyncio.create_task(collect())]
        work = [asyncio.create_task(worker(w, c, stop)) for c in clients]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*work)
        elapsed = time.monotonic() - t0
        await asyncio.gather(*tasks)
        for c in clients:
            await c.close()
        say("")
        # converge, then check every replica
        async with SchedulerHTTP(endpoints, timeout_s=10.0) as probe:
            statuses = await converge(probe, replicas, 60)
            await collector.poll(probe, strict=True)
            await collect_http.close()
            histories = collector.histories()
            finals: dict[int, set[str]] = {}
            for i, ep in enumerate(probe.endpoints):
                code, body = await probe.one(ep, "GET", "/v1/inspect/affinitygroups/?consistency=serializable")
                finals[i] = {g["metadata"]["name"] for g in body.get("items", [])
                             if g["status"]["state"] == "Allocated"} if code == 200 else set()
            new_seq = await sequencer(probe)
        digests = [s.get("digest") for s in statuses]
        same = len(set(digests)) == 1 and None not in digests
        invariants_ok = all(s.get("invariants") == [] for s in statuses)
        problems = check_history(histories, finals, w)
        lat = sorted(w.latencies_ms) or [0.0]
        c = w.counts
        ev = Counter(e["type"] for e in histories[max(histories, key=lambda i: len(histories[i]["events"]))]["events"])
        report.update({
            "ops": c["ops"], "ops_per_s": round(c["ops"] / elapsed, 1),
            "latency_ms": {"p50": round(lat[len(lat) // 2], 1), "p99": round(lat[int(len(lat) * 0.99)], 1),
                           "max": round(lat[-1], 1)},
            "client": dict(sorted(c.items())), "events": dict(sorted(ev.items())),
            "sequencer": {"killed": seq, "now": new_seq}, "bad_node": bad_node,
            "replicas_state": [{k: s.get(k) for k in ("node", "exec_slot", "applied", "digest", "groups", "pending",
                                                      "leaf_cells_used", "invariants", "error")} for s in statuses],
            "digests_match": same, "invariants_hold": invariants_ok,
            "acked_allocations": len(w.acked_placed), "acked_releases": len(w.acked_released),
            "problems": problems,
        })
        ok = same and invariants_ok and not problems
        report["ok"] = ok
        if as_json:
            echo(json.dumps(report, indent=2, sort_keys=True))
            return 0 if ok else 1
        echo(f"jobs         {c['ops']:,} operations in {elapsed:.1f} s ({report['ops_per_s']:,.0f}/s): "
             f"{c['placed']:,} placed, {c['queued']} queued, {c['released']:,} released, {c['gone']} already gone, "
             f"{c['unknown']} unanswered, {c['refused']} refused")
        echo(f"latency      p50 {report['latency_ms']['p50']} ms   p99 {report['latency_ms']['p99']} ms   "
             f"max {report['latency_ms']['max']:.0f} ms")
        echo("committed    " + ", ".join(f"{k} {v}" for k, v in sorted(ev.items())))
        echo(f"failover     node {seq} (sequencer) killed and restarted; sequencer now node {new_seq}; "
             f"node {bad_node} was bad for a while")
        for s in statuses:
            inv = s.get("invariants")
            echo(f"  node {s.get('node')}: executed slot {s.get('exec_slot')}  digest {s.get('digest')}  "
                 f"groups {s.get('groups')}  GPUs used {s.get('leaf_cells_used')}  invariants "
                 + ("hold" if inv == [] else f"BROKEN: {inv}" if inv else f"unknown ({s.get('error')})"))
        echo(f"replicas     {'identical state (digests match)' if same else 'DIGESTS DIFFER'}; invariants "
             f"{'hold on every replica' if invariants_ok else 'BROKEN'}")
        echo(f"acked        {len(w.acked_placed):,} allocations and {len(w.acked_released):,} releases checked "
             f"against every replica's log: " + ("none lost or doubled" if not problems else
                                                  f"{len(problems)} PROBLEMS"))
        for p in problems:
            echo(f"  - {p}")
        return 0 if ok else 1
    except Exception as e:
        msg = f"demo failed: {short_error(e)}"
        if as_json:
            report.update(ok=False, error=msg)
            echo(json.dumps(report, indent=2, sort_keys=True))
        else:
            echo(f"\n{msg}")
        return 1
    finally:
        cluster.stop_all()
        if keep:
            say(f"data and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


async def sequencer(http: SchedulerHTTP) -> int | None:
    """The sequencer the replicas agree on (bounded wait)."""
    deadline = time.monotonic() + 20
    while True:
        seen = []
        for ep in http.endpoints:
            try:
                code, body = await http.one(ep, "GET", "/v1/status")
                if code == 200:
                    seen.append(body.get("sequencer"))
            except Exception:
                pass
        if seen and len(set(seen)) == 1 and seen[0] is not None:
            return seen[0]
        if time.monotonic() > deadline:
            return seen[0] if seen else None
        await asyncio.sleep(0.1)


async def converge(http: SchedulerHTTP, replicas: int, timeout_s: float) -> list[dict]:
    """Every replica's /v1/status (with invariants) once all report the same executed
    slot and digest, or the last statuses seen when the wait ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = []
        for i, ep in enumerate(http.endpoints):
            try:
                code, body = await http.one(ep, "GET", "/v1/status?invariants=1")
                statuses.append(body if code == 200 else {"node": i, "error": f"HTTP {code}"})
            except Exception as e:
                statuses.append({"node": i, "error": short_error(e)})
        if all("digest" in s for s in statuses) and len({(s["exec_slot"], s["digest"]) for s in statuses}) == 1:
            return statuses
        if time.monotonic() > deadline:
            return statuses
        await asyncio.sleep(0.2)
