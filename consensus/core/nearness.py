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
  ``now - stamp`` whole ticks (the floor of the round trip plus the peer's reaction);
- samples are smoothed (exponential moving average, weight 1/4);
- the order changes by hysteresis: a peer moves ahead of another only when it is nearer
  by more than ``max(HYSTERESIS_TICKS, HYSTERESIS_FRACTION * the other's distance)``,
  so two peers about equally far do not swap places on every sample (each swap moves a
  replica's thrifty quorum);
- a peer never measured is infinitely far and keeps its place in the prior order
  (``peer_order``: ring order unless configured), so before the first echo (one round
  trip after start) and on a LAN, where every peer is 0 ticks away, nothing changes.

The slow-peer rule (a straggler is skipped in thrifty quorums) compares peers with each
other: a peer is slow when its accepts lately take far longer than its best *and* longer
than asking the nearest other healthy peer would take. A near peer that slowed down but
is still faster than the alternatives stays in the quorum.

Peer order is liveness and latency only: which peers receive an accept never decides
what is chosen (any quorum of acks does), so nothing here is a safety rule.
"""

from __future__ import annotations

INF = float("inf")
# A peer moves ahead of another when nearer by more than this (ticks) ...
HYSTERESIS_TICKS = 0.5
# ... or by this fraction of the other's distance, whichever is larger.
HYSTERESIS_FRACTION = 0.05
# A peer judged slow is retried in quorums after this long without evidence.
SLOW_PEER_MEMORY_TICKS = 500


class Nearness:
    """One replica's view of its peers' distances (pure: ticks in, order out)."""

    __slots__ = ("me", "rtt", "order", "ack_best", "ack_ewma", "ack_seen")

    def __init__(self, me: int, n: int, prior: tuple[int, ...]) -> None:
        self.me = me
        self.rtt = [INF] * n  # smoothed probe round trip, ticks (INF: never measured)
        self.rtt[me] = 0.0
        self.order = list(prior)  # peers, nearest first
        # Accept -> ack delays per peer, ticks: best ever, moving average, tick of the last.
        self.ack_best = [1 << 30] * n
        self.ack_ewma = [0.0] * n
        self.ack_seen = [-1] * n

    def echo(self, peer: int, sample: int) -> None:
        """A probe we stamped came back from ``peer`` after ``sample`` ticks."""
        old = self.rtt[peer]
        self.rtt[peer] = float(sample) if old == INF else (3 * old + sample) / 4
        self._reorder()

    def _reorder(self) -> None:
        # Insertion sort that moves a peer ahead only past peers it clearly beats: a
        # stable order for peers within the margin of each other.
        order, rtt = self.order, self.rtt
        for i in range(1, len(order)):
            p = order[i]
            d = rtt[p]
            j = i
            while j > 0 and _clearly_nearer(d, rtt[order[j - 1]]):
                order[j] = order[j - 1]
                j -= 1
            order[j] = p

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
        nearest of ``others`` (healthy alternatives) is expected to take."""
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
