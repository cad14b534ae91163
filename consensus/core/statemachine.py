"""The interface between consensus and the state machine it replicates.

A replicated state machine must be deterministic: the same commands in the same order
give the same results and the same snapshot bytes on every replica. No wall clock, no
randomness, no iteration over unordered containers inside ``apply``; time enters only
as a value carried in a command (stamped by the replica that proposes it).

Commands and results are msgpack-friendly values (None, bool, int, float, str, bytes,
lists and str-keyed dicts of those): they cross the network and the write-ahead log
through one msgpack codec, which turns tuples into lists.

Two protocols:

- ``StateMachine``: what the executor needs (``apply``, ``snapshot``, ``restore``).
- ``ReplicatedMachine``: the one seam every machine Cellar serves implements (the
  key-value machine ``store.kv_machine.KVStateMachine``, the HiveD scheduler
  ``scheduler_state.SchedulerStateMachine``); the drivers (``consensus.runtime``,
  ``consensus.sim``) use only these methods and never know which machine they carry.
  ``store.machines`` builds one by name.

How the methods are used:

============ ===================================================================
``apply``     every committed command, in log order, on every replica: writes and
              state-dependent calls (allocate, cas), and read-only operations that
              took the log path because no lease was available.
``read_key``  the driver's test "may this op be served as a read": ``None`` means
              no (it must be proposed and applied); otherwise the key the read
              depends on. A linearizable read asks the sequencer for the last slot
              that wrote that key (its lease path, SDPaxos §3.5), waits until that
              slot is executed here and answers with ``query``; without a lease
              the op goes through the log and ``apply`` answers it.
``keys_of``   the keys a command may write, computed before it is ordered (the
              sequencer's history table). Conservative is fine: listing too many
              keys only makes reads wait for more; listing too few breaks
              linearizability. Read-only commands write nothing and return ``[]``.
``query``     a read-only operation on the local state: never changes anything,
              returns an error result for an op that would. Also serves local
              *serializable* reads (no log, no lease: possibly stale).
``digest``    a short hash of ``snapshot()``: equal on replicas at the same point.
============ ===================================================================
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


@runtime_checkable
class ReplicatedMachine(StateMachine, Protocol):
    """The seam between Cellar's drivers and any machine they serve (module docstring)."""

    name: str  # the registry name ("kv", "scheduler")

    def query(self, op: Any) -> Any:
        """Answer a read-only ``op`` from the local state; never changes it."""
        ...

    def read_key(self, op: Any) -> Any | None:
        """``None`` if ``op`` is not read-only; else the key (str, int or bytes) it
        reads, for the sequencer's lease path."""
        ...

    def keys_of(self, command: Any) -> list:
        """Keys ``command`` may write (a superset is fine; ``[]`` for read-only)."""
        ...

    def digest(self) -> str:
        """A short hex digest of ``snapshot()``."""
        ...
