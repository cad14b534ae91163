"""The interface between consensus and the state machine it replicates.

A replicated state machine must be deterministic: the same commands in the same order
give the same results and the same snapshot bytes on every replica. No wall clock, no
randomness, no iteration over unordered containers inside ``apply``; time enters only
as a value carried in a command.

Commands and results are msgpack-friendly values (None, bool, int, float, str, bytes,
lists and str-keyed dicts of those): they cross the network and the write-ahead log
through one msgpack codec, which turns tuples into lists.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StateMachine(Protocol):
    """What consensus needs from the replicated application."""

    def apply(self, command: Any) -> Any:
        """Apply one committed command and return its result (msgpack-friendly).

        Must be deterministic and must not raise for a bad command: a command that
        cannot be applied returns an error result and leaves the state unchanged.
        """
        ...

    def snapshot(self) -> bytes:
        """Serialize the full state; equal states give byte-identical snapshots."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the state with one produced by ``snapshot``."""
        ...
