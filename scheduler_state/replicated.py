"""The scheduler as Cellar replicates it: empty until an ``init`` command commits its config.

``cellar serve --machine scheduler --hived-config FILE`` builds a ``ReplicatedScheduler``
with no config. The config enters the replicated state through the log, like every
other change: at start each replica proposes ``{"op": "init", "config": MAPPING}``
(its file, parsed) and waits for the result. The **first** ``init`` committed builds
the scheduler; every later one changes nothing and answers with the hash of the
config the cluster holds. A replica whose own hash differs refuses to serve: it
prints one line and exits (``store.scheduler_service``). Because the state comes
from the log, never from the local file, a replica started with the wrong file never
applies a single command differently from the others; it only learns that it must
not serve. Later config changes go through ``reconfigure`` (in the log); ``init`` is
only the genesis.

The hash (``config_hash``) is the SHA-256 of the canonical msgpack of the parsed
config, so comments and formatting do not matter, content does.

**Shared reads** (the HTTP API's inspect calls): an ``inspect`` read that carries
``"shared": true`` may be answered with the very result object an earlier read of the
same view got, as long as no command that may change the state was applied since
(every command outside ``READ_OPS`` counts, refused ones included). HiveD's cluster
views of a 1,024-node cluster take tens to hundreds of milliseconds to build, and a
poller asks for them again and again; a caller of a shared read must treat the result
as read-only. Reads without the flag (the embedding API) always get a fresh object.
The cache is outside the state (snapshot, digest) and never changes a result: a read
answered from it is the read computed on the same state.

**Batches**: ``{"op": "batch", "commands": [C1, C2, ...]}`` (at most ``BATCH_MAX``)
carries several commands in one log entry; a replica's service coalesces the calls
that arrive together (``store.scheduler_service``). Each ``Ci`` is applied on its own,
in order, with its own result, exactly as if it held the next slot: atomic alone, not
with the others (one that fails changes nothing and the rest still apply). The result
is ``{"ok": True, "results": [R1, R2, ...]}``; the observer sees each ``Ci`` (they share
the log entry's position). A batch inside a batch is refused (its own result).

Before ``init`` commits, every other command answers ``{"ok": False, "uninitialized":
True, "error": ...}`` and changes nothing.

**Observing applies** (metrics, the embedding API's change feed): the runtime may set
``observer`` to a callable ``(command, result, apply_ns)``, called after every
``apply`` and with ``(None, None, 0)`` after a ``restore`` (the state was replaced
wholesale: a feed must resynchronize), and ``timer`` to a nanosecond clock used only
to measure ``apply_ns``. Neither is part of the state (snapshot, digest) nor read by
``apply``'s logic; with no observer nothing is timed.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import msgpack

from scheduler_state.config import Config, ConfigError, load_config
from scheduler_state.machine import _HANDLERS, SCHEDULER_KEY, SchedulerStateMachine, _canonical, is_read

FORMAT = 1
BATCH = "batch"  # several commands in one log entry (module docstring)
BATCH_MAX = 256
SHARED = "shared"  # an inspect read that may share a cached result (module docstring)
_SHARED_VIEWS_MAX = 64  # distinct (view, name) results kept between two state changes
NOT_INITIALIZED = "scheduler not initialized: no config committed yet (the first init in the log sets it)"


DEPTH_MAX = 100  # nesting of a command's values: a spec needs fewer than 8 levels, an init or
# reconfigure's config 2 per level of its cell hierarchy; the core's batch sizing
# (op_bytes, recursive) broke at about 600. A config of the deepest hierarchy the
# config loader takes (32 levels, docs/scheduler_state.md) needs about 70.


_NESTED = (dict, list, tuple)


def _depth_over(value: Any, limit: int) -> bool:
    """True if ``value`` nests lists/maps deeper than ``limit`` (no recursion: a value
    a thousand levels deep must not raise here). Only containers are stacked."""
    stack = [(value, 1)] if type(value) in _NESTED else []
    while stack:  # bounded by the value's size
        v, d = stack.pop()
        if d > limit:
            return True
        items = [*v.keys(), *v.values()] if type(v) is dict else v
        stack.extend((x, d + 1) for x in items if type(x) in _NESTED)
    return False


def encode_checked(op: Any) -> bytes:
    """``op`` as msgpack, or ``ValueError`` naming why no replica may carry it: nested
    more than ``DEPTH_MAX`` levels, or not encodable (an integer beyond 64 bits, a set).
    A value 600 levels deep raised in the core's batch sizing (``op_bytes``) and an
    unencodable one in the transport, each stopping the replica, and the client's retry
    the next."""
    if _depth_over(op, DEPTH_MAX):
        raise ValueError(f"nested more than {DEPTH_MAX} levels deep")
    try:
        return msgpack.packb(op, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"not encodable: {type(e).__name__}: {str(e)[:80]}") from None


def validate(op: Any) -> dict[str, Any] | None:
    """The pre-proposal check a replica runs on a client's command (store.machines):
    None for a mapping whose ``op`` names a command (``init``, ``batch`` of such, or
    one of the machine's) that ``encode_checked`` takes, else the error result, so that
    nothing malformed enters the log. Its fields are the machine's to check in ``apply``
    (deterministic refusals)."""

    def bad(command: Any) -> str | None:
        if not isinstance(command, dict):
            return "a command is a mapping with an 'op'"
        name = command.get("op")
        if type(name) is not str or (name not in _HANDLERS and name != "init"):
            return f"unknown op {str(name)[:40]!r}; known: {', '.join(sorted([*_HANDLERS, 'init', BATCH]))}"
        return None

    if isinstance(op, dict) and op.get("op") == BATCH:
        commands = op.get("commands")
        if type(commands) is not list or not commands or len(commands) > BATCH_MAX:
            why: str | None = f"commands must be a list of 1..{BATCH_MAX} commands"
        else:
            why = next((f"command {i}: {w}" for i, w in ((i, bad(c)) for i, c in enumerate(commands)) if w), None)
    else:
        why = bad(op)
    if why is None:
        try:
            encode_checked(op)
        except ValueError as e:
            why = str(e)
    return None if why is None else {"ok": False, "code": "InvalidRequest", "error": why}


def stamp(op: Any, now_ms: int) -> Any:
    """``op`` with the proposing replica's clock in place of the ``now_ms`` a client
    sent (in a batch, in each command that has one): time enters the log from the
    replica that proposes, never from a client, which could otherwise move the
    machine's clock (the largest ``now_ms`` seen) years ahead and expire every lease
    at once, and no lease granted after that would ever end. Pure."""
    if type(op) is not dict:
        return op
    if op.get("op") == BATCH:
        commands = op.get("commands")
        if type(commands) is list and any(type(c) is dict and "now_ms" in c for c in commands):
            return {**op, "commands": [{**c, "now_ms": now_ms} if type(c) is dict and "now_ms" in c else c
                                       for c in commands]}
        return op
    return {**op, "now_ms": now_ms} if "now_ms" in op else op


def config_hash(config: Config) -> str:
    """SHA-256 (hex) of the canonical msgpack of the parsed config."""
    return hashlib.sha256(msgpack.packb(_canonical(config.to_dict()), use_bin_type=True)).hexdigest()


def init_command(config: Config) -> dict[str, Any]:
    return {"op": "init", "config": config.to_dict()}


class ReplicatedScheduler:
    """A ``ReplicatedMachine`` holding a ``SchedulerStateMachine`` once initialized."""

    name = "scheduler"

    def __init__(self, config: Config | None = None) -> None:
        self.inner: SchedulerStateMachine | None = None
        self.config_hash: str | None = None
        # Outside the state (module docstring): set by the runtime, never snapshotted.
        self.observer: Callable[[Any, Any, int], None] | None = None
        self.timer: Callable[[], int] | None = None
        self._shared: dict[tuple, Any] = {}  # (view, name) -> result, valid until the next state change
        if config is not None:  # tests and the simulator: as if init were the first command
            self._init(config)

    def _init(self, config: Config) -> None:
        self.inner = SchedulerStateMachine(config)
        self.config_hash = config_hash(config)
        self._shared.clear()

    def apply(self, command: Any) -> Any:
        if type(command) is dict and command.get("op") == BATCH:
            return self._apply_batch(command)
        observer = self.observer
        if observer is None:
            return self._apply(command)
        timer = self.timer
        t0 = timer() if timer is not None else 0
        result = self._apply(command)
        observer(command, result, timer() - t0 if timer is not None else 0)
        return result

    def _apply_batch(self, command: dict[str, Any]) -> Any:
        """Several commands in one log entry (module docstring, "Batches"): each applied
        on its own, in order, exactly as if they held consecutive slots."""
        commands = command.get("commands")
        if type(commands) is not list or not commands or len(commands) > BATCH_MAX:
            return {"ok": False, "error": f"commands must be a list of 1..{BATCH_MAX} commands"}
        observer = self.observer
        timer = self.timer
        results = []
        for sub in commands:
            if type(sub) is dict and sub.get("op") == BATCH:
                result: Any = {"ok": False, "error": "a batch cannot hold a batch"}
            elif observer is None:
                result = self._apply(sub)
            else:
                t0 = timer() if timer is not None else 0
                result = self._apply(sub)
                observer(sub, result, timer() - t0 if timer is not None else 0)
            results.append(result)
        return {"ok": True, "results": results}

    def _apply(self, command: Any) -> Any:
        if is_read(command):
            if SHARED in command:  # a shared read that took the log path
                return self.query(command)
        else:
            self._shared.clear()  # may change the state (refused commands too: conservative)
        if isinstance(command, dict) and command.get("op") == "init":
            if self.inner is not None:
                return {"ok": True, "initialized": False, "config_hash": self.config_hash}
            raw = command.get("config")
            if not isinstance(raw, dict):
                return {"ok": False, "error": "config must be a mapping (a parsed HiveD config)"}
            try:
                config = load_config(raw)
            except ConfigError as exc:
                return {"ok": False, "error": f"config: {exc}"}
            self._init(config)
            return {"ok": True, "initialized": True, "config_hash": self.config_hash}
        if self.inner is None:
            return {"ok": False, "uninitialized": True, "error": NOT_INITIALIZED}
        return self.inner.apply(command)

    def query(self, op: Any) -> Any:
        if self.inner is None:
            return {"ok": False, "uninitialized": True, "error": NOT_INITIALIZED}
        if isinstance(op, dict) and SHARED in op:
            op = {k: v for k, v in op.items() if k != SHARED}
            if op.get("op") == "inspect":
                key = (op.get("view"), op.get("name"))
                try:
                    hit = self._shared.get(key)
                except TypeError:  # an unhashable name: the machine refuses it below
                    hit, key = None, None
                if hit is not None:
                    return hit
                result = self.inner.query(op)
                if key is not None and isinstance(result, dict) and result.get("ok"):
                    if len(self._shared) >= _SHARED_VIEWS_MAX:
                        self._shared.clear()
                    self._shared[key] = result
                return result
        return self.inner.query(op)

    @staticmethod
    def read_key(op: Any) -> str | None:
        return SCHEDULER_KEY if is_read(op) else None

    @staticmethod
    def keys_of(command: Any) -> list:
        return SchedulerStateMachine.keys_of(command)

    def snapshot(self) -> bytes:
        inner = self.inner.snapshot() if self.inner is not None else None
        return msgpack.packb([FORMAT, self.config_hash, inner], use_bin_type=True)

    def restore(self, data: bytes) -> None:
        fmt, chash, inner = msgpack.unpackb(data, raw=False)
        if fmt != FORMAT:
            raise ValueError(f"not a replicated scheduler snapshot (format {fmt!r})")
        self._shared.clear()
        if inner is None:
            self.inner, self.config_hash = None, None
            if self.observer is not None:
                self.observer(None, None, 0)
            return
        m = SchedulerStateMachine.from_snapshot(inner)
        self.inner, self.config_hash = m, chash
        if self.observer is not None:
            self.observer(None, None, 0)

    def digest(self) -> str:
        return hashlib.sha256(self.snapshot()).hexdigest()[:16]
