"""Histories: the three readers, the writer, format detection, pairing and its errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from jepsen_like import edn
from jepsen_like.history import (
    INFO,
    OK,
    HistoryError,
    Op,
    detect_format,
    dumps_jsonl,
    pair,
    parse_jepsen_log,
    parse_jsonl,
    parse_kv,
    read_history,
)

ETCD_LOG = (
    "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n"
    "INFO  jepsen.util - 1\t:invoke\t:write\t4\n"
    "INFO  jepsen.core - Running test\n"  # another namespace: skipped
    "INFO  jepsen.util - 0\t:ok\t:read\tnil\n"
    "INFO  jepsen.util - 1\t:ok\t:write\t4\n"
    "INFO  jepsen.util - 2\t:invoke\t:cas\t[4 0]\n"
    "INFO  jepsen.util - :nemesis\t:info\t:start\tnil\n"
    "INFO  jepsen.util - 2\t:fail\t:cas\t[4 0]\n"
    "INFO  jepsen.util - 3\t:invoke\t:write\t3\n"
    "INFO  jepsen.util - 3\t:info\t:write\t:timed-out\n"
    "\tat clojure.core$eval.invoke(core.clj:1)\n"  # a stack-trace line: skipped
)

KV_LOG = (
    '{:process 0, :type :invoke, :f :put, :key "6", :value "x 0 0 y"}\n'
    '{:process 1, :type :invoke, :f :get, :key "6", :value nil}\n'
    '{:process 0, :type :ok, :f :put, :key "6", :value "x 0 0 y"}\n'
    '{:process 1, :type :ok, :f :get, :key "6", :value "x 0 0 y"}\n'
    '{:process 2, :type :invoke, :f :append, :key "7", :value "a \\"quoted\\" b"}\n'
)


def test_edn_values() -> None:
    assert edn.parse("nil") is None
    assert edn.parse("[3 0]") == (3, 0)
    assert edn.parse(":timed-out") == "timed-out"
    assert repr(edn.parse(":ok")) == ":ok"
    assert edn.parse('{:a 1, :b "x\\ny"}') == {"a": 1, "b": "x\ny"}
    assert edn.parse("#{1 2}") == frozenset({1, 2})
    assert edn.parse("-1.5") == -1.5
    assert edn.parse("x-y") == "x-y"  # a bare symbol
    with pytest.raises(edn.EdnError, match="column"):
        edn.parse("[1 2")
    with pytest.raises(edn.EdnError):
        edn.parse("#inst 1")


def test_jepsen_log_reader() -> None:
    ops = parse_jepsen_log(ETCD_LOG.splitlines(), "etcd.log")
    assert [(o.process, o.type, o.f, o.value) for o in ops] == [
        (0, "invoke", "read", None),
        (1, "invoke", "write", 4),
        (0, "ok", "read", None),
        (1, "ok", "write", 4),
        (2, "invoke", "cas", (4, 0)),
        ("nemesis", "info", "start", None),
        (2, "fail", "cas", (4, 0)),
        (3, "invoke", "write", 3),
        (3, "info", "write", "timed-out"),
    ]
    assert ops[0].time == 1 and ops[3].time == 5  # time is the line number


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("INFO  jepsen.util - 0\t:invoke\t:write\t[1\n", 1, "bad value"),
        ("INFO  jepsen.util - 0\t:invoke\t:write\t1\nthis is not a log line\n", 2, "not a Jepsen log line"),
        ("INFO  jepsen.util - 0\t:invoke\n", 1, "expected PROCESS TYPE F VALUE"),
        ("INFO  jepsen.util - Relative time begins now\n", 1, None),  # not an op: skipped
        ("INFO  jepsen.util - 0\t:ok\t:read\n", 1, "expected PROCESS TYPE F VALUE"),
    ],
)
def test_jepsen_log_errors_name_the_line(text: str, line: int, message: str | None) -> None:
    if message is None:
        assert parse_jepsen_log(text.splitlines(), "x.log") == []
        return
    with pytest.raises(HistoryError, match=message) as exc:
        parse_jepsen_log(text.splitlines(), "x.log")
    assert exc.value.line == line
    assert str(exc.value).startswith(f"x.log:{line}:")


def test_kv_reader_keys_become_independent_values() -> None:
    ops = parse_kv(KV_LOG.splitlines(), "kv.txt")
    assert ops[0].value == ("6", "x 0 0 y")
    assert ops[1].value == ("6", None)
    assert ops[4].value == ("7", 'a "quoted" b')
    with pytest.raises(HistoryError) as exc:
        parse_kv(['{:process 0, :type :invoke, :f :get, :key "1", :value nil}', "{:process 0, :type"], "kv.txt")
    assert exc.value.line == 2
    with pytest.raises(HistoryError, match="type must be"):
        parse_kv(["{:process 0, :type :done, :f :get, :value nil}"])


def test_jsonl_roundtrip_and_errors(tmp_path: Path) -> None:
    ops = [Op(0, 0, 0, "invoke", "cas", (1, 2)), Op(1, 5, 0, "ok", "cas", (1, 2), error="x")]
    text = dumps_jsonl(ops)
    assert parse_jsonl(text.splitlines()) == ops  # lists come back as tuples
    p = tmp_path / "h.jsonl"
    p.write_text(text + "\n" + '{"process": 1, "type": "invoke"}\n')
    with pytest.raises(HistoryError, match="missing field") as exc:
        read_history(p)
    assert exc.value.line == 4 and str(p) in str(exc.value)
    p.write_text('{"process": 1, "type": "invoke", "f": "read"}\n{"process": 1, ')
    with pytest.raises(HistoryError, match="not JSON") as exc:
        read_history(p, "jsonl")
    assert exc.value.line == 2
    p.write_text('{"process": 1, "type": "invoke", "f": "read", "time": 5}\n{"process": 1, "type": "ok", "f": "read", "time": 4}\n')
    with pytest.raises(HistoryError, match="time goes backwards"):
        read_history(p)


def test_detect_format_and_bad_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('\n{"process": 0, "type": "invoke", "f": "read"}\n')
    (tmp_path / "b.log").write_text(ETCD_LOG)
    (tmp_path / "c.edn").write_text(KV_LOG)
    (tmp_path / "d.txt").write_text("hello\n")
    (tmp_path / "e.txt").write_text("\n\n")
    assert detect_format(tmp_path / "a.jsonl") == "jsonl"
    assert detect_format(tmp_path / "b.log") == "jepsen"
    assert detect_format(tmp_path / "c.edn") == "kv"
    with pytest.raises(HistoryError, match="cannot tell the format") as exc:
        read_history(tmp_path / "d.txt")
    assert exc.value.line == 1
    with pytest.raises(HistoryError, match="empty"):
        read_history(tmp_path / "e.txt")
    with pytest.raises(HistoryError, match="unknown format"):
        read_history(tmp_path / "a.jsonl", "edn")
    with pytest.raises(HistoryError, match="No such file"):
        read_history(tmp_path / "missing.jsonl")


def test_pair_matches_completions_and_treats_missing_ones_as_info() -> None:
    ops = parse_jepsen_log(ETCD_LOG.splitlines())
    ops.append(Op(99, 99, 7, "invoke", "write", 1))  # never completes
    paired = pair(ops)
    assert [(o.process, o.f, o.type) for o in paired] == [
        (0, "read", OK),
        (1, "write", OK),
        (2, "cas", "fail"),
        (3, "write", INFO),
        (7, "write", INFO),
    ]
    assert paired[0].result is None and paired[1].result == 4
    assert paired[3].end == math.inf and paired[3].complete is not None
    assert paired[4].complete is None and paired[4].end == math.inf
    assert paired[0].start < paired[0].end


@pytest.mark.parametrize(
    "events, message",
    [
        ([(0, "ok", "read")], "has no invocation"),
        ([(0, "invoke", "read"), (0, "invoke", "write")], "still pending"),
        ([(0, "invoke", "read"), (0, "ok", "write")], "does not match"),
    ],
)
def test_pair_rejects_impossible_histories(events: list[tuple[int, str, str]], message: str) -> None:
    ops = [Op(i, i, p, t, f, None) for i, (p, t, f) in enumerate(events)]
    with pytest.raises(HistoryError, match=message):
        pair(ops, source="h.jsonl")
