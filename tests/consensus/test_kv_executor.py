"""The test key-value machine and exactly-once execution through client sessions."""

from consensus.core.executor import Executor
from store.kv_machine import KVStateMachine


def test_kv_operations_and_errors():
    kv = KVStateMachine()
    assert kv.apply(["put", "a", 1]) is None
    assert kv.apply(["get", "a"]) == 1
    assert kv.apply(["cas", "a", 2, 3]) is False
    assert kv.apply(["cas", "a", 1, 3]) is True
    assert kv.apply(["append", "s", "x"]) == "x"
    assert kv.apply(["append", "s", "y"]) == "xy"
    assert kv.apply(["delete", "s"]) is True
    for bad in (["bogus"], "not a list", ["put", ["unhashable"], 1], ["put", 1.5, "x"]):
        res = kv.apply(bad)
        assert res["ok"] is False and res["code"] == "InvalidRequest", bad
    assert kv.apply(["get", "a"]) == 3


def test_snapshot_is_canonical_and_exact():
    # Same log, different dict insertion orders (b restored midway): same bytes.
    log = [["put", k, k] for k in ["x", "b", "a"]] + [["delete", "x"], ["put", "x", 1], ["put", "c", 2]]
    a, b = KVStateMachine(), KVStateMachine()
    for op in log[:3]:
        a.apply(op)
    b.restore(a.snapshot())
    for op in log[3:]:
        a.apply(op)
        b.apply(op)
    assert a.snapshot() == b.snapshot()
    assert list(a.data) != list(b.data)  # the insertion orders really differ
    c = KVStateMachine()
    c.restore(a.snapshot())
    assert c.snapshot() == a.snapshot() and c.data == a.data


def test_sessions_skip_duplicates_and_keep_the_last_result():
    ex = Executor(KVStateMachine())
    out = []
    ex.run([[1, 1, ["append", "k", "a"]], [1, 1, ["append", "k", "a"]], [1, 2, ["append", "k", "b"]]], out)
    assert [(r[2], r[3]) for r in out] == [("a", True), ("a", False), ("ab", True)]
    out.clear()
    ex.run([[1, 1, ["append", "k", "a"]], [1, 2, ["append", "k", "b"]]], out)
    assert [(r[2], r[3]) for r in out] == [(None, False), ("ab", False)]
    assert ex.sm.data["k"] == "ab"
    copy = Executor(KVStateMachine())
    copy.restore(ex.snapshot())
    assert copy.snapshot() == ex.snapshot()
