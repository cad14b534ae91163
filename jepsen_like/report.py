"""A self-contained HTML page picturing a history and, when there is one, its violation.

``render_html(history, model, result=None, *, title=None, max_ops=600) -> str`` and
``write_report(path, history, model, result=None, ...)``.

The page holds one inline SVG: a row per process, each operation a bar from its invocation to
its completion, coloured by outcome (ok, fail, info; an info bar continues as a dashed line to
the right edge, since it may take effect at any later time). Every bar has a tooltip
(``<title>``) with the operation, its times and the key. On a violation, the failing
partition's operations carry ``class="violation"`` (red outline) and the operations the checker
could not place (the blocked one and the frontier) also ``class="involved"`` (thick red, with a
label); the page then lists the longest linearizable prefix found and the model state after it.
All text is HTML-escaped. Large histories are capped at ``max_ops`` bars: the failing cut's last
operations first, then others in the same time window; the page says how many were left out.
No JavaScript, no external files: it opens from disk or an artifact store.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .checker.core import CheckResult
from .history import FAIL, INFO, Op, Operation, pair
from .models import Model

__all__ = ["render_html", "write_report"]

_ROW_PX = 22
_BAR_PX = 14
_LEFT_PX = 90
_WIDTH_PX = 1400
_TOP_PX = 30

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .3em; }
.verdict-true { color: #1a7f37; } .verdict-false { color: #cf222e; } .verdict-unknown { color: #9a6700; }
table.summary td { padding: 0 1em 0 0; }
.legend span { display: inline-block; margin-right: 1.2em; }
.swatch { display: inline-block; width: 2em; height: .8em; vertical-align: middle; margin-right: .3em; }
svg text { font: 10px monospace; }
svg .row-label { font: 11px monospace; fill: #555; }
svg rect.ok { fill: #8fd19e; } svg rect.fail { fill: #d0d7de; } svg rect.info { fill: #f5c26b; }
svg line.info-tail { stroke: #d4a72c; stroke-dasharray: 4 3; }
svg rect.violation { stroke: #cf222e; stroke-width: 1.5; }
svg rect.involved { stroke: #cf222e; stroke-width: 3.5; fill-opacity: .9; }
svg text.involved-label { fill: #cf222e; font-weight: bold; }
ol.prefix { font: 12px monospace; max-height: 24em; overflow: auto; border: 1px solid #ddd; padding: .5em 2.5em; }
.note { color: #666; }
"""


def write_report(
    path: str | Path,
    history: Sequence[Op] | Sequence[Operation],
    model: Model,
    result: CheckResult | None = None,
    *,
    title: str | None = None,
    max_ops: int = 600,
) -> Path:
    path = Path(path)
    path.write_text(render_html(history, model, result, title=title, max_ops=max_ops), encoding="utf-8")
    return path


def render_html(
    history: Sequence[Op] | Sequence[Operation],
    model: Model,
    result: CheckResult | None = None,
    *,
    title: str | None = None,
    max_ops: int = 600,
) -> str:
    ops = list(history) if history and isinstance(history[0], Operation) else pair(history)  # type: ignore[arg-type]
    violation = result.violation if result is not None else None
    partition_ids: set[int] = set()
    involved_ids: set[int] = set()
    part_model = model
    if violation is not None:
        partition_ids = {o.id for o in violation.ops}
        involved_ids = {o.id for o in violation.involved}
        part_model = model.for_partition(violation.key)
    shown, left_out = _choose(ops, violation, max_ops)

    esc = html.escape
    out: list[str] = []
    heading = title or "Linearizability check"
    out.append(f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{esc(heading)}</title>")
    out.append(f"<style>{_CSS}</style></head><body>")
    out.append(f"<h1>{esc(heading)}</h1>")
    if result is not None:
        v = result.valid
        word = {True: "linearizable", False: "NOT linearizable"}.get(v, "unknown")  # type: ignore[arg-type]
        cls = {True: "true", False: "false"}.get(v, "unknown")  # type: ignore[arg-type]
        reason = f" ({esc(str(result.reason))})" if result.reason else ""
        out.append(f"<p class='verdict-{cls}'><strong>{esc(word)}</strong>{reason}</p>")
        out.append("<table class='summary'>")
        for k, val in (
            ("model", result.model),
            ("operations", result.ops),
            ("partitions", result.partitions),
            ("seconds", f"{result.seconds:.3f}"),
            ("search steps", result.steps),
        ):
            out.append(f"<tr><td>{esc(k)}</td><td>{esc(str(val))}</td></tr>")
        out.append("</table>")
    out.append(
        "<p class='legend'>"
        "<span><i class='swatch' style='background:#8fd19e'></i>ok</span>"
        "<span><i class='swatch' style='background:#d0d7de'></i>fail (did not happen)</span>"
        "<span><i class='swatch' style='background:#f5c26b'></i>info (indeterminate; may take "
        "effect any time after its invocation, dashed)</span>"
        "<span><i class='swatch' style='border:2px solid #cf222e'></i>failing partition</span>"
        "<span><i class='swatch' style='border:4px solid #cf222e'></i>could not be linearized</span>"
        "</p>"
    )
    if left_out:
        out.append(
            f"<p class='note'>Showing {len(shown)} of {len(ops)} operations ({left_out} left out"
            f"{' around the violation' if violation is not None else ''}).</p>"
        )
    out.append(_svg(shown, part_model, model, partition_ids, involved_ids))
    if violation is not None:
        out.append(_violation_html(violation, part_model))
    out.append("</body></html>\n")
    return "\n".join(out)


def _choose(ops: list[Operation], violation: Any, max_ops: int) -> tuple[list[Operation], int]:
    """Which operations to draw: all if few; otherwise, around a violation, the involved
    operations, then the failing partition's operations nearest to them in time (the context
    the checker was stuck in), then any other operations in that time window, widened until max_ops are shown."""
    if len(ops) <= max_ops:
        return ops, 0
    if violation is None:
        return ops[:max_ops], len(ops) - max_ops
    involved = violation.involved or violation.cut[-1:]
    focus = max(o.invoke.time for o in involved)
    chosen = {o.id: o for o in involved}
    nearest = sorted(violation.cut, key=lambda o: abs(o.invoke.time - focus))
    for o in nearest[: max(1, min(60, max_ops // 3))]:
        chosen.setdefault(o.id, o)
    lo = min(o.invoke.time for o in chosen.values())
    hi = max(_end_time(o) for o in chosen.values())
    for o in sorted(ops, key=lambda o: abs(o.invoke.time - focus)):
        if len(chosen) >= max_ops:
            break
        if o.id not in chosen and o.invoke.time <= hi and _end_time(o) >= lo:
            chosen[o.id] = o
    # The window may hold fewer than max_ops: widen it with the nearest operations in time.
    for o in sorted(ops, key=lambda o: abs(o.invoke.time - focus)):
        if len(chosen) >= max_ops:
            break
        chosen.setdefault(o.id, o)
    shown = sorted(chosen.values(), key=lambda o: o.start)
    return shown, len(ops) - len(shown)


def _end_time(o: Operation) -> float:
    return o.complete.time if o.complete is not None else o.invoke.time


def _svg(
    ops: list[Operation], part_model: Model, model: Model, partition_ids: set[int], involved_ids: set[int]
) -> str:
    esc = html.escape
    if not ops:
        return "<p class='note'>(empty history)</p>"
    t0 = min(o.invoke.time for o in ops)
    t1 = max(_end_time(o) for o in ops)
    span = (t1 - t0) or 1
    scale = (_WIDTH_PX - _LEFT_PX - 20) / span
    processes = sorted({o.process for o in ops}, key=lambda p: (isinstance(p, str), str(p) if isinstance(p, str) else p))
    row = {p: i for i, p in enumerate(processes)}
    height = _TOP_PX + _ROW_PX * len(processes) + 10
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{_WIDTH_PX}' height='{height}' "
        f"viewBox='0 0 {_WIDTH_PX} {height}' role='img' aria-label='history timeline'>"
    ]
    out.append(f"<text x='{_LEFT_PX}' y='14'>time {esc(_num(t0))} → {esc(_num(t1))}</text>")
    for p, i in row.items():
        y = _TOP_PX + i * _ROW_PX
        out.append(f"<text class='row-label' x='4' y='{y + _BAR_PX - 3}'>process {esc(str(p))}</text>")
        out.append(f"<line x1='{_LEFT_PX}' x2='{_WIDTH_PX - 10}' y1='{y + _BAR_PX + 3}' y2='{y + _BAR_PX + 3}' stroke='#f0f0f0'/>")
    for o in ops:
        y = _TOP_PX + row[o.process] * _ROW_PX
        x = _LEFT_PX + (o.invoke.time - t0) * scale
        w = max(2.0, (_end_time(o) - o.invoke.time) * scale)
        classes = ["op", o.type]
        if o.id in partition_ids:
            classes.append("violation")
        if o.id in involved_ids:
            classes.append("involved")
        desc = _describe(part_model if o.id in partition_ids else model, o)
        key = o.key
        tip = f"{desc}\nprocess {o.process}, {o.type}, invoked at {_num(o.invoke.time)}"
        if o.complete is not None:
            tip += f", completed at {_num(o.complete.time)}"
        if key is not None:
            tip += f"\nkey {key!r}"
        out.append(
            f"<g><title>{esc(tip)}</title><rect class='{' '.join(classes)}' data-op='{o.id}' "
            f"x='{x:.1f}' y='{y}' width='{w:.1f}' height='{_BAR_PX}' rx='2'/>"
        )
        if o.type == INFO:
            out.append(
                f"<line class='info-tail' x1='{x + w:.1f}' x2='{_WIDTH_PX - 10}' "
                f"y1='{y + _BAR_PX / 2}' y2='{y + _BAR_PX / 2}'/>"
            )
        label = desc if len(desc) * 6 < w - 4 else ""
        if o.id in involved_ids:
            out.append(f"<text class='involved-label' x='{x:.1f}' y='{y - 1}'>{esc(desc[:40])}</text>")
        elif label:
            out.append(f"<text x='{x + 2:.1f}' y='{y + _BAR_PX - 4}'>{esc(label)}</text>")
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _describe(model: Model, o: Operation) -> str:
    try:
        text = model.describe_op(o)
    except Exception:  # a report must not fail because a user model's describe_op did
        text = f"{o.f} {o.value!r}"
    if o.type == FAIL:
        text += " (fail)"
    return text


def _violation_html(violation: Any, model: Model) -> str:
    esc = html.escape
    out = ["<h2>Violation</h2>"]
    key = "" if violation.key is None else f" for key <code>{esc(repr(violation.key))}</code>"
    out.append(f"<p>The operations{key} cannot be linearized.")
    if violation.minimized:
        out.append(
            f" The shortest failing prefix of this partition ends at history position "
            f"{esc(_num(violation.cut_end))} ({len(violation.cut)} of {len(violation.ops)} operations)."
        )
    else:
        out.append(f" ({len(violation.ops)} operations; not shrunk within the budget.)")
    out.append("</p>")
    if violation.reason:
        out.append(f"<p><strong class='verdict-false'>{esc(violation.reason)}</strong></p>")
    if violation.culprit is not None:
        c = violation.culprit
        out.append(
            f"<p>Culprit: <span class='involved' data-op='{c.id}'>{esc(_describe(model, c))}</span> "
            f"(process {esc(str(c.process))}, index {c.invoke.index}).</p>"
        )
    if violation.blocked is not None:
        out.append(
            "<p>No linearization reaches the completion of "
            f"<strong class='verdict-false'>{esc(_describe(model, violation.blocked))}</strong> "
            f"(process {esc(str(violation.blocked.process))}, index {violation.blocked.invoke.index}). "
            "Operations that could not be placed next:</p><ul class='involved'>"
        )
        for o in violation.frontier:
            out.append(
                f"<li class='involved' data-op='{o.id}'>{esc(_describe(model, o))} — process "
                f"{esc(str(o.process))}, index {o.invoke.index}</li>"
            )
        out.append("</ul>")
    out.append(
        f"<p>Longest linearizable prefix found ({len(violation.longest)} operations), "
        f"leaving the state <code>{esc(str(violation.state))}</code>:</p><ol class='prefix'>"
    )
    for o in violation.longest:
        out.append(
            f"<li data-op='{o.id}'>{esc(_describe(model, o))} <span class='note'>(process "
            f"{esc(str(o.process))}, index {o.invoke.index})</span></li>"
        )
    out.append("</ol>")
    return "\n".join(out)


def _num(x: float) -> str:
    if isinstance(x, float) and (math.isinf(x) or not x.is_integer()):
        return f"{x:.3f}" if math.isfinite(x) else "∞"
    return str(int(x))
