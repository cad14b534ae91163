"""The checker on hand-made histories (acceptance 1), plus budgets, interleaving and explanations."""

from __future__ import annotations

from typing import Any

import pytest

from jepsen_like.checker import UNKNOWN_VERDICT, check
from jepsen_like.checker.bruteforce import brute_force, plain_wgl
from jepsen_like.checker.linear import Search, compile_problem
from jepsen_like.synth import generate
from jepsen_like.history import Op, pair
from jepsen_like.models import GENERIC, KV, UNKNOWN, CASRegister, Model, ModelError, Register, Transition

from .builders import h, replay_witness, seq

# ---------------------------------------------------------------------------------- anomalies

ANOMALIES: dict[str, tuple[Model, list[Op]]] = {
    "stale read": (
        Register(),
        h(*seq(("write", 1, 1), ("write", 2, 2)), *seq(("read", None, 1), process=1)),
    ),
    "lost write (register)": (
        Register(),
        h(*seq(("write", 1, 1)), *seq(("read", None, None), process=1)),
    ),
    "lost write (append)": (
        KV(),
        h(*seq(("append", ("k", "a"), ("k", "a")), ("append", ("k", "b"), ("k", "b"))), *seq(("get", ("k", None), ("k", "b")), process=1)),
    ),
    "read of a value never written": (
        Register(),
        h(
            (0, "invoke", "write", 1),
            (1, "invoke", "read", None),
            (1, "ok", "read", 7),
            (0, "ok", "write", 1),
        ),
    ),
    "cas success on a wrong value": (
        CASRegister(),
        h(*seq(("write", 1, 1), ("cas", (2, 3), (2, 3)))),
    ),
    "cas success after the value moved on": (
        CASRegister(),
        h(
            *seq(("write", 1, 1)),
            (1, "invoke", "cas", (1, 2)),
            (1, "ok", "cas", (1, 2)),
            (2, "invoke", "cas", (1, 3)),
            (2, "ok", "cas", (1, 3)),  # both cas from 1 succeeded, one after the other
        ),
    ),
    "non-monotonic reads": (
        Register(),
        h(
            (0, "invoke", "write", 1),
            (1, "invoke", "write", 2),
            (0, "ok", "write", 1),
            (1, "ok", "write", 2),
            *seq(("read", None, 2), ("read", None, 1), ("read", None, 2), process=2),
        ),
    ),
    "info write seen, then unseen": (
        Register(),
        h(
            (0, "invoke", "write", 1),
            (0, "info", "write", 1),
            *seq(("read", None, 1), ("read", None, None), process=1),
        ),
    ),
    "phantom append order": (
        KV(),
        h(
            (0, "invoke", "append", ("k", "a")),
            (1, "invoke", "append", ("k", "b")),
            (0, "ok", "append", ("k", "a")),
            (1, "ok", "append", ("k", "b")),
            *seq(("get", ("k", None), ("k", "ab")), ("get", ("k", None), ("k", "ba")), process=2),
        ),
    ),
}

VALID: dict[str, tuple[Model, list[Op]]] = {
    "concurrent overlapping writes, read in either order": (
        Register(),
        h(
            (0, "invoke", "write", 1),
            (1, "invoke", "write", 2),
            (2, "invoke", "read", None),
            (2, "ok", "read", 2),
            (2, "invoke", "read", None),
            (2, "ok", "read", 1),
            (1, "ok", "write", 2),
            (0, "ok", "write", 1),
        ),
    ),
    "info write landing late, after the info event": (
        Register(),
        h(
            (0, "invoke", "write", 1),
            (0, "info", "write", 1),
            *seq(("read", None, None), ("read", None, None), ("read", None, 1), ("read", None, 1), process=1),
        ),
    ),
    "info write never landing": (
        Register(),
        h((0, "invoke", "write", 1), (0, "info", "write", 1), *seq(("read", None, None), process=1)),
    ),
    "invoke without completion lands": (
        Register(),
        h((0, "invoke", "write", 1), *seq(("read", None, 1), process=1)),
    ),
    "failed cas did not happen": (
        CASRegister(),
        h(
            *seq(("write", 1, 1)),
            (1, "invoke", "cas", (1, 2)),
            (1, "fail", "cas", (1, 2)),  # even though it could have: fail means it did not
            *seq(("read", None, 1), process=2),
        ),
    ),
    "indeterminate cas that took effect": (
        CASRegister(),
        h(*seq(("write", 1, 1)), (1, "invoke", "cas", (1, 2)), (1, "info", "cas", (1, 2)), *seq(("read", None, 2), process=2)),
    ),
    "info read is ignored": (
        Register(),
        h(*seq(("write", 1, 1)), (1, "invoke", "read", None), (1, "info", "read", None)),
    ),
    "concurrent appends in the order reads reveal": (
        KV(),
        h(
            (0, "invoke", "append", ("k", "a")),
            (1, "invoke", "append", ("k", "b")),
            (2, "invoke", "get", ("k", None)),
            (2, "ok", "get", ("k", "b")),
            (0, "ok", "append", ("k", "a")),
            (1, "ok", "append", ("k", "b")),
            *seq(("get", ("k", None), ("k", "ba")), process=2),
        ),
    ),
    "independent keys": (
        KV(),
        h(*seq(("put", ("x", 1), ("x", 1)), ("put", ("y", 2), ("y", 2)), ("get", ("x", None), ("x", 1)), ("get", ("z", None), ("z", "")))),
    ),
}


@pytest.mark.parametrize("name", sorted(ANOMALIES))
def test_anomalies_are_rejected(name: str) -> None:
    model, history = ANOMALIES[name]
    result = check(history, model)
    assert result.valid is False, name
    assert result.linearizable is False
    assert brute_force(history, model) is False  # the oracle agrees that it is an anomaly
    assert result.violation is not None and result.violation.involved


@pytest.mark.parametrize("name", sorted(VALID))
def test_tricky_valid_histories_are_accepted(name: str) -> None:
    model, history = VALID[name]
    result = check(history, model)
    assert result.valid is True, name
    assert brute_force(history, model) is True


def test_witness_is_a_linearization() -> None:
    history = generate(clients=8, ops=400, keys=1, info_rate=0.1, seed=3)
    model = KV()
    parts = model.partition([o for o in pair(history) if o.type != "fail"])
    for key, part in parts.items():
        problem = compile_problem(model.for_partition(key), key, part)
        search = Search(problem)
        assert search.run(10**7) is True
        assert replay_witness(problem, search) == "ok"


def test_stale_read_violation_names_the_read_and_prefix() -> None:
    model, history = ANOMALIES["stale read"]
    v = check(history, model).violation
    assert v is not None
    assert [(o.f, o.value) for o in v.longest] == [("write", 1), ("write", 2)]
    assert [(o.f, o.result) for o in v.involved] == [("read", 1)]
    assert v.minimized and v.state == "2"


def test_shrinking_finds_the_cut_at_the_bad_read() -> None:
    history = generate(clients=10, ops=1500, keys=2, info_rate=0.05, seed=11, corrupt=True)
    good = generate(clients=10, ops=1500, keys=2, info_rate=0.05, seed=11)
    (bad_op,) = [a for a, b in zip(history, good) if a != b]
    result = check(history, KV())
    v = result.violation
    assert result.valid is False and v is not None
    assert v.key == bad_op.value[0]
    assert v.minimized and v.cut_end == bad_op.index  # the cut ends where the stale read returns
    assert bad_op.index in {o.complete.index for o in v.involved if o.complete is not None}


# ---------------------------------------------------------------------------------- user models


class Counter(Model):
    """A user model through the generic hook: add / read."""

    name = "counter"

    def init(self) -> int:
        return 0

    def step(self, state: Any, f: str, value: Any, result: Any) -> tuple[bool, Any]:
        if f == "add":
            return True, state + value
        if f == "read":
            return result is UNKNOWN or result == state, state
        raise ModelError(f"counter has no function {f!r}")


def test_user_model_hook() -> None:
    assert Counter().compile(pair(h((0, "invoke", "add", 1), (0, "ok", "add", 1)))[0]).kind == GENERIC
    ok = h(
        (0, "invoke", "add", 1),
        (1, "invoke", "add", 2),
        (2, "invoke", "read", None),
        (2, "ok", "read", 2),
        (0, "ok", "add", 1),
        (1, "ok", "add", 2),
        *seq(("read", None, 3), process=2),
    )
    bad = ok[:-1] + [Op(len(ok) - 1, len(ok) - 1, 2, "ok", "read", 4)]
    assert check(ok, Counter()).valid is True
    assert check(bad, Counter()).valid is False
    assert brute_force(ok, Counter()) and not brute_force(bad, Counter())
    with pytest.raises(ModelError, match="no function 'mul'"):
        check(h((0, "invoke", "mul", 2), (0, "ok", "mul", 2)), Counter())


def test_model_errors_name_the_op() -> None:
    with pytest.raises(ModelError, match="no function 'cas' at index 0"):
        check(h((0, "invoke", "cas", (1, 2)), (0, "ok", "cas", (1, 2))), Register())
    with pytest.raises(ModelError, match=r"needs a value \[key value\]"):
        check(h((0, "invoke", "put", 1), (0, "ok", "put", 1)), KV())
    with pytest.raises(ModelError, match="old new"):
        check(h((0, "invoke", "cas", 1), (0, "ok", "cas", 1)), CASRegister())


def test_nil_read_matches_any_is_knossos_semantics() -> None:
    history = h(*seq(("write", 1, 1), ("read", None, None)))
    assert check(history, Register()).valid is False
    assert check(history, Register(nil_read_matches_any=True)).valid is True


def test_compiled_transitions_agree_with_plain_wgl_on_generated_histories() -> None:
    for seed in range(20):
        history = generate(clients=4, ops=30, keys=1, info_rate=0.2, workload="cas", seed=seed)
        assert check(history, KV()).valid is True
        assert plain_wgl(history, KV()) is True


# ---------------------------------------------------------------------------------- budgets


def _hard_history() -> list[Op]:
    # 200 clients on one key: far more than one slice of search steps (seconds, at least).
    return generate(clients=200, ops=3000, keys=1, info_rate=0.03, seed=2)


def test_time_budget_answers_unknown() -> None:
    result = check(_hard_history(), KV(), timeout_s=0.0)
    assert result.valid == UNKNOWN_VERDICT and result.linearizable is None
    assert result.reason == "timeout"
    assert result.to_json()["linearizable"] is None


def test_memory_budget_answers_unknown() -> None:
    result = check(_hard_history(), KV(), memory_bytes_max=1000)
    assert result.valid == UNKNOWN_VERDICT and result.reason == "memory"
    assert result.results[0].reason == "memory"


def test_refuted_partition_stops_the_others() -> None:
    # Key "slow" is long and linearizable; key "bad" is refuted at once. Round-robin slices mean
    # "slow" is never run to completion.
    slow = generate(clients=20, ops=3000, keys=1, info_rate=0.0, seed=5)
    bad = [
        Op(len(slow) + i, slow[-1].time + 1 + i, 1000, t, f, ("bad", v))
        for i, (t, f, v) in enumerate(
            [
                ("invoke", "put", 1),
                ("ok", "put", 1),
                ("invoke", "put", 2),
                ("ok", "put", 2),
                ("invoke", "get", None),
                ("ok", "get", 1),  # stale: found by search, not by the impossible-value check
            ]
        )
    ]
    history = [Op(o.index, o.time, o.process, o.type, o.f, ("slow", o.value[1])) for o in slow] + bad
    result = check(history, KV(), slice_steps=500)
    assert result.valid is False and result.violation is not None
    assert result.violation.key == "bad"
    by_key = {r.key: r for r in result.results}
    assert by_key["bad"].valid is False and by_key["bad"].steps > 0
    assert by_key["slow"].valid == UNKNOWN_VERDICT and by_key["slow"].reason == "stopped"
    assert by_key["slow"].steps <= 1000


def test_workers_give_the_same_verdicts() -> None:
    for corrupt in (False, True):
        history = generate(clients=20, ops=2000, keys=4, info_rate=0.03, seed=9, corrupt=corrupt)
        one = check(history, KV(), workers=1)
        two = check(history, KV(), workers=2)
        assert one.valid == two.valid == (not corrupt)
        if corrupt:
            assert one.violation is not None and two.violation is not None
            assert one.violation.key == two.violation.key


def test_empty_and_trivial_histories() -> None:
    assert check([], Register()).valid is True
    assert check(h((0, "invoke", "write", 1), (0, "info", "write", 1)), Register()).valid is True
    only_failed = check(h((0, "invoke", "write", 1), (0, "fail", "write", 1)), Register())
    assert only_failed.valid is True and only_failed.ops == 1 and only_failed.partitions == 0


def test_impossible_values_are_refuted_without_search() -> None:
    history = generate(clients=50, ops=3000, keys=2, info_rate=0.03, workload="cas", seed=2, corrupt=True)
    result = check(history, KV())
    v = result.violation
    assert result.valid is False and v is not None and v.culprit is not None
    assert v.culprit.result == "never-written"
    assert v.reason is not None and "no operation ever writes never-written" in v.reason
    assert result.steps == 0
    model, cas_history = ANOMALIES["cas success on a wrong value"]
    v = check(cas_history, model).violation
    assert v is not None and v.reason == "cas 2→3: no operation ever writes 2"
