"""The simulated network: per-link delay, jitter, loss, duplication and partitions.

All randomness comes from the ``random.Random`` handed in (a sub-seed of the run's
seed), so a run replays bit for bit. Reordering is a consequence of jitter: two
messages on the same link may overtake each other, as the protocols must tolerate
(the paper assumes an asynchronous, unordered network).
"""

from __future__ import annotations

import random


class SimNetwork:
    def __init__(self, rng: random.Random, one_way_us: list[list[int]]) -> None:
        self.rng = rng
        self.one_way_us = one_way_us
        self.n = len(one_way_us)
        self.jitter = 0.0  # extra delay, uniform in [0, jitter * one_way]
        self.jitter_us_min = 0  # at least this much jitter range (LAN links are tiny)
        self.loss = 0.0
        self.dup = 0.0
        self.blocked: set[tuple[int, int]] = set()  # directed (src, dst) links cut
        self.sent = 0
        self.dropped = 0

    # --- partitions -------------------------------------------------------------------

    def partition(self, groups: list[list[int]]) -> None:
        """Only nodes in the same group can talk (symmetric)."""
        where = {}
        for g, members in enumerate(groups):
            for node in members:
                where[node] = g
        self.blocked = {
            (a, b) for a in range(self.n) for b in range(self.n) if a != b and where.get(a, -1 - a) != where.get(b, -1 - b)
        }

    def cut(self, src: int, dst: int) -> None:
        """Drop everything from ``src`` to ``dst`` (one way)."""
        self.blocked.add((src, dst))

    def uncut(self, src: int, dst: int) -> None:
        """Deliver from ``src`` to ``dst`` again (the other direction is untouched)."""
        self.blocked.discard((src, dst))

    def isolate(self, node: int) -> None:
        for other in range(self.n):
            if other != node:
                self.blocked.add((node, other))
                self.blocked.add((other, node))

    def heal(self) -> None:
        self.blocked = set()

    # --- transit ------------------------------------------------------------------------

    def plan(self, src: int, dst: int) -> list[int]:
        """Delays (µs) of the copies of one message that will arrive: 0, 1 or 2."""
        self.sent += 1
        if (src, dst) in self.blocked:
            self.dropped += 1
            return []
        rng = self.rng
        if self.loss and rng.random() < self.loss:
            self.dropped += 1
            return []
        base = self.one_way_us[src][dst]
        copies = [base + self._jitter(base)]
        if self.dup and rng.random() < self.dup:
            copies.append(base + self._jitter(base) + int(rng.random() * base) + 1)
        return copies

    def _jitter(self, base: int) -> int:
        if not self.jitter:
            return 0
        span = max(self.jitter * base, self.jitter_us_min)
        return int(self.rng.random() * span)
