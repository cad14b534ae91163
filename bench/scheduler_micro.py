"""Per-command apply cost of ``SchedulerStateMachine`` (microseconds), for apply-cost work.

Two recorded command streams on the benchmark's generated cluster
(``scheduler_state.bench.generate_config``, 1,024 nodes / 8 VCs by default):

- **group**: the ``cellar scheduler bench`` workload (allocate ``wait: false`` /
  release around 60% utilization, 10% opportunistic, priorities 0..9);
- **pod**: the extender's: each job (same sizes and mix) is filtered pod by pod
  (``what_if`` for the pod, then ``pod_schedule``), each pod bound (``pod_bind``), and a
  job ends by deleting its pods (``pod_delete``).

Each stream is recorded once (commands only), then replayed ``--repeat`` times on a
fresh machine; a command's cost is the smallest of its replays (the others lost time to
the machine's other work), reported as mean and percentiles per op. Times are CPU time
(``time.thread_time_ns``: the machine is shared) with the replicas' collector settings. Replays must give the
same results (the machine is deterministic); the script checks the final digest.

    PYTHONPATH=. python3 bench/scheduler_micro.py [--nodes 1024] [--ops 8000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from typing import Any

from scheduler_state.bench import GPUS_PER_NODE, SIZES_GPU, _group_spec, generate_config
from scheduler_state.config import load_config
from scheduler_state.machine import SchedulerStateMachine


def group_stream(nodes: int, vcs: int, ops: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    m = SchedulerStateMachine(load_config(generate_config(nodes, vcs)))
    live_target = max(1, int(nodes * GPUS_PER_NODE * 0.6 / (sum(SIZES_GPU) / len(SIZES_GPU))))
    live: list[str] = []
    out = []
    counter = 0
    for _ in range(ops):
        if len(live) < live_target and (not live or rng.random() < 0.55) or not live:
            counter += 1
            cmd = {"op": "allocate", "group": _group_spec(rng, f"g{counter}", vcs), "wait": False}
        else:
            cmd = {"op": "release", "group": live.pop(rng.randrange(len(live)))}
        r = m.apply(cmd)
        out.append(cmd)
        if cmd["op"] == "allocate" and r.get("ok"):
            live.append(r["group"])
            for v in r["preempted"]:
                if v in live:
                    live.remove(v)
    return out


def pod_stream(nodes: int, vcs: int, ops: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    m = SchedulerStateMachine(load_config(generate_config(nodes, vcs)))
    live_target = max(1, int(nodes * GPUS_PER_NODE * 0.6 / (sum(SIZES_GPU) / len(SIZES_GPU))))
    live: list[tuple[str, list[str]]] = []  # (group, uids of its bound pods)
    out: list[dict[str, Any]] = []
    counter = 0
    while len(out) < ops:
        if len(live) < live_target and (not live or rng.random() < 0.55) or not live:
            counter += 1
            name = f"j{counter}"
            spec = _group_spec(rng, name, vcs)
            k = spec["affinityGroup"]["members"][0]["leafCellNumber"]
            n = spec["affinityGroup"]["members"][0]["podNumber"]
            pspec = dict(spec, leafCellNumber=k)
            uids = []
            for i in range(n):
                pod = {"uid": f"{name}-{i}", "namespace": "bench", "name": f"{name}-{i}"}
                w = {"op": "what_if", "pod": pod, "spec": pspec}
                out.append(w)
                if not m.apply(w).get("placeable"):
                    break
                s = {"op": "pod_schedule", "pod": pod, "spec": pspec}
                out.append(s)
                r = m.apply(s)
                if not r.get("ok"):
                    break
                b = {"op": "pod_bind", "pod": {"uid": pod["uid"]}, "node": r["node"]}
                out.append(b)
                m.apply(b)
                uids.append(pod["uid"])
            if uids:
                live.append((name, uids))
        else:
            name, uids = live.pop(rng.randrange(len(live)))
            if name not in m.groups:
                continue
            for uid in uids:
                d = {"op": "pod_delete", "pod": {"uid": uid}}
                out.append(d)
                m.apply(d)
    return out


def replay(nodes: int, vcs: int, cmds: list[dict[str, Any]], repeat: int) -> tuple[list[int], str]:
    best: list[int] | None = None
    digest = None
    for _ in range(repeat):
        m = SchedulerStateMachine(load_config(generate_config(nodes, vcs)))
        gc.collect()
        gc.set_threshold(50_000, 50, 1000)  # the replicas' collector settings (store.server.tune_gc)
        times = []
        perf = time.thread_time_ns  # CPU time: the machine is shared
        apply = m.apply
        for cmd in cmds:
            t0 = perf()
            apply(cmd)
            times.append(perf() - t0)
        d = m.digest()
        if digest is not None and d != digest:
            raise AssertionError("replays differ: the machine is not deterministic")
        digest = d
        best = times if best is None else [min(a, b) for a, b in zip(best, times)]
    assert best is not None and digest is not None
    return best, digest


def summarize(cmds: list[dict[str, Any]], times: list[int]) -> dict[str, Any]:
    per: dict[str, list[int]] = {}
    for cmd, t in zip(cmds, times):
        per.setdefault(cmd["op"], []).append(t)
    out = {}
    for op, ts in per.items():
        ts_sorted = sorted(ts)
        out[op] = {"n": len(ts), "mean_us": round(sum(ts) / len(ts) / 1000, 2),
                   "p50_us": round(ts_sorted[len(ts) // 2] / 1000, 2),
                   "p99_us": round(ts_sorted[min(len(ts) - 1, int(0.99 * len(ts)))] / 1000, 2)}
    out["all"] = {"n": len(times), "mean_us": round(sum(times) / len(times) / 1000, 2)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--vcs", type=int, default=8)
    ap.add_argument("--ops", type=int, default=8000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--streams", default="group,pod")
    a = ap.parse_args()
    result = {}
    for name in a.streams.split(","):
        make = group_stream if name == "group" else pod_stream
        cmds = make(a.nodes, a.vcs, a.ops, a.seed)
        times, digest = replay(a.nodes, a.vcs, cmds, a.repeat)
        result[name] = {"digest": digest, **summarize(cmds, times)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
