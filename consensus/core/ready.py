"""What a replica asks its driver to do: the ``Ready`` batch of effects.

The contract, in the order the driver must follow (as etcd raft's ``Ready``):

1. **persist** every record in ``persist``, in order, and make them durable (fsync,
   possibly group-committed with other replicas' writes) — *before* step 2. These are
   promises, accepted C- and O-instances, views and commit markers; an acceptor's
   reply must never leave before the state it vouches for is on disk.
2. **send** ``messages``: one envelope per destination, ``(dst, [msg, ...])``.
   ``urgent`` messages, same shape, vouch for no stored state (round-trip probes and
   their echoes, ``consensus.core.nearness``): send them at once, before step 1's
   records are durable; nothing orders them with ``messages``.
3. **deliver** ``replies`` to the clients that proposed them.
4. ``executed`` reports what was applied to the state machine, in global order, for
   observers (simulator checks, metrics); the driver need not act on it.
5. ``token``: when ``persist`` is not empty, a number that grows with each such
   Ready. Once those records are durable, tell the replica: ``persisted(token)``
   (it means every Ready up to ``token``), then call ``ready()`` again — a replica
   counts its *own* acceptance towards a quorum only once it is durable, so the
   commits and executions it was waiting for come out then. A driver that makes the
   records durable before it acts on any effect of the Ready (the simulator without
   a disk model, the explorer, tests) may call ``ready(sync=True)`` instead: the
   Ready's records count as durable at once, and what that decides is in the same
   Ready (its persist list included, so it still goes to disk first).
6. ``snapshot_from``: when not None, the replica needs log entries that peer
   ``snapshot_from`` compacted away. Fetch that peer's latest stored snapshot
   ``(meta, state)`` (asynchronously; dropping the request is fine, the replica asks
   again) and, when it arrives, follow ``install_snapshot``'s steps
   (``consensus.core.sdpaxos``): ``install_snapshot`` → store durably → ``compact``
   → rewrite the WAL with the live records, before the next ``ready()``.
7. ``epoch_end``: when not None, this replica executed the END slot that closes its
   epoch (docs/membership.md); it executes nothing more in this epoch.

A driver that cannot persist (disk full, I/O error) must stop the replica rather than
send: sending without persisting breaks the protocol's safety argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Reply:
    """The answer to one client command. ``result`` is None for a blind write."""

    client: Any
    seq: int
    result: Any = None
    ok: bool = True
    error: str | None = None


@dataclass(slots=True)
class Executed:
    """One batch applied at global position ``slot`` (``label`` says where it came from)."""

    slot: int
    label: tuple
    cmds: list | None


@dataclass(slots=True)
class Ready:
    persist: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    replies: list = field(default_factory=list)
    executed: list = field(default_factory=list)
    # Fetch the latest snapshot of this peer (a needed log entry was compacted there).
    snapshot_from: int | None = None
    # Number of this Ready's persist list, for ``persisted`` (0: nothing to persist).
    token: int = 0
    # Messages sent without waiting for ``persist`` (see step 2 above).
    urgent: list = field(default_factory=list)
    # This replica executed its epoch's END slot (docs/membership.md): ``(slot,
    # [epoch, members, sequencer])``. The state now is the next epoch's initial state.
    epoch_end: tuple | None = None

    def empty(self) -> bool:
        return not (self.persist or self.messages or self.replies or self.executed or self.urgent
                    or self.snapshot_from is not None or self.epoch_end is not None)
