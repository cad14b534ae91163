"""A bounded exhaustive explorer that runs the real replicas (a stateless-model-checker
in the spirit of TLC and CHESS, over the implementation instead of a spec).

It builds the real ``SDPaxosReplica`` or ``MultiPaxosReplica`` objects (N = 3 or 5),
gives a few replicas one client command each (puts, a get, a compare-and-set), and
explores every schedule of the following *actions* up to a depth:

- ``deliver src dst h``: deliver any in-flight envelope (not only the oldest one:
  reordering), identified by its bytes' hash ``h``;
- ``drop src dst h`` and ``dup src dst h`` (deliver and keep it in flight), each
  within a budget;
- ``tick``: one unit of time passes at every live replica (lockstep: the sequencer
  lease relies on bounded clock drift, so clocks never drift here);
- ``crash r`` (at most ``max_crashes``, default one) and ``restart r``: the replica
  object is thrown away and rebuilt from its durable records, as the simulator does;
- ``invoke k``: client command ``k`` reaches its replica (``propose`` or ``read``);
  ``retry k r``: the client resends it to another replica after its own crashed.

Every message crosses the msgpack codec. Between actions each touched replica's
``ready()`` is carried out: records to its disk, messages into the network, replies
to the clients (at once: a reply that travelled longer would only make the history
easier to linearize), executed batches into the checks.

Checks. After every action (safety): no two replicas (or incarnations) executed
different batches at one log slot, committed different values in one C-instance or
O-slot (SDPaxos) or log slot (Multi-Paxos), or hold different states at the same
execution point; an exception from the core (its ``SafetyViolation`` included) is a
violation too. At every leaf — the depth bound, or no action left — the explorer
*stabilizes*: restarts a crashed replica, invokes the commands not yet invoked,
heals the network and delivers everything in order, ticking (clients resend after a
timeout) until the cluster is quiet. Then: every acknowledged write or CAS is in the
executed log, exactly once, with the result the client saw; the client history is
linearizable (``jepsen_like``'s checker, KV model); and the cluster went quiet at all
(liveness: an unhealed cluster that never converges is reported as such).

Pruning. Each state has a canonical digest: every replica's protocol fields walked
in a fixed order (dicts sorted by key; counters, metrics and the timing-only fields
of straggler detection left out), the in-flight multiset, the used budgets, the
client events in order and the chosen values seen so far; disks count only while a
crash may still read them. A state already reached at the same or a smaller depth is
not expanded again. Identical envelopes on one link are merged while in flight (the
``dup`` action restores the second copy). To branch, replicas are kept as pickles
and only the ones an action touches are unpickled (``measure_copy`` compares that
with ``copy.deepcopy``: pickling is about four times faster).

Randomness inside the core (election jitter, recovery back-off) comes from a tiny
counter-based generator whose state is part of the digest: its draws are fixed by the
path, not explored as choices. Straggler detection is switched off (its window never
ends) and compaction is not exercised.

Counterexamples are traces: a list of actions, printed one per line, saved as JSON
(``--save-trace``) and re-executed deterministically by ``replay`` (``--replay``).

Run ``python3 -m consensus.sim.explorer --replicas 3 --protocol sdpaxos --depth 12
--budget-states 20000`` (exhaustive) or ``--walks 200 --seed 1 --depth 150`` (seeded
random walks for deeper traces; ``--steer`` for steered walks: role-aware and typed
fault phases, forks at rare states, probe reads and the quorum check, see the
"steered walks" section below). See ``docs/explorer.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import pickle
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable

import msgpack

from consensus.core.config import ProtocolConfig, ballot_owner, ballot_round
from consensus.core.executor import Executor
from consensus.core.messages import decode_envelope, encode_envelope
from consensus.core.multipaxos import MultiPaxosReplica
from consensus.core.sdpaxos import SDPaxosReplica
from consensus.sim.registry import machine_factory

PROTOCOLS = {"sdpaxos": SDPaxosReplica, "multipaxos": MultiPaxosReplica}

# Client ids: command k is sent by client CLIENT_BASE + k (sequence number 1).
CLIENT_BASE = 100

# Named workloads: (replica, op) per command. Replica 0 is the first sequencer
# (leader), so the get there is a lease read; the writes come from the others.
WORKLOADS: dict[str, list[tuple[int, list]]] = {
    "wwr": [(1, ["put", "x", "a"]), (2, ["put", "x", "b"]), (0, ["get", "x"])],
    "wcr": [(1, ["put", "x", "a"]), (2, ["cas", "x", "a", "c"]), (0, ["get", "x"])],
    "wr": [(1, ["put", "x", "a"]), (0, ["get", "x"])],
    "ww": [(1, ["put", "x", "a"]), (2, ["put", "x", "b"])],
    "wc": [(1, ["put", "x", "a"]), (2, ["cas", "x", "a", "c"])],
    "rw": [(2, ["put", "x", "a"]), (0, ["get", "x"]), (1, ["get", "x"])],
}


def parse_workload(spec: str) -> list[tuple[int, list]]:
    """A preset name, or ``op:arg:...@replica`` items joined by commas
    (``put:x:a@1,cas:x:a:c@2,get:x@0``)."""
    if spec in WORKLOADS:
        return [(r, list(op)) for r, op in WORKLOADS[spec]]
    out = []
    for item in spec.split(","):
        body, _, at = item.strip().partition("@")
        parts = body.split(":")
        if not at or parts[0] not in ("put", "get", "cas") or len(parts) != {"put": 3, "get": 2, "cas": 4}[parts[0]]:
            raise ValueError(f"bad workload item {item!r} (want op:args@replica, op put|get|cas)")
        out.append((int(at), parts))
    return out


@dataclass(frozen=True)
class ExplorerConfig:
    """What is explored. Timers are in ticks and deliberately tiny, so that view
    changes, leases and recoveries happen within a few actions."""

    protocol: str = "sdpaxos"
    replicas: int = 3
    workload: str = "wwr"
    heartbeat_ticks: int = 2
    election_ticks: int = 4
    lease_ticks: int = 4
    resend_ticks: int = 4
    recovery_ticks: int = 2
    thrifty: bool = True
    # Deterministic lockstep ticks with FIFO delivery before exploring (leases held).
    warmup_ticks: int = 6
    max_crashes: int = 1
    max_drops: int = 2
    max_dups: int = 1
    max_ticks: int = 1_000_000  # tick actions per trace
    # "envelope": one in-flight item per ready() and destination, as on the wire;
    # "message": every message travels alone (finer interleavings, more states).
    granularity: str = "envelope"
    merge_duplicates: bool = True
    # Where to stabilize and run the end checks: "leaves", "all" states, or "none".
    stabilize: str = "leaves"
    stabilize_ticks_max: int = 400
    invoke_rest: bool = True  # stabilization invokes the commands not yet invoked
    check_liveness: bool = True
    lin_timeout_s: float = 10.0
    seed: int = 0  # the replicas' internal generators
    # Extra oracles (off by default; on in steered walks): probe reads (after every
    # action, what a lease read of each workload key would answer at once at a
    # sequencer holding a valid lease, against the writes acknowledged so far) and
    # the Paxos quorum invariant from the durable records (a C-instance is committed
    # at ballot b only once a majority accepted it at b or knew it chosen).
    probes: bool = False
    quorum_check: bool = False
    # Execution after send (ProtocolConfig.defer_execution, docs/runtime.md): a commit
    # only marks its replica's execution due; the action ``execute r`` runs it, so
    # deliveries, ticks, drops, crashes and invokes may come between the commit's Ready
    # and the execution, as in the runtime while that Ready waits for an fsync.
    execute_after_send: bool = False

    def protocol_config(self) -> ProtocolConfig:
        return ProtocolConfig(
            n=self.replicas,
            heartbeat_ticks=self.heartbeat_ticks,
            election_ticks=self.election_ticks,
            lease_ticks=self.lease_ticks,
            resend_ticks=self.resend_ticks,
            recovery_ticks=self.recovery_ticks,
            thrifty=self.thrifty,
            straggler_window_ticks=1 << 60,  # off: see the module docstring
            measure_rtt=False,  # the walk picks every delivery: no round trip to measure
            defer_execution=self.execute_after_send,
        )

    def commands(self) -> list[tuple[int, list]]:
        cmds = parse_workload(self.workload)
        for r, _ in cmds:
            if not 0 <= r < self.replicas:
                raise ValueError(f"workload names replica {r}, outside 0..{self.replicas - 1}")
        return cmds

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "ExplorerConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class ExplorerRandom:
    """The replicas' generator: splitmix64 over one integer (cheap to copy and to
    digest). Offers what the core draws: ``randrange`` (and ``random``)."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def _next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        if stop is None:
            start, stop = 0, start
        width = (stop - start + step - 1) // step
        if width <= 0:
            raise ValueError("empty range for randrange")
        return start + step * (self._next() % width)

    def random(self) -> float:
        return (self._next() >> 11) / float(1 << 53)

    def getrandbits(self, k: int) -> int:
        return self._next() & ((1 << k) - 1)


class Violation(Exception):
    """A checked property failed. ``kind``: agreement, chosen, state, exception,
    lost_acked, duplicated, wrong_result, linearizability, liveness."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


# --- canonical digest -----------------------------------------------------------------

# Fields left out of a replica's digest: constants, metrics, outboxes that ready()
# empties, the timing-only fields of straggler detection (switched off here) and a
# proposal's ``resent`` flag (it only decides whether an ack times the peer).
DIGEST_EXCLUDE = frozenset(
    {
        "cfg", "stats", "_keys_of", "_out", "_urgent", "_persist", "_replies", "_executed", "_exec_out",
        "_snapshot_from", "born", "done", "_window_total", "_window_count", "_best_ready",
        "_window_served", "_served_baseline", "resent",
    }
)
_SCALARS = frozenset((int, str, bool, float, bytes, type(None)))
_SLOTS: dict[type, tuple[str, ...]] = {}


def _slots_of(t: type) -> tuple[str, ...]:
    names = _SLOTS.get(t)
    if names is None:
        seen: list[str] = []
        for klass in reversed(t.__mro__):
            for name in getattr(klass, "__slots__", ()):
                if name not in seen and not name.startswith("__"):
                    seen.append(name)
        names = _SLOTS[t] = tuple(n for n in seen if n not in DIGEST_EXCLUDE)
    return names


def canon(x: Any) -> Any:
    """A deterministic, msgpack-able rendering of ``x`` (dict order never leaks)."""
    t = type(x)
    if t in _SCALARS:
        return x
    if t is list or t is tuple:
        return [canon(v) for v in x]
    if t is dict:
        items = [(canon(k), canon(v)) for k, v in x.items()]
        try:
            items.sort(key=itemgetter(0))
        except TypeError:
            items.sort(key=lambda kv: repr(kv[0]))
        return ["{", items]
    if t is set or t is frozenset:
        items = [canon(v) for v in x]
        try:
            items.sort()
        except TypeError:
            items.sort(key=repr)
        return ["<", items]
    if callable(x) and not hasattr(x, "__dict__") and not hasattr(t, "__slots__"):
        return ["fn", getattr(x, "__qualname__", t.__name__)]
    d = getattr(x, "__dict__", None)
    out: list = [t.__name__]
    if d is not None:
        for name in sorted(d):
            if name not in DIGEST_EXCLUDE:
                out.append(name)
                out.append(canon(d[name]))
    for name in _slots_of(t):
        if hasattr(x, name):
            out.append(name)
            out.append(canon(getattr(x, name)))
    return out


def digest_of(x: Any) -> bytes:
    return hashlib.blake2b(msgpack.packb(canon(x), use_bin_type=True), digest_size=16).digest()


def _ids(cmds: list | None) -> tuple:
    return tuple((c[0], c[1]) for c in cmds) if cmds else ()


# --- the world: replicas, network, disks, clients, ghost state ---------------------


class World:
    """Everything one explored state holds. Replicas are live objects or pickles
    (``freeze``); ``clone`` shares the pickles, so an action unpickles only the
    replicas it touches."""

    def __init__(self, cfg: ExplorerConfig) -> None:
        self.cfg = cfg
        self.pcfg = cfg.protocol_config()
        self.cls = PROTOCOLS[cfg.protocol]
        self.new_machine = machine_factory("kv")  # the workload's machine (consensus.sim.registry)
        n = self.n = cfg.replicas
        self.reps: list[Any] = [None] * n  # live object, pickle bytes, or None (down)
        self.incarnation = [0] * n
        self.net: list[tuple[int, int, bytes]] = []  # (src, dst, envelope) in send order
        self.disks: list[tuple] = [()] * n  # msgpack-encoded records, in order
        self.crashes = self.drops = self.dups = self.ticks = 0
        self.step = 0  # history clock: one per action (and per stabilization event)
        self.commands = cfg.commands()
        # per command: [state (new|pending|done), target, result, ok, invoked incarnation]
        self.cstate: list[list] = [["new", r, None, False, 0] for r, _ in self.commands]
        self.events: list[tuple] = []  # (step, "invoke"|"ok", k, result)
        self.exec_map: dict[int, tuple] = {}  # slot -> (label, ids), over every incarnation
        self.chosen: dict[tuple, Any] = {}  # ("C", l, i) / ("O", j) / ("M", j) -> value
        self.dcache: list[bytes | None] = [None] * n  # per-replica digest
        self.scache: list[tuple | None] = [None] * n  # per-replica (exec_slot, state)
        self.where = ""  # "" while exploring, "stabilize" after
        # execute_after_send: replica r's execute_due after its last Ready was carried
        # out (the ``execute r`` action is enabled); read without unpickling it.
        self.due = [False] * n
        self.due_step = [0] * n  # statistics only: the step at which it became due
        self.exec_lag = 0  # statistics only: actions from the commit to the last ``execute``
        # Warm-up and stabilization run execution after send as the runtime does, at
        # once after each Ready (no ``execute`` actions there).
        self.settling = False
        # Oracles' ghost state (``probes``, ``quorum_check``).
        self.id_slot: dict[tuple, int] = {}  # command id -> the slot that executed it
        self.cacc: dict[tuple, int] = {}  # (leader, inst, ballot) -> mask of replicas with a C record at it
        self.clast: dict[tuple, int] = {}  # (replica, leader, inst) -> ballot of its last C record
        self.clearn: dict[tuple, int] = {}  # (leader, inst) -> mask of replicas with a CC record

    # --- construction and copying -----------------------------------------------------

    @classmethod
    def initial(cls, cfg: ExplorerConfig) -> "World":
        w = cls(cfg)
        w.settling = True
        for r in range(w.n):
            w._start(r)
        for _ in range(cfg.warmup_ticks):
            w._tick()
            w._deliver_all()
        w.settling = False
        w.step = 0
        w._check_all()
        return w

    def _start(self, r: int) -> None:
        self.incarnation[r] += 1
        records = [msgpack.unpackb(b, raw=False, strict_map_key=False) for b in self.disks[r]]
        rng = ExplorerRandom(self.cfg.seed * 1_000_003 + r * 7919 + self.incarnation[r])
        replica = self.reps[r] = self.cls(r, self.pcfg, self.new_machine(), records=records or None, rng=rng)
        if replica.execute_due:
            # execute_after_send: the replayed log is executed before anything is sent,
            # as the runtime's Node.open does (and the immediate path, in the constructor).
            replica.execute()
        self.dcache[r] = None
        self.scache[r] = None
        self._drain(r)

    def rep(self, r: int) -> Any:
        """Replica ``r`` as a live object (unpickled on first use); marks it touched."""
        obj = self.reps[r]
        if type(obj) is bytes:
            obj = self.reps[r] = pickle.loads(obj)
            obj.cfg = self.pcfg
        self.dcache[r] = None
        return obj

    def live(self, r: int) -> bool:
        return self.reps[r] is not None

    def freeze(self, digest: bool = True) -> "World":
        """Pickle every live replica (after computing its digest, unless told not
        to: steered walks never compare digests)."""
        if digest:
            self.digest()
        for r, obj in enumerate(self.reps):
            if obj is not None and type(obj) is not bytes:
                self.reps[r] = _dumps_replica(obj)
        return self

    def clone(self, digest: bool = True) -> "World":
        """A copy that shares nothing mutable with this world. Live replicas are
        pickled first (``freeze``): a clone of a world holding live objects would
        otherwise share them, and an action on the clone would change this world
        behind its cached digest."""
        if any(obj is not None and type(obj) is not bytes for obj in self.reps):
            self.freeze(digest)
        w = World.__new__(World)
        w.__dict__.update(self.__dict__)
        w.reps = list(self.reps)
        w.incarnation = list(self.incarnation)
        w.net = list(self.net)
        w.disks = list(self.disks)
        w.cstate = [list(c) for c in self.cstate]
        w.events = list(self.events)
        w.exec_map = dict(self.exec_map)
        w.chosen = dict(self.chosen)
        w.dcache = list(self.dcache)
        w.scache = list(self.scache)
        w.due = list(self.due)
        w.due_step = list(self.due_step)
        w.id_slot = dict(self.id_slot)
        w.cacc = dict(self.cacc)
        w.clast = dict(self.clast)
        w.clearn = dict(self.clearn)
        return w

    # --- the driver: ready() carried out ----------------------------------------------

    def _drain(self, r: int) -> None:
        replica = self.reps[r]
        rd = replica.ready(sync=True)  # records go to disk before anything else
        if rd.persist:
            self.disks[r] = self.disks[r] + tuple(msgpack.packb(rec, use_bin_type=True) for rec in rd.persist)
            if self.cfg.quorum_check:
                self._quorum_records(r, rd.persist)
        for dst, msgs in rd.urgent + rd.messages:  # (no urgent ones: measure_rtt is off here)
            if not 0 <= dst < self.n or self.reps[dst] is None:
                continue  # a down replica receives nothing
            if self.cfg.granularity == "message":
                for m in msgs:
                    self._put(r, dst, encode_envelope(r, [m]))
            else:
                self._put(r, dst, encode_envelope(r, msgs))
        for reply in rd.replies:
            self._on_reply(reply)
        for ex in rd.executed:
            entry = (tuple(ex.label), _ids(ex.cmds))
            seen = self.exec_map.setdefault(ex.slot, entry)
            if seen != entry:
                raise Violation("agreement", f"slot {ex.slot}: R{r} executed {_show_exec(entry)}, another replica {_show_exec(seen)}")
            if self.cfg.probes:
                for cid in entry[1]:
                    self.id_slot.setdefault(cid, ex.slot)
        # execute_after_send: this Ready is carried out (persisted, sent, answered), so
        # what it committed may execute now: the ``execute r`` action, or at once while
        # settling (warm-up, stabilization: the runtime's execution after send).
        due = replica.execute_due
        if due and not self.due[r]:
            self.due_step[r] = self.step
        self.due[r] = due
        if due and self.settling:
            replica.execute()
            self._drain(r)

    def _quorum_records(self, r: int, records: list) -> None:
        """The quorum invariant, as each record is persisted: replica ``r`` commits
        (``CC``) a C-instance at the ballot of its last ``C`` record for it; a
        majority must hold a ``C`` record at that ballot or already know the
        instance chosen. (A proposer's tally that mixes ballots breaks it.)"""
        for rec in records:
            if type(rec) is not list or not rec:
                continue
            if rec[0] == "C":
                _, leader, inst, ballot, _cmds = rec
                self.clast[(r, leader, inst)] = ballot
                key = (leader, inst, ballot)
                self.cacc[key] = self.cacc.get(key, 0) | 1 << r
            elif rec[0] == "CC":
                leader, inst = rec[1], rec[2]
                ballot = self.clast.get((r, leader, inst))
                knew = self.clearn.get((leader, inst), 0)
                if ballot is not None:
                    who = self.cacc.get((leader, inst, ballot), 0) | knew
                    if who.bit_count() < self.n // 2 + 1:
                        names = [q for q in range(self.n) if who >> q & 1]
                        raise Violation("quorum", f"R{r} committed C-instance {leader}.{inst} at ballot {ballot}, "
                                        f"accepted at that ballot (or known chosen) by {names} only")
                self.clearn[(leader, inst)] = knew | 1 << r

    def _probe_reads(self) -> None:
        """What a lease read of each workload key would answer *now* at a sequencer
        that answers it at once (valid lease, the key's last write executed there):
        it must reflect every write or compare-and-set acknowledged so far. Pure:
        nothing is sent, nothing changes (the replica's own ``_read_slot`` decides)."""
        acked = []
        for k, st in enumerate(self.cstate):
            op = self.commands[k][1]
            if st[0] == "done" and (op[0] == "put" or (op[0] == "cas" and st[2] is True)):
                slot = self.id_slot.get((CLIENT_BASE + k, 1))
                if slot is not None:
                    acked.append((op[1], slot, k))
        if not acked:
            return
        for r in range(self.n):
            obj = self.reps[r]
            if obj is None:
                continue
            rep = self.rep(r) if type(obj) is bytes else obj
            if not hasattr(rep, "_read_slot") or not rep.lease_valid():
                continue
            for key, slot_w, k in acked:
                if slot_w < rep.exec_slot:
                    continue  # that write is executed here
                slot = rep._read_slot(key)
                if not 0 <= slot + 1 <= rep.exec_slot or slot >= rep.exec_slot:
                    continue  # the read would wait (or go through the log)
                have = rep.executor.sm.query(["get", key])
                want = self._value_after(key, slot_w)
                if have != want:
                    raise Violation("stale_read", f"a lease read of {key} at R{r} (view {rep.view}, executed {rep.exec_slot} slots) "
                                    f"would answer {have!r} now, but command {k} {self.commands[k][1]} was acknowledged "
                                    f"(executed at slot {slot_w}: {key} = {want!r} there)")

    def _value_after(self, key: Any, slot: int) -> Any:
        """The value of ``key`` once slots 0..``slot`` are executed (the ghost log)."""
        ops = {(CLIENT_BASE + k, 1): op for k, (_, op) in enumerate(self.commands)}
        ex = Executor(self.new_machine())
        out: list = []
        for j in range(slot + 1):
            entry = self.exec_map.get(j)
            if entry is None:
                return None
            ex.run([[cid, seq, ops.get((cid, seq), ["noop"])] for cid, seq in entry[1]], out)
            out.clear()
        return ex.sm.query(["get", key])

    def _put(self, src: int, dst: int, data: bytes) -> None:
        item = (src, dst, data)
        if self.cfg.merge_duplicates and item in self.net:
            return  # identical envelope already in flight on this link: merged
        self.net.append(item)

    def _on_reply(self, reply: Any) -> None:
        k = reply.client - CLIENT_BASE if type(reply.client) is int else -1
        if not 0 <= k < len(self.commands) or reply.seq != 1 or not reply.ok:
            return
        st = self.cstate[k]
        if st[0] != "pending":
            return
        st[0], st[2], st[3] = "done", reply.result, True
        self.events.append((self.step, "ok", k, reply.result))

    # --- actions ------------------------------------------------------------------------

    def actions(self) -> list[tuple]:
        """Every action enabled here, in a fixed order (deliveries first)."""
        cfg = self.cfg
        out: list[tuple] = []
        seen = set()
        items = []
        for src, dst, data in self.net:
            key = (src, dst, data)
            if key in seen:
                continue
            seen.add(key)
            items.append((src, dst, _hash(data)))
        for src, dst, h in items:
            out.append(("deliver", src, dst, h))
        for r in range(self.n):
            if self.due[r] and self.reps[r] is not None:
                out.append(("execute", r))
        for k, st in enumerate(self.cstate):
            if st[0] == "new" and self.live(st[1]):
                out.append(("invoke", k))
        if self.ticks < cfg.max_ticks:
            out.append(("tick",))
        for k, st in enumerate(self.cstate):
            if st[0] == "pending" and (not self.live(st[1]) or self.incarnation[st[1]] != st[4]):
                for r in range(self.n):
                    if r != st[1] and self.live(r):
                        out.append(("retry", k, r))
        if self.drops < cfg.max_drops:
            out.extend(("drop", src, dst, h) for src, dst, h in items)
        if self.dups < cfg.max_dups:
            out.extend(("dup", src, dst, h) for src, dst, h in items)
        for r in range(self.n):
            if self.reps[r] is None:
                out.append(("restart", r))
            elif self.crashes < cfg.max_crashes:
                out.append(("crash", r))
        return out

    def apply(self, action: tuple | list) -> None:
        """Carry out one action, then the safety checks; raises ``Violation`` (and
        ``ReplayError`` for an action that does not fit this state)."""
        name = action[0]
        idx = -1
        if name in ("deliver", "dup", "drop"):
            idx = self._find(action[1], action[2], action[3])
        elif name in ("crash", "restart", "retry", "invoke"):
            r = action[2] if name == "retry" else self.cstate[action[1]][1] if name == "invoke" else action[1]
            if not 0 <= r < self.n or (self.reps[r] is None) != (name == "restart"):
                raise ReplayError(f"action {list(action)} does not fit: replica {r} is {'down' if self.reps[r] is None else 'up'}")
        elif name == "execute":
            r = action[1]
            if not 0 <= r < self.n or self.reps[r] is None or not self.due[r]:
                raise ReplayError(f"action {list(action)} does not fit: replica {r} is "
                                  f"{'down' if 0 <= r < self.n and self.reps[r] is None else 'not due to execute'}")
        elif name not in ("tick", "stabilize"):
            raise ReplayError(f"unknown action {list(action)}")
        self.step += 1
        answered = len(self.events)
        try:
            if idx >= 0:
                data = self.net[idx][2]
                if name == "drop":
                    del self.net[idx]
                    self.drops += 1
                    return
                if name == "deliver":
                    del self.net[idx]
                else:
                    self.dups += 1
                self._deliver(action[2], data)
                self._check(action[2])
            elif name == "tick":
                self.ticks += 1
                self._tick()
                self._check_all()
            elif name == "execute":
                self.exec_lag = self.step - self.due_step[action[1]]
                replica = self.rep(action[1])
                replica.execute()
                self._drain(action[1])
                self._check(action[1])
            elif name == "invoke":
                k = action[1]
                self._invoke(k, self.cstate[k][1])
                self._check(self.cstate[k][1])
            elif name == "retry":
                k, r = action[1], action[2]
                self._invoke(k, r)
                self._check(r)
            elif name == "crash":
                self._crash(action[1])
                self.crashes += 1
            elif name == "restart":
                self._start(action[1])
                self._check(action[1])
            else:
                self.stabilize()
            if len(self.events) > answered and any(e[1] == "ok" for e in self.events[answered:]):
                self.check_history()
            if self.cfg.probes:
                self._probe_reads()
        except Violation:
            raise
        except Exception as exc:  # SafetyViolation (an assertion of the core) or a crash
            raise Violation("exception", f"{type(exc).__name__}: {exc} (during {_show_action(action)})") from exc

    def _find(self, src: int, dst: int, h: str) -> int:
        for i, (s, d, data) in enumerate(self.net):
            if s == src and d == dst and _hash(data) == h:
                return i
        raise ReplayError(f"message {src}->{dst} #{h} is not in flight")

    def _deliver(self, dst: int, data: bytes) -> None:
        src, msgs = decode_envelope(data)
        replica = self.rep(dst)
        replica.step(src, msgs)
        self._drain(dst)

    def _tick(self) -> None:
        for r in range(self.n):
            if self.reps[r] is not None:
                self.rep(r).tick()
                self._drain(r)

    def _invoke(self, k: int, r: int) -> None:
        st = self.cstate[k]
        _, op = self.commands[k]
        if st[0] == "new":
            st[0] = "pending"
            self.events.append((self.step, "invoke", k, None))
        st[1], st[4] = r, self.incarnation[r]
        replica = self.rep(r)
        client = CLIENT_BASE + k
        if op[0] == "get" and hasattr(replica, "read"):
            replica.read(client, 1, list(op), op[1])
        else:
            replica.propose(client, 1, list(op), needs_result=op[0] != "put")
        self._drain(r)

    def _crash(self, r: int) -> None:
        if self.reps[r] is None:
            raise ValueError(f"crash of down replica {r}")
        self.reps[r] = None
        self.dcache[r] = None
        self.scache[r] = None
        self.due[r] = False  # committed, not executed: the restart executes it from the log
        self.net = [it for it in self.net if it[1] != r]  # in flight to it: lost

    def _deliver_all(self, cap: int = 20_000) -> None:
        """Deliver everything in send order (what that sends too, up to ``cap``); the
        chosen-value checks run once at the end (chosen values never change)."""
        count = 0
        while self.net and count < cap:
            _src, dst, data = self.net.pop(0)
            self.step += 1
            self._deliver(dst, data)
            count += 1
        self._check_all()

    # --- safety checks ------------------------------------------------------------------

    def _check_all(self) -> None:
        for r in range(self.n):
            if self.reps[r] is not None and type(self.reps[r]) is not bytes:
                self._check(r)

    def _check(self, r: int) -> None:
        """Chosen values of replica ``r`` against everything seen so far."""
        replica = self.reps[r]
        if replica is None or type(replica) is bytes:
            return
        chosen = self.chosen
        if self.cfg.protocol == "sdpaxos":
            for leader, log in enumerate(replica.clog):
                for inst, c in log.items():
                    if c.committed:
                        key, value = ("C", leader, inst), _ids(c.cmds)
                        seen = chosen.setdefault(key, value)
                        if seen != value:
                            raise Violation("chosen", f"C-instance {leader}.{inst}: R{r} committed {list(value)}, another replica {list(seen)}")
            for j, s in replica.oslots.items():
                if s.committed:
                    seen = chosen.setdefault(("O", j), s.leader)
                    if seen != s.leader:
                        raise Violation("chosen", f"O-slot {j}: R{r} committed leader {s.leader}, another replica {seen}")
        else:
            for j, s in replica.log.items():
                if s.committed:
                    value = _ids(s.batch)
                    seen = chosen.setdefault(("M", j), value)
                    if seen != value:
                        raise Violation("chosen", f"slot {j}: R{r} committed {list(value)}, another replica {list(seen)}")
        state = self.scache[r]
        if state is not None and state[0] == replica.exec_slot:
            return  # executed nothing since the last check: same state
        state = self.scache[r] = (replica.exec_slot, replica.executor.snapshot())
        for q in range(self.n):
            other = self.scache[q]
            if q != r and other is not None and self.reps[q] is not None and other[0] == state[0] and other[1] != state[1]:
                raise Violation("state", f"R{r} and R{q} both executed {state[0]} slots but hold different states")

    # --- digest ---------------------------------------------------------------------------

    def digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for r in range(self.n):
            obj = self.reps[r]
            if obj is None:
                h.update(b"down")
            else:
                d = self.dcache[r]
                if d is None:
                    if type(obj) is bytes:
                        obj = self.rep(r)
                    d = self.dcache[r] = digest_of(obj)
                h.update(d)
            if obj is None or self.crashes < self.cfg.max_crashes:
                h.update(hashlib.blake2b(b"".join(self.disks[r]), digest_size=16).digest())
        for item in sorted(self.net):
            h.update(b"%d>%d:" % (item[0], item[1]))
            h.update(hashlib.blake2b(item[2], digest_size=16).digest())
        rest = [
            self.crashes, self.drops, self.dups, [list(c[:4]) for c in self.cstate], list(self.due),
            [[e[1], e[2], e[3]] for e in self.events],
            sorted([k, list(v) if type(v) is tuple else v] for k, v in self.exec_map.items()),
            sorted(([list(k), canon(v)] for k, v in self.chosen.items()), key=repr),
        ]
        h.update(msgpack.packb(canon(rest), use_bin_type=True))
        return h.digest()

    # --- stabilization and end checks ---------------------------------------------------

    def quiet(self) -> bool:
        if any(st[0] == "pending" for st in self.cstate):
            return False
        live = [r for r in range(self.n) if self.reps[r] is not None]
        reps = [self.rep(r) for r in live]
        if not all(rep.idle() and not rep.execute_due for rep in reps):
            return False
        if len({rep.exec_slot for rep in reps}) > 1:
            return False
        # ``idle()`` is local: a cluster whose replicas are each idle may still be in
        # a view change (a candidate, an accepted but uncommitted slot that only the
        # next sequencer will commit). Quiet means settled too: one view, everyone
        # normal under a live leader, every slot committed anywhere executed (an
        # accepted, uncommitted leftover beyond the leader's log is legitimate).
        if len({rep.view for rep in reps}) > 1 or any(getattr(rep, "phase", "normal") != "normal" for rep in reps):
            return False
        head = reps[0]
        lead = getattr(head, "sequencer", getattr(head, "leader", None))
        if lead is not None and lead not in live:
            return False
        slots = "oslots" if self.cfg.protocol == "sdpaxos" else "log"
        return all(j < rep.exec_slot for rep in reps for j, s in getattr(rep, slots).items() if s.committed)

    def stabilize(self) -> bool:
        """Heal: restart the crashed, invoke the rest, deliver everything in order and
        tick (clients resend after a timeout) until quiet. True if it went quiet."""
        self.where = "stabilize"
        self.settling = True  # execution after send: at once after each Ready from now on
        for r in range(self.n):
            if self.due[r] and self.reps[r] is not None:
                self.step += 1
                self.rep(r).execute()
                self._drain(r)
                self._check(r)
        for r in range(self.n):
            if self.reps[r] is None:
                self._start(r)
                self._check(r)
        if self.cfg.invoke_rest:
            for k, st in enumerate(self.cstate):
                if st[0] == "new":
                    self.step += 1
                    self._invoke(k, st[1])
                    self._check(st[1])
        timeout = 3 * self.cfg.election_ticks + self.cfg.resend_ticks
        waited = [0] * len(self.commands)
        for _ in range(self.cfg.stabilize_ticks_max):
            self._deliver_all()
            if self.quiet():
                return True
            for k, st in enumerate(self.cstate):
                if st[0] == "pending":
                    waited[k] += 1
                    if waited[k] >= timeout:
                        waited[k] = 0
                        self.step += 1
                        target = (st[1] + 1) % self.n
                        self._invoke(k, target)
                        self._check(target)
            self.step += 1
            self._tick()
            self._check_all()
        self._deliver_all()
        return self.quiet()

    def end_checks(self, went_quiet: bool) -> None:
        """After ``stabilize``: lost or duplicated acknowledged commands, results,
        linearizability, liveness."""
        ops = {(CLIENT_BASE + k, 1): op for k, (_, op) in enumerate(self.commands)}
        replay = Executor(self.new_machine())
        applied: dict[tuple, Any] = {}
        out: list = []
        slot = 0
        while slot in self.exec_map:
            _label, ids = self.exec_map[slot]
            batch = [[cid, seq, ops.get((cid, seq), ["noop"])] for cid, seq in ids]
            replay.run(batch, out)
            for cid, seq, result, fresh in out:
                if fresh:
                    if (cid, seq) in applied:
                        raise Violation("duplicated", f"command {cid - CLIENT_BASE} applied twice")
                    applied[(cid, seq)] = result
            out.clear()
            slot += 1
        if not went_quiet and self.cfg.check_liveness:
            pending = [k for k, st in enumerate(self.cstate) if st[0] == "pending"]
            raise Violation("liveness", f"healed cluster not quiet after {self.cfg.stabilize_ticks_max} ticks (pending commands {pending}; " + self.describe_replicas() + ")")
        for k, st in enumerate(self.cstate):
            op = self.commands[k][1]
            if st[0] != "done" or op[0] == "get":
                continue
            key = (CLIENT_BASE + k, 1)
            if key not in applied:
                if not went_quiet:
                    continue  # not converged (liveness not checked): may come later
                raise Violation("lost_acked", f"command {k} {op} was acknowledged but is not in the executed log")
            if applied[key] != st[2]:
                raise Violation("wrong_result", f"command {k} {op}: client saw {st[2]!r}, the log gives {applied[key]!r}")
        lin = linearizable(self.history_ops(), self.cfg.lin_timeout_s)
        if lin is False:
            raise Violation("linearizability", "client history is not linearizable: " + self.describe_history())

    def check_history(self) -> None:
        """The answers so far must be linearizable (unanswered commands may or may not
        take effect, later): checked whenever a client gets an answer."""
        if linearizable(self.history_ops(), self.cfg.lin_timeout_s) is False:
            raise Violation("linearizability", "client history is not linearizable: " + self.describe_history())

    def history_ops(self) -> list:
        from jepsen_like.history import Op

        ops = []
        for t, kind, k, result in self.events:
            op = self.commands[k][1]
            ops.append(_history_op(Op, len(ops), t, k, op, kind, result))
        for k, st in enumerate(self.cstate):
            if st[0] == "pending":
                ops.append(_history_op(Op, len(ops), self.step + 1, k, self.commands[k][1], "info", None))
        return ops

    def describe_history(self) -> str:
        parts = []
        for t, kind, k, result in self.events:
            op = self.commands[k][1]
            parts.append(f"t{t} {kind} c{k} {':'.join(map(str, op))}" + (f" -> {result!r}" if kind == "ok" else ""))
        return "; ".join(parts)

    def describe_replicas(self) -> str:
        out = []
        for r in range(self.n):
            if self.reps[r] is None:
                out.append(f"R{r} down")
                continue
            rep = self.rep(r)
            st = rep.status()
            out.append(f"R{r} view={st.get('view')} phase={st.get('phase')} exec={st.get('exec_slot')}")
        return ", ".join(out)


def _history_op(Op: Any, index: int, t: int, k: int, op: list, kind: str, result: Any) -> Any:
    if op[0] == "cas":
        value = (op[1], (op[2], op[3]))
        if kind == "ok":
            kind = "ok" if result is True else "fail"
        return Op(index, t, CLIENT_BASE + k, kind, "cas", value)
    f = "get" if op[0] == "get" else "put"
    if kind == "invoke":
        return Op(index, t, CLIENT_BASE + k, "invoke", f, (op[1], None if f == "get" else op[2]))
    if kind == "ok":
        return Op(index, t, CLIENT_BASE + k, "ok", f, (op[1], result if f == "get" else op[2]))
    return Op(index, t, CLIENT_BASE + k, "info", f, (op[1], None if f == "get" else op[2]))


_LIN_CACHE: dict[tuple, bool | None] = {}


def linearizable(ops: list, timeout_s: float) -> bool | None:
    """jepsen_like's verdict (KV model), memoized per history (leaves repeat them)."""
    from jepsen_like.checker import check
    from jepsen_like.models import KV

    key = tuple((o.process, o.type, o.f, repr(o.value)) for o in ops)
    verdict = _LIN_CACHE.get(key, _LIN_CACHE)
    if verdict is _LIN_CACHE:
        verdict = check(ops, KV(), timeout_s=timeout_s).linearizable
        if verdict is not None and len(_LIN_CACHE) < 100_000:
            _LIN_CACHE[key] = verdict
    return verdict


class ReplayError(Exception):
    """A trace does not fit the state it is replayed on (wrong config or core)."""


def _dumps_replica(obj: Any) -> bytes:
    cfg = obj.cfg
    obj.cfg = None  # the same for every replica: left out, put back by World.rep
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        obj.cfg = cfg


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=5).hexdigest()


def _show_exec(entry: tuple) -> str:
    label, ids = entry
    cmds = ",".join(f"c{cid - CLIENT_BASE}" if type(cid) is int else str(cid) for cid, _seq in ids) or "no-op"
    return f"{list(label)}[{cmds}]"


def describe_envelope(data: bytes) -> str:
    _src, msgs = decode_envelope(data)
    parts = []
    for m in msgs:
        fields = []
        for name in m.__slots__:
            v = getattr(m, name)
            text = repr(v)
            if len(text) > 40:
                text = text[:37] + "..."
            fields.append(f"{name}={text}")
        parts.append(f"{type(m).__name__}({', '.join(fields)})")
    return " + ".join(parts)


def _show_action(action: tuple | list) -> str:
    name = action[0]
    if name in ("deliver", "drop", "dup"):
        return f"{name} R{action[1]}->R{action[2]} #{action[3]}"
    if name in ("crash", "restart", "execute"):
        return f"{name} R{action[1]}"
    if name == "invoke":
        return f"invoke c{action[1]}"
    if name == "retry":
        return f"retry c{action[1]} at R{action[2]}"
    return name


# --- search -------------------------------------------------------------------------------


@dataclass
class Result:
    """What a search did and found."""

    mode: str
    config: dict
    states: int = 0  # distinct states reached
    transitions: int = 0  # actions applied
    revisits: int = 0  # pruned: digest already seen at the same or a smaller depth
    leaves: int = 0  # states stabilized and end-checked
    depth_reached: int = 0
    seconds: float = 0.0
    exhausted: bool = False  # the whole bounded space was explored
    walks: int = 0
    violation: dict | None = None
    unknown_lin: int = 0
    liveness_failures: int = 0
    # execute_after_send: ``execute`` actions applied, and those applied after other
    # actions came between the commit and the execution (a lag above one action).
    executes: int = 0
    executes_late: int = 0
    by_depth: dict = field(default_factory=dict)

    @property
    def states_per_s(self) -> float:
        return round(self.states / self.seconds, 1) if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["states_per_s"] = self.states_per_s
        return out


def _count_execute(result: "Result", world: World) -> None:
    result.executes += 1
    if world.exec_lag > 1:
        result.executes_late += 1


def _trace_list(node: tuple | None) -> list:
    out = []
    while node is not None:
        node, action = node
        out.append(list(action))
    out.reverse()
    return out


def _violation_entry(v: Violation, trace: list, world: World | None) -> dict:
    return {"kind": v.kind, "detail": v.detail, "trace": trace, "phase": world.where if world is not None else ""}


def _leaf(world: World, result: Result) -> None:
    """Stabilize ``world`` in place and run the end checks (raises Violation; an
    exception of the core during stabilization is one too)."""
    try:
        quiet = world.stabilize()
    except Violation:
        raise
    except Exception as exc:  # SafetyViolation (an assertion of the core) or a crash
        raise Violation("exception", f"{type(exc).__name__}: {exc} (during stabilization)") from exc
    if not quiet and not world.cfg.check_liveness:
        result.liveness_failures += 1
    world.end_checks(quiet)


def explore(
    cfg: ExplorerConfig,
    depth: int,
    budget_states: int = 10_000,
    budget_s: float | None = None,
    strategy: str = "dfs",
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 1.0,
    prefix: list | None = None,
) -> Result:
    """Exhaustive search of every schedule up to ``depth`` actions (within budgets),
    from the initial state or from the end of ``prefix`` (a trace: bounded
    exhaustive search around an interesting state; counterexamples include it)."""
    if strategy not in ("dfs", "bfs"):
        raise ValueError("strategy is dfs or bfs")
    t0 = time.monotonic()
    result = Result(mode=strategy, config=cfg.to_json())
    root = World.initial(cfg)
    start = None
    for action in prefix or []:
        if action[0] == "stabilize":
            break
        root.apply(tuple(action))  # a violation here is the prefix's own
        start = (start, tuple(action))
    visited: dict[bytes, int] = {root.digest(): 0}
    frontier: deque = deque([(root.freeze(), start, 0)])
    result.states = 1
    next_report = t0 + progress_every_s
    stopped = False
    while frontier:
        world, trace, d = frontier.pop() if strategy == "dfs" else frontier.popleft()
        actions = world.actions()
        children = []
        for action in actions:
            child = world.clone()
            result.transitions += 1
            node = (trace, action)
            try:
                child.apply(action)
            except Violation as v:
                result.violation = _violation_entry(v, _trace_list(node), child)
                stopped = True
                break
            if action[0] == "execute":
                _count_execute(result, child)
            dg = child.digest()
            prev = visited.get(dg)
            if prev is not None and prev <= d + 1:
                result.revisits += 1
                continue
            visited[dg] = d + 1
            result.states += 1
            result.by_depth[d + 1] = result.by_depth.get(d + 1, 0) + 1
            if d + 1 > result.depth_reached:
                result.depth_reached = d + 1
            at_leaf = d + 1 >= depth or not child.actions()
            if at_leaf or cfg.stabilize == "all":
                if cfg.stabilize != "none":
                    probe = child if at_leaf else child.clone()
                    try:
                        _leaf(probe, result)
                    except Violation as v:
                        result.violation = _violation_entry(v, _trace_list(node) + [["stabilize"]], probe)
                        stopped = True
                        break
                    result.leaves += 1
            if not at_leaf:
                children.append((child.freeze(), node, d + 1))
            if result.states >= budget_states:
                stopped = True
                break
        if strategy == "dfs":
            frontier.extend(reversed(children))  # first action explored first
        else:
            frontier.extend(children)
        now = time.monotonic()
        if progress is not None and now >= next_report:
            next_report = now + progress_every_s
            progress(_progress_line(result, now - t0, len(frontier)))
        if stopped or (budget_s is not None and now - t0 > budget_s):
            break
    result.exhausted = not frontier and not stopped
    result.seconds = round(time.monotonic() - t0, 3)
    return result


def _progress_line(result: Result, elapsed: float, frontier: int) -> str:
    rate = result.states / elapsed if elapsed > 0 else 0.0
    return (
        f"[explore] {result.states} states, {result.transitions} transitions, {result.revisits} revisits, "
        f"{result.leaves} leaves, depth {result.depth_reached}, frontier {frontier}, {rate:.0f} states/s, {elapsed:.0f} s"
    )


# Walk profiles: each walk draws its own rates and a schedule of network phases
# (swarm testing, Jepsen's nemeses): rare combinations get room instead of being
# averaged away, and partitions last long enough for timeouts to fire.
def _connectivity(rng: random.Random, n: int) -> frozenset:
    """Directed links cut during one phase."""
    links = [(a, b) for a in range(n) for b in range(n) if a != b]
    kind = rng.choice(("none", "none", "isolate", "out", "in", "pair", "oneway", "oneway2", "random", "split"))
    a = rng.randrange(n)
    b = rng.choice([x for x in range(n) if x != a])
    if kind == "isolate":
        cut = {(x, y) for x, y in links if a in (x, y)}
    elif kind == "out":
        cut = {(a, y) for y in range(n) if y != a}
    elif kind == "in":
        cut = {(x, a) for x in range(n) if x != a}
    elif kind == "pair":
        cut = {(a, b), (b, a)}
    elif kind == "oneway":
        cut = {(a, b)}
    elif kind == "oneway2":
        c = rng.choice([x for x in range(n) if x != a])
        cut = {(a, b), (rng.randrange(n), c)} - {(c, c)}
    elif kind == "random":
        cut = {lk for lk in links if rng.random() < 0.3}
    elif kind == "split":
        side = set(rng.sample(range(n), n // 2))
        cut = {(x, y) for x, y in links if (x in side) != (y in side)}
    else:
        cut = set()
    return frozenset(cut)


def _walk_profile(rng: random.Random, cfg: ExplorerConfig, length: int) -> dict:
    phases = []
    at = 0
    while at < length:
        span = rng.choice((3, 6, 10, 20, 40))
        phases.append((at, at + span, _connectivity(rng, cfg.replicas)))
        at += span
    prof = {
        "tick": rng.choice((0.05, 0.1, 0.2, 0.3)),
        "invoke": rng.choice((0.02, 0.05, 0.15)),
        "drop": rng.choice((0.0, 0.02, 0.08)),
        "dup": rng.choice((0.0, 0.01, 0.04)),
        "cut_drop": rng.choice((0.0, 0.1, 0.3)),
        "crash": rng.choice((0.0, 0.01, 0.03)),
        "restart": rng.choice((0.02, 0.1)),
        "fifo": rng.choice((0.0, 0.5, 0.9)),
        "phases": phases,
    }
    if cfg.execute_after_send:
        # Per step, the chance that a replica due to execute does so now: the runtime
        # executes right after the commits' Ready leaves, or an fsync later, so mostly
        # within an action or two; the low rates leave room for steps, ticks and crashes
        # between commit and execution. (Drawn last, and only with the option: walks
        # without it draw exactly what they did before.)
        prof["execute"] = rng.choice((0.1, 0.3, 0.6, 0.9))
    return prof


def _pick_execute(rng: random.Random, world: World, prof: dict) -> tuple | None:
    """execute_after_send: ``execute r`` for a replica due to, at the profile's rate
    (no draw at all while no replica is due: walks without the option are unchanged)."""
    due = [x for x in range(world.n) if world.due[x] and world.reps[x] is not None]
    if due and rng.random() < prof.get("execute", 1.0):
        return ("execute", due[0] if len(due) == 1 else rng.choice(due))
    return None


def _pick(rng: random.Random, world: World, prof: dict, step: int) -> tuple | None:
    cfg = world.cfg
    cut: frozenset = frozenset()
    for s0, s1, links in prof["phases"]:
        if s0 <= step < s1:
            cut = links
            break
    deliverable = []
    blocked = []
    for it in world.net:
        (blocked if (it[0], it[1]) in cut else deliverable).append(it)
    new = [k for k, st in enumerate(world.cstate) if st[0] == "new" and world.live(st[1])]
    down = [x for x in range(world.n) if world.reps[x] is None]
    act = _pick_execute(rng, world, prof)
    if act is not None:
        return act
    if new and rng.random() < prof["invoke"]:
        return ("invoke", rng.choice(new))
    if down and rng.random() < prof["restart"]:
        return ("restart", down[0])
    if len(down) < (world.n - 1) // 2 and world.crashes < cfg.max_crashes and rng.random() < prof["crash"]:
        # Overlapping crashes up to a minority (with max_crashes > 1 and N=5); with
        # one crash per trace this is the old "nobody down" rule, walks unchanged.
        up = [x for x in range(world.n) if x not in down]
        return ("crash", up[rng.randrange(len(up))] if down else rng.randrange(world.n))
    stuck = [(k, st) for k, st in enumerate(world.cstate) if st[0] == "pending" and (not world.live(st[1]) or world.incarnation[st[1]] != st[4])]
    if stuck and rng.random() < 0.2:
        k, st = rng.choice(stuck)
        targets = [x for x in range(world.n) if x != st[1] and world.live(x)]
        if targets:
            return ("retry", k, rng.choice(targets))
    if blocked and world.drops < cfg.max_drops and rng.random() < prof["cut_drop"]:
        src, dst, data = rng.choice(blocked)
        return ("drop", src, dst, _hash(data))
    if not deliverable or rng.random() < prof["tick"]:
        return ("tick",) if world.ticks < cfg.max_ticks else None
    if rng.random() < prof["fifo"]:
        item = deliverable[0]
    else:
        item = rng.choice(deliverable)
    src, dst, data = item
    h = _hash(data)
    r = rng.random()
    if r < prof["drop"] and world.drops < cfg.max_drops:
        return ("drop", src, dst, h)
    if r < prof["drop"] + prof["dup"] and world.dups < cfg.max_dups:
        return ("dup", src, dst, h)
    return ("deliver", src, dst, h)


def random_walks(
    cfg: ExplorerConfig,
    walks: int,
    depth: int,
    seed: int = 1,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 1.0,
    first: int = 0,
) -> Result:
    """``walks`` seeded random schedules of ``depth`` actions each, then stabilize and
    check. Walk ``w`` of ``seed`` is the same schedule every run. Budgets on drops and
    duplicates do not apply (their rates are part of each walk's profile). ``first``
    skips the walks before it (to resume a campaign past a known counterexample)."""
    t0 = time.monotonic()
    wcfg = dataclasses.replace(cfg, max_drops=1 << 30, max_dups=1 << 30)
    result = Result(mode="walk", config=wcfg.to_json())
    base = World.initial(wcfg)
    base.freeze()
    next_report = t0 + progress_every_s
    for w in range(first, first + walks):
        rng = random.Random(seed * 1_000_003 + w)
        prof = _walk_profile(rng, wcfg, depth)
        world = base.clone()
        trace: list = []
        try:
            for step in range(depth):
                action = _pick(rng, world, prof, step)
                if action is None:
                    break
                trace.append(list(action))
                result.transitions += 1
                world.apply(action)
                if action[0] == "execute":
                    _count_execute(result, world)
                result.states += 1
            result.depth_reached = max(result.depth_reached, len(trace))
            if cfg.stabilize != "none":
                trace.append(["stabilize"])
                _leaf(world, result)
                result.leaves += 1
        except Violation as v:
            result.violation = _violation_entry(v, trace, world)
            result.violation["walk"] = w
            result.violation["seed"] = seed
            result.walks = w + 1 - first
            break
        result.walks = w + 1 - first
        now = time.monotonic()
        if progress is not None and now >= next_report:
            next_report = now + progress_every_s
            progress(f"[walk] {w + 1 - first}/{walks} walks, {result.transitions} actions, {result.transitions / (now - t0):.0f} actions/s, {now - t0:.0f} s")
        if budget_s is not None and now - t0 > budget_s:
            break
    result.seconds = round(time.monotonic() - t0, 3)
    result.exhausted = result.violation is None and result.walks == walks
    return result


def signature(world: World) -> tuple:
    """A coarse abstraction of a state for coverage-guided search: per replica its
    role and phase, the rank of its view, whom it follows, its lease promise and
    lease, recoveries and blocking, whether it lags in execution; and the clients'
    progress. New signatures are what the guided search keeps and extends."""
    reps = [world.reps[r] for r in range(world.n)]
    live = [world.rep(r) if reps[r] is not None else None for r in range(world.n)]
    views = sorted({rep.view for rep in live if rep is not None})
    top_exec = max((rep.exec_slot for rep in live if rep is not None), default=0)
    out = []
    for r, rep in enumerate(live):
        if rep is None:
            out.append(("down",))
            continue
        now = rep.now
        lease_until = getattr(rep, "lease_until", 0)
        out.append(
            (
                getattr(rep, "phase", ""),
                views.index(rep.view),
                getattr(rep, "sequencer", getattr(rep, "leader", -1)),
                getattr(rep, "lease_to", -1) if now < lease_until else -1,
                rep.lease_valid() if hasattr(rep, "lease_valid") else False,
                tuple(sorted(getattr(rep, "crec", {}))),
                getattr(rep, "_blocked_on", None) is not None,
                bool(getattr(rep, "unready", None) or getattr(rep, "_mine", None)),
                rep.exec_slot < top_exec,
            )
        )
    return (tuple(out), tuple(st[0] for st in world.cstate), world.crashes)


def guided(
    cfg: ExplorerConfig,
    runs: int,
    depth: int,
    seed: int = 1,
    segment: int = 40,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 1.0,
) -> Result:
    """Coverage-guided random search (greybox fuzzing of schedules): a corpus of
    states with new ``signature``s; each run resumes the least-extended one with a
    seeded random segment of up to ``segment`` actions (traces up to ``depth``),
    keeps the states with new signatures on the way, then stabilizes and checks.
    Deterministic for a seed (and a fixed number of runs)."""
    t0 = time.monotonic()
    wcfg = dataclasses.replace(cfg, max_drops=1 << 30, max_dups=1 << 30) if cfg.max_drops < 1 << 20 else cfg
    result = Result(mode="guided", config=wcfg.to_json())
    rng = random.Random(seed)
    root = World.initial(wcfg)
    seen = {signature(root)}
    corpus: list[list] = [[root.freeze(), [], 0]]  # [frozen world, trace, times extended]
    next_report = t0 + progress_every_s
    for run in range(runs):
        low = min(e[2] for e in corpus)
        pool = [e for e in corpus if e[2] <= low + 1]
        entry = rng.choice(pool)
        entry[2] += 1
        world = entry[0].clone()
        trace = list(entry[1])
        length = min(segment, depth - len(trace))
        if length <= 0:
            entry[2] += 1 << 20  # full length: never again
            if budget_s is not None and time.monotonic() - t0 > budget_s:
                break  # (a corpus of full-length traces only must not outlive the budget)
            continue
        prof = _walk_profile(rng, wcfg, length)
        try:
            for step in range(length):
                action = _pick(rng, world, prof, step)
                if action is None:
                    break
                trace.append(list(action))
                result.transitions += 1
                world.apply(action)
                if action[0] == "execute":
                    _count_execute(result, world)
                sig = signature(world)
                if sig not in seen:
                    seen.add(sig)
                    result.states += 1
                    corpus.append([world.clone().freeze(), list(trace), 0])
            result.depth_reached = max(result.depth_reached, len(trace))
            if cfg.stabilize != "none":
                trace.append(["stabilize"])
                _leaf(world, result)
                result.leaves += 1
        except Violation as v:
            result.violation = _violation_entry(v, trace, world)
            result.violation["seed"] = seed
            result.walks = run + 1
            break
        result.walks = run + 1
        now = time.monotonic()
        if progress is not None and now >= next_report:
            next_report = now + progress_every_s
            progress(f"[guided] {run + 1}/{runs} runs, {len(corpus)} signatures, {result.transitions} actions, longest trace {result.depth_reached}, {now - t0:.0f} s")
        if budget_s is not None and now - t0 > budget_s:
            break
    result.seconds = round(time.monotonic() - t0, 3)
    result.exhausted = result.violation is None and result.walks == runs
    return result


# --- steered walks: a role-aware nemesis at message level, forking at rare states ------------
#
# Walks draw link cuts blind to the protocol. The bugs of issue 9 need faults placed
# within one round trip of one another, on the replica that holds a role *then*: a
# message of one kind lost on one link while the next one, in the same exchange,
# arrives. Steered walks add three generic things, none of which names a schedule:
#
# - role-aware phases: a phase's cut is resolved when it starts, from the replicas'
#   state then (the sequencer of the highest view, candidates, command leaders with
#   instances in flight, recoverers), e.g. "isolate the sequencer", "cut the
#   sequencer from one peer", "cut a command leader off";
# - typed phases (drops by message type, Jepsen's and TigerBeetle's nemeses): one or
#   two message kinds, drawn uniformly from the protocol's, held or dropped on the
#   links into or out of a role, or everywhere; with ``granularity="message"`` every
#   message travels alone, so one kind can be lost while its envelope-mate arrives;
# - forking at rare states (greybox fuzzing, as in ``consensus.sim.steer``): a walk
#   notes the first action at which each coarse protocol situation (``walk_signals``)
#   shows; after the walk, the state where its rarest one (seen in the fewest walks
#   so far) first showed is continued ``branches`` times with fresh draws; a branch
#   that shows a signal new to its lineage, no commoner than the one it was forked
#   at, is forked in turn (``levels`` deep): the rare recovery states (a recoverer
#   and a live command leader on one instance, an own re-prepare the sequencer has
#   not ordered) are mostly reached from other rare states.
#
# Oracles: steered walks turn on probe reads and the quorum check (``ExplorerConfig``).

STEER_KINDS = (
    "none", "none", "isolate-seq", "seq-peer", "seq-oneway", "isolate-leader", "isolate-cand", "split", "oneway",
    "types", "types", "types", "types",
)
SDP_TYPES = ("CAccept", "CAck", "CCommit", "CRequest", "CPrepare", "CPromise", "OAccept", "OAck", "OCommit",
             "VRequest", "Vote", "Ping", "Pong", "PreVote", "PreVoteReply", "RRequest", "RReply", "Fetch")
MP_TYPES = ("Forward", "MAccept", "MAck", "MCommit", "VRequest", "Vote", "Ping", "Pong", "PreVote", "PreVoteReply", "Fetch")
_TYPE_CACHE: dict[bytes, frozenset] = {}


def _types_of(data: bytes) -> frozenset:
    t = _TYPE_CACHE.get(data)
    if t is None:
        if len(_TYPE_CACHE) > 200_000:
            _TYPE_CACHE.clear()
        _src, msgs = decode_envelope(data)
        t = _TYPE_CACHE[data] = frozenset(type(m).__name__ for m in msgs)
    return t


def world_roles(world: World) -> dict:
    """Who holds which role now (live replicas): the sequencer of the highest view
    (serving or recovering; else the owner of the highest view), candidates, command
    leaders with instances in flight, recoverers."""
    live = [r for r in range(world.n) if world.reps[r] is not None]
    reps = {r: world.rep(r) for r in live}
    seq = None
    if world.cfg.protocol == "sdpaxos":
        serving = [r for r in live if reps[r].sequencer == r and reps[r].phase in ("normal", "recovering")]
        if serving:
            seq = max(serving, key=lambda r: reps[r].view)
        elif live:
            top = max(live, key=lambda r: reps[r].view)
            seq = reps[top].sequencer if reps[top].sequencer in reps else None
        leaders = [r for r in live if reps[r].unready]
        recov = [r for r in live if reps[r].crec]
    else:
        lead = [r for r in live if getattr(reps[r], "leader", -1) == r]
        seq = max(lead, key=lambda r: reps[r].view) if lead else None
        leaders, recov = [], []
    return {"live": live, "seq": seq, "candidates": [r for r in live if getattr(reps[r], "phase", "") == "candidate"],
            "leaders": leaders, "recoverers": recov}


def walk_signals(world: World) -> set:
    """Coarse rare situations present now (coverage), read from the live replicas:
    the general states a view change or a recovery passes through (the same as
    ``consensus.sim.steer.signals``, plus phase 2 of a recovery in progress and a
    candidate that is not the owner of the highest view), and finer states of
    C-instance recovery, the rare protocol states where a command leader and a
    recoverer act on the same instances:

    - ``recovering-live-leader``: a peer's recovery in phase 2 over instances that
      their command leader, alive, still has in flight;
    - ``foreign-ballot-open``: a command leader holds its own in-flight instance at a
      recoverer's ballot while that recoverer is in phase 2 and fewer than a quorum
      of live replicas hold that ballot's value; ``foreign-ballot-proposed`` once
      the leader's own C-accept at that ballot is in flight to the recoverer (two
      proposers of one ballot);
    - ``re-prepare-unordered``: a command leader re-prepares its own instances and
      the sequencer has not ordered one of them yet; ``re-prepared-unordered`` and
      ``re-prepared-blind`` after it (an instance at a re-prepared ballot not yet
      ordered, or ordered by a sequencer that does not hold it)."""
    out: set = set()
    if world.cfg.protocol != "sdpaxos":
        return out
    byid = {r: world.rep(r) for r in range(world.n) if world.reps[r] is not None}
    live = list(byid.values())
    if not live:
        return out
    top_view = max(r.view for r in live)
    top_oview = max(r.o_view for r in live)
    quorum = world.n // 2 + 1
    seq = None
    for r in live:
        if r.sequencer == r.id and r.phase == "normal" and (seq is None or r.view > seq.view):
            seq = r
    for r in live:
        if r.now < r.lease_until and r.lease_to >= 0 and r.lease_to != r.sequencer:
            out.add("promise-elsewhere")
        if r.lease_valid() and r.view < top_view:
            out.add("stale-lease")
        assigned = getattr(seq, "assigned", None) if seq is not None and seq is not r else None
        for inst, c in r.unready.items():
            owner = ballot_owner(c.ballot)
            if owner == r.id and ballot_round(c.ballot) > 0 and assigned is not None and not r.crec:
                # An instance its leader re-prepared (its ballot moved past the first):
                # not yet ordered, or ordered by a sequencer that does not hold it.
                if inst >= assigned[r.id]:
                    out.add("re-prepared-unordered")
                elif seq.clog[r.id].get(inst) is None:
                    out.add("re-prepared-blind")
            if owner != r.id:
                out.add("foreign-ballot")
                rec = getattr(byid.get(owner), "crec", {}).get(r.id)
                if rec is None or rec.ballot != c.ballot or inst not in getattr(rec, "accepting", {}):
                    continue
                held = 0
                for q in live:
                    qc = q.clog[r.id].get(inst)
                    held += qc is not None and qc.ballot == c.ballot
                if held < quorum:
                    out.add("foreign-ballot-open")
                    if _in_flight(world, r.id, owner, "CAccept", r.id, inst, c.ballot):
                        out.add("foreign-ballot-proposed")
        for leader, rec in r.crec.items():
            out.add(("re-prepare" if leader == r.id else "peer-recovery") + ("-accepting" if rec.accepting else ""))
            if leader != r.id and rec.accepting and leader in byid and set(rec.accepting) & set(byid[leader].unready):
                out.add("recovering-live-leader")
            if leader == r.id and seq is not None and seq is not r:
                assigned = getattr(seq, "assigned", None)
                if assigned is not None and any(inst >= assigned[r.id] for inst in r.unready):
                    out.add("re-prepare-unordered")
        if r.sequencer == r.id and r.phase in ("candidate", "recovering") and r.o_view < top_oview:
            out.add("hidden-view")
        if r.phase == "candidate" and r.view < top_view:
            out.add("candidate-behind")
    return out


def _in_flight(world: World, src: int, dst: int, kind: str, leader: int, inst: int, ballot: int) -> bool:
    """A ``kind`` message for C-instance ``leader.inst`` at ``ballot`` in flight src -> dst."""
    for s, d, data in world.net:
        if s == src and d == dst and kind in _types_of(data):
            for m in decode_envelope(data)[1]:
                if type(m).__name__ == kind and m.leader == leader and m.inst == inst and m.ballot == ballot:
                    return True
    return False


def _steer_profile(rng: random.Random, cfg: ExplorerConfig, length: int) -> dict:
    prof = _walk_profile(rng, cfg, length)
    phases = []
    at = 0
    while at < length:
        span = rng.choice((2, 4, 8, 15, 30))
        phases.append([at, at + span, rng.choice(STEER_KINDS), rng.getrandbits(32), None])
        at += span
    prof["phases"] = phases
    prof["invoke"] = rng.choice((0.01, 0.03, 0.1, 0.3))
    prof["tick"] = rng.choice((0.03, 0.08, 0.15, 0.3))
    prof["type_drop"] = rng.choice((0.0, 0.5, 1.0))  # typed phases: drop (vs hold) the matched messages
    return prof


def _resolve(world: World, kind: str, salt: int) -> tuple:
    """A phase's cut, resolved from the roles now: (directed links, message kinds or
    None for every kind, drop)."""
    rng = random.Random(salt)
    n = world.n
    links = [(a, b) for a in range(n) for b in range(n) if a != b]
    ro = world_roles(world)
    seq = ro["seq"] if ro["seq"] is not None else rng.randrange(n)
    pick = lambda pool: rng.choice(pool) if pool else rng.randrange(n)  # noqa: E731
    other = lambda x: rng.choice([y for y in range(n) if y != x])  # noqa: E731
    if kind == "isolate-seq":
        return frozenset((a, b) for a, b in links if seq in (a, b)), None, False
    if kind == "seq-peer":
        p = other(seq)
        return frozenset({(seq, p), (p, seq)}), None, False
    if kind == "seq-oneway":
        p = other(seq)
        return frozenset({(seq, p)} if rng.random() < 0.5 else {(p, seq)}), None, False
    if kind == "isolate-leader":
        x = pick(ro["leaders"] + ro["recoverers"])
        return frozenset((a, b) for a, b in links if x in (a, b)), None, False
    if kind == "isolate-cand":
        x = pick(ro["candidates"])
        return frozenset((a, b) for a, b in links if x in (a, b)), None, False
    if kind == "split":
        side = set(rng.sample(range(n), rng.randint(1, (n - 1) // 2)))
        return frozenset((a, b) for a, b in links if (a in side) != (b in side)), None, False
    if kind == "oneway":
        a = rng.randrange(n)
        return frozenset({(a, other(a))}), None, False
    if kind == "types":
        pool = SDP_TYPES if world.cfg.protocol == "sdpaxos" else MP_TYPES
        types = frozenset(rng.sample(pool, rng.choice((1, 1, 2))))
        where = rng.choice(("all", "into-seq", "out-seq", "out-leader", "into-one", "out-one", "pair"))
        x = {"into-seq": seq, "out-seq": seq, "out-leader": pick(ro["leaders"] + ro["recoverers"])}.get(where, rng.randrange(n))
        if where == "all":
            cut = links
        elif where in ("into-seq", "into-one"):
            cut = [(a, b) for a, b in links if b == x]
        elif where == "pair":
            y = other(x)
            cut = [(x, y), (y, x)]
        else:
            cut = [(a, b) for a, b in links if a == x]
        if rng.random() < 0.5 and len(cut) > 1:  # a subset of those links only
            cut = rng.sample(cut, rng.randint(1, len(cut) - 1))
        return frozenset(cut), types, None
    return frozenset(), None, False


def _spick(rng: random.Random, world: World, prof: dict, step: int) -> tuple | None:
    """``_pick`` with steered phases (resolved from the roles when they start)."""
    cfg = world.cfg
    rule = None
    for ph in prof["phases"]:
        if ph[0] <= step < ph[1]:
            if ph[4] is None:
                ph[4] = _resolve(world, ph[2], ph[3])
            rule = ph[4]
            break
    cut, types, drop = rule if rule is not None else (frozenset(), None, False)
    if drop is None:
        drop = rng.random() < prof["type_drop"]
    deliverable = []
    blocked = []
    for it in world.net:
        if (it[0], it[1]) in cut and (types is None or _types_of(it[2]) & types):
            blocked.append(it)
        else:
            deliverable.append(it)
    new = [k for k, st in enumerate(world.cstate) if st[0] == "new" and world.live(st[1])]
    down = [x for x in range(world.n) if world.reps[x] is None]
    act = _pick_execute(rng, world, prof)
    if act is not None:
        return act
    if new and rng.random() < prof["invoke"]:
        return ("invoke", rng.choice(new))
    if down and rng.random() < prof["restart"]:
        return ("restart", down[0])
    if len(down) < (world.n - 1) // 2 and world.crashes < cfg.max_crashes and rng.random() < prof["crash"]:
        up = [x for x in range(world.n) if x not in down]
        if rng.random() < 0.5:  # a role holder half the time
            ro = world_roles(world)
            up = [x for x in [ro["seq"]] + ro["leaders"] + ro["candidates"] if x in up] or up
        return ("crash", rng.choice(up))
    stuck = [(k, st) for k, st in enumerate(world.cstate) if st[0] == "pending" and (not world.live(st[1]) or world.incarnation[st[1]] != st[4])]
    if stuck and rng.random() < 0.2:
        k, st = rng.choice(stuck)
        targets = [x for x in range(world.n) if x != st[1] and world.live(x)]
        if targets:
            return ("retry", k, rng.choice(targets))
    if blocked and (drop or rng.random() < prof["cut_drop"]):
        src, dst, data = blocked[0] if drop else rng.choice(blocked)
        return ("drop", src, dst, _hash(data))
    if not deliverable or rng.random() < prof["tick"]:
        return ("tick",) if world.ticks < cfg.max_ticks else None
    item = deliverable[0] if rng.random() < prof["fifo"] else rng.choice(deliverable)
    src, dst, data = item
    h = _hash(data)
    r = rng.random()
    if r < prof["drop"]:
        return ("drop", src, dst, h)
    if r < prof["drop"] + prof["dup"]:
        return ("dup", src, dst, h)
    return ("deliver", src, dst, h)


def steer_config(cfg: ExplorerConfig) -> ExplorerConfig:
    """The configuration steered walks run with: unbounded drops and duplicates (rates
    are per walk), the extra oracles on."""
    return dataclasses.replace(cfg, max_drops=1 << 30, max_dups=1 << 30, probes=True, quorum_check=True)


def steered_walks(
    cfg: ExplorerConfig,
    walks: int,
    depth: int,
    seed: int = 1,
    branches: int = 8,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 1.0,
    first: int = 0,
    levels: int = 3,
) -> Result:
    """Seeded steered walks (see the section comment), each followed by ``branches``
    continuations from the state where its rarest signal first showed. A branch that
    shows a signal new to its lineage and rarer than the one it was forked at is
    forked in turn (up to ``levels`` forks deep): rare states reached only from
    other rare states get their own continuations. Walk ``w`` of ``seed`` draws
    from ``Random(seed, w)``, its branch ``b`` from ``Random(seed, w, b)`` and a
    nested branch from its path; which signal is rarest depends on the runs before,
    so a campaign is deterministic from its first walk. Every walk and branch counts
    in ``walks``; a violation records ``walk`` and ``branch`` (``b`` or the path
    ``"b.b2..."``) and its full trace (``replay``)."""
    t0 = time.monotonic()
    wcfg = steer_config(cfg)
    result = Result(mode="steer", config=wcfg.to_json())
    base = World.initial(wcfg)
    base.freeze()
    counts: dict[str, int] = {}
    result.by_depth = {"signals": counts, "forks": {}}
    next_report = t0 + progress_every_s

    def one(rng: random.Random, world: World, trace: list, length: int, w: int, b: Any, firsts: dict, seen: set) -> bool:
        prof = _steer_profile(rng, wcfg, length)
        start = len(trace)
        try:
            for step in range(length):
                action = _spick(rng, world, prof, step)
                if action is None:
                    break
                trace.append(list(action))
                result.transitions += 1
                world.apply(action)
                if action[0] == "execute":
                    _count_execute(result, world)
                result.states += 1
                for sig in walk_signals(world):
                    if sig not in seen and sig not in firsts:
                        firsts[sig] = (world.clone(digest=False), list(trace), len(trace) - start)
            result.depth_reached = max(result.depth_reached, len(trace))
            if cfg.stabilize != "none":
                trace.append(["stabilize"])
                _leaf(world, result)
                result.leaves += 1
        except Violation as v:
            result.violation = _violation_entry(v, trace, world)
            result.violation.update(walk=w, branch=b, seed=seed)
            return True
        return False

    def rarest(firsts: dict) -> str | None:
        pick = None
        for sig in sorted(firsts):
            if pick is None or counts.get(sig, 0) < counts.get(pick, 0):
                pick = sig
        for sig in firsts:
            counts[sig] = counts.get(sig, 0) + 1
        return pick

    def out_of_time() -> bool:
        return budget_s is not None and time.monotonic() - t0 > budget_s

    def fork(w: int, path: tuple, sig: str, firsts: dict, seen: set, used_before: int) -> bool:
        """``branches`` continuations from where ``sig`` first showed; True to stop."""
        result.by_depth["forks"][sig] = result.by_depth["forks"].get(sig, 0) + 1
        at, prefix, used = firsts[sig]
        used += used_before
        lineage = seen | set(firsts)
        rank = counts.get(sig, 0)
        for b in range(branches):
            if not path:
                brng = random.Random((seed * 1_000_003 + w) * 1009 + b + 1)
            else:
                brng = random.Random(f"{seed}:{w}:{'.'.join(map(str, path + (b,)))}")
            label: Any = b if not path else ".".join(map(str, path + (b,)))
            result.walks += 1
            sub: dict = {}
            if one(brng, at.clone(digest=False), list(prefix), max(depth - used, depth // 2), w, label, sub, lineage):
                return True
            nxt = rarest(sub)
            if nxt is not None and len(path) + 1 < levels and counts.get(nxt, 0) <= rank:
                if fork(w, path + (b,), nxt, sub, lineage, used):
                    return True
            if out_of_time():
                return False
        return False

    stop = False
    for w in range(first, first + walks):
        firsts: dict = {}
        rng = random.Random(seed * 1_000_003 + w)
        result.walks += 1
        if one(rng, base.clone(digest=False), [], depth, w, None, firsts, set()):
            break
        pick = rarest(firsts)
        if pick is not None and branches > 0:
            stop = fork(w, (), pick, firsts, set(), 0)
        now = time.monotonic()
        if stop or (budget_s is not None and now - t0 > budget_s):
            break
        if progress is not None and now >= next_report:
            next_report = now + progress_every_s
            progress(f"[steer] walk {w + 1 - first}, {result.walks} runs, {result.transitions} actions, "
                     f"{result.transitions / (now - t0):.0f} actions/s, {now - t0:.0f} s, signals {counts}")
    result.seconds = round(time.monotonic() - t0, 3)
    result.exhausted = result.violation is None and result.walks >= walks
    return result


@dataclass
class Replay:
    ok: bool
    violation: dict | None
    log: list[str]
    world: World


def replay(cfg: ExplorerConfig, trace: list, verbose: bool = False) -> Replay:
    """Re-execute ``trace`` from the initial state, deterministically. Returns the
    violation it reproduces (None if none) and one line per action."""
    world = World.initial(cfg)
    log: list[str] = []
    for i, action in enumerate(trace):
        action = tuple(action)
        line = f"{i + 1:4d}. {_show_action(action)}"
        if verbose and action[0] in ("deliver", "dup", "drop"):
            try:
                line += "  " + describe_envelope(world.net[world._find(action[1], action[2], action[3])][2])
            except ReplayError:
                pass
        log.append(line)
        try:
            if action[0] == "stabilize":
                _leaf(world, Result(mode="replay", config={}))
            else:
                world.apply(action)
        except Violation as v:
            return Replay(False, _violation_entry(v, [list(a) for a in trace[: i + 1]], world), log, world)
    return Replay(True, None, log, world)


# --- copy measurement -----------------------------------------------------------------------


def measure_copy(cfg: ExplorerConfig, rounds: int = 300) -> dict:
    """Time the two ways to branch a state: ``copy.deepcopy`` of the replicas against
    a pickle round trip (what the explorer does), on a warmed-up cluster with work."""
    w = World.initial(cfg)
    for k in range(len(w.commands)):
        w.apply(("invoke", k))
    for _ in range(5):
        if w.net:
            src, dst, data = w.net[0]
            w.apply(("deliver", src, dst, _hash(data)))
    reps = [w.rep(r) for r in range(w.n)]
    t = time.perf_counter()
    for _ in range(rounds):
        copy.deepcopy(reps)
    deep = (time.perf_counter() - t) / rounds
    t = time.perf_counter()
    for _ in range(rounds):
        blobs = [_dumps_replica(r) for r in reps]
        [pickle.loads(b) for b in blobs]
    pick = (time.perf_counter() - t) / rounds
    t = time.perf_counter()
    for _ in range(rounds):
        for r in reps:
            digest_of(r)
    dig = (time.perf_counter() - t) / rounds
    return {
        "replicas": w.n,
        "deepcopy_us": round(deep * 1e6, 1),
        "pickle_roundtrip_us": round(pick * 1e6, 1),
        "digest_us": round(dig * 1e6, 1),
        "pickle_bytes": sum(len(_dumps_replica(r)) for r in reps),
    }


# --- command line ------------------------------------------------------------------------------


def _format_violation(v: dict, cfg: ExplorerConfig) -> str:
    return f"VIOLATION {v['kind']}{' (after stabilization)' if v.get('phase') == 'stabilize' else ''}: {v['detail']} [trace of {len(v['trace'])} actions]"


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python3 -m consensus.sim.explorer", description="Bounded exhaustive explorer over the real replicas.")
    p.add_argument("--protocol", choices=sorted(PROTOCOLS), default="sdpaxos")
    p.add_argument("--replicas", type=int, choices=(3, 5), default=3)
    p.add_argument("--workload", default="wwr", help=f"preset ({', '.join(WORKLOADS)}) or op:args@replica,... (default wwr)")
    p.add_argument("--depth", type=int, default=10, help="actions per trace (walks: per walk)")
    p.add_argument("--budget-states", type=int, default=20_000, help="stop after this many distinct states")
    p.add_argument("--budget-seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--strategy", choices=("dfs", "bfs"), default="dfs")
    p.add_argument("--seed", type=int, default=None, help="random walks: the seed (walk w replays as seed, w)")
    p.add_argument("--walks", type=int, default=None, help="run this many seeded random walks instead of exhaustive search")
    p.add_argument("--first-walk", type=int, default=0, help="random walks: start at this walk number (resume a campaign)")
    p.add_argument("--guided", action="store_true", help="with --walks: coverage-guided runs that resume states with new signatures")
    p.add_argument("--segment", type=int, default=40, help="guided: actions per run")
    p.add_argument("--steer", action="store_true",
                   help="with --walks: steered walks (role-aware and typed phases, forks at rare states; probe reads and the quorum check on)")
    p.add_argument("--branches", type=int, default=8, help="steered walks: continuations from each walk's rarest state (8)")
    p.add_argument("--probes", action="store_true", help="check probe reads (lease reads a sequencer would answer now) after every action")
    p.add_argument("--quorum-check", action="store_true", help="check each C-commit against the durable accept records")
    p.add_argument("--execute-after-send", action="store_true",
                   help="replicas defer execution (ProtocolConfig.defer_execution); 'execute r' becomes an action")
    p.add_argument("--crashes", type=int, default=1, help="at most this many crashes per trace")
    p.add_argument("--drops", type=int, default=2, help="at most this many dropped messages per trace")
    p.add_argument("--dups", type=int, default=1, help="at most this many duplicated deliveries per trace")
    p.add_argument("--max-ticks", type=int, default=1_000_000, help="at most this many tick actions per trace")
    p.add_argument("--warmup-ticks", type=int, default=6)
    p.add_argument("--granularity", choices=("envelope", "message"), default="envelope")
    p.add_argument("--stabilize", choices=("leaves", "all", "none"), default="leaves")
    p.add_argument("--no-liveness", action="store_true", help="do not report a healed cluster that never goes quiet")
    p.add_argument("--timers", default=None, metavar="H,E,L,R", help="heartbeat,election,lease,resend ticks (default 2,4,4,4)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--save-trace", metavar="FILE", help="write a counterexample (config and trace) as JSON")
    p.add_argument("--replay", metavar="FILE", help="re-execute a saved trace and print it")
    p.add_argument("--prefix", metavar="FILE[:K]", help="exhaustive search from the state after the first K actions of a saved trace")
    p.add_argument("--measure-copy", action="store_true", help="time deepcopy against pickle for branching")
    args = p.parse_args(argv)

    def echo_err(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    if args.replay:
        with open(args.replay) as fp:
            saved = json.load(fp)
        cfg = ExplorerConfig.from_json(saved["config"])
        try:
            rp = replay(cfg, saved["trace"], verbose=True)
        except ReplayError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps({"reproduced": rp.violation, "actions": len(saved["trace"])}))
        else:
            print("\n".join(rp.log))
            print(_format_violation(rp.violation, cfg) if rp.violation else "no violation: the trace replays cleanly")
        return 1 if rp.violation else 0

    kw: dict[str, Any] = {}
    if args.timers:
        h, e, lease, r = (int(x) for x in args.timers.split(","))
        kw.update(heartbeat_ticks=h, election_ticks=e, lease_ticks=lease, resend_ticks=r)
    try:
        cfg = ExplorerConfig(
            protocol=args.protocol, replicas=args.replicas, workload=args.workload, max_crashes=args.crashes,
            max_drops=args.drops, max_dups=args.dups, max_ticks=args.max_ticks, warmup_ticks=args.warmup_ticks,
            granularity=args.granularity, stabilize=args.stabilize, check_liveness=not args.no_liveness,
            probes=args.probes, quorum_check=args.quorum_check, execute_after_send=args.execute_after_send, **kw,
        )
        cfg.commands()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.measure_copy:
        print(json.dumps(measure_copy(cfg)))
        return 0
    if args.walks:
        seed = 1 if args.seed is None else args.seed
        echo_err(f"SEED={seed} {'guided runs' if args.guided else 'walks'}={args.walks} depth={args.depth} protocol={cfg.protocol} replicas={cfg.replicas} workload={cfg.workload}")
        if args.steer:
            res = steered_walks(cfg, args.walks, args.depth, seed=seed, branches=args.branches, budget_s=args.budget_seconds,
                                progress=echo_err, first=args.first_walk)
        elif args.guided:
            res = guided(cfg, args.walks, args.depth, seed=seed, segment=args.segment, budget_s=args.budget_seconds, progress=echo_err)
        else:
            res = random_walks(cfg, args.walks, args.depth, seed=seed, budget_s=args.budget_seconds, progress=echo_err, first=args.first_walk)
    else:
        echo_err(f"explore {args.strategy} depth={args.depth} budget={args.budget_states} states protocol={cfg.protocol} replicas={cfg.replicas} workload={cfg.workload}"
                 + (" execute-after-send" if cfg.execute_after_send else ""))
        prefix = None
        if args.prefix:
            path, _, count = args.prefix.partition(":")
            with open(path) as fp:
                saved = json.load(fp)
            cfg = ExplorerConfig.from_json({**saved["config"], "max_drops": cfg.max_drops, "max_dups": cfg.max_dups, "max_crashes": cfg.max_crashes})
            prefix = [a for a in saved["trace"] if a[0] != "stabilize"]
            prefix = prefix[: int(count)] if count else prefix
        try:
            res = explore(cfg, args.depth, args.budget_states, args.budget_seconds, args.strategy, progress=echo_err, prefix=prefix)
        except (ReplayError, Violation) as exc:
            print(f"error: the prefix does not replay here: {exc}", file=sys.stderr)
            return 2
    v = res.violation
    if v is not None and args.save_trace:
        with open(args.save_trace, "w") as fp:
            json.dump({"config": res.config, "violation": {k: v[k] for k in v if k != "trace"}, "trace": v["trace"]}, fp, indent=1)
    if args.json:
        print(json.dumps(res.to_json()))
    else:
        status = "exhausted" if res.exhausted else "budget reached" if v is None else "stopped at a violation"
        what = f"{res.walks} runs" if res.mode in ("walk", "guided", "steer") else f"{res.states} states ({res.revisits} revisits pruned)"
        print(f"{res.mode}: {what}, {res.leaves} leaves checked, depth {res.depth_reached}, {res.seconds} s, {res.states_per_s} states/s; {status}")
        if v is not None:
            print(_format_violation(v, cfg))
            rcfg = ExplorerConfig.from_json(res.config)
            rp = replay(rcfg, v["trace"], verbose=True)
            print("\n".join(rp.log))
            if args.save_trace:
                print(f"replay: python3 -m consensus.sim.explorer --replay {args.save_trace}")
    return 1 if v is not None else 0


if __name__ == "__main__":
    from store.machines import install_in_simulator  # the composition root (consensus.sim.registry)

    install_in_simulator()
    sys.exit(main())
