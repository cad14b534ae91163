"""Apply-throughput benchmark (issue 5, acceptance 4): ``cellar scheduler bench``.

``generate_config(nodes, vcs)`` builds a HiveD config: 8-GPU nodes (GPU > 2-GPU >
4-GPU > NODE, with the node level marked), grouped 16 to a rack (the top-level cell).
The racks' cells are shared among ``vcs`` VCs: each gets a quarter of its share as whole
racks and the rest as single nodes (``RACK.NODE``), so both binding levels are exercised.

``run(...)`` drives one ``SchedulerStateMachine`` with a seeded mix of allocate and
release commands, timing each ``apply`` (wall clock lives here, never in ``apply``):

- a new group is allocated while fewer than ``live_target`` groups are running (chosen
  so the cluster runs around ``utilization``), otherwise a random running group is
  released; so allocations and releases alternate around a steady state;
- group sizes are drawn from 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 GPUs; up to 8 GPUs
  is one pod, larger groups are pods of 8 (a gang of several nodes);
- 10% of groups are opportunistic, the rest guaranteed with priorities 0..9, so
  preemption happens; allocations are sent with ``"wait": false`` (a failed allocation is
  answered, not queued: the benchmark measures apply, not queue retries).

The figures: operations per second over all timed applies, and the p50 / p99 / max
apply time, both in wall-clock time and in the process's CPU time for the apply (the
latter excludes time the OS gave to other processes, which on a shared machine dominates
the wall-clock tail). Random numbers decide the *commands*, which then carry every choice; the
machine itself stays deterministic.
"""

from __future__ import annotations

import gc
import random
import time
from typing import Any

from scheduler_state.config import load_config
from scheduler_state.invariants import check
from scheduler_state.machine import SchedulerStateMachine

GPUS_PER_NODE = 8
NODES_PER_RACK = 16
SIZES_GPU = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def generate_config(nodes: int, vcs: int) -> dict[str, Any]:
    if nodes <= 0 or nodes % NODES_PER_RACK:
        raise ValueError(f"nodes must be a positive multiple of {NODES_PER_RACK}")
    racks = nodes // NODES_PER_RACK
    if vcs <= 0 or racks % vcs:
        raise ValueError(f"the {racks} racks must divide evenly among {vcs} VCs")
    physical = []
    for r in range(racks):
        physical.append({
            "cellType": "RACK",
            "cellChildren": [{"cellAddress": f"node-{r:03d}-{n:02d}"} for n in range(NODES_PER_RACK)],
        })
    per_vc = racks // vcs
    whole = max(per_vc // 4, 0)
    singles = (per_vc - whole) * NODES_PER_RACK
    virtual = {}
    for i in range(vcs):
        cells = []
        if whole:
            cells.append({"cellType": "RACK", "cellNumber": whole})
        if singles:
            cells.append({"cellType": "RACK.NODE", "cellNumber": singles})
        virtual[f"vc{i}"] = {"virtualCells": cells}
    return {
        "physicalCluster": {
            "skuTypes": {"GPU": {"gpu": 1, "cpu": 8, "memory": "64Gi"}},
            "cellTypes": {
                "GPU-2": {"childCellType": "GPU", "childCellNumber": 2},
                "GPU-4": {"childCellType": "GPU-2", "childCellNumber": 2},
                "NODE": {"childCellType": "GPU-4", "childCellNumber": 2, "isNodeLevel": True},
                "RACK": {"childCellType": "NODE", "childCellNumber": NODES_PER_RACK},
            },
            "physicalCells": physical,
        },
        "virtualClusters": virtual,
    }


def _group_spec(rng: random.Random, name: str, vcs: int) -> dict[str, Any]:
    gpus = rng.choice(SIZES_GPU)
    members = [{"podNumber": 1, "leafCellNumber": gpus}] if gpus <= GPUS_PER_NODE else \
        [{"podNumber": gpus // GPUS_PER_NODE, "leafCellNumber": GPUS_PER_NODE}]
    priority = -1 if rng.random() < 0.1 else rng.randrange(10)
    return {
        "virtualCluster": f"vc{rng.randrange(vcs)}",
        "priority": priority,
        "leafCellType": "GPU",
        "affinityGroup": {"name": name, "members": members},
    }


def run(nodes: int = 1024, vcs: int = 8, ops: int = 50_000, seed: int = 1, utilization: float = 0.6,
        warmup: int = 2_000, check_every: int = 0, gc_freeze: bool = False) -> dict[str, Any]:
    """Run the benchmark and return its figures (times in microseconds).

    ``gc_freeze`` moves the freshly built cell trees out of the cyclic garbage
    collector's reach (``gc.freeze()``), as a long-running replica might after loading
    its state, so a full collection does not walk tens of thousands of cells. Off by
    default: on this workload it made no measurable difference to p50/p99.
    """
    rng = random.Random(seed)
    t0 = time.perf_counter()
    machine = SchedulerStateMachine(load_config(generate_config(nodes, vcs)))
    build_s = time.perf_counter() - t0
    if gc_freeze:
        gc.collect()
        gc.freeze()
    mean_gpus = sum(SIZES_GPU) / len(SIZES_GPU)
    live_target = max(1, int(nodes * GPUS_PER_NODE * utilization / mean_gpus))
    live: list[str] = []
    live_pos: dict[str, int] = {}
    counter = 0
    times_ns: list[int] = []
    cpu_ns: list[int] = []
    counts = {"allocate": 0, "release": 0, "allocated": 0, "waiting": 0, "preempted": 0, "errors": 0}
    perf = time.perf_counter_ns
    cpu = time.thread_time_ns
    for i in range(warmup + ops):
        if len(live) < live_target and (not live or rng.random() < 0.55) or not live:
            counter += 1
            name = f"g{counter}"
            cmd = {"op": "allocate", "group": _group_spec(rng, name, vcs), "wait": False}
            kind = "allocate"
        else:
            name = live[rng.randrange(len(live))]
            cmd = {"op": "release", "group": name}
            kind = "release"
        cpu_start = cpu()
        start = perf()
        result = machine.apply(cmd)
        elapsed = perf() - start
        cpu_elapsed = cpu() - cpu_start
        if i >= warmup:
            times_ns.append(elapsed)
            cpu_ns.append(cpu_elapsed)
            counts[kind] += 1
        if "error" in result:
            counts["errors"] += 1
        if kind == "allocate":
            if result.get("ok"):
                _add(live, live_pos, name)
                for victim in result["preempted"]:
                    _remove(live, live_pos, victim)
                if i >= warmup:
                    counts["allocated"] += 1
                    counts["preempted"] += len(result["preempted"])
            elif i >= warmup:
                counts["waiting"] += 1
        elif result.get("ok"):
            _remove(live, live_pos, name)
        if check_every and i % check_every == 0:
            problems = check(machine)
            if problems:
                raise AssertionError(f"invariants broken after op {i}: {problems[:3]}")
    if gc_freeze:
        gc.unfreeze()
    used = sum(t.used for ch in machine.cluster.chains.values() for t in ch.tops)
    return {
        "gc_freeze": gc_freeze,
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "vcs": vcs,
        "seed": seed,
        "ops": len(times_ns),
        "build_s": round(build_s, 3),
        "wall": _figures(times_ns),
        "cpu": _figures(cpu_ns),
        "counts": counts,
        "final_used_gpus": used,
        "final_groups": len(machine.groups),
    }


def _figures(samples_ns: list[int]) -> dict[str, float]:
    """Throughput and percentiles of per-apply times (microseconds)."""
    if not samples_ns:
        return {"ops_per_s": 0.0, "p50_us": 0.0, "p99_us": 0.0, "max_us": 0.0, "total_s": 0.0}
    ordered = sorted(samples_ns)
    total_s = sum(ordered) / 1e9

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000, 1)

    return {
        "ops_per_s": round(len(ordered) / total_s, 1) if total_s else 0.0,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
        "max_us": round(ordered[-1] / 1000, 1),
        "total_s": round(total_s, 3),
    }


def _add(live: list[str], pos: dict[str, int], name: str) -> None:
    pos[name] = len(live)
    live.append(name)


def _remove(live: list[str], pos: dict[str, int], name: str) -> None:
    i = pos.pop(name, None)
    if i is None:
        return
    last = live.pop()
    if i < len(live):
        live[i] = last
        pos[last] = i
