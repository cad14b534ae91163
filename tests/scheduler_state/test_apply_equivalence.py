"""Apply-cost work (issue 11) changes no result: the benchmark's command generator
(``scheduler_state.bench``: allocate and release of mixed-size groups around a target
utilization) on several configs gives exactly the results, events, snapshot bytes and
digests it gave before that work (recorded on 833abe7, the branch point of sched-speed).

Each run hashes every command's result and its change-feed events
(``events.events_of``), the digest every ``DIGEST_EVERY`` commands and the final
snapshot bytes. The runs cover what the machine's derived state (indexes, counters,
caches) must follow:

- ``bench``: ``cellar scheduler bench``'s own stream (1,024 nodes, 8 VCs), as it runs;
- ``full``: near full utilization, lazily preemptible groups (preemption, lazy
  preemption and undone lazy demotions);
- ``hot``: priorities spread over a cluster asked for more than it has, many
  opportunistic groups (inter- and intra-VC preemption, opportunistic spread);
- ``health``: node health changes (bad cells, doomed bad cells), waiting groups (the
  pending queue and its retries), partial releases, suggested nodes, leases and their
  expiry, and snapshot/restore round trips mid-stream (the caches rebuilt by restore);
- ``reconf``: reconfiguration mid-stream (VCs added and removed, a quota shrunk:
  work-preserving re-adding, lazy preemption by reconfiguration), with bad nodes;
- ``batch``: the replicated path (``ReplicatedScheduler``), the commands coalesced into
  ``batch`` log entries as a replica's service does, with dry runs (``what_if``) and
  status reads between them;
- ``vcs1`` / ``vcs16``: one VC and sixteen.

Record new values only for a change that is meant to change a decision, and say so."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest

from scheduler_state.bench import GPUS_PER_NODE, SIZES_GPU, _group_spec, generate_config
from scheduler_state.config import load_config
from scheduler_state.events import events_of
from scheduler_state.invariants import check
from scheduler_state.machine import SchedulerStateMachine
from scheduler_state.replicated import ReplicatedScheduler

DIGEST_EVERY = 250

# name -> stream parameters
RUNS: dict[str, dict[str, Any]] = {
    "bench": dict(nodes=1024, vcs=8, seed=1, ops=3000, utilization=0.6),
    "full": dict(nodes=256, vcs=4, seed=2, ops=2500, utilization=0.97, lazy=0.3),
    "hot": dict(nodes=128, vcs=2, seed=3, ops=2500, utilization=1.3, opportunistic=0.3, lazy=0.1),
    "health": dict(nodes=256, vcs=2, seed=4, ops=2500, utilization=1.1, health=0.03, healthy=0.35, wait=0.3,
                   partial=0.1,
                   suggested=0.05, lease=0.05, restore_at=(700, 1500, 2200)),
    "reconf": dict(nodes=256, vcs=4, seed=5, ops=2500, utilization=0.85, health=0.01, lazy=0.2, wait=0.1,
                   reconfigure={800: "vcs2", 1500: "shrunk", 2100: "base"}),
    "batch": dict(nodes=256, vcs=4, seed=6, ops=2500, utilization=0.9, wait=0.1, health=0.01, batch=16, reads=0.03),
    "vcs1": dict(nodes=256, vcs=1, seed=7, ops=1500, utilization=0.8, lazy=0.2),
    "vcs16": dict(nodes=256, vcs=16, seed=8, ops=1500, utilization=0.9, health=0.01),
}

GOLDEN = {  # name -> (hash of every result, event and digest; sha256 of the final snapshot), 833abe7
    "bench": ("c8c26762a3e1bddd", "8a804eda42dff514"),
    "full": ("08c109d36a4301de", "62c2baefbedd1ae4"),
    "hot": ("80be3f5bef7b98d3", "86a9763d40480431"),
    "health": ("456ddb38db6e427c", "11f7df7ab10a0e88"),
    "reconf": ("185c81d178ae999c", "218fab4e04ff833a"),
    "batch": ("9c3d7b62c0b5489a", "c8f934bada5b5c00"),
    "vcs1": ("8df7d082a15346d2", "42680075ba57ba01"),
    "vcs16": ("abe4efd09b9de172", "67a5dc0f9cee0e85"),
}


def _config(nodes: int, vcs: int, variant: str) -> dict[str, Any]:
    if variant == "vcs2":  # half of the VCs deleted, their quota given to the others
        return generate_config(nodes, max(1, vcs // 2))
    cfg = generate_config(nodes, vcs)
    if variant == "shrunk":  # the last VC loses half of its single nodes
        cells = cfg["virtualClusters"][f"vc{vcs - 1}"]["virtualCells"]
        cells[-1]["cellNumber"] //= 2
    return cfg


def run(nodes: int, vcs: int, seed: int, ops: int, utilization: float, lazy: float = 0.0,
        opportunistic: float = 0.0, health: float = 0.0, healthy: float = 0.5, wait: float = 0.0, partial: float = 0.0,
        suggested: float = 0.0, lease: float = 0.0, restore_at: tuple[int, ...] = (),
        reconfigure: dict[int, str] | None = None, batch: int = 0, reads: float = 0.0,
        check_every: int = 0) -> tuple[str, str]:
    """The bench's generator (``bench.run``: allocate while fewer than the target of
    groups run, else release a random running one) with the extras named in the
    module docstring; returns (hash of results/events/digests, snapshot hash)."""
    rng = random.Random(seed)
    m: Any = SchedulerStateMachine(load_config(generate_config(nodes, vcs)))
    if batch:
        m = ReplicatedScheduler(load_config(generate_config(nodes, vcs)))
    h = hashlib.sha256()
    mean_gpus = sum(SIZES_GPU) / len(SIZES_GPU)
    live_target = max(1, int(nodes * GPUS_PER_NODE * utilization / mean_gpus))
    live: list[str] = []
    cur_vcs = vcs
    counter = 0
    now = 0
    reconfigure = reconfigure or {}
    pending: list[dict[str, Any]] = []

    def record(cmd: dict[str, Any], res: dict[str, Any]) -> None:
        h.update(json.dumps(res, sort_keys=True, default=repr).encode())
        h.update(json.dumps(events_of(cmd, res), sort_keys=True, default=repr).encode())
        if cmd["op"] == "allocate" and (res.get("ok") or res.get("queued")):
            live.append(cmd["group"]["affinityGroup"]["name"])
        for victim in res.get("preempted") or ():
            if victim in live:
                live.remove(victim)
        if cmd["op"] == "release" and res.get("released") is True:
            if cmd["group"] in live:
                live.remove(cmd["group"])
        if cmd["op"] == "lease_expire":
            for name in res.get("expired", []) + res.get("cancelled", []):
                if name in live:
                    live.remove(name)

    def flush() -> None:
        if not pending:
            return
        out = m.apply({"op": "batch", "commands": list(pending)})
        assert out["ok"], out
        for cmd, res in zip(pending, out["results"]):
            record(cmd, res)
        pending.clear()

    def digest() -> str:
        return m.inner.digest() if batch else m.digest()

    for i in range(ops):
        if i in restore_at:
            blob = m.snapshot()
            h.update(hashlib.sha256(blob).digest())
            m = SchedulerStateMachine.from_snapshot(blob)
            assert m.snapshot() == blob
        if i in reconfigure:
            flush()
            variant = reconfigure[i]
            cur_vcs = max(1, vcs // 2) if variant == "vcs2" else vcs
            cmd = {"op": "reconfigure", "config": _config(nodes, vcs, variant)}
            res = m.apply(cmd)
            assert res.get("ok"), res
            record(cmd, res)
        r = rng.random()
        if r < health:
            node = f"node-{rng.randrange(nodes // 16):03d}-{rng.randrange(16):02d}"
            cmd: dict[str, Any] = {"op": "set_node_health", "node": node, "healthy": rng.random() < healthy}
        elif r < health + lease:
            now += rng.randrange(200)
            cmd = {"op": "lease_expire", "now_ms": now}
        elif r < health + lease + reads and batch:
            flush()
            kind = rng.randrange(3)
            if kind == 0:
                cmd = {"op": "what_if", "group": _group_spec(rng, f"w{i}", cur_vcs)}
            elif kind == 1:
                cmd = {"op": "vc_status", "vc": f"vc{rng.randrange(cur_vcs)}"}
            else:
                cmd = {"op": "group_status", "group": live[rng.randrange(len(live))] if live else "nobody"}
            record(cmd, m.query(cmd))
            continue
        elif len(live) < live_target and (not live or rng.random() < 0.55) or not live:
            counter += 1
            spec = _group_spec(rng, f"g{counter}", cur_vcs)
            if opportunistic and rng.random() < opportunistic:
                spec["priority"] = -1
            if lazy and rng.random() < lazy:
                spec["lazyPreemptionEnable"] = True
            cmd = {"op": "allocate", "group": spec, "wait": bool(wait and rng.random() < wait)}
            if suggested and rng.random() < suggested:
                cmd["suggestedNodes"] = [f"node-{rng.randrange(nodes // 16):03d}-{j:02d}" for j in range(16)]
            if lease and rng.random() < lease:
                now += rng.randrange(20)
                cmd["now_ms"] = now
                cmd["ttl_ms"] = rng.randint(1, 2000)
        else:
            name = live[rng.randrange(len(live))]
            cmd = {"op": "release", "group": name}
            if partial and rng.random() < partial:
                cmd["pods"] = [0]
        if batch:
            pending.append(cmd)
            if len(pending) >= batch or rng.random() < 0.1:
                flush()
        else:
            record(cmd, m.apply(cmd))
        if i % DIGEST_EVERY == 0:
            flush()
            h.update(digest().encode())
        if check_every and i % check_every == 0:
            flush()
            problems = check(m.inner if batch else m)
            assert not problems, (i, problems[:3])
    flush()
    inner = m.inner if batch else m
    assert check(inner) == []
    blob = inner.snapshot()
    return h.hexdigest()[:16], hashlib.sha256(blob).hexdigest()[:16]


def test_every_run_is_pinned():
    assert sorted(GOLDEN) == sorted(RUNS)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_apply_gives_the_same_results_events_and_snapshots(name):
    assert run(**RUNS[name]) == GOLDEN[name]


if __name__ == "__main__":  # print the values to record (python3 -m tests.scheduler_state.test_apply_equivalence)
    for n in RUNS:
        print(f"    {n!r}: {run(**RUNS[n])!r},")
