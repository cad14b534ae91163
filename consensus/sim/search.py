"""Swarm-style fault search: one seed decides a whole run, and the run is judged.

``swarm_config(seed)`` draws everything from ``random.Random(seed)`` (TigerBeetle's
VOPR ``options_swarm``): protocol (SDPaxos or Multi-Paxos), 3 or 5 replicas, delay
model and timers, network misbehaviour (jitter, so reordering; loss; duplication),
clock skew within the drift bound, a SimDisk half of the time, snapshots, a workload
of puts, gets (through the sequencer lease) and compare-and-sets on a few keys, and
a fault schedule. Swarm testing: each run enables a random subset of fault kinds,
so rare combinations get room instead of being diluted by everything at once:

- ``crash``: crash and restart up to f replicas at a time, overlapping;
- ``churn``: many short crash-restarts of one replica at a time (with a slow SimDisk,
  a crash then often falls between a write and its sync);
- ``pause``: SIGSTOP/SIGCONT a replica (counted with the crashed ones);
- ``partition``: a minority cut from the majority, then healed;
- ``bridge``: two sides joined through one node (Jepsen's bridge);
- ``isolate``: one replica cut off, then rejoined;
- ``oneway``: asymmetric cuts (A→B dropped, B→A delivered);
- ``drop``: one message type dropped on one link or everywhere, for a while;
- ``loss``: bursts of message loss; ``slow``: a slow node (straggler).

Every schedule ends healed at 70 % of the run (the liveness phase), and the run is
judged by ``judge``: every incarnation executed a prefix of one sequence, per-slot
agreement, no acknowledged write lost, nothing applied twice, every result a client
saw equals the sequential replay, the history (puts, gets, CAS) linearizable under
the key-value model, and liveness: after the heal every command completed.

With ``reconfig`` (``cellar sim search --reconfig``) every run is SDPaxos and an admin
client asks, once or twice at random times, for the membership change that closes
the epoch (docs/membership.md); the other draws of the seed are unchanged. The run
must then end with every live replica past the same END slot, nothing committed
above it (``past_end``), no acknowledged write lost and the history linearizable.

A failure is printed with its seed, the exact ``SimConfig`` and a replay command;
``tests/testdata/fault_regressions.json`` keeps the failures found so far (full
configs, so a change to this generator does not change what they replay).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

from .simulator import SimConfig, Simulation

FAULT_KINDS = ("crash", "churn", "pause", "partition", "bridge", "isolate", "oneway", "drop", "loss", "slow")

# Message types worth dropping, per protocol (names of consensus.core.messages classes).
MESSAGE_TYPES = {
    "sdpaxos": (
        "CAccept", "CAck", "CCommit", "CRequest", "CPrepare", "CPromise", "OAccept", "OAck", "OCommit",
        "Fetch", "VRequest", "Vote", "Ping", "Pong", "RRequest", "RReply", "PreVote", "PreVoteReply",
    ),
    "multipaxos": ("Forward", "MAccept", "MAck", "MCommit", "VRequest", "Vote", "Ping"),
}

# Clock skew per node stays within the lease's drift bound (ProtocolConfig.drift, 5 %):
# with every |skew| <= 2.4 %, the sequencer's lease (lease * (1 - drift) of its ticks)
# ends before any voter's promise (lease of its ticks) in real time.
SKEW_MAX = 0.024

REGRESSIONS = Path(__file__).resolve().parents[2] / "tests" / "testdata" / "fault_regressions.json"


def swarm_config(seed: int, reconfig: bool = False) -> SimConfig:
    """The whole run of ``seed``: cluster, network, disk, workload and faults."""
    cfg = _swarm_config(seed)
    if not reconfig:
        return cfg
    rng = random.Random(seed ^ 0x5EC0_4F16)  # apart, so every other draw stays
    ms = cfg.seconds * 1000
    asks = [(round(rng.uniform(0.05, 0.8) * ms, 3), "reconfig", rng.randrange(cfg.replicas))
            for _ in range(rng.choice((1, 1, 2)))]
    faults = sorted(list(cfg.faults) + asks, key=lambda e: e[0])
    return dataclasses.replace(cfg, protocol="sdpaxos", faults=faults)


def _swarm_config(seed: int) -> SimConfig:
    rng = random.Random(seed)
    protocol = rng.choice(("sdpaxos", "sdpaxos", "multipaxos"))
    n = rng.choice((3, 5))
    rtt = rng.choice(("geo", "geo", "geo", "lan"))
    # LAN runs are short (a LAN client commits thousands of commands a second) with
    # timers scaled down so that failovers still happen inside the run.
    if rtt == "geo":
        seconds, timer_ms, tick_ms, client_timeout_ms, clients = 3.0, 500.0, 10.0, 1000.0, rng.randint(1, 3)
    else:
        seconds, timer_ms, tick_ms, client_timeout_ms, clients = 0.6, 60.0, 3.0, 120.0, 1
    skew: tuple = ()
    if rng.random() < 0.5:
        skew = tuple(round(rng.uniform(-SKEW_MAX, SKEW_MAX), 4) for _ in range(n))
    # A third of the runs are crash-heavy with a SimDisk: churn plus at most one other
    # kind; the others enable a random subset of every kind (swarm testing).
    crashy = rng.random() < 1 / 3
    disk_sync_ms = 0.0
    disk_jitter_ms = 0.0
    if crashy or rng.random() < 0.5:
        # A sync (plus jitter) stays within a tenth of the timers: with syncs as slow
        # as a recovery timeout, recoveries duel forever (a liveness limit, not a bug
        # of the search to report on every run).
        disk_sync_ms = rng.choice((0.5, 2.0, 10.0, 20.0) if rtt == "geo" else (0.2, 0.5, 2.0, 5.0))
        disk_jitter_ms = rng.choice((0.0, disk_sync_ms, 1.5 * disk_sync_ms))
        disk_jitter_ms = max(0.0, min(disk_jitter_ms, timer_ms / 10 - disk_sync_ms))
    if crashy:
        kinds = ["churn", "churn", rng.choice(FAULT_KINDS)]
    else:
        kinds = [k for k in FAULT_KINDS if rng.random() < 0.5] or [rng.choice(FAULT_KINDS)]
    snapshot_every = rng.choice((0, 0, 5, 20)) if protocol == "sdpaxos" else 0
    read_fraction = rng.choice((0.2, 0.4))
    cas_fraction = rng.choice((0.2, 0.4))
    return SimConfig(
        protocol=protocol,
        replicas=n,
        rtt=rtt,
        sequencer=rng.randrange(n),
        clients_per_site=clients,
        seconds=seconds,
        seed=rng.getrandbits(32),
        batch=rng.choice((1, 8, 256)),
        inflight=rng.choice((2, 32)),
        tick_ms=tick_ms,
        resend_ms=timer_ms,
        heartbeat_ms=timer_ms,
        ping_ms=timer_ms / 5,
        lease_ms=timer_ms,
        recovery_ms=timer_ms,
        jitter=rng.choice((0.0, 0.5, 1.5)),
        jitter_ms_min=0.0 if rtt == "geo" else rng.choice((0.0, 1.0)),
        loss=rng.choice((0.0, 0.02, 0.1)),
        dup=rng.choice((0.0, 0.05)),
        read_fraction=read_fraction,
        cas_fraction=cas_fraction,
        keys=rng.randint(1, 3),
        client_timeout_ms=client_timeout_ms,
        tick_skew=skew,
        snapshot_every=snapshot_every,
        disk_sync_ms=disk_sync_ms,
        disk_sync_jitter_ms=disk_jitter_ms,
        lose_unsynced_on_crash=rng.random() < 0.9,
        disk_torn=rng.random() < 0.5,
        faults=swarm_schedule(rng, n, seconds, kinds, protocol),
        # Drawn last, so that every other field of a seed stays what it was.
        early_send=rng.random() < 0.5,
        defer_execution=rng.random() < 0.5,  # after early_send, for the same reason
    )


def swarm_schedule(rng: random.Random, n: int, seconds: float, kinds: list[str], protocol: str) -> list[tuple]:
    """Faults of the enabled ``kinds`` over the first 70 % of the run, then heal all.

    At most f replicas are crashed or paused at any moment (crashes overlap); network
    faults come and go on their own timers and may cut off more than f for a while
    (safety must hold regardless; liveness is judged after the heal).
    """
    f = (n - 1) // 2
    ms = seconds * 1000
    end = 0.7 * ms
    out: list[tuple] = []
    down_until: dict[int, float] = {}  # crashed or paused, back at
    t = rng.uniform(0.03, 0.12) * ms

    def at(x: float) -> float:
        return round(min(x, end), 3)

    def links_of(node: int) -> tuple:
        return tuple((a, b) for a in range(n) for b in range(n) if a != b and node in (a, b))

    while t < end:
        kind = rng.choice(kinds)
        span = rng.uniform(0.03, 0.35) * ms  # how long this fault lasts
        down = [r for r, back in down_until.items() if back > t]
        if kind in ("crash", "pause") and len(down) < f:
            victim = rng.choice([r for r in range(n) if r not in down])
            down_until[victim] = t + span
            if kind == "crash":
                out += [(at(t), "crash", victim), (at(t + span), "restart", victim)]
            else:
                # A paused LAN replica comes back to thousands of messages, which the
                # simulator's busy queue re-queues per event: keep LAN pauses short.
                held = span if ms >= 2000 else min(span, 0.05 * ms)
                down_until[victim] = t + held
                out += [(at(t), "pause", victim), (at(t + held), "resume", victim)]
        elif kind == "churn" and not down:
            # A burst of short crash-restarts, one replica at a time.
            stop = min(end, t + span)
            while t < stop:
                victim = rng.randrange(n)
                gone = rng.uniform(0.005, 0.05) * ms
                out += [(at(t), "crash", victim), (at(t + gone), "restart", victim)]
                down_until[victim] = t + gone
                t += gone + rng.uniform(0.01, 0.1) * ms
        elif kind == "partition":
            nodes = list(range(n))
            rng.shuffle(nodes)
            minority = set(nodes[: rng.randint(1, f)])
            links = tuple((a, b) for a in range(n) for b in range(n) if (a in minority) != (b in minority))
            out += [(at(t), "block", links), (at(t + span), "unblock", links)]
        elif kind == "bridge":
            nodes = list(range(n))
            rng.shuffle(nodes)
            bridge, rest = nodes[0], nodes[1:]
            left = set(rest[: len(rest) // 2])
            links = tuple(
                (a, b) for a in rest for b in rest if a != b and (a in left) != (b in left)
            )
            out += [(at(t), "block", links), (at(t + span), "unblock", links)]
        elif kind == "isolate":
            links = links_of(rng.randrange(n))
            out += [(at(t), "block", links), (at(t + span), "unblock", links)]
        elif kind == "oneway":
            a, b = rng.sample(range(n), 2)
            links = ((a, b),)
            if rng.random() < 0.3:  # everything into (or out of) one node, one way
                links = tuple((x, b) for x in range(n) if x != b) if rng.random() < 0.5 else tuple((a, x) for x in range(n) if x != a)
            out += [(at(t), "block", links), (at(t + span), "unblock", links)]
        elif kind == "drop":
            name = rng.choice(MESSAGE_TYPES[protocol])
            src = rng.choice([-1] + list(range(n)))
            dst = rng.choice([-1] + [r for r in range(n) if r != src])
            out += [(at(t), "drop", name, src, dst), (at(t + span), "undrop", name, src, dst)]
        elif kind == "loss":
            out += [(at(t), "loss", rng.choice((0.05, 0.2, 0.5))), (at(t + span), "loss", 0.0)]
        elif kind == "slow":
            node = rng.randrange(n)
            # A slow node's events queue behind it and are re-queued while it is busy:
            # on a LAN (thousands of messages a second) keep the factor modest.
            factor = rng.choice((5.0, 50.0, 400.0) if ms >= 2000 else (2.0, 5.0, 20.0))
            out += [(at(t), "slow", node, factor), (at(t + span), "slow", node, 1.0)]
        t += rng.uniform(0.02, 0.15) * ms
    out.append((round(end, 3), "heal"))
    out.append((round(end, 3), "loss", 0.0))
    for r in range(n):
        out.append((round(end, 3), "slow", r, 1.0))
        out.append((round(end, 3), "resume", r))
        out.append((round(end, 3), "restart", r))
    out.sort(key=lambda e: e[0])  # stable: at equal times, in the order drawn
    return out


def churn_schedule(n: int, seconds: float, seed: int, down_ms: tuple = (20.0, 150.0), up_ms: tuple = (50.0, 300.0)) -> list[tuple]:
    """Crash-restart one replica after another for 70 % of the run, then heal.

    With a slow SimDisk, crashes keep landing between a record's write and its sync:
    a driver or core that lets an answer out before its record is durable loses it.
    """
    rng = random.Random(seed)
    end = 0.7 * seconds * 1000
    t = rng.uniform(100.0, 300.0)
    out: list[tuple] = []
    while t < end:
        victim = rng.randrange(n)
        gone = rng.uniform(*down_ms)
        out += [(round(t, 3), "crash", victim), (round(min(t + gone, end), 3), "restart", victim)]
        t += gone + rng.uniform(*up_ms)
    out.append((round(end, 3), "heal"))
    out += [(round(end, 3), "restart", r) for r in range(n)]
    return out


# --- judging a run ------------------------------------------------------------------------


def judge(cfg: SimConfig, lin_timeout_s: float = 60.0) -> dict:
    """Run ``cfg`` and check it; ``failures`` lists what went wrong (empty: passed)."""
    try:
        sim = Simulation(cfg).run()
    except Exception as exc:  # an assertion inside the core (SafetyViolation) or a crash
        return {"failures": [f"exception: {type(exc).__name__}: {exc}"], "linearizable": None}
    result = sim.summary()
    failures = []
    for name in ("consistent", "agreement"):
        if not result[name]:
            failures.append(name)
    for name in ("lost_acked", "duplicated", "wrong_results", "past_end"):
        if result.get(name):
            failures.append(f"{name}={result[name]}")
    if not sim.quiet():
        failures.append("not live: commands still pending after the heal")
    lin = sim.linearizable(timeout_s=lin_timeout_s)
    if lin is not True:
        failures.append("not linearizable" if lin is False else "linearizability unknown (checker budget)")
    result["linearizable"] = lin
    result["failures"] = failures
    return result


def config_to_json(cfg: SimConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def config_from_json(data: dict) -> SimConfig:
    """The inverse of ``config_to_json``: tuples where the simulator had tuples."""

    def tup(v: Any) -> Any:
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    data = dict(data)
    data["faults"] = [tup(f) for f in data.get("faults", [])]
    data["tick_skew"] = tuple(data.get("tick_skew", ()))
    return SimConfig(**data)


def replay_hint(seed: int | None, cfg: SimConfig) -> str:
    lines = []
    if seed is not None:
        lines.append(f"SEED={seed}")
        lines.append(f"replay: cellar sim search --replay {seed}   (or python3 -m consensus.sim.search --replay {seed})")
    lines.append(f"config: Simulation({cfg!r}).run()   (the machines installed first: store.machines.install_in_simulator())")
    return "\n".join(lines)


def search(seeds, budget_s: float | None = None, echo=None, stop_on_failure: bool = False,
           reconfig: bool = False) -> list[dict]:
    """Judge ``swarm_config(s)`` for each seed; returns the failures found."""
    found = []
    start = time.monotonic()
    for count, seed in enumerate(seeds, 1):
        if budget_s is not None and time.monotonic() - start > budget_s:
            break
        cfg = swarm_config(seed, reconfig)
        result = judge(cfg)
        if result["failures"]:
            entry = {"seed": seed, "failures": result["failures"], "config": config_to_json(cfg)}
            found.append(entry)
            if echo:
                echo(f"FAIL {', '.join(result['failures'])}\n{replay_hint(seed, cfg)}")
            if stop_on_failure:
                break
        elif echo and count % 50 == 0:
            echo(f"{count} runs, {len(found)} failures, {time.monotonic() - start:.0f} s")
    return found


def load_regressions(path: Path = REGRESSIONS) -> list[dict]:
    if not path.exists():
        return []
    return json.loads(path.read_text())


def save_regressions(entries: list[dict], path: Path = REGRESSIONS) -> int:
    """Add failures not recorded yet (by seed and config); returns how many were added."""
    known = load_regressions(path)
    have = {json.dumps(e["config"], sort_keys=True) for e in known}
    added = 0
    for e in entries:
        key = json.dumps(e["config"], sort_keys=True)
        if key in have:
            continue
        have.add(key)
        known.append({
            "name": f"seed-{e.get('seed')}",
            "seed": e.get("seed"),
            "found": e.get("failures", []),
            "status": "open",
            "note": "found by the swarm search; describe the cause, set status to fixed once it passes",
            "config": e["config"],
        })
        added += 1
    if added:
        path.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return added


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python3 -m consensus.sim.search", description=__doc__.split("\n")[0])
    p.add_argument("--replay", type=int, help="judge one seed and print it")
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--seed", type=int, default=None, help="first seed (default: from the clock, printed)")
    p.add_argument("--save", action="store_true", help=f"record failures in {REGRESSIONS.name}")
    args = p.parse_args(argv)
    if args.replay is not None:
        cfg = swarm_config(args.replay)
        result = judge(cfg)
        print(json.dumps({k: result.get(k) for k in ("failures", "lost_acked", "duplicated", "wrong_results", "linearizable", "view_changes", "committed")}))
        print(replay_hint(args.replay, cfg))
        return 1 if result["failures"] else 0
    first = args.seed if args.seed is not None else int(time.time())
    print(f"SEED={first} examples={args.examples}")
    found = search(range(first, first + args.examples), echo=print)
    if args.save and found:
        print(f"saved {save_regressions(found)} new regression case(s) to {REGRESSIONS}")
    print(f"{args.examples} runs from seed {first}: {len(found)} failure(s)")
    return 1 if found else 0


if __name__ == "__main__":
    from store.machines import install_in_simulator  # the composition root (consensus.sim.registry)

    install_in_simulator()
    raise SystemExit(main())
