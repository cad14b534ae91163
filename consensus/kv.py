"""A small deterministic key-value state machine, used by tests, the simulator and the
minimal client path of the runtime.

Operations (lists, as they arrive through msgpack):

- ``["put", key, value]`` → None
- ``["get", key]`` → the value, or None
- ``["cas", key, expected, new]`` → True if the value was ``expected`` (then set)
- ``["append", key, suffix]`` → the new value (string concatenation)
- ``["delete", key]`` → True if the key existed

A malformed operation returns ``["error", reason]`` and changes nothing.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack


class KVStateMachine:
    """Implements ``consensus.core.statemachine.ReplicatedMachine``."""

    __slots__ = ("data",)
    name = "kv"

    def __init__(self) -> None:
        self.data: dict[Any, Any] = {}

    def apply(self, op: Any) -> Any:
        if type(op) is not list or not op:
            return ["error", "operation must be a non-empty list"]
        name = op[0]
        data = self.data
        if len(op) > 1 and type(op[1]) not in (str, int, bytes):
            return ["error", "keys must be strings, integers or bytes"]
        if name == "put" and len(op) == 3:
            data[op[1]] = op[2]
            return None
        if name == "get" and len(op) == 2:
            return data.get(op[1])
        if name == "cas" and len(op) == 4:
            if data.get(op[1]) == op[2]:
                data[op[1]] = op[3]
                return True
            return False
        if name == "append" and len(op) == 3:
            value = data.get(op[1], "")
            if not isinstance(value, str) or not isinstance(op[2], str):
                return ["error", "append needs string values"]
            data[op[1]] = value = value + op[2]
            return value
        if name == "delete" and len(op) == 2:
            return data.pop(op[1], _MISSING) is not _MISSING
        return ["error", f"unknown operation {str(name)[:40]!r} with {len(op) - 1} arguments"]

    def query(self, op: Any) -> Any:
        """Read-only operations (served by lease reads without going through the log)."""
        if type(op) is list and len(op) == 2 and op[0] == "get" and type(op[1]) in (str, int, bytes):
            return self.data.get(op[1])
        return ["error", "only get can be served as a read"]

    @staticmethod
    def read_key(op: Any) -> Any | None:
        """``get`` is the one read-only operation; it reads its key."""
        if type(op) is list and len(op) == 2 and op[0] == "get" and type(op[1]) in (str, int, bytes):
            return op[1]
        return None

    @staticmethod
    def keys_of(op: Any) -> list:
        """Keys a command writes (the sequencer's history table, paper §3.5)."""
        if type(op) is list and len(op) >= 2 and op[0] in ("put", "cas", "append", "delete"):
            return [op[1]]
        return []

    def snapshot(self) -> bytes:
        items = sorted(self.data.items(), key=lambda kv: (str(type(kv[0])), kv[0]))
        return msgpack.packb(items, use_bin_type=True)

    def restore(self, data: bytes) -> None:
        self.data = {k: v for k, v in msgpack.unpackb(data, raw=False, strict_map_key=False)}

    def digest(self) -> str:
        return hashlib.sha256(self.snapshot()).hexdigest()[:16]


_MISSING = object()
