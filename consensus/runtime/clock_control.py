"""TESTING ONLY: a replica's tick clock running at a rate a test sets at run time.

``cellar serve --clock-control FILE`` (``NodeConfig.extra["clock_control"]``) makes
the node's tick timer (``consensus.runtime.node.Node._on_timer``) count ticks on a
clock that runs ``rate`` times as fast as the monotonic clock: the replica ticks
every ``tick_ms / rate``. FILE holds one number, the rate (``1.02``: 2 % fast,
``0.98``: 2 % slow); a missing or empty file means 1. The node looks at the file's
size and modification time at most every ``POLL_S`` seconds and re-reads it when
they change (write a new file and rename it over the old one). A number it cannot
read, or one outside ``RATE_MIN``..``RATE_MAX``, is ignored with one log line (the
previous rate stays).

This is the simulator's clock skew on real processes (``SimConfig.tick_skew``: node i
ticks every ``tick_ms * (1 + skew)``, i.e. ``rate = 1 / (1 + skew)``); the Jepsen
harness's clock nemesis (``jepsen_like.nemesis.ClockNemesis``) writes these files.
The sequencer's lease is safe while every two replicas' rates differ by at most the
protocol's drift bound (``ProtocolConfig.drift``, 5 %), which ``|skew| <=
consensus.sim.search.SKEW_MAX`` (2.4 %) guarantees. Without the option the node reads
the monotonic clock directly and this module is never imported.

A rate change never moves the clock back: the clock is continuous, only its slope
changes (``elapsed`` is piecewise linear in real time).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("cellar.node")

__all__ = ["ClockControl", "RATE_MAX", "RATE_MIN", "read_rate", "write_rate"]

RATE_MIN, RATE_MAX = 0.1, 10.0
POLL_S = 0.05


def read_rate(path: str) -> float | None:
    """The rate in ``path`` (1.0 if missing or empty), None if unreadable or out of range."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return 1.0
    except OSError:
        return None
    if not text:
        return 1.0
    try:
        rate = float(text)
    except ValueError:
        return None
    if not RATE_MIN <= rate <= RATE_MAX:
        return None
    return rate


def write_rate(path: str, rate: float) -> None:
    """Atomically set the rate a node with ``--clock-control path`` runs at."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{rate:.6f}\n")
    os.replace(tmp, path)


class ClockControl:
    """A clock that starts at 0 at ``t0`` (monotonic seconds) and runs at the file's rate."""

    def __init__(self, path: str, t0: float) -> None:
        self.path = path
        self.rate = 1.0
        self._anchor_real = t0  # at this monotonic time ...
        self._anchor = 0.0  # ... the clock read this
        self._sig: tuple | None = None
        self._next_poll = 0.0
        self.changes = 0
        self.poll(t0)

    def elapsed(self, now: float) -> float:
        return self._anchor + (now - self._anchor_real) * self.rate

    def real_delay(self, elapsed_target: float, now: float) -> float:
        """Monotonic seconds from ``now`` until the clock reads ``elapsed_target``."""
        return max(0.0, (elapsed_target - self.elapsed(now)) / self.rate)

    def poll(self, now: float) -> None:
        """Re-read the file if it changed (at most every POLL_S)."""
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_S
        try:
            st = os.stat(self.path)
            sig: tuple | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            sig = None
        if sig == self._sig:
            return
        self._sig = sig
        rate = read_rate(self.path)
        if rate is None:
            log.warning("clock control %s: not a rate within %g..%g; keeping %g", self.path, RATE_MIN, RATE_MAX, self.rate)
            return
        if rate != self.rate:
            self._anchor = self.elapsed(now)
            self._anchor_real = now
            self.rate = rate
            self.changes += 1
            log.info("clock control %s: ticking at rate %g", self.path, rate)

    def status(self) -> dict:
        return {"file": self.path, "rate": self.rate, "changes": self.changes}
