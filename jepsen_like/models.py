"""Sequential specifications that the linearizability checker compares histories against.

A model is a pure, deterministic single-threaded object. The hook for user models (the store's
key-value API, compare-and-swap, later the scheduler's commands) is to subclass ``Model``:

.. code-block:: python

    class Counter(Model):
        name = "counter"

        def init(self):                                  # initial state: must be hashable
            return 0

        def step(self, state, f, value, result):
            # -> (ok, new_state). ``value`` is the invocation's argument, ``result`` what the
            # completion returned, or ``UNKNOWN`` when the op is indeterminate (``info``): then
            # answer as if it took effect, ok=False only if it could not have happened here.
            if f == "add":
                return True, state + value
            if f == "read":
                return result is UNKNOWN or result == state, state
            raise ModelError(f"counter has no function {f!r}")

States must be hashable and compare by value: the checker memoises (linearized set, state)
pairs. Optional overrides:

- ``partition(ops) -> dict[key, list[Operation]]``: split a history into independent
  sub-histories (P-compositionality: a history is linearizable iff every part is), and
  ``for_partition(key) -> Model``, the model that checks one part (by default the model itself).
  ``Independent`` splits ``(key, value)`` ops, Jepsen's ``independent``, and checks each key
  with its inner model.
- ``compile(op) -> Transition``: a fast, inlined form of ``step`` for one op (see ``Transition``);
  the default wraps ``step`` and is always correct. ``NOOP`` drops an op that can never change or
  be contradicted by the state (an indeterminate read, for instance).
- ``describe_op(op) -> str`` and ``describe_state(state) -> str`` for reports.

Built-in models: ``Register`` (``read``/``write``), ``CASRegister`` (adds ``cas [old new]``),
``KV`` (``get``/``put``/``append``/``cas`` on ``(key, value)`` ops, partitioned by key). ``MODELS``
maps CLI names to factories; ``get_model(name)``.

Conventions shared by the built-ins: the register starts at ``None`` (Jepsen's ``nil``: the key
does not exist), and an ``ok`` read of ``None`` means it read that empty register, as in
Porcupine's etcd model (pass ``nil_read_matches_any=True`` for Knossos' older reading, where a nil
read matches anything). In ``KV`` the empty string and ``None`` are the same value (a missing
key), since key-value test suites print missing keys as ``""``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any

from .history import INFO, Operation

__all__ = [
    "APPEND",
    "CAS",
    "FAILED",
    "GENERIC",
    "MODELS",
    "NOOP",
    "READ",
    "UNKNOWN",
    "WRITE",
    "CASRegister",
    "Independent",
    "KV",
    "Model",
    "ModelError",
    "Register",
    "Transition",
    "get_model",
]


class _Unknown:
    """The result of an indeterminate (``info``) operation."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __reduce__(self) -> str:  # stays a singleton across pickling (worker processes)
        return "UNKNOWN"


UNKNOWN = _Unknown()


class ModelError(ValueError):
    """The history uses a function or value the model does not understand."""


# Transition kinds, interpreted inline by the search loop (a Python call per step is the single
# largest cost in a pure-Python checker, so the common shapes avoid it).
NOOP = 0  # never changes or checks the state: dropped before the search
READ = 1  # ok iff state == arg; state unchanged
WRITE = 2  # always ok; state = arg (a "blind" write)
CAS = 3  # ok iff state == arg[0]; state = arg[1]
APPEND = 4  # always ok; state = arg if state is None else state + arg
GENERIC = 5  # arg(state) -> new state, or FAILED when the op cannot happen in this state

FAILED = object()  # returned by a GENERIC transition function to say "not in this state"


@dataclass(frozen=True, slots=True)
class Transition:
    """What one operation does to the state, in a form the search loop can run without calls."""

    kind: int
    arg: Any = None


class Model:
    """Base class for models; see the module docstring for the contract."""

    name = "model"

    def init(self) -> Hashable:
        raise NotImplementedError

    def step(self, state: Any, f: str, value: Any, result: Any) -> tuple[bool, Any]:
        raise NotImplementedError

    def partition(self, ops: list[Operation]) -> dict[Any, list[Operation]]:
        return {None: list(ops)} if ops else {}

    def for_partition(self, key: Any) -> Model:
        return self

    def compile(self, op: Operation) -> Transition:
        step = self.step
        f, value = op.f, op.value
        result = UNKNOWN if op.type == INFO else op.result

        def fn(state: Any) -> Any:
            ok, new = step(state, f, value, result)
            return new if ok else FAILED

        return Transition(GENERIC, fn)

    def describe_op(self, op: Operation) -> str:
        if op.type == INFO:
            return f"{op.f} {_show(op.value)} ?"
        if op.result is None or op.result == op.value:
            return f"{op.f} {_show(op.value)}"
        return f"{op.f} {_show(op.value)} → {_show(op.result)}"

    def describe_state(self, state: Any) -> str:
        return _show(state)


def _show(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, tuple):
        return "[" + " ".join(_show(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value) if (not value or " " in value) else value
    return str(value)


def _pair(op: Operation, what: str) -> tuple[Any, Any]:
    v = op.value
    if not (isinstance(v, tuple) and len(v) == 2):
        raise ModelError(f"{what} at index {op.invoke.index} needs a value [old new], not {_show(v)}")
    return v[0], v[1]


class Register(Model):
    """A read/write register, initially ``None``."""

    name = "register"
    functions = ("read", "write")

    def __init__(self, initial: Any = None, nil_read_matches_any: bool = False) -> None:
        self.initial = initial
        self.nil_read_matches_any = nil_read_matches_any

    def init(self) -> Hashable:
        return self.initial

    def step(self, state: Any, f: str, value: Any, result: Any) -> tuple[bool, Any]:
        t = self.compile_fv(f, value, result, None)
        return _apply(t, state)

    def compile(self, op: Operation) -> Transition:
        return self.compile_fv(op.f, op.value, UNKNOWN if op.type == INFO else op.result, op)

    def compile_fv(self, f: str, value: Any, result: Any, op: Operation | None) -> Transition:
        where = f" at index {op.invoke.index}" if op is not None else ""
        if f in ("read", "get"):
            if result is UNKNOWN or (result is None and self.nil_read_matches_any):
                return Transition(NOOP)
            return Transition(READ, result)
        if f in ("write", "put"):
            return Transition(WRITE, value)
        if f == "cas" and "cas" in self.functions:
            if not (isinstance(value, tuple) and len(value) == 2):
                raise ModelError(f"cas{where} needs a value [old new], not {_show(value)}")
            return Transition(CAS, value)
        raise ModelError(f"{self.name} has no function {f!r}{where}")

    def describe_op(self, op: Operation) -> str:
        if op.f in ("read", "get"):
            return f"{op.f} → ?" if op.type == INFO else f"{op.f} → {_show(op.result)}"
        if op.f == "cas" and isinstance(op.value, tuple) and len(op.value) == 2:
            tail = " ?" if op.type == INFO else ""
            return f"cas {_show(op.value[0])}→{_show(op.value[1])}{tail}"
        return super().describe_op(op)


class CASRegister(Register):
    """A register with compare-and-set: ``cas`` takes ``[old new]`` and succeeds iff the register
    holds ``old``. A ``fail``ed cas did not happen (it is dropped, as Jepsen records it)."""

    name = "cas-register"
    functions = ("read", "write", "cas")


class Independent(Model):
    """Lift a single-object model to a map of independent objects: every op's value (and an ok
    op's result) is ``(key, value)``; each key is checked on its own (Jepsen's ``independent``).

    ``init``/``step`` describe the whole map (a frozenset of ``(key, state)`` pairs, keys absent
    until touched), so an unpartitioned reference checker gets the true semantics; the fast
    checker partitions by key and uses ``for_partition(key)``, the inner model."""

    def __init__(self, inner: Model, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or f"independent-{inner.name}"

    def init(self) -> Hashable:
        return frozenset()

    def step(self, state: Any, f: str, value: Any, result: Any) -> tuple[bool, Any]:
        if not (isinstance(value, tuple) and len(value) == 2):
            raise ModelError(f"{self.name}: needs a value [key value], not {_show(value)}")
        key, v = value
        if isinstance(result, tuple) and len(result) == 2 and result[0] == key:
            result = result[1]
        current = dict(state)
        ok, new = self.inner.step(current.get(key, self.inner.init()), f, v, result)
        if not ok:
            return False, state
        current[key] = new
        return True, frozenset(current.items())

    def for_partition(self, key: Any) -> Model:
        return self.inner

    def partition(self, ops: list[Operation]) -> dict[Any, list[Operation]]:
        parts: dict[Any, list[Operation]] = {}
        for op in ops:
            v = op.value
            if not (isinstance(v, tuple) and len(v) == 2):
                raise ModelError(
                    f"{self.name}: op at index {op.invoke.index} needs a value [key value], not {_show(v)}"
                )
            key, inner_value = v
            res = op.result
            if isinstance(res, tuple) and len(res) == 2 and res[0] == key:
                res = res[1]
            # Positional construction: dataclasses.replace costs more than the search on easy
            # histories.
            parts.setdefault(key, []).append(
                Operation(op.id, op.process, op.f, inner_value, res, op.type, op.start, op.end, op.invoke, op.complete)
            )
        return parts

    def describe_op(self, op: Operation) -> str:
        v = op.value
        if isinstance(v, tuple) and len(v) == 2:  # not yet partitioned: show the key
            res = op.result
            if isinstance(res, tuple) and len(res) == 2 and res[0] == v[0]:
                res = res[1]
            return f"{_show(v[0])}: {self.inner.describe_op(replace(op, value=v[1], result=res))}"
        return self.inner.describe_op(op)

    def describe_state(self, state: Any) -> str:
        if isinstance(state, frozenset):
            return "{" + ", ".join(f"{_show(k)} {self.inner.describe_state(v)}" for k, v in sorted(state, key=repr)) + "}"
        return self.inner.describe_state(state)


class _KVValue(Register):
    """One key of the KV map: get/put/append/cas, where ``""`` and ``None`` both mean absent."""

    name = "kv-value"
    functions = ("read", "write", "cas")

    def compile_fv(self, f: str, value: Any, result: Any, op: Operation | None) -> Transition:
        if f == "append":
            if value is None or value == "":
                return Transition(NOOP)  # appending nothing can neither change nor contradict
            return Transition(APPEND, value if isinstance(value, str) else (value,))
        if f in ("get", "read") and result == "":
            result = None
        if f in ("put", "write") and value == "":
            value = None
        if f == "cas" and isinstance(value, tuple) and len(value) == 2:
            value = tuple(None if v == "" else v for v in value)
        return super().compile_fv(f, value, result, op)

    def describe_op(self, op: Operation) -> str:
        if op.f == "append":
            return f"append {_show(op.value)}" + (" ?" if op.type == INFO else "")
        return super().describe_op(op)


class KV(Independent):
    """A key-value map: ops are ``get``/``put``/``append``/``cas`` with value ``(key, v)``; each
    key starts absent (``None``, equal to ``""``) and is checked independently."""

    def __init__(self) -> None:
        super().__init__(_KVValue(), name="kv")


def _apply(t: Transition, state: Any) -> tuple[bool, Any]:
    """Run a compiled transition the slow way (reference semantics for the inlined loop)."""
    k, a = t.kind, t.arg
    if k == NOOP:
        return True, state
    if k == READ:
        return state == a, state
    if k == WRITE:
        return True, a
    if k == CAS:
        return state == a[0], a[1]
    if k == APPEND:
        try:
            return True, (a if state is None else state + a)
        except TypeError:
            return False, state
    new = a(state)
    return (False, state) if new is FAILED else (True, new)


apply_transition = _apply

MODELS: dict[str, Callable[[], Model]] = {
    "register": Register,
    "cas-register": CASRegister,
    "kv": KV,
}


def get_model(name: str) -> Model:
    try:
        return MODELS[name]()
    except KeyError:
        raise ModelError(f"unknown model {name!r} (expected one of {', '.join(MODELS)})") from None
