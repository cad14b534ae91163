"""A seeded discrete-event simulator that drives the real protocol code.

One ``random.Random(seed)`` hands sub-seeds to the network, the replicas' private
generators, the workload and the fault schedule (TigerBeetle's VOPR habit). Virtual
time is an integer number of microseconds; events sit in a heap ordered by
``(time, sequence number)`` so ties break the same way every run. Every message
crosses the msgpack codec, as on a real wire, and every processed event is folded
into ``trace_hash``: same seed, same hash, bit for bit.

Each replica has a durable "disk": the records of its ``Ready.persist``, written
before its messages leave (persist-before-send). A crash throws the replica object
away (volatile state is lost); a restart builds a new one from the disk.

With ``disk_sync_ms`` > 0 the disk is a ``SimDisk`` (``disk.py``) that tells written
from synced records: the driver appends a Ready's records, syncs (group commit, one
sync in flight, ``disk_sync_ms`` plus up to ``disk_sync_jitter_ms``), and only then
sends its messages and replies; a peer's snapshot is installed after that. A crash
loses what was not synced (``lose_unsynced_on_crash``; ``disk_torn`` keeps a random
prefix of it), so a core that answers before its record is durable is caught.

Snapshots (``snapshot_every`` > 0, SDPaxos): whenever a replica's execution point
moved that many slots past its last snapshot, the driver takes one, stores it as the
node's latest snapshot, calls ``compact`` and replaces the disk with the live
records (WAL compaction); a restart builds the replica from (latest snapshot, disk).
All three steps happen within one event, and a crash falls between events; the
intermediate states are checked by ``tests/consensus/test_snapshot.py``. When a
replica asks for a peer's snapshot (``Ready.snapshot_from``), the request and the
peer's latest stored snapshot each cross the network once (lost if the peer is
down or the link is cut); on arrival the driver installs it, stores it, compacts.
Each incarnation's executed log is kept in segments that start where execution
jumped (restart from a snapshot, install); the checks merge them by slot.

Faults beyond crash/partition (all opt-in by schedule): ``cut``/``uncut`` one direction
of a link, ``block``/``unblock`` a set of directed links, ``drop`` one message type on a link
(``-1`` for any end) until ``heal``/``undrop``, ``pause``/``resume`` a node (SIGSTOP:
its events wait and are handled in order on resume).

Closed-loop clients sit at sites next to replicas and send each command to their own
replica; with ``client_timeout_ms`` they resend the same command (same client id and
sequence number, so the replicas' sessions execute it at most once) to the next
replica that is up. Gets go through the replica's ``read`` (the sequencer lease) when it
has one; with ``cas_fraction`` some commands are compare-and-set on the same keys.

At the end the run stops the clients, lets the cluster drain, and checks:
``consistent`` (every replica incarnation executed a prefix of one sequence),
``agreement`` (every incarnation that executed slot s executed the same batch there;
replicas at the same execution point hold the same state; and no two records of any
replica's disk accept different values for one SDPaxos C-instance at one ballot: a
ballot has one proposer, which proposes one value per instance),
``lost_acked`` (acknowledged commands that were not applied), ``duplicated``
(commands applied twice), and that every result a client saw equals what a
sequential replay of the executed order produces.

Membership change (docs/membership.md): the fault ``("reconfig", node[, members])``
has an admin client at ``node``'s site send the reconfiguration command that closes
epoch 0. The epoch layer is not simulated: once every live replica has executed END
the run is quiet, and the commands still unanswered are the epoch's unfinished ones.
``check`` then also reports ``past_end``: O-slots above the END slot that some replica
holds as committed (none may be chosen there).
"""

from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import msgpack

from consensus.core.config import ProtocolConfig
from consensus.core.executor import Executor
from consensus.core.messages import decode_envelope, encode_envelope
from consensus.core.multipaxos import MultiPaxosReplica
from consensus.core.sdpaxos import SDPaxosReplica

from .geo import sites_for
from .disk import SimDisk
from .network import SimNetwork
from .registry import machine_factory

PROTOCOLS = {"sdpaxos": SDPaxosReplica, "multipaxos": MultiPaxosReplica}

# Event kinds
_TICK, _DELIVER, _REQUEST, _REPLY, _CLIENT_TIMEOUT, _FAULT, _CLIENT_START, _SNAP_REQ, _SNAP_DATA, _DISK_SYNC = range(10)
# Events a node's process must handle itself (held while it is paused); ``a`` is the node.
_NODE_KINDS = frozenset((_TICK, _DELIVER, _REQUEST, _SNAP_REQ, _SNAP_DATA, _DISK_SYNC))


@dataclass
class SimConfig:
    protocol: str = "sdpaxos"
    replicas: int = 3
    rtt: str = "geo"
    rtt_file: str | None = None
    sequencer: int = 0
    clients_per_site: int = 1
    seconds: float = 10.0
    seed: int = 1
    batch: int = 256
    inflight: int = 32
    tick_ms: float = 10.0
    resend_ms: float = 500.0
    # Failure detection and leases as in the paper (500 ms each): a replica that hears
    # nothing from the sequencer for heartbeat_ms (plus up to half again, randomized)
    # starts a view change; pings go out every ping_ms and renew lease_ms leases.
    heartbeat_ms: float = 500.0
    ping_ms: float = 100.0
    lease_ms: float = 500.0
    recovery_ms: float = 500.0
    straggler_window_ms: float = 500.0
    straggler_cooldown_ms: float = 10_000.0
    thrifty: bool = True
    # ProtocolConfig.early_send (SDPaxos): matters only with a disk model (disk_sync_ms).
    early_send: bool = False
    # ProtocolConfig.defer_execution: a replica executes its commits after sending them
    # (as the runtime does by default).
    defer_execution: bool = False
    jitter: float = 0.0
    jitter_ms_min: float = 0.0
    loss: float = 0.0
    dup: float = 0.0
    read_fraction: float = 0.0
    keys: int = 8
    client_timeout_ms: float = 2000.0  # resend to the next replica; 0: never
    # After the load stops, run until quiet (every client answered, every live
    # replica executed the same log) or at most this long.
    drain_seconds: float = 30.0
    # Processing cost: a node handles one event at a time, each costing
    # cpu_us_event + cpu_us_msg per message, times its slowness factor.
    cpu_us_event: float = 10.0
    cpu_us_msg: float = 1.0
    # Clock skew per node: node i ticks every tick_ms * (1 + tick_skew[i]).
    tick_skew: tuple = ()
    # Take a snapshot (and compact the log) every this many executed slots; 0: never.
    snapshot_every: int = 0
    faults: list = field(default_factory=list)  # [(ms, action, *args)]
    # --- Opt-in behaviour below: the defaults reproduce the original simulator exactly
    # (same events, same random draws in the same order; tests/testdata/trace_corpus.json).
    # Workload: this fraction of commands are ["cas", key, expected, new] on the same
    # small key set, expected being the last value this client saw there (reads, its own
    # writes); read_fraction of gets, the rest puts.
    cas_fraction: float = 0.0
    # SimDisk (consensus/sim/disk.py): a record is durable only after a sync that takes
    # disk_sync_ms plus up to disk_sync_jitter_ms; a Ready's messages and replies wait
    # for its records. 0: every write is durable at once and effects leave at once.
    disk_sync_ms: float = 0.0
    disk_sync_jitter_ms: float = 0.0
    # With a SimDisk, a crash loses the records not yet synced (a machine crash) or,
    # False, keeps them (only the process died); disk_torn keeps a random prefix of them.
    lose_unsynced_on_crash: bool = True
    disk_torn: bool = False
    # The replicated machine, by name (resolved through consensus.sim.registry, which the
    # application layer fills: store.machines): "kv" (the workload above) or
    # "scheduler" with machine_config a HiveD config (YAML text, mapping or path).
    # The scheduler workload: each client allocates a one-pod group (1-2 leaf cells,
    # priority -1..1, a VC drawn from the config, wait false), releases it, and
    # allocates again; read_fraction of its commands are read-only queries.
    machine: str = "kv"
    machine_config: Any = None


@dataclass
class Client:
    cid: int
    site: int
    seq: int = 0
    target: int = 0
    op: Any = None
    needs_result: bool = False
    t_send: int = 0  # first send of the current command (µs)
    attempt: int = 0
    active: bool = True
    history: list = field(default_factory=list)  # (t_invoke, t_complete, op, result, acked)
    seen: dict = field(default_factory=dict)  # key -> last value seen (CAS workload)
    admin: bool = False  # sends one command (a reconfiguration), then stops


def kv_history(events: list, end_time: int) -> list:
    """Key-value client events as jepsen_like ops (the KV model: value ``(key, v)``).

    ``events`` are ``(time, phase, process, op, result)``: phase 1 an invocation, 0 its
    completion, 2 a command still unanswered at the end (reported as ``info`` at
    ``end_time``). A client's next command starts the instant its last one completes, so
    completions (0) sort before invocations (1) at equal times; unfinished ones last. A
    cas answered False did not happen (Jepsen records it as ``fail``)."""
    from jepsen_like.history import Op

    ops: list = []
    for t, phase, process, op, result in sorted(events, key=lambda e: (e[0], e[1], e[2])):
        if op[0] == "cas":
            f, value = "cas", (op[1], (op[2], op[3]))
            kind = "invoke" if phase == 1 else ("ok" if result is True else "fail") if phase == 0 else "info"
        else:
            f = "get" if op[0] == "get" else "put"
            kind = "invoke" if phase == 1 else "ok" if phase == 0 else "info"
            value = (op[1], (result if phase == 0 else None) if f == "get" else op[2])
        ops.append(Op(len(ops), end_time if phase == 2 else t, process, kind, f, value))
    return ops


class Simulation:
    def __init__(self, cfg: SimConfig) -> None:
        if cfg.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {cfg.protocol!r} (sdpaxos or multipaxos)")
        self.cfg = cfg
        self.sites, self.rtt_ms = sites_for(cfg.replicas, cfg.rtt, cfg.rtt_file)
        n = self.n = cfg.replicas
        if not 0 <= cfg.sequencer < n:
            raise ValueError(f"sequencer index {cfg.sequencer} outside 0..{n - 1}")
        root = random.Random(cfg.seed)
        self._net_rng = random.Random(root.getrandbits(64))
        self._work_rng = random.Random(root.getrandbits(64))
        self._node_seeds = [root.getrandbits(64) for _ in range(n)]
        self._tick_phase = [root.randrange(1000, int(cfg.tick_ms * 1000) + 1000) for _ in range(n)]
        # Drawn after every draw above, so runs without a SimDisk are unchanged.
        self._disk_rng = random.Random(root.getrandbits(64))
        one_way = [[max(1, int(round(self.rtt_ms[a][b] * 500))) for b in range(n)] for a in range(n)]
        self.net = SimNetwork(self._net_rng, one_way)
        self.net.jitter = cfg.jitter
        self.net.jitter_us_min = int(cfg.jitter_ms_min * 1000)
        self.net.loss = cfg.loss
        self.net.dup = cfg.dup
        tick = cfg.tick_ms
        self.pcfg = ProtocolConfig(
            n=n,
            initial_sequencer=cfg.sequencer,
            tick_ms=tick,
            batch_max=cfg.batch,
            inflight_max=cfg.inflight,
            thrifty=cfg.thrifty,
            resend_ticks=max(1, round(cfg.resend_ms / tick)),
            heartbeat_ticks=max(1, round(cfg.ping_ms / tick)),
            election_ticks=max(2, round(cfg.heartbeat_ms / tick)),
            lease_ticks=max(1, round(cfg.lease_ms / tick)),
            recovery_ticks=max(1, round(cfg.recovery_ms / tick)),
            straggler_window_ticks=max(1, round(cfg.straggler_window_ms / tick)),
            straggler_cooldown_ticks=max(1, round(cfg.straggler_cooldown_ms / tick)),
            early_send=cfg.early_send,
            defer_execution=cfg.defer_execution,
        )
        self.cls = PROTOCOLS[cfg.protocol]
        self.new_machine = machine_factory(cfg.machine, cfg.machine_config)  # draws nothing
        self._probe = self.new_machine()  # read_key / keys_of only (both pure)
        self._vcs: list[str] = []
        if cfg.machine == "scheduler":
            self._vcs = sorted(self._probe.inner.config.virtual_clusters)
        self.disks: list[list] = [[] for _ in range(n)]
        self.snaps: list[tuple | None] = [None] * n  # each node's latest stored snapshot
        self._snap_slot = [0] * n
        # defer_execution: the disk mark (records count) of the Ready that carried the
        # commits; execution runs once the effects up to it have left (Node._exec_mark).
        self._exec_mark: list[int | None] = [None] * n
        self.snapshots_taken = 0
        self.snapshots_installed = 0
        # (leader, inst, ballot) -> the value first written for it on any disk (the
        # agreement check: one value per ballot and C-instance, on every replica).
        self._ballot_values: dict[tuple, Any] = {}
        self.ballot_conflicts: list[tuple] = []
        self._snapshot_every = cfg.snapshot_every
        self.nodes: list[Any] = [None] * n
        self.incarnation = [0] * n
        # Executed segments: exec_logs[k] = [(label, ids), ...] from slot exec_starts[k];
        # a new one per incarnation and wherever execution jumped (snapshot).
        self.exec_logs: list[list] = []
        self.exec_starts: list[int] = []
        self._exec_log_of: list[list] = [[] for _ in range(n)]
        self._exec_seg_of = [-1] * n
        self.now = 0
        self._seq = 0
        self._heap: list = []
        self._hash = hashlib.blake2b(digest_size=16)
        self.events = 0
        self.clients: dict[int, Client] = {}
        self.latency_us: list[list[int]] = [[] for _ in range(n)]
        self.exec_latency_us: list[list[int]] = [[] for _ in range(n)]
        self.commit_times: list[list[int]] = [[] for _ in range(n)]
        self._awaiting_exec: dict[tuple, tuple[int, int]] = {}
        self.acked: set[tuple] = set()
        self.client_results: dict[tuple, Any] = {}
        self.sent_ops: dict[tuple, Any] = {}
        self.stop_us = int(cfg.seconds * 1_000_000)
        self.messages_sent = 0
        self.crashed_at: dict[int, int] = {}
        self.all_replicas: list = []
        self._elections_seen = [0] * n
        self.view_change_times: list[int] = []
        self.first_fault_us = min((int(f[0] * 1000) for f in cfg.faults), default=None)
        self.busy_until = [0] * n
        self.msg_filter = None  # (src, dst, msg) -> keep?
        self.message_counts: dict[str, int] | None = None
        self.slowness = [1.0] * n
        # Opt-in machinery; empty or None unless a config field or fault asks for it.
        self.sim_disks: list[SimDisk] | None = None
        self._sync_us = int(cfg.disk_sync_ms * 1000)
        self._sync_jitter_us = int(cfg.disk_sync_jitter_ms * 1000)
        if cfg.disk_sync_ms > 0:
            self.sim_disks = [SimDisk(self.disks[i]) for i in range(n)]
        self._drops: list[tuple] = []  # (message type name, src or -1, dst or -1)
        self._paused: set[int] = set()
        skew = list(cfg.tick_skew) + [0.0] * n
        self._tick_us = [int(cfg.tick_ms * 1000 * (1 + skew[i])) for i in range(n)]
        self._held: dict[int, list] = {}  # events of a paused node, in arrival order
        for node in range(n):
            self._start_node(node)
        for site in range(n):
            for k in range(cfg.clients_per_site):
                cid = site * 1000 + k
                self.clients[cid] = Client(cid, site, target=site)
                # Stagger client starts a little so they do not move in lockstep.
                self._push(self._work_rng.randrange(0, 2000), _CLIENT_START, cid, 0)
        self._pending_faults = []
        for spec in cfg.faults:
            self._push(int(spec[0] * 1000), _FAULT, tuple(spec[1:]), 0)
            self._pending_faults.append(int(spec[0] * 1000))

    # --- event plumbing -------------------------------------------------------------------

    def _push(self, t: int, kind: int, a: Any, b: Any, c: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b, c))

    def _start_node(self, node: int) -> None:
        self.incarnation[node] += 1
        self._exec_mark[node] = None
        rng = random.Random(self._node_seeds[node] + self.incarnation[node])
        snap = self.snaps[node]
        self.nodes[node] = self.cls(node, self.pcfg, self.new_machine(), records=list(self.disks[node]), rng=rng, snapshot=snap)
        self.all_replicas.append(self.nodes[node])
        self._elections_seen[node] = 0
        self._new_segment(node, snap[0]["slot"] if snap is not None else 0)
        self._push(self.now + self._tick_phase[node], _TICK, node, self.incarnation[node])
        self._drain(node)

    def _new_segment(self, node: int, start: int) -> None:
        log: list = []
        self.exec_logs.append(log)
        self.exec_starts.append(start)
        self._exec_log_of[node] = log
        self._exec_seg_of[node] = len(self.exec_logs) - 1

    def crash(self, node: int) -> None:
        if self.nodes[node] is not None:
            self.nodes[node] = None
            self.crashed_at[node] = self.now
            if self.sim_disks is not None:
                cfg = self.cfg
                disk = self.sim_disks[node]
                before = disk.synced
                disk.crash(cfg.lose_unsynced_on_crash, cfg.disk_torn, self._disk_rng)
                self._note_values(node, disk.records[before:])  # what the crash kept is durable
            if node in self._paused:
                self.resume(node)  # a dead process is not paused; its held events lapse

    def pause(self, node: int) -> None:
        """SIGSTOP: the node handles nothing (its events wait) until ``resume``."""
        if self.nodes[node] is not None and node not in self._paused:
            self._paused.add(node)
            self._held[node] = []

    def resume(self, node: int) -> None:
        """SIGCONT: the clock catches up, then what arrived meanwhile is handled in order.

        Ticks are never dropped (``consensus/runtime/node.py`` feeds every elapsed tick
        after a stall): a replica counts its lease in its own ticks, so they must not
        fall behind real time. Every tick that fell due while paused is delivered
        first, then the held messages and requests.
        """
        if node not in self._paused:
            return
        self._paused.discard(node)
        self.busy_until[node] = self.now
        held = self._held.pop(node, [])
        replica = self.nodes[node]
        for t, _, kind, a, b, c in held:
            if kind == _TICK and replica is not None and self.incarnation[node] == b:
                step = self._tick_us[node]
                while t <= self.now:
                    replica.tick()
                    t += step
                self._drain(node)
                self._push(t, _TICK, node, b)
        # The backlog is handled one event after another: spread it by each event's
        # cost, so the busy check does not re-queue every waiting event per event.
        t_next = self.now
        cfg = self.cfg
        for _t, _, kind, a, b, c in held:
            if kind != _TICK:
                self._push(t_next, kind, a, b, c)
                if kind <= _REQUEST:
                    cost = cfg.cpu_us_event + (cfg.cpu_us_msg * c[2] if kind == _DELIVER else 0)
                    t_next += int(cost * self.slowness[node])

    def restart(self, node: int) -> None:
        if self.nodes[node] is None:
            self._start_node(node)

    def _drain(self, node: int) -> None:
        """Carry out a replica's effects: persist, then send, then reply."""
        replica = self.nodes[node]
        # Without a disk model every record is durable at once (ready(sync=True)).
        rd = replica.ready(sync=self.sim_disks is None)
        if rd.urgent:  # probes and echoes: not behind the records' sync
            self._send(node, rd.urgent, [])
        elections = replica.stats.get("elections", 0)
        if elections != self._elections_seen[node]:
            self._elections_seen[node] = elections
            self.view_change_times.append(self.now)
        if self.sim_disks is not None:
            self._drain_to_disk(node, replica, rd)
            if self._exec_mark[node] is None and replica.execute_due:
                self._exec_mark[node] = len(self.disks[node])  # this Ready's effects carry the commits
            self._execute_after_send(node)  # if they left already; else _on_sync, once they do
            return
        if rd.persist:
            self.disks[node].extend(rd.persist)
            self._note_values(node, rd.persist)
        self._send(node, rd.messages, rd.replies)
        if rd.executed:
            self._record_executed(node, rd.executed)
        if rd.snapshot_from is not None:
            self._request_snapshot(node, rd.snapshot_from)
        every = self._snapshot_every
        if every and replica.exec_slot - self._snap_slot[node] >= every:
            self._take_snapshot(node)
        self._execute_after_send(node)

    def _execute_after_send(self, node: int) -> None:
        """ProtocolConfig.defer_execution: once the commits are sent, execute them
        (the runtime's ``Node._execution_after_send``): at once without a disk
        model (a Ready's effects leave with it), else once the effects up to the
        Ready that carried them have left, not the whole queue (review 62)."""
        replica = self.nodes[node]
        if replica is None or not replica.execute_due:
            return
        if self.sim_disks is not None:
            mark, waiting = self._exec_mark[node], self.sim_disks[node].waiting
            if mark is not None and waiting and waiting[0][0] <= mark:
                return
            self._exec_mark[node] = None
        replica.execute()
        self._drain(node)

    def _send(self, node: int, messages: list, replies: list) -> None:
        """Messages to peers, then replies to clients (their records are durable)."""
        now = self.now
        for dst, msgs in messages:
            if self._drops:
                msgs = [m for m in msgs if not self._dropped(node, dst, m)]
                if not msgs:
                    continue
            if self.msg_filter is not None:
                # Scripted scenarios drop chosen messages (etcd raft's msgHook).
                msgs = [m for m in msgs if self.msg_filter(node, dst, m)]
                if not msgs:
                    continue
            if self.message_counts is not None:
                for m in msgs:
                    name = type(m).__name__
                    self.message_counts[name] = self.message_counts.get(name, 0) + 1
            data = encode_envelope(node, msgs)
            self.messages_sent += 1
            for delay in self.net.plan(node, dst):
                self._push(now + delay, _DELIVER, dst, node, (data, self.incarnation[dst], len(msgs)))
        for reply in replies:
            client = self.clients.get(reply.client)
            if client is not None:
                delay = self.net.one_way_us[node][client.site] if client.site != node else self._local_us(node)
                self._push(now + delay, _REPLY, reply.client, reply.seq, reply.result)

    def _record_executed(self, node: int, executed: list) -> None:
        """Observe what the node applied (the checks read these logs)."""
        now = self.now
        log = self._exec_log_of[node]
        awaiting = self._awaiting_exec
        for ex in executed:
            ids = tuple((c[0], c[1]) for c in ex.cmds) if ex.cmds else ()
            seg = self._exec_seg_of[node]
            if not log:
                self.exec_starts[seg] = ex.slot
            elif ex.slot != self.exec_starts[seg] + len(log):
                self._new_segment(node, ex.slot)  # execution jumped (snapshot)
                log = self._exec_log_of[node]
            log.append((tuple(ex.label), ids))
            if awaiting:
                for key in ids:
                    hit = awaiting.get(key)
                    if hit is not None and hit[1] == node:
                        del awaiting[key]
                        self.exec_latency_us[node].append(now - hit[0])

    def _dropped(self, src: int, dst: int, msg: Any) -> bool:
        name = type(msg).__name__
        for kind, a, b in self._drops:
            if kind == name and a in (-1, src) and b in (-1, dst):
                return True
        return False

    # --- SimDisk: persist → sync → send → reply → install snapshot ----------------------

    def _note_values(self, node: int, records: list) -> None:
        # Durable records only: an unsynced one a crash lost was never sent (without
        # early send) and its value may be proposed again at the same ballot.
        values = self._ballot_values
        for rec in records:
            if rec[0] == "C" and len(rec) == 5:
                key = (rec[1], rec[2], rec[3])
                seen = values.setdefault(key, rec[4])
                if seen is not rec[4] and seen != rec[4] and len(self.ballot_conflicts) < 20:
                    self.ballot_conflicts.append((node, key))

    def _drain_to_disk(self, node: int, replica: Any, rd: Any) -> None:
        disk = self.sim_disks[node]
        if rd.executed:
            self._record_executed(node, rd.executed)  # in memory: happened already
        records = self.disks[node]
        if rd.persist:
            records.extend(rd.persist)
            disk.tokens.append((len(records), rd.token))
        if rd.messages or rd.replies or rd.snapshot_from is not None:
            effects = (len(records), rd.messages, rd.replies, rd.snapshot_from)
            if not disk.waiting and len(records) <= disk.synced:
                self._release(node, effects)
            else:
                disk.waiting.append(effects)
        if len(records) > disk.synced:
            if disk.syncing is None:
                self._start_sync(node)
        elif not disk.waiting:
            self._disk_snapshot_steps(node)

    def _release(self, node: int, effects: tuple) -> None:
        _mark, messages, replies, snapshot_from = effects
        self._send(node, messages, replies)
        if snapshot_from is not None:
            self._request_snapshot(node, snapshot_from)

    def _start_sync(self, node: int) -> None:
        disk = self.sim_disks[node]
        delay = self._sync_us
        if self._sync_jitter_us:
            delay += int(self._disk_rng.random() * self._sync_jitter_us)
        disk.syncing = len(disk.records)
        self._push(self.now + max(1, delay), _DISK_SYNC, node, (self.incarnation[node], disk.epoch), disk.syncing)

    def _on_sync(self, node: int, inc: int, epoch: int, mark: int) -> None:
        disk = self.sim_disks[node]
        if self.nodes[node] is None or self.incarnation[node] != inc or disk.epoch != epoch:
            return  # crashed, or the log was rewritten meanwhile
        self._hash.update(b"Y%d,%d,%d," % (self.now, node, mark))
        disk.syncing = None
        disk.syncs += 1
        if mark > disk.synced:
            self._note_values(node, disk.records[disk.synced:mark])  # durable now
            disk.synced = mark
        token = 0
        tokens = disk.tokens
        while tokens and tokens[0][0] <= disk.synced:
            token = tokens.popleft()[1]
        if token:
            self.nodes[node].persisted(token)  # its own accepts count now: maybe more to do
        waiting = disk.waiting
        while waiting and waiting[0][0] <= disk.synced:
            self._release(node, waiting.popleft())
        if len(disk.records) > disk.synced:
            self._start_sync(node)
        if token:
            self._drain(node)
        else:
            self._execute_after_send(node)
        self._disk_snapshot_steps(node)

    def _disk_snapshot_steps(self, node: int) -> None:
        """The last driver step: install a peer's snapshot that waited, take our own."""
        disk = self.sim_disks[node]
        if disk.install is not None:
            peer, meta, state = disk.install
            disk.install = None
            self._install(node, peer, meta, state)
            return
        every = self._snapshot_every
        if every and self.nodes[node] is not None and self.nodes[node].exec_slot - self._snap_slot[node] >= every:
            self._take_snapshot(node)

    # --- snapshots ----------------------------------------------------------------------

    def _store_snapshot(self, node: int, snap: tuple) -> None:
        """Durably store ``snap`` as the node's latest, compact, rewrite the disk."""
        meta = snap[0]
        self.snaps[node] = snap
        self._snap_slot[node] = meta["slot"]
        live = self.nodes[node].compact(meta)
        if self.sim_disks is not None:  # the rewrite makes the unsynced records durable (restated)
            old = self.sim_disks[node]
            self._note_values(node, old.records[old.synced:])
        self.disks[node] = list(live)  # the WAL now starts with the live records
        self._hash.update(b"S%d,%d,%d," % (self.now, node, meta["slot"]))
        if self.sim_disks is not None:
            # Snapshot and fresh WAL are durable together: everything the replica
            # holds is on disk, so whatever waited for a sync may leave now.
            disk = self.sim_disks[node]
            self.disks[node] = disk.rewrite(self.disks[node])
            replica = self.nodes[node]
            while disk.waiting:
                self._release(node, disk.waiting.popleft())
            if self._exec_mark[node] is not None:
                # The Ready with the commits left with the rest; the mark counted records
                # of the old disk, and later Readys count on the new, shorter one: kept,
                # it would hold execution back until they left (review 65).
                self._exec_mark[node] = -1
            if replica.token > replica.durable_token:
                replica.persisted(replica.token)
                self._drain(node)

    def _take_snapshot(self, node: int) -> None:
        snap = self.nodes[node].take_snapshot()
        if snap is None:
            if self.cfg.protocol != "sdpaxos":
                self._snapshot_every = 0  # this protocol does not compact
            return  # not now (SDPaxos: an executed slot is not committed yet)
        self.snapshots_taken += 1
        self._store_snapshot(node, snap)

    def _request_snapshot(self, node: int, peer: int) -> None:
        if not 0 <= peer < self.n or peer == node:
            return
        for delay in self.net.plan(node, peer)[:1]:
            self._push(self.now + delay, _SNAP_REQ, peer, node, self.incarnation[node])

    def _on_snapshot_request(self, peer: int, node: int, inc: int) -> None:
        snap = self.snaps[peer]
        if self.nodes[peer] is None or snap is None:
            return  # the peer is down (or has none): the replica asks again later
        # The snapshot crosses the wire: meta through msgpack, state as bytes.
        wire = msgpack.packb([snap[0], snap[1]], use_bin_type=True)
        for delay in self.net.plan(peer, node)[:1]:
            self._push(self.now + delay, _SNAP_DATA, node, peer, (wire, inc))

    def _on_snapshot_data(self, node: int, peer: int, wire: bytes, inc: int) -> None:
        replica = self.nodes[node]
        if replica is None or self.incarnation[node] != inc:
            return
        self._hash.update(b"I%d,%d,%d," % (self.now, node, peer))
        meta, state = msgpack.unpackb(wire, raw=False)
        if self.sim_disks is not None and self.sim_disks[node].holds():
            self.sim_disks[node].install = (peer, meta, state)  # after the sync (last step)
            return
        self._install(node, peer, meta, state)

    def _install(self, node: int, peer: int, meta: dict, state: bytes) -> None:
        replica = self.nodes[node]
        if replica.install_snapshot(meta, state):
            self.snapshots_installed += 1
            self._store_snapshot(node, (meta, state))
        self._drain(node)

    def _local_us(self, node: int) -> int:
        return self.net.one_way_us[node][node]

    # --- clients ------------------------------------------------------------------------

    def _client_next(self, client: Client) -> None:
        if self.now >= self.stop_us:
            client.active = False
            return
        rng = self._work_rng
        client.seq += 1
        if self._vcs:
            self._scheduler_op(client, rng)
        else:
            self._kv_op(client, rng)
        client.t_send = self.now
        client.attempt = 0
        self.sent_ops[(client.cid, client.seq)] = client.op
        client.target = client.site
        self._client_send(client)

    def _scheduler_op(self, client: Client, rng: random.Random) -> None:
        held = client.seen.get("group")
        if self.cfg.read_fraction and rng.random() < self.cfg.read_fraction:
            if held is not None:
                client.op = {"op": "inspect", "view": "affinitygroup", "name": held}
            else:
                client.op = {"op": "list_groups"}
        elif held is not None:
            client.op = {"op": "release", "group": held}
        else:
            spec = {"name": f"c{client.cid}-{client.seq}", "virtualCluster": self._vcs[rng.randrange(len(self._vcs))],
                    "priority": rng.randrange(-1, 2), "leafCellNumber": 1 + rng.randrange(2)}
            client.op = {"op": "allocate", "group": spec, "wait": False}
        client.needs_result = True

    def _kv_op(self, client: Client, rng: random.Random) -> None:
        key = f"k{rng.randrange(self.cfg.keys)}"
        if self.cfg.cas_fraction:
            r = rng.random()
            if r < self.cfg.read_fraction:
                client.op, client.needs_result = ["get", key], True
            elif r < self.cfg.read_fraction + self.cfg.cas_fraction:
                expected = client.seen.get(key)
                client.op, client.needs_result = ["cas", key, expected, f"{client.cid}:{client.seq}"], True
            else:
                client.op, client.needs_result = ["put", key, f"{client.cid}:{client.seq}"], False
        elif self.cfg.read_fraction and rng.random() < self.cfg.read_fraction:
            client.op, client.needs_result = ["get", key], True
        else:
            client.op, client.needs_result = ["put", key, f"{client.cid}:{client.seq}"], False

    def _client_send(self, client: Client) -> None:
        node = client.target
        delay = self._local_us(node) if node == client.site else self.net.one_way_us[client.site][node]
        self._push(self.now + delay, _REQUEST, node, client.cid, (client.seq, client.op, client.needs_result))
        if client.attempt == 0 and node == client.site:
            self._awaiting_exec[(client.cid, client.seq)] = (self.now, node)
        if self.cfg.client_timeout_ms:
            self._push(self.now + int(self.cfg.client_timeout_ms * 1000), _CLIENT_TIMEOUT, client.cid, (client.seq, client.attempt))

    def _on_reply(self, cid: int, seq: int, result: Any) -> None:
        client = self.clients[cid]
        if seq != client.seq or client.op is None:
            return  # a late answer to an earlier attempt
        key = (cid, seq)
        self.acked.add(key)
        self.client_results[key] = result
        client.history.append((client.t_send, self.now, client.op, result, True))
        if self._vcs:
            op = client.op
            if op["op"] == "allocate" and result.get("ok"):
                client.seen["group"] = op["group"]["name"]
            elif op["op"] == "release":  # done, or gone already (a retried release)
                client.seen.pop("group", None)
        elif self.cfg.cas_fraction:
            op = client.op
            if op[0] == "get":
                client.seen[op[1]] = result
            elif op[0] == "put" or (op[0] == "cas" and result is True):
                client.seen[op[1]] = op[-1]
        client.op = None
        if client.admin:
            return
        site = client.site
        self.latency_us[site].append(self.now - client.t_send)
        self.commit_times[site].append(self.now)
        self._client_next(client)

    def _on_client_timeout(self, cid: int, seq: int, attempt: int) -> None:
        client = self.clients[cid]
        if client.op is None or client.seq != seq or client.attempt != attempt:
            return
        client.attempt += 1
        # Try the next replica that is up (the client cannot know, it just rotates).
        client.target = (client.target + 1) % self.n
        self._client_send(client)

    # --- main loop ----------------------------------------------------------------------

    def run(self, until_ms: float | None = None) -> "Simulation":
        """Run to the end (load, then drain until quiet), or only until ``until_ms``."""
        end = self.stop_us + int(self.cfg.drain_seconds * 1_000_000)
        if until_ms is not None:
            end = min(end, int(until_ms * 1000))
        heap = self._heap
        h = self._hash
        nodes = self.nodes
        skew = list(self.cfg.tick_skew) + [0.0] * self.n
        tick_us = [int(self.cfg.tick_ms * 1000 * (1 + skew[i])) for i in range(self.n)]
        while heap:
            if heap[0][0] > end:
                break
            t, _, kind, a, b, c = heapq.heappop(heap)
            if self._paused and a in self._paused and kind in _NODE_KINDS:
                self._held[a].append((t, 0, kind, a, b, c))  # SIGSTOPped: waits for resume
                continue
            if kind <= _REQUEST and self.busy_until[a] > t:
                # The node is still busy with earlier work: queue behind it (FIFO).
                self._seq += 1
                heapq.heappush(heap, (self.busy_until[a], self._seq, kind, a, b, c))
                continue
            self.now = t
            self.events += 1
            if kind <= _REQUEST:
                cost = self.cfg.cpu_us_event
                if kind == _DELIVER:
                    cost += self.cfg.cpu_us_msg * c[2]
                self.busy_until[a] = t + int(cost * self.slowness[a])
            if kind == _DELIVER:
                data, inc, _count = c
                replica = nodes[a]
                if replica is None or self.incarnation[a] != inc:
                    continue
                h.update(b"D%d,%d,%d," % (t, a, b))
                h.update(data)
                src, msgs = decode_envelope(data)
                replica.step(src, msgs)
                self._drain(a)
            elif kind == _TICK:
                if nodes[a] is None or self.incarnation[a] != b:
                    continue
                nodes[a].tick()
                self._drain(a)
                self._push(t + tick_us[a], _TICK, a, b)
                if t > self.stop_us and until_ms is None and self.quiet():
                    break
            elif kind == _REQUEST:
                replica = nodes[a]
                h.update(b"Q%d,%d,%d," % (t, a, b))
                if replica is None:
                    continue
                seq, op, needs = c
                key = self._probe.read_key(op)
                if key is not None and hasattr(replica, "read"):
                    replica.read(b, seq, op, key)
                else:
                    replica.propose(b, seq, op, needs)
                self._drain(a)
            elif kind == _REPLY:
                h.update(b"R%d,%d,%d," % (t, a, b))
                self._on_reply(a, b, c)
            elif kind == _CLIENT_TIMEOUT:
                self._on_client_timeout(a, b[0], b[1])
            elif kind == _CLIENT_START:
                self._client_next(self.clients[a])
            elif kind == _FAULT:
                h.update(b"F%d," % t + repr(a).encode())
                self._apply_fault(a)
            elif kind == _SNAP_REQ:
                self._on_snapshot_request(a, b, c)
            elif kind == _SNAP_DATA:
                self._on_snapshot_data(a, b, c[0], c[1])
            elif kind == _DISK_SYNC:
                self._on_sync(a, b[0], b[1], c)
        return self

    def quiet(self) -> bool:
        """Load stopped, every client answered, live replicas executed the same log
        (or every live replica ended the epoch: what is unanswered stays so)."""
        live = [i for i in range(self.n) if self.nodes[i] is not None]
        if live and len(self.ended()) == len(live) and not any(t > self.now for t in self._pending_faults):
            return True
        if any(c.op is not None for c in self.clients.values()):
            return False
        if any(t > self.now for t in self._pending_faults):
            return False
        live = [i for i in range(self.n) if self.nodes[i] is not None]
        if not all(self.nodes[i].idle() for i in live):
            return False
        ends = {self.nodes[i].exec_slot for i in live}
        if len(ends) > 1:
            return False
        if self._paused:
            return False
        if self.sim_disks is not None and any(self.sim_disks[i].holds() for i in live):
            return False
        return True

    def _apply_fault(self, action: tuple) -> None:
        name, args = action[0], action[1:]
        if name == "crash":
            self.crash(args[0])
        elif name == "restart":
            self.restart(args[0])
        elif name == "partition":
            self.net.partition([list(g) for g in args[0]])
        elif name == "isolate":
            self.net.isolate(args[0])
        elif name == "cut":
            self.net.cut(args[0], args[1])
        elif name == "heal":
            self.net.heal()
            self._drops = []
        elif name == "uncut":
            self.net.uncut(args[0], args[1])
        elif name == "block":
            for src, dst in args[0]:
                self.net.cut(src, dst)
        elif name == "unblock":
            for src, dst in args[0]:
                self.net.uncut(src, dst)
        elif name == "drop":
            # Drop every message of one type from src to dst (-1: any), until heal/undrop.
            self._drops.append((args[0], args[1], args[2]))
        elif name == "undrop":
            # That one drop, or (no arguments) all of them.
            self._drops = [d for d in self._drops if args and d != tuple(args)]
        elif name == "pause":
            self.pause(args[0])
        elif name == "resume":
            self.resume(args[0])
        elif name == "loss":
            self.net.loss = args[0]
        elif name == "slow":
            self.slowness[args[0]] = float(args[1])
        elif name == "reconfig":
            self._reconfigure(args[0], list(args[1]) if len(args) > 1 else None)
        else:
            raise ValueError(f"unknown fault {name!r}")

    def _reconfigure(self, site: int, members: list | None) -> None:
        """An admin client at ``site`` asks to close epoch 0 (docs/membership.md)."""
        from consensus.core.executor import RECONFIG

        members = members or [f"r{i}" for i in range(self.n)]
        cid = 900_000 + len([c for c in self.clients.values() if c.admin])
        client = self.clients[cid] = Client(cid, site, target=site, admin=True)
        client.seq = 1
        client.op, client.needs_result = [RECONFIG, 0, members, members[0]], True
        client.t_send = self.now
        self.sent_ops[(cid, 1)] = client.op
        self._client_send(client)

    def ended(self) -> dict[int, int]:
        """Live replicas that executed their epoch's END: node -> END slot."""
        return {i: r.ended for i, r in enumerate(self.nodes) if r is not None and getattr(r, "ended", -1) >= 0}

    # --- results --------------------------------------------------------------------------

    def history_ops(self) -> list:
        """The client history as jepsen_like ops (KV model: value is ``(key, v)``)."""
        if self._vcs:
            raise ValueError("history_ops and linearizable model the kv machine only")
        events = []
        for client in self.clients.values():
            if client.admin:
                continue  # a reconfiguration: no key-value operation
            for t0, t1, op, result, _ok in client.history:
                events.append((t0, 1, client.cid, op, None))
                events.append((t1, 0, client.cid, op, result))
            if client.op is not None:
                events.append((client.t_send, 1, client.cid, client.op, None))
                events.append((10**18, 2, client.cid, client.op, None))
        return kv_history(events, self.now)

    def linearizable(self, timeout_s: float = 60.0):
        """True, False or None (checker budget ran out) for the client history."""
        from jepsen_like.checker import check
        from jepsen_like.models import KV

        result = check(self.history_ops(), KV(), timeout_s=timeout_s)
        return result.linearizable

    def stall_ms(self) -> float:
        """Longest gap between commits at any correct site after the first fault."""
        if self.first_fault_us is None:
            return 0.0
        start = self.first_fault_us
        worst = 0
        for node in range(self.n):
            if self.nodes[node] is None or node in self.crashed_at:
                continue  # not a correct site
            times = [t for t in self.commit_times[node] if t >= start]
            prev = start
            for t in times:
                worst = max(worst, t - prev)
                prev = t
            if not times:
                worst = max(worst, min(self.now, self.stop_us) - start)
        return round(worst / 1000, 1)

    def stall_ms_by_site(self) -> dict[str, float]:
        """Per site, the longest gap between commits of its clients after the first
        fault (crashed sites included: their clients move on to other replicas)."""
        if self.first_fault_us is None:
            return {}
        start, end = self.first_fault_us, min(self.now, self.stop_us)
        out = {}
        for node, name in enumerate(self.sites):
            times = [t for t in self.commit_times[node] if t >= start]
            prev, worst = start, 0
            for t in times:
                worst = max(worst, t - prev)
                prev = t
            if not times:
                worst = max(0, end - start)
            out[name] = round(worst / 1000, 1)
        return out

    def throughput(self, t0_us: int, t1_us: int) -> float:
        """Commits per simulated second in [t0, t1)."""
        if t1_us <= t0_us:
            return 0.0
        count = sum(1 for times in self.commit_times for t in times if t0_us <= t < t1_us)
        return round(count / ((t1_us - t0_us) / 1e6), 1)

    @property
    def trace_hash(self) -> str:
        return self._hash.hexdigest()

    def canonical_log(self) -> list:
        """The executed sequence from slot 0, merged from every segment (longest wins)."""
        merged: list = []
        for k in sorted(range(len(self.exec_logs)), key=lambda k: (self.exec_starts[k], -len(self.exec_logs[k]))):
            start, log = self.exec_starts[k], self.exec_logs[k]
            if start <= len(merged) and start + len(log) > len(merged):
                merged.extend(log[len(merged) - start :])
        return merged

    def check(self) -> dict:
        """Safety checks over everything every replica executed."""
        canonical = self.canonical_log()
        starts = self.exec_starts
        consistent = all(
            not log or (starts[k] + len(log) <= len(canonical) and log == canonical[starts[k] : starts[k] + len(log)])
            for k, log in enumerate(self.exec_logs)
        )
        # Sequential replay of the executed order.
        replay = Executor(self.new_machine())
        applied: dict[tuple, Any] = {}
        applied_twice = 0
        out: list = []
        ops = self.sent_ops
        for _label, ids in canonical:
            if not ids:
                continue
            batch = [[cid, seq, ops.get((cid, seq))] for cid, seq in ids]
            replay.run(batch, out)
            for cid, seq, result, fresh in out:
                if fresh:
                    if (cid, seq) in applied:
                        applied_twice += 1
                    applied[(cid, seq)] = result
            out.clear()
        # Lease reads never enter the log; the linearizability check covers them.
        lost = [key for key in self.acked if key not in applied and not self._is_read(ops.get(key))]
        # Reads are judged by the linearizability check: a read answered through the
        # lease and retried through the log has two legitimate answers.
        wrong = [
            key
            for key, result in self.client_results.items()
            if key in applied and applied[key] != result and not self._is_read(ops.get(key))
        ]
        # Agreement per slot: every incarnation that executed slot s executed the same
        # batch there; replicas at the same execution point hold the same state.
        at_slot: dict[int, tuple] = {}
        disagreements = 0
        for k, log in enumerate(self.exec_logs):
            start = starts[k]
            for i, entry in enumerate(log):
                seen = at_slot.setdefault(start + i, entry)
                if seen != entry:
                    disagreements += 1
        states: dict[int, bytes] = {}
        for replica in self.nodes:
            if replica is not None and hasattr(replica, "exec_slot"):
                state = replica.executor.snapshot()
                if states.setdefault(replica.exec_slot, state) != state:
                    disagreements += 1
        ends = [r.ended for r in self.all_replicas if getattr(r, "ended", -1) >= 0]
        past_end = 0
        if ends:
            end = min(ends)
            past_end = sum(1 for r in self.all_replicas for j, s in r.oslots.items() if j > end and s.committed)
            disagreements += len(set(ends)) - 1
        return {
            "consistent": consistent,
            "agreement": disagreements == 0 and not self.ballot_conflicts,
            "past_end": past_end,
            "lost_acked": len(lost),
            "duplicated": applied_twice,
            "wrong_results": len(wrong),
            "executed_slots": len(canonical),
        }

    def _is_read(self, op: Any) -> bool:
        return op is not None and self._probe.read_key(op) is not None

    def summary(self) -> dict:
        def pct(values: list[int], q: float) -> float:
            if not values:
                return 0.0
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000, 3)

        sites = {}
        for node, name in enumerate(self.sites):
            lat = self.latency_us[node]
            sites[name] = {
                "commits": len(lat),
                "p50_ms": pct(lat, 0.5),
                "mean_ms": round(sum(lat) / len(lat) / 1000, 3) if lat else 0.0,
                "p99_ms": pct(lat, 0.99),
                "exec_p50_ms": pct(self.exec_latency_us[node], 0.5),
            }
        checks = self.check()
        extra = {"view_changes": sum(r.stats.get("elections", 0) for r in self.all_replicas)}
        if self.cfg.snapshot_every or self.snapshots_installed:
            extra["snapshots_taken"] = self.snapshots_taken
            extra["snapshots_installed"] = self.snapshots_installed
        if self.cfg.faults:
            extra["stall_ms"] = self.stall_ms()
        if checks["past_end"] or self.ended():
            extra["epoch_end"] = sorted(set(self.ended().values()))
            extra["past_end"] = checks["past_end"]
        if self.sim_disks is not None:
            extra["disk_syncs"] = sum(d.syncs for d in self.sim_disks)
            extra["disk_records_lost"] = sum(d.lost for d in self.sim_disks)
        return {
            "protocol": self.cfg.protocol,
            "replicas": self.n,
            "sequencer": self.sites[self.cfg.sequencer],
            "sites": sites,
            "committed": sum(len(v) for v in self.latency_us),
            "sim_seconds": self.cfg.seconds,
            "consistent": checks["consistent"],
            "lost_acked": checks["lost_acked"],
            "duplicated": checks["duplicated"],
            "wrong_results": checks["wrong_results"],
            "agreement": checks["agreement"],
            **extra,
            "messages": self.messages_sent,
            "events": self.events,
            "seed": self.cfg.seed,
            "trace_hash": self.trace_hash,
        }
