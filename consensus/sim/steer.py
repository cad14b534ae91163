"""Steered fault search: a role-aware nemesis over short seeded simulations.

The swarm search (``search.py``) draws a whole fault schedule up front, blind to what
the cluster does; the four safety bugs of issue 9 each need a fault to hit *the
replica that holds a role at that moment* (the sequencer serving on a lease, a
command leader with instances in flight), which a blind schedule rarely does. Here a
Jepsen-style nemesis runs *inside* the simulation: every few milliseconds of
simulated time it reads the replicas' state (who is sequencer now, who is a
candidate, who has C-instances in flight) and applies one fault of a randomly chosen
family to whoever holds the role then. Nothing here knows a bug's schedule; the
families are the generic ones of Jepsen's and TigerBeetle's nemeses:

- ``isolate-seq``: cut the current sequencer off from everyone, then heal;
- ``halves``: a minority (one or two replicas) cut from the majority, the
  sequencer in the minority half the time (Jepsen's random halves);
- ``bridge``: a non-sequencer B stays connected to both sides, the sequencer's
  side and the rest cannot talk (Jepsen's bridge, built around the sequencer);
- ``cut-isolate``: a bridge first, then (a fraction of a lease later) the
  sequencer of that moment isolated as well (a composition);
- ``oneway``: one direction of one link cut (A→B dropped, B→A delivered), one end
  the sequencer half the time;
- ``flap``: a link (or the sequencer's links) cut and healed at short random
  intervals for a while (a flaky link);
- ``crash``: crash a replica (the sequencer, a command leader with instances in
  flight, or anyone) and restart it, often within the lease window;
- ``drop-accepts``: one replica's C-accepts (with or without the C-commits) or
  O-accepts dropped for a while: those coming into one replica (the sequencer
  now, or another), or those a command leader sends;
- ``drop-requests``: a command leader's C-requests to the sequencer dropped;
- ``loss``: a burst of random loss (5–50 %).

Each run (swarm testing) enables a random subset of the families and draws its
cluster (N=3 or 5; SDPaxos), its network (``NETS``: LAN, a slow LAN whose jitter
makes a protocol round last about as long as a fault, or the paper's regions) and
timers, a short load of puts, gets and compare-and-sets on one or two keys (30-80 %
gets: a get at the sequencer is a lease read), 1-3 clients per replica, and client
timeouts of half a timer to four; the nemesis acts over the first 70 % of the run
and heals everything then.

Coverage-guided mode (``--guided``, ``Coverage``): the run is observed every tick
and ``signals`` names rare protocol states present (a replica joined a view while
its lease promise to another sequencer runs; a lease holder behind a higher view; a
command leader holding its own instance at a recoverer's ballot; a re-prepare; a
peer recovery; a new sequencer behind the last serving view). After each seed's
run, its rarest signal (seen in the fewest runs so far) becomes a fork point: the
run is re-executed up to that observation (or a little before it) and continued
with other nemesis, step-clock and network draws, ``--branches`` times. A branch is
named ``(observation, branch)`` and replays with ``--fork``.

Checks (``check_run``): the simulator's (one executed sequence, per-slot agreement,
no acknowledged write lost or applied twice, results as replayed), linearizability of
the history (``jepsen_like``, KV model), liveness after the heal, two ghost checks
over every replica incarnation that ever lived (one value per committed C-instance,
one command leader per committed O-slot) and *probe reads*: at every observation,
what a lease read of each key would answer at once at a replica holding a valid
lease, judged at the end against the writes acknowledged before it (no client
needs to be reading at that instant; the probe changes nothing).

Everything is a function of (seed, options): ``--replay SEED`` with the same options
re-runs a failure bit for bit, and every failure prints that command. See
``docs/steered-search.md``.

    python3 -m consensus.sim.steer --seed 1 --runs 2000 --budget-seconds 300 [--guided]
    python3 -m consensus.sim.steer --replay 1234 [--fork 57:3] [--replicas 5] [--families ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field

from consensus.core.config import ballot_owner
from consensus.core.executor import Executor

from .simulator import _FAULT, SimConfig, Simulation

FAMILIES = (
    "isolate-seq", "halves", "bridge", "cut-isolate", "oneway", "flap", "crash", "drop-accepts", "drop-requests", "loss",
)


@dataclass
class Options:
    """What a campaign varies; each run draws the rest from its seed."""

    replicas: tuple = (3, 5)
    families: tuple = FAMILIES
    # Probability that each family is enabled in a run (swarm testing); at least one is.
    family_p: float = 0.5
    check_liveness: bool = True
    lin_timeout_s: float = 10.0

    def argv(self) -> list[str]:
        out = []
        if tuple(self.replicas) != (3, 5):
            out += ["--replicas", ",".join(map(str, self.replicas))]
        if tuple(self.families) != FAMILIES:
            out += ["--families", ",".join(self.families)]
        if self.family_p != 0.5:
            out += ["--family-p", str(self.family_p)]
        if not self.check_liveness:
            out.append("--no-liveness")
        return out


@dataclass
class Plan:
    """One run, drawn from its seed: the cluster, the workload, the nemesis."""

    seed: int
    cfg: SimConfig
    families: list
    timer_ms: float
    net: str = "lan"
    step_ms: tuple = (0.1, 0.6)  # nemesis step, in timers
    log: list = field(default_factory=list)  # what the nemesis did: (ms, action, detail)


# Delay models: "lan" (0.1 ms one way, up to 0.5-1 ms jitter, timers 20-60 ms: a
# protocol round is far shorter than a nemesis step), "slow-lan" (up to 2-8 ms of
# jitter, so rounds last as long as a fault does and messages overtake each other),
# "geo" (the paper's regions, 10-115 ms one way, timers 300-500 ms).
NETS = ("lan", "slow-lan", "geo")


def plan_run(seed: int, opts: Options) -> Plan:
    rng = random.Random(seed)
    n = rng.choice(list(opts.replicas))
    net = rng.choice(NETS)
    if net == "geo":
        # Timers above the longest round trip (229 ms with N=5): below it a resend
        # or re-prepare times out before any answer can come back (no progress).
        timer_ms = rng.choice((300.0, 400.0, 500.0))
        seconds = rng.choice((3.0, 4.0))
        jitter, jitter_min = rng.choice((0.2, 0.5)), 0.0
    else:
        timer_ms = rng.choice((20.0, 40.0, 60.0))
        seconds = rng.choice((0.3, 0.5, 0.8))
        jitter = rng.choice((0.5, 1.5))
        jitter_min = rng.choice((0.0, 0.5, 1.0)) if net == "lan" else rng.choice((2.0, 4.0, 8.0))
    tick_ms = timer_ms / 20
    families = [f for f in opts.families if rng.random() < opts.family_p] or [rng.choice(list(opts.families))]
    skew: tuple = ()
    if rng.random() < 0.5:
        skew = tuple(round(rng.uniform(-0.024, 0.024), 4) for _ in range(n))
    cfg = SimConfig(
        protocol="sdpaxos",
        replicas=n,
        rtt="geo" if net == "geo" else "lan",
        sequencer=rng.randrange(n),
        # A LAN run commits thousands of commands a second: one client per site there.
        clients_per_site=1 if net == "lan" else rng.randint(1, 3),
        seconds=seconds,
        seed=rng.getrandbits(32),
        batch=rng.choice((1, 4)),
        inflight=rng.choice((2, 8)),
        tick_ms=tick_ms,
        resend_ms=timer_ms,
        heartbeat_ms=timer_ms,
        ping_ms=timer_ms / 5,
        lease_ms=timer_ms,
        recovery_ms=timer_ms,
        jitter=jitter,
        jitter_ms_min=jitter_min,
        loss=rng.choice((0.0, 0.0, 0.02)),
        dup=rng.choice((0.0, 0.02)),
        read_fraction=rng.choice((0.3, 0.5, 0.8)),
        cas_fraction=rng.choice((0.1, 0.2)),
        keys=rng.randint(1, 2),
        client_timeout_ms=rng.choice((0.5, 1.0, 2.0, 4.0)) * timer_ms,
        tick_skew=skew,
        drain_seconds=max(5.0, 20 * timer_ms / 1000),
    )
    return Plan(seed, cfg, families, timer_ms, net=net)


# --- the nemesis --------------------------------------------------------------------------


def roles(sim: Simulation) -> dict:
    """Who holds which role now, read from the live replicas."""
    live = [i for i in range(sim.n) if sim.nodes[i] is not None and i not in sim._paused]
    seqs = [i for i in live if sim.nodes[i].sequencer == i and sim.nodes[i].phase in ("normal", "recovering")]
    # Several may think they serve (an old one cut off): the highest view is "now".
    seq = max(seqs, key=lambda i: sim.nodes[i].view) if seqs else None
    if seq is None and live:
        views = [sim.nodes[i].view for i in live]
        top = max(views)
        owner = next(sim.nodes[i].sequencer for i in live if sim.nodes[i].view == top)
        seq = owner if owner in live else None
    return {
        "live": live,
        "sequencer": seq,
        "candidates": [i for i in live if sim.nodes[i].phase == "candidate"],
        "leaders": [i for i in live if sim.nodes[i].unready],  # C-instances in flight
        "down": [i for i in range(sim.n) if sim.nodes[i] is None],
    }


class Nemesis:
    """Applies faults through the simulator's own fault actions. A fault's end (heal,
    restart, undrop) is scheduled in the simulator's event queue at its exact time;
    composed faults that name a role later (``cut-isolate``) resolve it at the next
    nemesis step after their time."""

    def __init__(self, plan: Plan, rng: random.Random) -> None:
        self.plan = plan
        self.rng = rng
        self.n = plan.cfg.replicas
        self.f = (self.n - 1) // 2
        self.later: list[tuple[float, float]] = []  # (ms, span): isolate the sequencer then
        self.end = 0.7 * plan.cfg.seconds * 1000

    def _do(self, sim: Simulation, t: float, action: tuple, note: str = "") -> None:
        sim._apply_fault(action)
        self.plan.log.append((round(t, 3), action, note))

    def _at(self, sim: Simulation, t: float, action: tuple, note: str = "") -> None:
        t = min(t, self.end)  # the heal at the end of the fault phase comes after
        sim._push(int(t * 1000), _FAULT, action, 0)
        self.plan.log.append((round(t, 3), action, note or "scheduled"))

    def due(self, sim: Simulation, t: float) -> None:
        keep = []
        for when, span in self.later:
            if when > t:
                keep.append((when, span))
                continue
            seq = roles(sim)["sequencer"]
            if seq is not None:
                links = _links_of(self.n, seq)
                self._do(sim, t, ("block", links), f"isolate sequencer R{seq} (cut-isolate)")
                self._at(sim, t + span, ("unblock", links), f"heal R{seq}")
        self.later = keep

    def step(self, sim: Simulation, t: float) -> None:
        rng = self.rng
        r = roles(sim)
        fam = rng.choice(self.plan.families)
        timer = self.plan.timer_ms
        span = rng.uniform(0.3, 3.0) * timer
        seq = r["sequencer"]
        others = [i for i in range(self.n) if i != seq]
        if fam == "isolate-seq" and seq is not None:
            links = _links_of(self.n, seq)
            self._do(sim, t, ("block", links), f"isolate sequencer R{seq}")
            self._at(sim, t + span, ("unblock", links), f"heal R{seq}")
        elif fam == "halves":
            # A minority cut from the majority; the sequencer in the minority half the time.
            nodes = list(range(self.n))
            rng.shuffle(nodes)
            minority = set(nodes[: rng.randint(1, self.f)])
            if seq is not None and rng.random() < 0.5 and seq not in minority:
                minority.pop()
                minority.add(seq)
            links = tuple((a, b) for a in range(self.n) for b in range(self.n) if (a in minority) != (b in minority))
            self._do(sim, t, ("block", links), f"partition {sorted(minority)} from the rest")
            self._at(sim, t + span, ("unblock", links), "heal partition")
        elif fam in ("bridge", "cut-isolate") and seq is not None:
            links = _bridge(rng, self.n, seq)
            self._do(sim, t, ("block", links), f"bridge around sequencer R{seq}")
            self._at(sim, t + span, ("unblock", links), "heal bridge")
            if fam == "cut-isolate":
                self.later.append((t + rng.uniform(0.2, 1.5) * timer, rng.uniform(0.5, 3.0) * timer))
        elif fam == "oneway":
            if seq is not None and rng.random() < 0.5:
                peer = rng.choice(others)
                a, b = (seq, peer) if rng.random() < 0.5 else (peer, seq)
            else:
                a, b = rng.sample(range(self.n), 2)
            self._do(sim, t, ("cut", a, b), f"cut R{a}->R{b}")
            self._at(sim, t + span, ("uncut", a, b))
        elif fam == "flap":
            # A flaky link set: cut and healed at short random intervals for a while.
            if seq is not None and rng.random() < 0.5:
                links = _links_of(self.n, seq) if rng.random() < 0.5 else ((seq, rng.choice(others)),)
            else:
                a, b = rng.sample(range(self.n), 2)
                links = ((a, b), (b, a)) if rng.random() < 0.5 else ((a, b),)
            u, stop, on = t, t + span, True
            self.plan.log.append((round(t, 3), ("flap", links), f"until {stop:.1f}"))
            stop = min(stop, self.end)
            while u < stop:
                sim._push(int(u * 1000), _FAULT, ("block" if on else "unblock", links), 0)
                u += rng.uniform(0.02, 0.2) * timer
                on = not on
            sim._push(int(min(u, self.end) * 1000), _FAULT, ("unblock", links), 0)
        elif fam == "crash":
            if len(r["down"]) >= self.f:
                return
            pick = rng.random()
            pool = r["live"]
            if pick < 0.35 and seq is not None and seq in pool:
                victim, why = seq, "sequencer"
            elif pick < 0.7 and r["leaders"]:
                victim, why = rng.choice(r["leaders"]), "command leader"
            elif pool:
                victim, why = rng.choice(pool), "replica"
            else:
                return
            self._do(sim, t, ("crash", victim), f"crash {why} R{victim}")
            # Half the time back within the lease (a promise it no longer remembers).
            back = rng.uniform(0.2, 1.0) * timer if rng.random() < 0.5 else rng.uniform(1.0, 5.0) * timer
            self._at(sim, t + back, ("restart", victim))
        elif fam == "drop-accepts":
            names = rng.choice((("CAccept",), ("CAccept", "CCommit"), ("OAccept",)))
            if rng.random() < 0.6:
                # Into one replica: the sequencer now, or another one.
                target = seq if seq is not None and rng.random() < 0.4 else rng.choice(others or [0])
                specs = [(name, -1, target) for name in names]
                note = f"drop {'+'.join(names)} into R{target}"
            else:
                src = rng.choice(r["leaders"] or list(range(self.n)))
                specs = [(name, src, -1) for name in names]  # out of one (command) leader
                note = f"drop {'+'.join(names)} from R{src}"
            for spec in specs:
                self._do(sim, t, ("drop",) + spec, note)
                self._at(sim, t + span, ("undrop",) + spec)
        elif fam == "drop-requests" and seq is not None:
            src = rng.choice(r["leaders"] or others) if others else seq
            spec = ("CRequest", src, seq)
            self._do(sim, t, ("drop",) + spec)
            self._at(sim, t + span, ("undrop",) + spec)
        elif fam == "loss":
            self._do(sim, t, ("loss", rng.choice((0.05, 0.2, 0.5))))
            self._at(sim, t + span, ("loss", 0.0))


# --- coverage: rare states, read from the replicas ---------------------------------------

SIGNALS = ("promise-elsewhere", "stale-lease", "foreign-ballot", "re-prepare", "peer-recovery", "hidden-view")


def signals(sim: Simulation) -> set:
    """Rare protocol states present now (coverage for the guided mode). Each is a
    general situation a view change or a recovery passes through, not a schedule:

    - ``promise-elsewhere``: a replica joined a view whose sequencer is not the one
      its running lease promise is to;
    - ``stale-lease``: a replica holds a valid sequencer lease while a live replica
      is in a higher view;
    - ``foreign-ballot``: a command leader holds one of its own in-flight instances
      at another replica's (a recoverer's) ballot;
    - ``re-prepare``: a command leader re-prepares its own instances;
    - ``peer-recovery``: a replica recovers another leader's instances;
    - ``hidden-view``: a candidate or recovering sequencer knows of an older last
      serving view (``o_view``) than some live replica.
    """
    out = set()
    live = [r for r in sim.nodes if r is not None]
    if not live:
        return out
    top_view = max(r.view for r in live)
    top_oview = max(r.o_view for r in live)
    for r in live:
        if r.now < r.lease_until and r.lease_to >= 0 and r.lease_to != r.sequencer:
            out.add("promise-elsewhere")
        if r.lease_valid() and r.view < top_view:
            out.add("stale-lease")
        if any(ballot_owner(c.ballot) != r.id for c in r.unready.values()):
            out.add("foreign-ballot")
        if r.crec:
            out.add("re-prepare" if r.id in r.crec else "peer-recovery")
        if r.sequencer == r.id and r.phase in ("candidate", "recovering") and r.o_view < top_oview:
            out.add("hidden-view")
    return out


def _links_of(n: int, node: int) -> tuple:
    return tuple((a, b) for a in range(n) for b in range(n) if a != b and node in (a, b))


def _bridge(rng: random.Random, n: int, seq: int) -> tuple:
    """Links cut for a bridge: the sequencer's side and the rest cannot talk, one
    non-sequencer (the bridge) talks to both."""
    others = [i for i in range(n) if i != seq]
    rng.shuffle(others)
    bridge, rest = others[0], others[1:]
    side = {seq} | set(rest[: rng.randint(0, (len(rest) - 1) // 2)])
    far = [i for i in rest if i not in side]
    return tuple((a, b) for a in side for b in far) + tuple((b, a) for a in side for b in far)


# --- one run ------------------------------------------------------------------------------


class Run:
    """One run in progress: the simulation, the nemesis and two clocks. The run is
    *observed* every tick (``index`` counts observations; coverage reads the replicas
    there) and the nemesis *acts* at random steps of 0.1-0.6 timers. A run can
    switch to a *branch* at an observation (``fork``): the nemesis acts right there,
    and from there on the nemesis, the step clock and the network (jitter, loss)
    draw from generators seeded by (seed, observation, branch)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.sim = Simulation(plan.cfg)
        self.rng = random.Random(plan.seed * 7919 + 1)
        self.nemesis = Nemesis(plan, self.rng)
        self.end = 0.7 * plan.cfg.seconds * 1000
        self.t = 0.0
        self.obs_ms = plan.cfg.tick_ms
        self.next_act = self.rng.uniform(0.05, 0.15) * plan.cfg.seconds * 1000
        self.index = 0  # observations made
        self.probes: list[tuple] = []  # (µs, replica, key, value) lease reads probed

    def observe(self) -> bool:
        """Run the simulation one tick on; False once past the fault phase."""
        t = self.t + self.obs_ms
        if t >= self.end:
            return False
        self.t = t
        self.index += 1
        self.sim.run(until_ms=t)
        probe_reads(self.sim, self.probes)
        return True

    def act(self, now: bool = False) -> None:
        self.nemesis.due(self.sim, self.t)
        if now or self.t >= self.next_act:
            self.nemesis.step(self.sim, self.t)
            self.next_act = self.t + self.rng.uniform(*self.plan.step_ms) * self.plan.timer_ms

    def fork(self, branch: int) -> None:
        salt = (self.plan.seed * 1_000_003 + self.index) * 1009 + branch
        self.rng.seed(salt)  # the nemesis shares this generator
        self.sim.net.rng.seed(salt + 1)  # jitter (reordering), loss, duplication
        self.plan.log.append((round(self.t, 3), ("fork", self.index, branch), "branch"))

    def finish(self, opts: Options) -> dict:
        sim = self.sim
        sim.run(until_ms=self.end)
        self.nemesis.due(sim, self.end)
        for action in [("heal",), ("loss", 0.0)] + [("restart", r) for r in range(sim.n)]:
            sim._apply_fault(action)
        self.plan.log.append((round(self.end, 3), ("heal",), "heal all, restart all"))
        sim.run()
        return check_run(sim, opts, stale_probes(sim, self.probes))


def run_plan(plan: Plan, opts: Options, fork: tuple | None = None, on_step=None) -> dict:
    """Run ``plan`` under the nemesis and check it; ``failures`` empty means passed.

    ``fork`` = (observation, branch): switch to that branch there. ``on_step(run)``
    is called at every observation, before the nemesis acts (coverage)."""
    run = Run(plan)
    try:
        while run.observe():
            forked = fork is not None and run.index == fork[0]
            if forked:
                run.fork(fork[1])
            if on_step is not None:
                on_step(run)
            run.act(now=forked)
        return run.finish(opts)
    except Exception as exc:  # SafetyViolation inside the core, or a crash
        return {"failures": [f"exception: {type(exc).__name__}: {exc}"], "sim": run.sim}


def probe_reads(sim: Simulation, out: list) -> None:
    """Probe reads: what a lease read of each key would answer *now* at every replica
    that would answer one at once (a serving sequencer with a valid lease whose
    history table says the key's last write is executed). Pure: nothing is sent,
    nothing changes; judged at the end against the writes acknowledged before."""
    keys = [f"k{i}" for i in range(sim.cfg.keys)]
    for r in sim.nodes:
        if r is None or r.id in sim._paused or not r.lease_valid():
            continue
        for k in keys:
            op = ["get", k]
            slot = r._read_slot(sim._probe.read_key(op))
            if 0 <= slot + 1 <= r.exec_slot and slot < r.exec_slot:
                out.append((sim.now, r.id, k, r.executor.sm.query(op)))


def stale_probes(sim: Simulation, probes: list) -> list[str]:
    """A probe read is stale if it returns a value written before (in the executed
    order) a write on that key that a client saw acknowledged before the probe."""
    if not probes:
        return []
    # Position of each value in the executed order, per key (values are unique).
    pos: dict[tuple, int] = {}
    replay = Executor(sim.new_machine())
    results: list = []
    for k, (_label, ids) in enumerate(sim.canonical_log()):
        if not ids:
            continue
        batch = [[cid, seq, sim.sent_ops.get((cid, seq))] for cid, seq in ids]
        replay.run(batch, results)
        for cid, seq, result, fresh in results:
            op = sim.sent_ops.get((cid, seq))
            if fresh and op is not None and (op[0] == "put" or (op[0] == "cas" and result is True)):
                pos[(op[1], op[-1])] = (k, len(pos))
        results.clear()
    acked: dict[str, list] = {}  # key -> [(ack µs, position)]
    for client in sim.clients.values():
        for _t0, t1, op, result, ok in client.history:
            if ok and (op[0] == "put" or (op[0] == "cas" and result is True)) and (op[1], op[-1]) in pos:
                acked.setdefault(op[1], []).append((t1, pos[(op[1], op[-1])]))
    out = []
    for t, node, k, value in probes:
        floor = max((p for t1, p in acked.get(k, ()) if t1 < t), default=None)
        if floor is None:
            continue
        have = pos.get((k, value), (-1, -1)) if value is not None else (-1, -1)
        if have < floor:
            out.append(f"stale lease read: at {t / 1000:.3f} ms R{node} would answer get {k} -> {value!r}, "
                       f"older than a write acknowledged before")
            break
    return out


def ghost_checks(sim: Simulation) -> list[str]:
    """One value per committed C-instance, one leader per committed O-slot, over every
    incarnation that ever lived (a crashed one keeps the state it died with)."""
    out = []
    chosen: dict[tuple, tuple] = {}
    oslot: dict[int, int] = {}
    for k, rep in enumerate(sim.all_replicas):
        for leader, log in enumerate(getattr(rep, "clog", ())):
            for inst, c in log.items():
                if not c.committed:
                    continue
                value = tuple((x[0], x[1]) for x in c.cmds) if c.cmds else ()
                seen = chosen.setdefault((leader, inst), value)
                if seen != value and len(out) < 3:
                    out.append(f"chosen: C-instance ({leader},{inst}) committed as {list(seen)} and as {list(value)} (R{rep.id})")
        for j, s in getattr(rep, "oslots", {}).items():
            if s.committed:
                seen = oslot.setdefault(j, s.leader)
                if seen != s.leader and len(out) < 3:
                    out.append(f"chosen: O-slot {j} committed for R{seen} and for R{s.leader} (R{rep.id})")
    return out


def quorum_checks(sim: Simulation) -> list[str]:
    """Paxos's invariant behind every C-commit, from the durable records: an instance
    committed at ballot b was accepted at b by a majority (a proposer's tally may not
    mix ballots, and nobody commits on fewer acks). Each replica persists a ``C``
    record before it acks and a ``CC`` record when it learns the commit; the ballot a
    ``CC`` commits is that of the replica's last ``C`` record for the instance. Skipped
    in runs that compacted (snapshots drop records)."""
    if sim.snapshots_taken or getattr(sim, "snapshots_installed", 0):
        return []
    quorum = sim.n // 2 + 1
    accepted: dict[tuple, set] = {}
    learned: dict[tuple, set] = {}  # replicas that knew the instance chosen: they ack any higher ballot unstored
    commits: set = set()
    for node, records in enumerate(sim.disks):
        last: dict[tuple, int] = {}
        for rec in records:
            if type(rec) is not list or not rec:
                continue
            if rec[0] == "C":
                _, leader, inst, ballot, _cmds = rec
                last[(leader, inst)] = ballot
                accepted.setdefault((leader, inst, ballot), set()).add(node)
            elif rec[0] == "CC":
                b = last.get((rec[1], rec[2]))
                learned.setdefault((rec[1], rec[2]), set()).add(node)
                if b is not None:
                    commits.add((rec[1], rec[2], b))
    out = []
    for leader, inst, ballot in sorted(commits):
        who = accepted.get((leader, inst, ballot), set()) | learned.get((leader, inst), set())
        if len(who) < quorum and len(out) < 3:
            out.append(f"quorum: C-instance ({leader},{inst}) committed at ballot {ballot}, "
                       f"accepted at that ballot by {sorted(who)} only")
    return out


def check_run(sim: Simulation, opts: Options, failures: list[str]) -> dict:
    result = sim.summary()
    for name in ("consistent", "agreement"):
        if not result[name]:
            failures.append(name)
    for name in ("lost_acked", "duplicated", "wrong_results"):
        if result[name]:
            failures.append(f"{name}={result[name]}")
    failures += ghost_checks(sim)
    failures += quorum_checks(sim)
    if opts.check_liveness and not sim.quiet():
        failures.append("not live: commands still pending after the heal")
    lin = sim.linearizable(timeout_s=opts.lin_timeout_s)
    if lin is False:
        failures.append("not linearizable")
    result["linearizable"] = lin
    result["failures"] = failures
    result["sim"] = sim
    return result


def replay_command(seed: int, opts: Options, fork: tuple | None = None) -> str:
    out = ["python3 -m consensus.sim.steer --replay", str(seed)]
    if fork is not None:
        out += ["--fork", f"{fork[0]}:{fork[1]}"]
    return " ".join(out + opts.argv())


def run_seed(seed: int, opts: Options, fork: tuple | None = None, on_step=None) -> tuple[Plan, dict]:
    plan = plan_run(seed, opts)
    return plan, run_plan(plan, opts, fork, on_step)


def guided_timer_obs(seed: int, opts: Options) -> int:
    """Observations (ticks) per timer in ``seed``'s run."""
    plan = plan_run(seed, opts)
    return max(1, round(plan.timer_ms / plan.cfg.tick_ms))


class Coverage:
    """Guided mode: how often each signal was seen (one count per run), and where
    a run first showed each. A run's rarest signal (seen in the fewest runs so far,
    below ``cap``) becomes a fork point: ``branches`` continuations are run from its
    first step, each with its own nemesis, step clock and network draws."""

    def __init__(self, branches: int = 8, cap: int = 400) -> None:
        self.branches = branches
        self.cap = cap
        self.count: dict[str, int] = {}

    def watcher(self):
        first: dict[str, int] = {}

        def on_step(run: Run) -> None:
            for sig in signals(run.sim):
                first.setdefault(sig, run.index)

        return first, on_step

    def pick(self, first: dict[str, int]) -> tuple[str, int] | None:
        best = None
        for sig, step in sorted(first.items()):
            seen = self.count.get(sig, 0)
            if seen < self.cap and (best is None or seen < self.count.get(best[0], 0)):
                best = (sig, step)
        for sig in first:
            self.count[sig] = self.count.get(sig, 0) + 1
        return best


def campaign(seeds, opts: Options, budget_s: float | None = None, stop_on_failure: bool = True, echo=None,
             guided: Coverage | None = None) -> dict:
    """Run seeds until the first failure (or all, or the budget); returns a report.
    With ``guided``, each seed's run may be followed by branches from its rarest
    state (``Coverage``); every run and branch counts as one run."""
    start = time.monotonic()
    found: list[dict] = []
    runs = seeds_run = unknown = 0
    first_seed = None
    forks: dict[str, int] = {}

    def judge_one(seed: int, fork: tuple | None, on_step=None) -> dict | None:
        nonlocal runs, unknown
        plan, result = run_seed(seed, opts, fork, on_step)
        runs += 1
        if result.get("linearizable") is None and not result["failures"]:
            unknown += 1
        if not result["failures"]:
            return None
        entry = {
            "seed": seed,
            "fork": list(fork) if fork else None,
            "run": runs,
            "seconds": round(time.monotonic() - start, 2),
            "failures": result["failures"],
            "replicas": plan.cfg.replicas,
            "families": plan.families,
            "replay": replay_command(seed, opts, fork),
        }
        found.append(entry)
        if echo:
            echo(f"FAIL seed {seed}{' fork ' + str(fork) if fork else ''} after {runs} runs, {entry['seconds']} s: "
                 f"{'; '.join(result['failures'])}\n  replay: {entry['replay']}")
        return entry

    def out_of_budget() -> bool:
        return budget_s is not None and time.monotonic() - start > budget_s

    for seed in seeds:
        if first_seed is None:
            first_seed = seed
        if out_of_budget():
            break
        seeds_run += 1
        first, on_step = guided.watcher() if guided else ({}, None)
        if judge_one(seed, None, on_step) and stop_on_failure:
            break
        if guided:
            pick = guided.pick(first)
            if pick is not None:
                sig, step = pick
                forks[sig] = forks.get(sig, 0) + 1
                hit = False
                for b in range(guided.branches):
                    if out_of_budget():
                        break
                    # Half the branches act where the state showed, half re-draw the
                    # stretch that led to it (from a random earlier observation, up
                    # to half a timer before).
                    back = max(1, int(0.5 * guided_timer_obs(seed, opts)))
                    at = step if b % 2 == 0 else max(1, step - 1 - (b * 7919) % back)
                    if judge_one(seed, (at, b)) and stop_on_failure:
                        hit = True
                        break
                if hit:
                    break
        if echo and seeds_run % 25 == 0:
            echo(f"{seeds_run} seeds, {runs} runs, {len(found)} failures, {time.monotonic() - start:.0f} s"
                 + (f", signals {guided.count}" if guided else ""))
    return {
        "first_seed": first_seed,
        "seeds": seeds_run,
        "runs": runs,
        "seconds": round(time.monotonic() - start, 2),
        "failures": found,
        "lin_unknown": unknown,
        "signals": dict(guided.count) if guided else None,
        "forks": forks if guided else None,
        "options": opts.argv(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m consensus.sim.steer", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=None, help="first seed (default: from the clock, printed)")
    p.add_argument("--runs", type=int, default=1000, help="seeds to run at most (1000)")
    p.add_argument("--budget-seconds", type=float, default=None, help="stop after this many wall seconds")
    p.add_argument("--keep-going", action="store_true", help="do not stop at the first failure")
    p.add_argument("--replay", type=int, metavar="SEED", help="run one seed and print what the nemesis did")
    p.add_argument("--replicas", default="3,5", help="cluster sizes to draw from (3,5)")
    p.add_argument("--families", default=",".join(FAMILIES), help="nemesis families to draw from: " + ",".join(FAMILIES))
    p.add_argument("--family-p", type=float, default=0.5, help="probability each family is enabled in a run (0.5)")
    p.add_argument("--no-liveness", action="store_true", help="do not judge liveness after the heal")
    p.add_argument("--guided", action="store_true", help="coverage-guided: branch from each run's rarest state")
    p.add_argument("--branches", type=int, default=8, help="guided: continuations per fork point (8)")
    p.add_argument("--fork", metavar="STEP:BRANCH", help="with --replay: the branch to replay")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = p.parse_args(argv)
    families = tuple(x.strip() for x in args.families.split(",") if x.strip())
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        p.error(f"unknown family {bad[0] if bad else '(none)'} (choose from {', '.join(FAMILIES)})")
    opts = Options(
        replicas=tuple(int(x) for x in args.replicas.split(",")),
        families=families,
        family_p=args.family_p,
        check_liveness=not args.no_liveness,
    )
    fork = tuple(int(x) for x in args.fork.split(":")) if args.fork else None
    if args.replay is not None:
        plan, result = run_seed(args.replay, opts, fork)
        if not args.json:
            print(f"seed {args.replay}: N={plan.cfg.replicas}, families {', '.join(plan.families)}, "
                  f"timer {plan.timer_ms:.0f} ms, {plan.cfg.seconds} s")
            for t, action, note in plan.log:
                print(f"  {t:9.3f} ms  {action!r}{'  # ' + note if note else ''}")
            print(f"config: {plan.cfg!r}")
        out = {k: result.get(k) for k in ("failures", "lost_acked", "duplicated", "linearizable", "view_changes", "committed")}
        print(json.dumps({"seed": args.replay, **out, "replay": replay_command(args.replay, opts, fork)}))
        return 1 if result["failures"] else 0
    first = args.seed if args.seed is not None else int(time.time())
    echo = None if args.json else print
    if echo:
        echo(f"SEED={first} runs={args.runs} {' '.join(opts.argv())}".rstrip())
    guided = Coverage(args.branches) if args.guided else None
    report = campaign(range(first, first + args.runs), opts, args.budget_seconds, not args.keep_going, echo, guided)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['seeds']} seeds ({report['runs']} runs) from seed {first} in {report['seconds']} s: "
              f"{len(report['failures'])} failure(s)")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    from store.machines import install_in_simulator  # the composition root (consensus.sim.registry)

    install_in_simulator()
    sys.exit(main())
