"""The HTML report renders, marks the failing operations, and escapes what it prints."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from jepsen_like.checker import check
from jepsen_like.synth import generate
from jepsen_like.history import pair
from jepsen_like.models import KV, Register
from jepsen_like.report import render_html, write_report

from .builders import h, seq


class _Bars(HTMLParser):
    """Collects each SVG bar's classes by operation id, the li items, and all text."""

    def __init__(self) -> None:
        super().__init__()
        self.bars: dict[int, set[str]] = {}
        self.involved_items: list[int] = []
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "rect" and a.get("data-op") is not None:
            self.bars[int(a["data-op"])] = set((a.get("class") or "").split())  # type: ignore[arg-type]
        if tag == "li" and "involved" in (a.get("class") or ""):
            self.involved_items.append(int(a["data-op"]))  # type: ignore[arg-type]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(page: str) -> _Bars:
    p = _Bars()
    p.feed(page)
    return p


def test_report_marks_the_failing_operations(tmp_path: Path) -> None:
    history = h(
        *seq(("write", 1, 1), ("write", 2, 2)),
        *seq(("read", None, 1), process=1),  # stale
        *seq(("read", None, 2), process=2),
    )
    model = Register()
    result = check(history, model)
    path = write_report(tmp_path / "r.html", history, model, result, title="stale read")
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and page.rstrip().endswith("</html>")
    bars = _parse(page)
    ops = pair(history)
    stale = next(o for o in ops if o.f == "read" and o.result == 1)
    assert "involved" in bars.bars[stale.id] and "violation" in bars.bars[stale.id]
    assert all("ok" in classes for classes in bars.bars.values())
    assert bars.involved_items == [stale.id]
    text = "".join(bars.text)
    assert "NOT linearizable" in text and "Longest linearizable prefix found (2 operations)" in text
    assert "process 1" in text


def test_report_escapes_values() -> None:
    evil = "<script>alert(1)</script>"
    history = h(*seq(("put", ("k&", evil), ("k&", evil)), ("get", ("k&", None), ("k&", "x"))))
    result = check(history, KV())
    page = render_html(history, KV(), result)
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert "script" not in _parse(page).tags


def test_large_history_is_capped_around_the_violation() -> None:
    history = generate(clients=10, ops=2000, keys=2, info_rate=0.05, seed=11, corrupt=True)
    result = check(history, KV())
    assert result.violation is not None
    page = render_html(history, KV(), result, max_ops=300)
    bars = _parse(page)
    assert len(bars.bars) <= 300
    assert "Showing 300 of 2000 operations" in page
    involved = {o.id for o in result.violation.involved}
    assert involved and involved <= set(bars.bars)
    assert all("involved" in bars.bars[i] for i in involved)


def test_report_without_a_result_draws_the_history() -> None:
    history = h((0, "invoke", "write", 1), (1, "invoke", "read", None), (1, "ok", "read", 1), (0, "info", "write", 1))
    page = render_html(history, Register())
    bars = _parse(page)
    assert len(bars.bars) == 2 and any("info" in c for c in bars.bars.values())
    assert "info-tail" in page
