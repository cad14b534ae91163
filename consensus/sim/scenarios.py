"""Named fault schedules for ``cellar sim --scenario`` (and the tests).

A schedule is a list of ``(ms, action, *args)`` the simulator applies at simulated
time ``ms``: ``crash``/``restart`` a node, ``isolate`` one, ``partition`` into groups,
``cut`` one direction of a link, ``heal``, set ``loss``, make a node ``slow`` by a
factor, ``pause``/``resume`` one (SIGSTOP) — ``consensus.sim.simulator`` lists all. Faults stay within what the protocols claim to survive (a minority down or
cut off at any time, TigerBeetle's habit), and every schedule ends healed so that
liveness can be judged: after the heal, every submitted command must complete.
"""

from __future__ import annotations

import random

SCENARIOS = (
    "none",
    "sequencer-crash",
    "leader-crash",
    "partition-sequencer",
    "minority-crash-restart",
    "straggler-sequencer",
    "random",
    "isolate-rejoin",
    "isolate-rejoin-sequencer",
    "pause-sequencer",
    "asymmetric",
    "flapping",
)


def schedule(name: str, n: int, sequencer: int, seconds: float, faults_seed: int = 1) -> list[tuple]:
    """The fault list of scenario ``name`` for ``n`` replicas over ``seconds``."""
    ms = seconds * 1000
    at = lambda frac: round(ms * frac, 3)  # noqa: E731
    f = (n - 1) // 2
    if name == "none":
        return []
    if name == "sequencer-crash":
        return [(at(0.35), "crash", sequencer)]
    if name == "leader-crash":
        return [(at(0.35), "crash", (sequencer + 1) % n)]
    if name == "partition-sequencer":
        return [(at(0.3), "isolate", sequencer), (at(0.6), "heal")]
    if name == "minority-crash-restart":
        victims = [sequencer] + [(sequencer + k) % n for k in range(2, 2 + f - 1)]
        return [(at(0.3), "crash", v) for v in victims] + [(at(0.6), "restart", v) for v in victims]
    if name == "straggler-sequencer":
        return [(at(0.3), "slow", sequencer, 400.0)]
    if name == "random":
        return random_schedule(n, seconds, faults_seed)
    # Rejoin: one replica cut off for 5 s (less in a short run), then healed. Only
    # safety is promised; view_changes and stall_ms show whether the healthy majority
    # was disturbed by the one coming back.
    hold = min(5000.0, 0.6 * ms)
    start = min(1000.0, 0.15 * ms)
    if name == "isolate-rejoin":
        return [(start, "isolate", (sequencer + 1) % n), (start + hold, "heal")]
    if name == "isolate-rejoin-sequencer":
        return [(start, "isolate", sequencer), (start + hold, "heal")]
    if name == "pause-sequencer":
        # SIGSTOP for longer than an election; it resumes with everything it missed.
        return [(start, "pause", sequencer), (start + min(2000.0, 0.4 * ms), "resume", sequencer)]
    if name == "asymmetric":
        return asymmetric_schedule(n, sequencer, ms)
    if name == "flapping":
        return flapping_schedule(n, sequencer, ms)
    raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}")


def asymmetric_schedule(n: int, sequencer: int, ms: float) -> list[tuple]:
    """One-way cuts (A→B dropped, B→A delivered), four phases, then healed:

    1. the sequencer's messages to one replica are lost (it still hears that replica);
    2. one replica's messages to the sequencer are lost (it still hears the sequencer);
    3. nothing reaches the sequencer, everything it sends arrives (check-quorum's case);
    4. a replica hears nobody but is heard by all.
    """
    a, b = (sequencer + 1) % n, (sequencer + 2) % n
    t = [round(ms * x, 3) for x in (0.1, 0.25, 0.4, 0.55, 0.7)]
    out: list[tuple] = [(t[0], "cut", sequencer, a)]
    out += [(t[1], "heal"), (t[1], "cut", b, sequencer)]
    out += [(t[2], "heal")] + [(t[2], "cut", r, sequencer) for r in range(n) if r != sequencer]
    out += [(t[3], "heal")] + [(t[3], "cut", r, a) for r in range(n) if r != a]
    out.append((t[4], "heal"))
    return out


def flapping_schedule(n: int, sequencer: int, ms: float, period_ms: float = 300.0) -> list[tuple]:
    """The sequencer (with f - 1 others) cut from the rest and back every ``period_ms``,
    from 10 % to 70 % of the run (several seconds in a run of ten)."""
    f = (n - 1) // 2
    minority = tuple(sorted((sequencer + k) % n for k in range(f)))
    majority = tuple(r for r in range(n) if r not in minority)
    t, end = 0.1 * ms, 0.7 * ms
    out: list[tuple] = []
    cut = False
    while t < end:
        out.append((round(t, 3), "heal") if cut else (round(t, 3), "partition", (majority, minority)))
        cut = not cut
        t += period_ms
    out.append((round(end, 3), "heal"))
    return out


def random_schedule(n: int, seconds: float, seed: int) -> list[tuple]:
    """A seeded random fault schedule over the first 70 % of the run, then heal.

    At most a minority is crashed at any moment, and a partition's small side is a
    minority. Isolations and one-way cuts are drawn without regard to the crashes and
    add up until a heal or the next partition (which replaces every earlier cut), so
    together they can leave no connected majority for a while: safety must hold
    throughout, progress only after the final heal. Slow nodes and loss bursts come and go.
    """
    rng = random.Random(seed)
    f = (n - 1) // 2
    ms = seconds * 1000
    t = rng.uniform(0.05, 0.15) * ms
    end = 0.7 * ms
    down: list[int] = []
    out: list[tuple] = []
    while t < end:
        kind = rng.choice(["crash", "restart", "partition", "isolate", "heal", "loss", "slow", "cut"])
        if kind == "crash" and len(down) < f:
            victim = rng.choice([r for r in range(n) if r not in down])
            down.append(victim)
            out.append((round(t, 3), "crash", victim))
        elif kind == "restart" and down:
            victim = down.pop(rng.randrange(len(down)))
            out.append((round(t, 3), "restart", victim))
        elif kind == "partition":
            nodes = list(range(n))
            rng.shuffle(nodes)
            minority = nodes[: rng.randint(1, f)]
            majority = nodes[len(minority) :]
            out.append((round(t, 3), "partition", (tuple(sorted(majority)), tuple(sorted(minority)))))
        elif kind == "isolate":
            out.append((round(t, 3), "isolate", rng.randrange(n)))
        elif kind == "cut":
            a, b = rng.sample(range(n), 2)
            out.append((round(t, 3), "cut", a, b))
        elif kind == "heal":
            out.append((round(t, 3), "heal"))
        elif kind == "loss":
            out.append((round(t, 3), "loss", rng.choice([0.0, 0.05, 0.2])))
        elif kind == "slow":
            out.append((round(t, 3), "slow", rng.randrange(n), rng.choice([1.0, 5.0, 50.0])))
        t += rng.uniform(0.05, 0.2) * ms
    out.append((round(end, 3), "heal"))
    out.append((round(end, 3), "loss", 0.0))
    for r in range(n):
        out.append((round(end, 3), "slow", r, 1.0))
    for victim in down:
        out.append((round(end, 3), "restart", victim))
    return out
