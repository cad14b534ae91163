"""Where the event loop was when it paused: a watchdog thread for finding stalls.

``LoopLag`` (node.py) says *that* the loop paused and for how long; this says *where*.
When ``CELLAR_STALL_TRACE_MS`` is set (say ``30``), every replica runs a daemon thread
that wakes every few milliseconds and, when the tick timer is late by more than that
many milliseconds, writes the main thread's stack to ``<data dir>/stalls.log``, again
each further threshold while the stall lasts, with whether a garbage collection was
running (and of which generation); with ``CELLAR_STALL_TRACE_DIR`` set, to
``<that dir>/stalls-<node id>.log`` instead (the data dir of a benchmark's cluster is
removed at its end). Off by default: it costs a thread wake-up every
few milliseconds and a GIL hand-off when it fires.

    CELLAR_STALL_TRACE_MS=30 cellar steady --seconds 120
    grep -c STALL /tmp/.../node-*/stalls.log
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback
from typing import Callable


def threshold_from_env() -> float | None:
    raw = os.environ.get("CELLAR_STALL_TRACE_MS", "").strip()
    if not raw:
        return None
    try:
        ms = float(raw)
    except ValueError:
        return None
    return ms if ms > 0 else None


def log_path(data_dir: str, node_id: int) -> str:
    where = os.environ.get("CELLAR_STALL_TRACE_DIR", "").strip()
    return os.path.join(where, f"stalls-{node_id}.log") if where else os.path.join(data_dir, "stalls.log")


class StallTracer:
    """Samples the main thread's stack while ``due()`` (the monotonic time the loop
    should have run its timer) is more than ``threshold_ms`` in the past."""

    def __init__(self, path: str, due: Callable[[], float], threshold_ms: float) -> None:
        self.path = path
        self._due = due
        self._threshold = threshold_ms / 1000.0
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._gc_gen: int | None = None
        self._gc_started = 0.0
        self._thread = threading.Thread(target=self._run, name="cellar-stall-tracer", daemon=True)
        self.reports = 0
        self._notes: list = []  # (monotonic, label): the runtime's recent steps (note())

    def note(self, label: str) -> None:
        """Remember a runtime step (a snapshot's fork, its child's exit, a compaction):
        a report lists those of the last second, so a stall can be put beside them."""
        notes = self._notes
        notes.append((time.monotonic(), label))
        if len(notes) > 64:
            del notes[:32]

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_gen = info.get("generation")
            self._gc_started = time.monotonic()
        else:
            self._gc_gen = None

    def _run(self) -> None:
        poll = min(0.005, self._threshold / 4)
        reported_due = None
        next_report = 0.0
        while not self._stop.wait(poll):
            due = self._due()
            late = time.monotonic() - due
            if late < self._threshold:
                continue
            if due != reported_due:
                reported_due = due
                next_report = self._threshold
            if late < next_report:
                continue
            next_report += self._threshold
            self._report(late)

    def _kernel_state(self) -> str:
        """The main thread as the kernel sees it: run state (R running or runnable, S
        sleeping, D in uninterruptible I/O), where it waits, its faults so far."""
        tid = threading.main_thread().native_id
        out = []
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out.append(f"state {fields[0]} minflt {fields[7]} majflt {fields[9]}")
            with open(f"/proc/self/task/{tid}/wchan") as f:
                out.append(f"wchan {f.read().strip() or '-'}")
            with open(f"/proc/self/task/{tid}/stack") as f:  # root only
                out.append("kstack " + " < ".join(line.split()[-1].split("+")[0] for line in f.read().splitlines()[:6]))
        except (OSError, IndexError):
            pass
        return "; ".join(out)

    def _report(self, late: float) -> None:
        frames = sys._current_frames()
        me = threading.get_ident()
        names = {t.ident: t.name for t in threading.enumerate()}
        frame = frames.get(self._main)  # type: ignore[arg-type]
        stack = "".join(traceback.format_stack(frame, limit=25)) if frame is not None else "(no frame)\n"
        for ident, other in frames.items():  # a thread holding the GIL shows here
            if ident not in (me, self._main):
                inner = "".join(traceback.format_stack(other, limit=6))
                stack += f"  [thread {names.get(ident, ident)}]\n{inner}"
        gen = self._gc_gen
        gc_line = (f"gc generation {gen} running for {(time.monotonic() - self._gc_started) * 1000:.0f} ms"
                   if gen is not None else "no gc running")
        stack += f"  [kernel] {self._kernel_state()}\n"
        now = time.monotonic()
        recent = [f"{(t - now) * 1000:+.0f} ms {label}" for t, label in list(self._notes) if now - t < 1.0]
        if recent:
            stack += "  [recent steps] " + "; ".join(recent) + "\n"
        self.reports += 1
        try:
            with open(self.path, "a") as f:
                f.write(f"--- STALL {time.strftime('%H:%M:%S')} timer {late * 1000:.0f} ms late; {gc_line}\n{stack}")
        except OSError:
            pass
