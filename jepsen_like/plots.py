"""Latency and throughput plots of a history, with the nemesis' fault windows shaded
(Jepsen's latency-raw.png and rate.png). Needs matplotlib (the ``bench`` extra).

``op_points(history)``: per completed operation, (invoke time s, latency ms, f, type).
``rates(history, bucket_s)``: completions per second per (f, type) in time buckets.
``write_plots(dir, history, faults)`` writes ``latency.png`` and ``rate.png``; ``faults``
are dicts with ``start``, ``end`` (seconds, the history's clock) and ``kind``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from .history import INVOKE, Op

__all__ = ["longest_gap", "op_points", "rates", "stalls", "write_plots"]


def op_points(history: Sequence[Op]) -> list[tuple[float, float, str, str]]:
    """(invocation time s, latency ms, f, completion type) of every completed op."""
    open_: dict[Any, Op] = {}
    out = []
    for op in history:
        if op.process == "nemesis":
            continue
        if op.type == INVOKE:
            open_[op.process] = op
            continue
        inv = open_.pop(op.process, None)
        if inv is not None:
            out.append((float(inv.time), (float(op.time) - float(inv.time)) * 1000.0, inv.f, op.type))
    return out


def rates(history: Sequence[Op], bucket_s: float = 0.5) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """{(f, type): [(bucket start s, completions per second)]}, every bucket present."""
    counts: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    end = 0.0
    for t, lat, f, typ in op_points(history):
        done = t + lat / 1000.0
        counts[(f, typ)][int(done // bucket_s)] += 1
        end = max(end, done)
    buckets = int(end // bucket_s) + 1
    return {key: [(b * bucket_s, c.get(b, 0) / bucket_s) for b in range(buckets)] for key, c in counts.items()}


def longest_gap(times: Sequence[float], start: float, end: float) -> float:
    """The longest interval in [start, end] that holds none of ``times``."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    return max((b - a for a, b in zip(points, points[1:])), default=end - start)


def stalls(history: Sequence[Op], start: float, end: float) -> float:
    """The longest time (s) in [start, end] without a successful completion."""
    return longest_gap([t + lat / 1000.0 for t, lat, _f, typ in op_points(history) if typ == "ok"], start, end)


_COLORS = {"partition": "#f4a3a3", "kill": "#a3b8f4", "pause": "#f4dca3", "clock": "#c8a3f4", "disk": "#a3f4c4", "delay": "#d0d0d0"}


def _shade(ax, faults: Sequence[dict]) -> None:
    seen = set()
    for f in faults:
        # a combined window (``A+B``): A shaded, B hatched over it in its own colour
        for k, part in enumerate(f["kind"].split("+")):
            family = part.split("-")[0]
            family = family if family in _COLORS else "partition"
            label = None if family in seen else family
            seen.add(family)
            if k == 0:
                ax.axvspan(f["start"], f["end"], color=_COLORS[family], alpha=0.35, lw=0, label=label)
            else:
                ax.axvspan(f["start"], f["end"], facecolor="none", edgecolor=_COLORS[family], hatch="//",
                           lw=0, label=label)


def write_plots(directory: str | Path, history: Sequence[Op], faults: Sequence[dict], title: str = "") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    written = []
    pts = op_points(history)
    marks = {"ok": "o", "fail": "x", "info": "^"}
    fig, ax = plt.subplots(figsize=(11, 4.5))
    _shade(ax, faults)
    for f in sorted({p[2] for p in pts}):
        for typ, m in marks.items():
            xs = [p[0] for p in pts if p[2] == f and p[3] == typ]
            ys = [max(p[1], 0.01) for p in pts if p[2] == f and p[3] == typ]
            if xs:
                ax.scatter(xs, ys, s=4, marker=m, label=f"{f} {typ}", alpha=0.6)
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{title} latency".strip())
    ax.legend(loc="upper right", fontsize=7, markerscale=2, ncol=2)
    fig.tight_layout()
    path = directory / "latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    _shade(ax, faults)
    for (f, typ), series in sorted(rates(history).items()):
        ax.plot([s[0] for s in series], [s[1] for s in series], label=f"{f} {typ}", lw=1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("completions / s")
    ax.set_title(f"{title} throughput".strip())
    ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    path = directory / "rate.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
