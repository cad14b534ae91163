"""CPU seconds of benchmark processes, read from Linux ``/proc``.

A replica is more than its own process: with ``fsync_worker = "process"`` (the
default) a child process runs its fsyncs, and a forked child writes its snapshots.
Their CPU is the replica's, so every figure here is of a process *and its live
descendants* (the ones already reaped are in the parent's ``cutime``/``cstime``, which
only grow when a child exits; those are added too)."""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass
    return out


def tree_cpu_s(pid: int, exclude: frozenset[int] | set[int] = frozenset()) -> float | None:
    """User + system CPU seconds of ``pid`` and its descendants (but not of those in
    ``exclude``, nor theirs), reaped children included; None if ``pid`` cannot be read."""
    try:
        fields = _stat(pid)
        total = sum(int(x) for x in fields[11:15]) / _TICK  # utime, stime, cutime, cstime
    except (OSError, IndexError, ValueError):
        return None
    stack = [c for c in _children(pid) if c not in exclude]
    seen = {pid}
    while stack:  # bounded by the processes on the machine
        child = stack.pop()
        if child in seen:
            continue
        seen.add(child)
        try:
            total += sum(int(x) for x in _stat(child)[11:15]) / _TICK
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile: its time is in our cutime once reaped
        stack.extend(c for c in _children(child) if c not in exclude)
    return total


def self_cpu_s(exclude: frozenset[int] | set[int] = frozenset()) -> float:
    """This process (every thread, exact) plus its descendants but ``exclude``d ones."""
    total = time.process_time()
    for child in _children(os.getpid()):
        if child not in exclude:
            total += tree_cpu_s(child, exclude) or 0.0
    return total
