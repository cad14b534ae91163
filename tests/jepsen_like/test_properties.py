"""Property tests (acceptance 2): histories recorded from a real sequential object under random
concurrent schedules are linearizable by construction and must all be accepted; with one read
mutated, the checker must agree with the brute-force checker (small histories) and with a plain
memoised WGL search (medium ones) on every case."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from jepsen_like.checker import check
from jepsen_like.checker.bruteforce import brute_force, plain_wgl
from jepsen_like.history import Op
from jepsen_like.models import KV, CASRegister, Model, Register

MODELS: dict[str, Model] = {"register": Register(), "cas-register": CASRegister(), "kv": KV()}
READS = ("read", "get")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def recorded(draw: st.DrawFn, kind: str, max_ops: int) -> list[Op]:
    """Run a sequential object while a random schedule interleaves invocations, linearization
    points, completions, crashes (info: the op may still take effect later, or never) and
    processes that vanish without a completion."""
    n_threads = draw(st.integers(1, 4))
    n_ops = draw(st.integers(1, max_ops))
    keys = ["x", "y"][: draw(st.integers(1, 2))] if kind == "kv" else [None]
    store: dict[Any, Any] = {}
    events: list[tuple[Any, str, str, Any]] = []
    current: dict[int, dict[str, Any] | None] = {t: None for t in range(n_threads)}
    process = list(range(n_threads))
    zombies: list[dict[str, Any]] = []  # crashed before taking effect: may still take effect
    started = 0

    def wrap(key: Any, v: Any) -> Any:
        return v if key is None else (key, v)

    def apply(op: dict[str, Any]) -> None:
        cur = store.get(op["key"])
        f, arg = op["f"], op["arg"]
        if f in READS:
            op["result"] = cur
        elif f in ("write", "put"):
            store[op["key"]] = arg
        elif f == "append":
            store[op["key"]] = arg if cur is None else cur + arg
        elif f == "cas":
            if cur == arg[0]:
                store[op["key"]] = arg[1]
            else:
                op["failed"] = True
        op["applied"] = True

    while started < n_ops or any(current.values()) or zombies:
        busy = [t for t, op in current.items() if op is not None]
        actions = []
        if started < n_ops and len(busy) < n_threads:
            actions.append("invoke")
        if any(not current[t]["applied"] for t in busy):  # type: ignore[index]
            actions.append("apply")
        if any(current[t]["applied"] for t in busy):  # type: ignore[index]
            actions.append("complete")
        if busy:
            actions.append("crash")
        if zombies:
            actions.append("zombie")
        action = draw(st.sampled_from(actions))
        if action == "invoke":
            t = draw(st.sampled_from([t for t in current if current[t] is None]))
            key = draw(st.sampled_from(keys))
            if kind == "kv":
                f = draw(st.sampled_from(["get", "put", "append"]))
                arg = None if f == "get" else draw(st.sampled_from(["a", "b", "c"]))
            else:
                fs = ["read", "write"] + (["cas"] if kind == "cas-register" else [])
                f = draw(st.sampled_from(fs))
                vals = st.integers(0, 2)
                arg = None if f == "read" else (draw(st.tuples(vals, vals)) if f == "cas" else draw(vals))
            current[t] = {"f": f, "key": key, "arg": arg, "applied": False, "result": None, "failed": False}
            events.append((process[t], "invoke", f, wrap(key, arg)))
            started += 1
        elif action == "apply":
            t = draw(st.sampled_from([t for t in busy if not current[t]["applied"]]))  # type: ignore[index]
            apply(current[t])  # type: ignore[arg-type]
        elif action == "complete":
            t = draw(st.sampled_from([t for t in busy if current[t]["applied"]]))  # type: ignore[index]
            op = current[t]
            assert op is not None
            value = op["result"] if op["f"] in READS else op["arg"]
            events.append((process[t], "fail" if op["failed"] else "ok", op["f"], wrap(op["key"], value)))
            current[t] = None
        elif action == "crash":
            t = draw(st.sampled_from(busy))
            op = current[t]
            assert op is not None
            if draw(st.booleans()):  # an info completion; otherwise the process just vanishes
                events.append((process[t], "info", op["f"], wrap(op["key"], op["arg"])))
            if not op["applied"]:
                zombies.append(op)
            current[t] = None
            process[t] += 100  # Jepsen: a crashed process never returns
        else:
            op = zombies.pop(draw(st.integers(0, len(zombies) - 1)))
            if draw(st.booleans()):
                apply(op)  # takes effect late; otherwise never
    return [Op(i, i, p, t, f, v) for i, (p, t, f, v) in enumerate(events)]


def _mutate(draw: st.DrawFn, history: list[Op], kind: str) -> list[Op] | None:
    reads = [i for i, op in enumerate(history) if op.type == "ok" and op.f in READS]
    if not reads:
        return None
    i = draw(st.sampled_from(reads))
    op = history[i]
    if kind == "kv":
        key, old = op.value
        new: Any = (key, draw(st.sampled_from([None, "a", "b", "ab", "ba", "bc", "ca", "abc"]).filter(lambda v: v != old)))
    else:
        new = draw(st.sampled_from([None, 0, 1, 2, 3]).filter(lambda v: v != op.value))
    out = list(history)
    out[i] = Op(op.index, op.time, op.process, op.type, op.f, new)
    return out


KINDS = st.sampled_from(sorted(MODELS))


@SETTINGS
@given(st.data(), KINDS)
def test_recorded_histories_are_accepted(data: st.DataObject, kind: str) -> None:
    history = data.draw(recorded(kind, max_ops=40))
    event(f"{kind}: {'with' if any(op.type == 'info' for op in history) else 'no'} info")
    result = check(history, MODELS[kind])
    assert result.valid is True, history


@SETTINGS
@given(st.data(), KINDS)
def test_mutated_reads_agree_with_brute_force(data: st.DataObject, kind: str) -> None:
    history = data.draw(recorded(kind, max_ops=7))
    mutated = _mutate(data.draw, history, kind)
    if mutated is None:
        return
    model = MODELS[kind]
    assert brute_force(history, model) is True
    expected = brute_force(mutated, model, max_ops=12)
    event(f"{kind}: mutation {'valid' if expected else 'invalid'}")
    assert check(mutated, model).valid is expected, mutated


@SETTINGS
@given(st.data(), KINDS)
def test_mutated_reads_agree_with_plain_wgl(data: st.DataObject, kind: str) -> None:
    history = data.draw(recorded(kind, max_ops=20))
    mutated = _mutate(data.draw, history, kind)
    if mutated is None:
        return
    model = MODELS[kind]
    try:
        expected = plain_wgl(mutated, model, max_states=100_000)
    except RuntimeError:
        # The plain search has none of the checker's reductions; some append histories with
        # several indeterminate appends are beyond it. That limits the oracle, not the checker.
        event("oracle gave up")
        reject()
    event(f"{kind}: mutation {'valid' if expected else 'invalid'}")
    assert check(mutated, model).valid is expected, mutated
