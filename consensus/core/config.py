"""Static configuration shared by the protocol state machines.

Time is counted in ticks; the driver (simulator or asyncio runtime) decides how long a
tick is and passes ``tick_ms`` only so that ``ticks`` can turn milliseconds into
ticks. Nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Ballots are ``round << BALLOT_BITS | proposer`` so two proposers never share one.
BALLOT_BITS = 5
MAX_REPLICAS = 1 << BALLOT_BITS  # must stay consistent with make_ballot/ballot_owner

# O-slot value meaning "no command leader": executed as a no-op (paper §3.3, "no-cl").
NOCL = -1
# O-slot value closing an epoch: nothing after it is chosen (docs/membership.md).
END = -2


def make_ballot(round_: int, proposer: int) -> int:
    return (round_ << BALLOT_BITS) | proposer


def ballot_round(ballot: int) -> int:
    return ballot >> BALLOT_BITS


def ballot_owner(ballot: int) -> int:
    """The proposer of a ballot; for a view, its sequencer (or leader)."""
    return ballot & (MAX_REPLICAS - 1)


def majority(n: int) -> int:
    return n // 2 + 1


@dataclass(frozen=True)
class ProtocolConfig:
    """Everything a replica needs to know about the cluster and its timers.

    ``peer_order[r]`` is r's prior order of its peers (ring order unless given): thrifty
    messaging sends accepts to the first ``majority - 1`` peers of r's *measured* order
    (``consensus.core.nearness``), which starts as this one and follows the round trips
    r measures with probes every ``heartbeat_ticks`` when ``measure_rtt``.
    """

    n: int
    initial_sequencer: int = 0
    tick_ms: float = 10.0
    batch_max: int = 256
    # A batch (one C-instance or log slot, or one Forward) also stops once its commands'
    # estimated size (op_bytes) reaches this: with commands limited to 1 MiB by the
    # runtime, every accept stays far below a peer frame (8 MiB). The first command of
    # a batch always goes.
    batch_bytes_max: int = 1 << 20
    inflight_max: int = 32
    thrifty: bool = True
    resend_ticks: int = 50
    # The sequencer (Multi-Paxos: leader) pings every heartbeat_ticks; a replica that
    # hears nothing from it for election_ticks (plus a random share of it, so
    # elections converge) starts a view change.
    heartbeat_ticks: int = 10
    election_ticks: int = 50
    # Sequencer lease: a replica that answers a ping promises not to vote for another
    # sequencer for lease_ticks; the sequencer counts on it for lease_ticks * (1 -
    # drift) from the moment it sent the ping (clock drift bound).
    lease_ticks: int = 50
    drift: float = 0.05
    # A replica blocked on another leader's missing C-instance starts recovering
    # it after recovery_ticks * (1 + its distance from that leader).
    recovery_ticks: int = 50
    # Straggler detection (paper §4): per window, how long my committed instances
    # waited to be ordered vs. how long replication took; 3 bad windows in a row,
    # confirmed by a majority, replace the sequencer, at most once per
    # straggler_cooldown_ticks. A replica confirms a peer's request only on its own
    # evidence (straggler_agree_strikes doubtful windows in a row: the same tests,
    # milder), and a vote counts for two windows unless renewed.
    straggler_window_ticks: int = 50
    straggler_min_demand: int = 4
    straggler_strikes: int = 3
    straggler_agree_strikes: int = 2
    straggler_cooldown_ticks: int = 1000
    # The shortest ready time a window's mean is held against: the fastest this
    # replica has seen, but never below this. 1 is the clock's resolution (an
    # instance answered within its tick took up to one tick). The runtime sets it
    # from real time (NodeConfig.straggler_floor_ms): on loopback the fastest is
    # 0-1 tick, and a saturated machine's own queueing (every replica's loop late by
    # tens of ms) would otherwise look like a slow sequencer and depose it.
    straggler_floor_ticks: int = 1
    peer_order: tuple[tuple[int, ...], ...] = field(default=())
    # Probe every peer every heartbeat_ticks and order peers by the measured round trips.
    # Off only where delivery times mean nothing (the explorer picks every delivery).
    measure_rtt: bool = True
    # SDPaxos: a command leader's C-accepts (and C-requests) of its new instances leave
    # before its own record of them is durable, within instance numbers reserved by a
    # durable record; its own vote counts once durable, and a restart re-prepares the
    # reserved instances its log lacks (docs/early-send.md). Saves one fsync on the
    # commit path. Off: every accept waits for the leader's record.
    early_send: bool = False
    # Execution after send (docs/runtime.md, "Execution after send"): a commit only
    # marks execution due (``execute_due``); the driver runs it with ``execute()`` once
    # it has sent the Ready that carries the commit's messages, so the peers learn of
    # a commit before this replica spends its time applying it (etcd raft's
    # CommittedEntries, applied after the messages go). Order and results unchanged.
    defer_execution: bool = False
    # Which configuration of the cluster this is (docs/membership.md): a reconfiguration
    # command must name it.
    epoch: int = 0

    def __post_init__(self) -> None:
        if not 3 <= self.n <= MAX_REPLICAS or self.n % 2 == 0:
            # 1 replica tolerates no failure and both protocols count their own accept
            # as a whole quorum there (review 10); an even count adds a replica to every
            # quorum without tolerating one more failure, and is not tested.
            raise ValueError(f"a cluster has an odd number of replicas from 3 to {MAX_REPLICAS - 1 + MAX_REPLICAS % 2} (3, 5, 7, ...), not {self.n}")
        if not 0 <= self.initial_sequencer < self.n:
            raise ValueError(f"sequencer {self.initial_sequencer} is not a replica id")
        if self.batch_max < 1 or self.inflight_max < 1 or self.batch_bytes_max < 1:
            raise ValueError("batch_max, batch_bytes_max and inflight_max must be >= 1")
        if not self.peer_order:
            order = tuple(tuple((r + 1 + k) % self.n for k in range(self.n - 1)) for r in range(self.n))
            object.__setattr__(self, "peer_order", order)
        for r, peers in enumerate(self.peer_order):
            if sorted(peers) != [p for p in range(self.n) if p != r]:
                raise ValueError(f"peer_order[{r}] must list every other replica once")

    @property
    def initial_view(self) -> int:
        """Views are ballots: ``round << BALLOT_BITS | sequencer``; round 0 is given."""
        return make_ballot(0, self.initial_sequencer)

    @property
    def quorum(self) -> int:
        return majority(self.n)

    def ticks(self, ms: float) -> int:
        """Milliseconds to ticks, at least one."""
        return max(1, round(ms / self.tick_ms))
