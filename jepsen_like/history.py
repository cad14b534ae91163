"""Histories: what clients saw, as Jepsen records it, and the file formats we read and write.

An ``Op`` is one event: ``index`` (position in the history), ``time`` (monotonic, any unit),
``process`` (the logical client; an int, or a string such as ``"nemesis"`` for non-client
events), ``type`` (``invoke | ok | fail | info``), ``f`` (the function, e.g. ``"write"``),
``value`` and an optional ``error``. Every client operation is an ``invoke`` followed, on the
same process, by one completion:

- ``ok``: it happened; the completion's ``value`` is the result (e.g. what a read returned);
- ``fail``: it definitely did not happen (the checker drops it);
- ``info``: indeterminate (timed out, connection lost): it may or may not have taken effect, at
  any time after its invocation, *including after the info event itself*. An invoke that never
  completes is treated the same way.

Values read from files are frozen (lists become tuples) so that they can be part of hashable
model states.

Public interface:

- ``Op``, ``OpType`` constants ``INVOKE OK FAIL INFO``, ``HistoryError`` (names file and line);
- ``read_history(path, format="auto") -> list[Op]`` with formats ``jsonl``, ``jepsen`` (Jepsen /
  Knossos log lines ``INFO  jepsen.util - 3\\t:invoke\\t:cas\\t[3 0]``), ``kv`` (one EDN map per
  line, ``{:process 0, :type :invoke, :f :get, :key "6", :value nil}``; a ``:key`` turns the
  value into ``(key, value)``, Jepsen's ``independent`` convention); ``detect_format(path)``;
- ``parse_jsonl(lines, source)``, ``parse_jepsen_log(lines, source)``, ``parse_kv(lines, source)``
  for text already in memory; ``write_jsonl(ops, fp)``, ``dumps_jsonl(ops)``;
- ``pair(ops) -> list[Operation]``: invocations matched with their completions (Knossos'
  ``complete``), validating that each process does one thing at a time.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from . import edn

__all__ = [
    "FAIL",
    "FORMATS",
    "INFO",
    "INVOKE",
    "OK",
    "HistoryError",
    "Op",
    "Operation",
    "detect_format",
    "dumps_jsonl",
    "freeze",
    "pair",
    "parse_jepsen_log",
    "parse_jsonl",
    "parse_kv",
    "read_history",
    "write_jsonl",
]

INVOKE = "invoke"
OK = "ok"
FAIL = "fail"
INFO = "info"
TYPES = frozenset((INVOKE, OK, FAIL, INFO))
FORMATS = ("auto", "jsonl", "jepsen", "kv")


class HistoryError(ValueError):
    """A history that cannot be read or makes no sense; names the source and line when known."""

    def __init__(self, message: str, source: str | None = None, line: int | None = None) -> None:
        where = source or "<history>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line


@dataclass(frozen=True, slots=True)
class Op:
    """One history event (an invocation or a completion)."""

    index: int
    time: int | float
    process: Any
    type: str
    f: str
    value: Any = None
    error: Any = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "index": self.index,
            "time": self.time,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
        }
        if self.error is not None:
            d["error"] = self.error
        return d


def freeze(value: Any) -> Any:
    """Make a JSON/EDN value hashable: lists become tuples, dicts become sorted item tuples."""
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    return value


# --------------------------------------------------------------------------- JSON Lines


def parse_jsonl(lines: Iterable[str], source: str | None = None) -> list[Op]:
    """One JSON object per line: ``process``, ``type`` and ``f`` required; ``index``, ``time``,
    ``value`` and ``error`` optional (index and time default to the op's position)."""
    ops: list[Op] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"not JSON: {exc.msg} (column {exc.colno})", source, lineno) from None
        if not isinstance(d, dict):
            raise HistoryError("expected a JSON object per line", source, lineno)
        ops.append(_op_from_fields(d, len(ops), source, lineno))
    return _validated(ops, source)


def write_jsonl(ops: Iterable[Op], fp: IO[str]) -> None:
    for op in ops:
        fp.write(json.dumps(op.to_json(), separators=(",", ":"), default=_json_default))
        fp.write("\n")


def dumps_jsonl(ops: Iterable[Op]) -> str:
    return "".join(
        json.dumps(op.to_json(), separators=(",", ":"), default=_json_default) + "\n" for op in ops
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, frozenset | set):
        return sorted(value, key=repr)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _op_from_fields(d: dict[Any, Any], position: int, source: str | None, lineno: int) -> Op:
    missing = [k for k in ("process", "type", "f") if k not in d]
    if missing:
        raise HistoryError(f"missing field(s) {', '.join(missing)}", source, lineno)
    type_ = str(d["type"])
    if type_ not in TYPES:
        raise HistoryError(f"type must be invoke, ok, fail or info, not {d['type']!r}", source, lineno)
    index = d.get("index", position)
    time = d.get("time", position)
    if not isinstance(index, int) or isinstance(index, bool):
        raise HistoryError(f"index must be an integer, not {index!r}", source, lineno)
    if not isinstance(time, int | float) or isinstance(time, bool) or math.isnan(time):
        raise HistoryError(f"time must be a number, not {time!r}", source, lineno)
    process = d["process"]
    if isinstance(process, list | dict | float | bool) or process is None:
        raise HistoryError(f"process must be an integer or a name, not {process!r}", source, lineno)
    return Op(index, time, process, type_, str(d["f"]), freeze(d.get("value")), freeze(d.get("error")))


# --------------------------------------------------------------------------- Jepsen log lines

_LOG_HEADER = re.compile(
    r"^(\d{4}-\d\d-\d\d[ T][\d:.,]+\S*\s+)?(\{[^}]*\}\s+)?(\[[^\]]*\]\s+)?"
    r"(TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL)\b"
)
_UTIL = re.compile(r"\bjepsen\.util\s+-\s+")
_OP_TYPE = re.compile(r"^:?(invoke|ok|fail|info)$")


def parse_jepsen_log(lines: Iterable[str], source: str | None = None) -> list[Op]:
    """Op lines as Jepsen's ``jepsen.util/log-op`` prints them (Jepsen's etcd test, Knossos):
    ``[timestamp] INFO  jepsen.util - PROCESS\\t:TYPE\\t:F\\tVALUE[\\tERROR]``.

    Other log lines (any level, other namespaces, stack-trace continuations) are skipped, since
    real Jepsen logs interleave them; an op line that does not parse, or a line that is not a log
    line at all, is an error naming its line number. Nemesis lines are kept with their process
    name (the checker ignores non-client processes). Time is the line number."""
    ops: list[Op] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        m = _UTIL.search(line)
        if m is None or not _LOG_HEADER.match(line):
            if _LOG_HEADER.match(line) or line[:1].isspace() or line.startswith(("Caused by", "...")):
                continue
            raise HistoryError(f"not a Jepsen log line: {_clip(line)!r}", source, lineno)
        rest = line[m.end() :]
        fields = rest.split("\t") if "\t" in rest else rest.split(None, 3)
        if len(fields) < 2 or not _OP_TYPE.match(fields[1].strip()):
            continue  # some other jepsen.util message, not an op
        if len(fields) < 4:
            raise HistoryError(f"expected PROCESS TYPE F VALUE, got {_clip(rest)!r}", source, lineno)
        try:
            process = edn.parse(fields[0].strip())
            f = edn.parse(fields[2].strip())
            value = edn.parse(fields[3].strip()) if fields[3].strip() else None
            error = edn.parse(fields[4].strip()) if len(fields) > 4 and fields[4].strip() else None
        except edn.EdnError as exc:
            raise HistoryError(f"bad value: {exc}", source, lineno) from None
        if isinstance(process, bool) or not isinstance(process, int | str):
            raise HistoryError(f"bad process {fields[0]!r}", source, lineno)
        if not isinstance(f, str):
            raise HistoryError(f"bad function {fields[2]!r}", source, lineno)
        type_ = _OP_TYPE.match(fields[1].strip()).group(1)  # type: ignore[union-attr]
        ops.append(Op(len(ops), lineno, _plain(process), type_, str(f), _plain(value), _plain(error)))
    return _validated(ops, source)


# --------------------------------------------------------------------------- EDN op maps


def parse_kv(lines: Iterable[str], source: str | None = None) -> list[Op]:
    """One EDN map per line, as in Knossos histories and linearizability-checker test suites:
    ``{:process 0, :type :invoke, :f :put, :key "6", :value "x 0 0 y"}``. With a ``:key``, the
    op's value becomes ``(key, value)``. ``:index`` and ``:time`` are used when present."""
    ops: list[Op] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(";"):
            continue
        try:
            d = edn.parse(line)
        except edn.EdnError as exc:
            raise HistoryError(f"bad EDN: {exc}", source, lineno) from None
        if not isinstance(d, dict):
            raise HistoryError("expected one EDN map {...} per line", source, lineno)
        fields: dict[str, Any] = {str(k): _plain(v) for k, v in d.items()}
        if "key" in fields:
            fields["value"] = (fields.pop("key"), fields.get("value"))
        ops.append(_op_from_fields(fields, len(ops), source, lineno))
    return _validated(ops, source)


def _plain(value: Any) -> Any:
    """Keywords become plain strings so that ``:read`` in a file equals ``"read"`` in Python."""
    if isinstance(value, edn.Keyword):
        return str(value)
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(_plain(k)), _plain(v)) for k, v in value.items()))
    return value


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


# --------------------------------------------------------------------------- files


def detect_format(path: str | Path) -> str:
    """Guess the format from the first non-blank line: ``{"`` is JSON Lines, ``{:`` is EDN maps,
    and a log line is a Jepsen log."""
    with open(path, encoding="utf-8", errors="replace") as fp:
        for lineno, line in enumerate(fp, 1):
            s = line.strip()
            if not s:
                continue
            if s.startswith('{"') or s.startswith("{ \""):
                return "jsonl"
            if s.startswith("{:") or s.startswith("{ :"):
                return "kv"
            if _UTIL.search(s) or _LOG_HEADER.match(s):
                return "jepsen"
            raise HistoryError(
                "cannot tell the format (expected JSON Lines, EDN maps or Jepsen log lines)",
                str(path),
                lineno,
            )
    raise HistoryError("empty history file", str(path))


def read_history(path: str | Path, format: str = "auto") -> list[Op]:
    """Read a history file; raise ``HistoryError`` naming the file and line on bad input."""
    source = str(path)
    if format not in FORMATS:
        raise HistoryError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})", source)
    try:
        if format == "auto":
            format = detect_format(path)
        with open(path, encoding="utf-8") as fp:
            lines = fp.read().splitlines()
    except OSError as exc:
        raise HistoryError(exc.strerror or str(exc), source) from None
    except UnicodeDecodeError as exc:
        raise HistoryError(f"not UTF-8 text ({exc.reason})", source) from None
    parser = {"jsonl": parse_jsonl, "jepsen": parse_jepsen_log, "kv": parse_kv}[format]
    return parser(lines, source)


def _validated(ops: list[Op], source: str | None) -> list[Op]:
    """Times must not go backwards: the checker orders events by position and reports by time."""
    last = -math.inf
    for op in ops:
        if op.time < last:
            raise HistoryError(f"time goes backwards at index {op.index}", source, None)
        last = op.time
    return ops


# --------------------------------------------------------------------------- pairing


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation paired with its completion (``type`` is the completion's type; an invoke
    with no completion is ``info``). ``value`` is the invocation's argument and ``result`` the
    completion's value (``None`` unless ``ok``). ``start``/``end`` are positions in the event
    order, ``end`` is ``math.inf`` for info; ``invoke``/``complete`` are the ``Op`` events."""

    id: int
    process: Any
    f: str
    value: Any
    result: Any
    type: str
    start: int
    end: int | float
    invoke: Op = field(repr=False)
    complete: Op | None = field(repr=False)

    @property
    def key(self) -> Any:
        """The key of a ``(key, value)`` op (Jepsen's ``independent`` convention), else None."""
        v = self.value
        return v[0] if isinstance(v, tuple) and len(v) == 2 else None


def pair(ops: Iterable[Op], source: str | None = None) -> list[Operation]:
    """Match each invocation with its process's next completion.

    Errors (with the op's line when ``source`` maps 1:1, otherwise its index): a completion with
    no pending invocation, a second invocation while one is pending, a completion whose ``f``
    differs from the invocation's. Non-client processes (names such as ``"nemesis"``) are
    skipped: they do not operate on the object under test."""
    pending: dict[Any, tuple[int, Op]] = {}
    # (invoke position, invoke, completion position, completion)
    done: list[tuple[int, Op, int, Op | None]] = []
    for pos, op in enumerate(ops):
        if isinstance(op.process, str):
            continue
        if op.type == INVOKE:
            if op.process in pending:
                _, prev = pending[op.process]
                raise HistoryError(
                    f"process {op.process} invoked {op.f} (index {op.index}) while its {prev.f} "
                    f"(index {prev.index}) is still pending",
                    source,
                )
            pending[op.process] = (pos, op)
            continue
        entry = pending.pop(op.process, None)
        if entry is None:
            raise HistoryError(
                f"{op.type} {op.f} (index {op.index}) on process {op.process} has no invocation",
                source,
            )
        ipos, inv = entry
        if inv.f != op.f:
            raise HistoryError(
                f"completion {op.f} (index {op.index}) does not match invocation {inv.f} "
                f"(index {inv.index}) on process {op.process}",
                source,
            )
        done.append((ipos, inv, pos, op))
    for ipos, inv in pending.values():
        done.append((ipos, inv, -1, None))
    done.sort(key=lambda t: t[0])
    result: list[Operation] = []
    for ipos, inv, cpos, comp in done:
        if comp is None or comp.type == INFO:
            end: int | float = math.inf
            type_ = INFO
        else:
            end = cpos
            type_ = comp.type
        res = comp.value if comp is not None and comp.type == OK else None
        result.append(Operation(len(result), inv.process, inv.f, inv.value, res, type_, ipos, end, inv, comp))
    return result


def iter_ops(operations: Iterable[Operation]) -> Iterator[Op]:
    """Flatten paired operations back into events, in history order."""
    events: list[Op] = []
    for o in operations:
        events.append(o.invoke)
        if o.complete is not None:
            events.append(o.complete)
    events.sort(key=lambda op: op.index)
    return iter(events)
