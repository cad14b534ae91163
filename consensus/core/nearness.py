"""How near each peer is: round trips a replica measures itself, and the order it asks
its peers in (issue 15).

Thrifty messaging sends an accept to the ``quorum - 1`` nearest live peers only, so a
replica's commit latency is its round trip to the farthest of those: with the wrong
order a replica at OR waits for OH (68 ms) instead of CA (20 ms). The order used to be
configuration (``ProtocolConfig.peer_order``) that the simulator computed from its RTT
matrix and ``cellar serve`` never set; now every replica measures it, in the simulator
and on real networks alike, by the same mechanism:

- every ``heartbeat_ticks`` a replica sends each peer a ``Probe`` stamped with its own
  tick; the peer answers at once with an ``Echo`` of the stamp; the sample is
  ``now - stamp`` whole ticks (the floor of the round trip plus the peer's reaction).
  Both travel as *urgent* messages (``Ready.urgent``): they vouch for no stored state,
  so the driver sends them without waiting for the records of their Ready to be
  durable -- an echo held behind its acceptor's fsync made the peers we send accepts to
  look farther than idle ones, and the quorum flapped between them (review15 F1);
- a probe left unanswered for longer than twice the peer's round trip (plus two ticks)
  counts as a sample of its age at each heartbeat, so a peer that stops answering (a
  one-way cut: it still talks to us and is never suspected) moves back (F3);
- samples are smoothed (exponential moving average, weight 1/4);
- the thrifty quorum (the first ``quorum - 1`` peers) changes by hysteresis: a peer
  outside it replaces the farthest member only when nearer by more than
  ``max(HYSTERESIS_TICKS, HYSTERESIS_FRACTION * the member's distance)`` -- more than
  one tick, the resolution of a sample, so jitter does not swap near-equal peers on
  every probe (each swap costs a Multi-Paxos newcomer a round trip to fill its gap,
  F1); inside and outside the quorum, peers are sorted by distance;
- a peer never measured is infinitely far and keeps its place in the prior order
  (``peer_order``: ring order unless configured), so before the first echo (one round
  trip after start) and on a LAN, where every peer is 0 ticks away, nothing changes.

The slow-peer rule (a straggler is skipped in thrifty quorums) compares peers with each
other: a quorum member is slow when its accepts lately take far longer than its best
*and* longer than asking the nearest healthy peer *outside* the quorum (the one that
would replace it) would take. A near peer that slowed down but is still faster than its
replacement stays. Ack delays are sampled only for accepts sent once (Karn's rule: an
ack of a resent accept cannot say which send it answers, F4).

Peer order is liveness and latency only: which peers receive an accept never decides
what is chosen (any quorum of acks does), so nothing here is a safety rule.
"""

from __future__ import annotations

INF = float("inf")
# A peer replaces a quorum member when nearer by more than this (ticks) ...
HYSTERESIS_TICKS = 1.5
# ... or by this fraction of the member's distance, whichever is larger.
HYSTERESIS_FRACTION = 0.10
# A peer judged slow is retried in quorums after this long without evidence.
SLOW_PEER_MEMORY_TICKS = 500


class Nearness:
    """One replica's view of its peers' distances (pure: ticks in, order out)."""

    __slots__ = ("me", "k", "rtt", "order", "unanswered", "ack_best", "ack_ewma", "ack_seen")

    def __init__(self, me: int, n: int, prior: tuple[int, ...], k: int | None = None) -> None:
        self.me = me
        self.k = n // 2 if k is None else k  # the thrifty quorum: quorum - 1 peers
        self.rtt = [INF] * n  # smoothed probe round trip, ticks (INF: never measured)
        self.rtt[me] = 0.0
        self.order = list(prior)  # peers: the thrifty quorum, then the rest; each nearest first
        self.unanswered = [-1] * n  # stamp of the oldest probe not yet echoed (-1: none)
        # Accept -> ack delays per peer, ticks: best ever, moving average, tick of the last.
        self.ack_best = [1 << 30] * n
        self.ack_ewma = [0.0] * n
        self.ack_seen = [-1] * n

    def probing(self, now: int) -> None:
        """We send every peer a probe stamped ``now``. A peer whose oldest unanswered
        probe is older than twice its round trip (plus two ticks) gets that age as a
        sample: silence is evidence too."""
        changed = False
        for p in self.order:
            since = self.unanswered[p]
            if since < 0:
                self.unanswered[p] = now
                continue
            age = now - since
            d = self.rtt[p]
            if d != INF and age > 2 * d + 2:
                self.rtt[p] = (3 * d + age) / 4
                changed = True
        if changed:
            self._reorder()

    def echo(self, peer: int, sample: int, stamp: int | None = None) -> None:
        """A probe (stamped ``stamp``) came back from ``peer`` after ``sample`` ticks."""
        if stamp is not None and stamp >= self.unanswered[peer]:
            self.unanswered[peer] = -1  # every probe up to this one is answered
        old = self.rtt[peer]
        self.rtt[peer] = float(sample) if old == INF else (3 * old + sample) / 4
        self._reorder()

    def _reorder(self) -> None:
        rtt = self.rtt
        pos = {p: i for i, p in enumerate(self.order)}

        def key(p: int) -> tuple[float, int]:
            return rtt[p], pos[p]  # ties keep their places

        k = self.k
        members, rest = self.order[:k], self.order[k:]
        # A peer outside the thrifty quorum replaces its farthest member only when it is
        # clearly nearer (hysteresis on membership, not between neighbours: a clearly
        # nearer peer is never shielded by one in between, F5). Each swap brings in a
        # strictly nearer peer, so this ends.
        while members and rest:
            far = max(members, key=key)
            near = min(rest, key=key)
            if not _clearly_nearer(rtt[near], rtt[far]):
                break
            members[members.index(far)] = near
            rest[rest.index(near)] = far
        self.order = sorted(members, key=key) + sorted(rest, key=key)

    def ack(self, peer: int, ticks: int, now: int) -> None:
        """An accept we sent ``peer`` was acked after ``ticks``."""
        if ticks < self.ack_best[peer]:
            self.ack_best[peer] = ticks
        seen = self.ack_seen[peer] >= 0
        self.ack_ewma[peer] = (3 * self.ack_ewma[peer] + ticks) / 4 if seen else float(ticks)
        self.ack_seen[peer] = now

    def expected(self, peer: int, now: int) -> float:
        """How long an accept to ``peer`` should take to come back: its measured round
        trip, or its best ack delay when that is recent evidence and larger (it counts
        the peer's disk)."""
        d = self.rtt[peer]
        if 0 <= self.ack_seen[peer] and now - self.ack_seen[peer] <= SLOW_PEER_MEMORY_TICKS:
            d = max(d, self.ack_best[peer]) if d != INF else self.ack_best[peer]
        return d

    def slow(self, peer: int, now: int, others: list[int]) -> bool:
        """Acks from ``peer`` lately take far longer than its best, and longer than the
        nearest of ``others`` (the healthy peers that would replace it) is expected to
        take."""
        seen = self.ack_seen[peer]
        if seen < 0 or now - seen > SLOW_PEER_MEMORY_TICKS:
            return False  # no recent evidence: give it another chance
        lag = self.ack_ewma[peer]
        if lag <= 3 * self.ack_best[peer] + 2:
            return False
        alternative = min((self.expected(q, now) for q in others if q != peer), default=INF)
        return _clearly_nearer(alternative, lag)


def _clearly_nearer(a: float, b: float) -> bool:
    """``a`` is nearer than ``b`` by more than the hysteresis margin."""
    if b == INF:
        return a != INF
    return a + max(HYSTERESIS_TICKS, HYSTERESIS_FRACTION * b) < b
