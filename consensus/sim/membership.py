"""A seeded fault search for membership change (docs/membership.md, issue 13).

``consensus.core.epochs.Member`` processes (SDPaxos replicas across epochs) under one
driver, in rounds: messages cross the msgpack codec with random delays, loss and
duplication; processes crash and restart from their durable records (each epoch's log
and the latest epoch base, stored before anything of its epoch); links are cut and
healed; an admin asks for reconfigurations at random moments (grow, shrink, replace,
move the sequencer, new processes from a pool), and closed-loop clients put, get
(through the sequencer lease half the time) and compare-and-set a few keys, retrying
elsewhere on a timeout. Everything is drawn from ``random.Random(seed)``: a failure
replays from its seed (``cellar sim membership --replay SEED``).

A lockstep driver like ``transcript.py``'s, not ``simulator.py``: that one drives a
fixed set of replicas by index; here processes come and go by name.

Judged at the end (after a heal and a drain): every process that closed epoch e
closed it with the same base (members, sequencer, state after END); the members of the
last epoch hold the same state; the client history is linearizable (so no
acknowledged write is lost); and every client command completed (liveness).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from consensus.core.config import ProtocolConfig
from consensus.core.epochs import EpochBase, Member
from consensus.core.executor import RECONFIG
from consensus.core.messages import decode_envelope, encode_envelope
from consensus.core.sdpaxos import SDPaxosReplica

from .registry import machine_factory
from .simulator import kv_history


@dataclass
class MembershipConfig:
    seed: int = 1
    pool: int = 7  # process names r0 .. r{pool-1}
    start: int = 3  # epoch 0: r0 .. r{start-1}, sequencer r0
    rounds: int = 1200  # with faults and reconfigurations
    drain_rounds: int = 1500  # healed, until every client is answered
    clients: int = 4
    keys: int = 3
    reconfigs: int = 3
    crash_p: float = 0.004  # per round
    cut_p: float = 0.003  # per round: cut one process off for a while
    loss: float = 0.0
    dup: float = 0.0
    delay_max: int = 2  # rounds a message may take beyond the next one
    read_fraction: float = 0.3
    cas_fraction: float = 0.2
    client_timeout: int = 40  # rounds
    # Crash the process the admin asked, this many rounds after the ask (-1: never):
    # the proposer of the change dying mid-way.
    kill_asked_after: int = -1
    # ProtocolConfig.defer_execution: members execute their commits after sending them
    # (the runtime's default; docs/runtime.md, "Execution after send").
    defer_execution: bool = False


@dataclass
class _Client:
    name: str
    seq: int = 0
    op: Any = None
    at: str = ""
    sent: int = 0
    started: int = 0
    history: list = field(default_factory=list)  # (invoked round, completed round, op, result)


def protocol_config(delay_max: int) -> ProtocolConfig:
    """Timers in rounds, scaled to the longest round trip (a message takes 1 to
    1 + delay_max rounds): timers shorter than a round trip make recoveries duel."""
    rtt = 2 * (1 + delay_max)
    return ProtocolConfig(n=3, heartbeat_ticks=max(1, rtt // 2), election_ticks=5 * rtt, lease_ticks=2 * rtt,
                          resend_ticks=3 * rtt, recovery_ticks=2 * rtt, measure_rtt=False)


class MembershipSim:
    def __init__(self, cfg: MembershipConfig) -> None:
        self.cfg = cfg
        rng = random.Random(cfg.seed)
        self.rng = random.Random(rng.getrandbits(64))
        self.net_rng = random.Random(rng.getrandbits(64))
        self.new_machine = machine_factory("kv")
        self.pcfg = dataclasses.replace(protocol_config(cfg.delay_max), defer_execution=cfg.defer_execution)
        self.names = [f"r{i}" for i in range(cfg.pool)]
        first = EpochBase(0, tuple(self.names[: cfg.start]), self.names[0])
        # Durable per process: the bases it stored, and each epoch's records.
        self.bases: dict[str, list[EpochBase]] = {n: ([first] if n in first.members else []) for n in self.names}
        self.disks: dict[str, dict[int, list]] = {n: {} for n in self.names}
        self.procs: dict[str, Member | None] = {n: None for n in self.names}
        self.started: set[str] = set()
        self.round = 0
        self._seq = 0
        self.net: list[tuple[int, int, str, str, int, bytes]] = []  # (due, seq, src, dst, epoch, data)
        self.cuts: dict[str, int] = {}  # process -> round its links heal
        self.down: dict[str, int] = {}  # process -> round it restarts
        self.closed: dict[int, set] = {}  # epoch -> distinct bases its closers computed
        self.clients = [_Client(f"c{i}") for i in range(cfg.clients)]
        self.admin = _Client("admin")
        self.asks = sorted(self.rng.randrange(50, int(cfg.rounds * 0.7)) for _ in range(cfg.reconfigs))
        self.answers: list = []  # the admin's results
        self._kills: list[tuple[int, str]] = []  # (round, process): planned crashes
        for n in first.members:
            self._start(n)

    # --- processes ----------------------------------------------------------------------

    def _replica(self, name: str):
        def make(index, pcfg, snapshot, records):
            rng = random.Random(self.rng.getrandbits(64))  # drawn in a replayable order
            return SDPaxosReplica(index, pcfg, self.new_machine(), records=records, rng=rng, snapshot=snapshot)
        return make

    def _start(self, name: str) -> None:
        bases = self.bases[name]
        base = bases[-1] if bases else None
        records = self.disks[name].get(base.epoch) if base is not None else None
        self.procs[name] = Member(name, base, self.pcfg, self._replica(name), records=list(records) if records else None)
        self.started.add(name)
        self._drain(name)

    def _store_base(self, name: str, base: EpochBase) -> None:
        self.bases[name].append(base)
        self.disks[name].setdefault(base.epoch, [])

    def _drain(self, name: str) -> None:
        m = self.procs[name]
        for _ in range(1000):
            if m.want_base is not None:
                peer, m.want_base = self.procs.get(m.want_base), None
                if peer is not None and peer.base.epoch > m.epoch and self._reachable(peer.name, name):
                    self._store_base(name, peer.base)  # durable before the new epoch acts
                    m.adopt(peer.base)
            for dst, epoch, msgs in m.notices():
                self._send(name, dst, epoch, msgs)
            if m.inner is None:
                return
            rd = m.inner.ready(sync=True)
            if rd.persist:
                self.disks[name].setdefault(m.epoch, []).extend(rd.persist)
            for dst, epoch, msgs in m.address(rd.urgent + rd.messages):
                self._send(name, dst, epoch, msgs)
            for rp in rd.replies:
                if rp.ok:
                    self._answer(rp.client, rp.seq, rp.result)
            if rd.epoch_end is None:
                if m.inner.execute_due:  # sent: now execute, and carry out what that gives
                    m.inner.execute()
                    continue
                return
            base = m.close(rd.epoch_end)
            self.closed.setdefault(base.epoch - 1, set()).add((base.members, base.sequencer, base.state))
            self._store_base(name, base)
            m.enter(base)

    def _reachable(self, a: str, b: str) -> bool:
        return a not in self.cuts and b not in self.cuts

    def _send(self, src: str, dst: str, epoch: int, msgs: list) -> None:
        rng = self.net_rng
        if rng.random() < self.cfg.loss:
            return
        copies = 2 if rng.random() < self.cfg.dup else 1
        data = encode_envelope(0, msgs)
        for _ in range(copies):
            self._seq += 1
            self.net.append((self.round + 1 + rng.randint(0, self.cfg.delay_max), self._seq, src, dst, epoch, data))

    # --- clients ------------------------------------------------------------------------

    def _serving(self) -> list[str]:
        return [n for n, m in self.procs.items() if m is not None and not m.removed and m.inner is not None]

    def _submit(self, c: _Client) -> None:
        live = self._serving()
        if not live:
            return
        options = [n for n in live if n != c.at] or live
        c.at = self.rng.choice(options)
        c.sent = self.round
        inner = self.procs[c.at].inner
        op = c.op
        if op[0] == RECONFIG:
            op = [RECONFIG, self.procs[c.at].epoch, op[2], op[3]]  # the epoch the asked process is in
            c.op = op
        if op[0] == "get" and self.rng.random() < 0.5:
            inner.read(c.name, c.seq, op, op[1])
        else:
            inner.propose(c.name, c.seq, op, needs_result=op[0] != "put")
        self._drain(c.at)

    def _answer(self, client: str, seq: int, result: Any) -> None:
        c = self.admin if client == "admin" else next((x for x in self.clients if x.name == client), None)
        if c is None or c.op is None or seq != c.seq:
            return
        c.history.append((c.started, self.round, c.op, result))
        if c is self.admin:
            self.answers.append(result)
        c.op = None

    def _client_round(self, load: bool) -> None:
        rng = self.rng
        for c in self.clients:
            if c.op is None and load:
                c.seq += 1
                key = f"k{rng.randrange(self.cfg.keys)}"
                r = rng.random()
                if r < self.cfg.read_fraction:
                    c.op = ["get", key]
                elif r < self.cfg.read_fraction + self.cfg.cas_fraction:
                    seen = [h[3] for h in c.history if h[2][0] == "get" and h[2][1] == key]
                    c.op = ["cas", key, seen[-1] if seen else None, f"{c.name}:{c.seq}"]
                else:
                    c.op = ["put", key, f"{c.name}:{c.seq}"]
                c.started = self.round
                self._submit(c)
            elif c.op is not None and self.round - c.sent >= self.cfg.client_timeout:
                self._submit(c)  # the same command elsewhere (sessions drop a duplicate)
        a = self.admin
        if a.op is not None and self.round - a.sent >= self.cfg.client_timeout:
            if self.round - a.started > 10 * self.cfg.client_timeout:
                a.history.append((a.started, None, a.op, None))
                a.op = None  # give up: it may or may not happen
            else:
                self._submit(a)
        if load and a.op is None and self.asks and self.round >= self.asks[0]:
            self.asks.pop(0)
            size = rng.choice((3, 3, 5))
            members = rng.sample(self.names, size)
            for n in members:
                if n not in self.started and n not in self.down:
                    self._start(n)  # a new, empty process (the operator starts it first)
            a.seq += 1
            a.op = [RECONFIG, -1, members, rng.choice(members)]
            a.started = self.round
            self._submit(a)
            if self.cfg.kill_asked_after >= 0 and a.at:
                self._kills.append((self.round + self.cfg.kill_asked_after, a.at))

    # --- faults ---------------------------------------------------------------------------

    def _fault_round(self) -> None:
        rng = self.rng
        for n in [n for n, back in self.down.items() if back <= self.round]:
            del self.down[n]
            self._start(n)
        for n in [n for n, back in self.cuts.items() if back <= self.round]:
            del self.cuts[n]
        live = sorted(n for n in self.started if self.procs[n] is not None)
        victims = [n for t, n in self._kills if t <= self.round and self.procs[n] is not None]
        self._kills = [(t, n) for t, n in self._kills if t > self.round]
        if live and rng.random() < self.cfg.crash_p:
            victims.append(rng.choice(live))
        for victim in victims:
            self.procs[victim] = None  # volatile state lost; disks and bases stay
            self.down[victim] = self.round + rng.randint(5, 80)
        if live and rng.random() < self.cfg.cut_p:
            self.cuts[rng.choice(live)] = self.round + rng.randint(5, 80)

    # --- the run ------------------------------------------------------------------------

    def step_round(self, load: bool, faults: bool) -> None:
        self.round += 1
        due = [x for x in self.net if x[0] <= self.round]
        if due:
            self.net = [x for x in self.net if x[0] > self.round]
            for _t, _s, src, dst, epoch, data in sorted(due):
                m = self.procs.get(dst)
                if m is None or not self._reachable(src, dst):
                    continue
                _i, msgs = decode_envelope(data)
                m.step(src, epoch, msgs)
                self._drain(dst)
        for n in sorted(self.procs):
            m = self.procs[n]
            if m is not None:
                if m.epoch < 0 and self.round % 20 == 0:
                    m.want_base = self.rng.choice([x for x in self.names if x != n])  # a join: ask someone
                m.tick()
                self._drain(n)
        if faults:
            self._fault_round()
        self._client_round(load)

    def run(self) -> "MembershipSim":
        for _ in range(self.cfg.rounds):
            self.step_round(load=True, faults=True)
        self.cuts = {}
        for n in list(self.down):
            del self.down[n]
            self._start(n)
        for _ in range(self.cfg.drain_rounds):
            self.step_round(load=False, faults=False)
            if self.quiet():
                break
        return self

    def final(self) -> EpochBase:
        """The newest configuration any process stored."""
        return max((b[-1] for b in self.bases.values() if b), key=lambda b: b.epoch)

    def quiet(self) -> bool:
        """Every client answered, and every member of the newest configuration in it,
        serving one sequencer, idle, at one execution point."""
        if any(c.op is not None for c in self.clients) or self.admin.op is not None:
            return False
        final = self.final()
        members = [self.procs[n] for n in final.members]
        if any(m is None or m.epoch != final.epoch or m.inner is None for m in members):
            return False
        inner = [m.inner for m in members]
        if not all(r.idle() and r.phase == "normal" for r in inner) or len({r.sequencer for r in inner}) != 1:
            return False
        return len({r.exec_slot for r in inner}) == 1

    # --- judging ---------------------------------------------------------------------------

    def history_ops(self) -> list:
        events = []
        for c in self.clients:
            for t0, t1, op, result in c.history:
                events.append((t0, 1, c.name, op, None))
                events.append((t1, 0, c.name, op, result))
            if c.op is not None:
                events.append((c.started, 1, c.name, c.op, None))
                events.append((10**9, 2, c.name, c.op, None))
        return kv_history(events, self.round)

    def judge(self) -> dict:
        from jepsen_like.checker import check
        from jepsen_like.models import KV

        failures = []
        for epoch, bases in sorted(self.closed.items()):
            if len(bases) != 1:
                failures.append(f"epoch {epoch} closed {len(bases)} different ways")
        final = self.final()
        last = final.epoch
        members = [m for m in (self.procs[n] for n in final.members) if m is not None and m.epoch == last and m.inner is not None]
        states = {m.inner.executor.snapshot() for m in members}
        if len(states) > 1:
            failures.append(f"the {len(members)} members of epoch {last} hold {len(states)} different states")
        if not self.quiet():
            failures.append("not live: commands unanswered after the heal")
        lin = check(self.history_ops(), KV(), timeout_s=30.0).linearizable
        if lin is not True:
            failures.append("not linearizable" if lin is False else "linearizability unknown")
        ok_asks = sum(1 for a in self.answers if type(a) is dict and a.get("ok"))
        return {"seed": self.cfg.seed, "failures": failures, "epochs": last, "reconfigs_ok": ok_asks,
                "answered": sum(len(c.history) for c in self.clients), "rounds": self.round,
                "members": sorted(m.name for m in members)}


def swarm_membership(seed: int, defer_execution: bool = False) -> MembershipConfig:
    """Every knob drawn from the seed (swarm testing: each run its own mix); execution
    after send is the caller's choice (``cellar sim membership --execute-after-send``),
    so that a seed's run stays what it was."""
    rng = random.Random(seed)
    return MembershipConfig(
        seed=rng.getrandbits(32),
        start=rng.choice((3, 3, 5)),
        reconfigs=rng.choice((2, 3, 5)),
        clients=rng.choice((2, 4)),
        keys=rng.choice((1, 3)),
        crash_p=rng.choice((0.0, 0.003, 0.01)),
        cut_p=rng.choice((0.0, 0.003, 0.01)),
        loss=rng.choice((0.0, 0.02, 0.1)),
        dup=rng.choice((0.0, 0.05)),
        delay_max=rng.choice((0, 1, 3)),
        kill_asked_after=rng.choice((-1, -1, 0, 3, 10)),
        defer_execution=defer_execution,
    )


def judge_seed(seed: int, defer_execution: bool = False) -> dict:
    result = MembershipSim(swarm_membership(seed, defer_execution)).run().judge()
    result["seed"] = seed
    return result


def search(seeds, echo=None) -> list[dict]:
    found = []
    for count, seed in enumerate(seeds, 1):
        result = judge_seed(seed)
        if result["failures"]:
            found.append(result)
            if echo:
                echo(f"FAIL seed {seed}: {', '.join(result['failures'])}")
        elif echo and count % 20 == 0:
            echo(f"{count} runs, {len(found)} failures")
    return found
