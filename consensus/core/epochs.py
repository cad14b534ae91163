"""Membership change, part 2: one process's replicas across epochs (docs/membership.md).

A cluster's history is a sequence of epochs, each an ordinary SDPaxos cluster with a
fixed member list. ``Member`` is one named process across them, pure like the core
(no I/O, no clock): it holds the core replica of the epoch it is in (``inner``), says
which peer every message goes to by *name*, and moves to the next epoch when its
replica executes END (``Ready.epoch_end``):

1. ``close(end)`` -> the next epoch's ``EpochBase``: its number, members, sequencer and
   the state machine's state after END (the executor's snapshot, sessions included, the
   pending reconfiguration left behind). The driver stores it durably *before* it acts
   on anything of the next epoch (its records are in a new log: ``epoch`` tags them).
2. ``enter(base)``: the replica of the new epoch, built from that state at slot 0 with
   ``ProtocolConfig(n=len(members), epoch=...)``; the commands and reads the old
   replica still owed an answer (``unfinished()``) are proposed again in it (a command
   also executed below END is dropped by the client sessions carried over). A process
   that is not a member retires: it answers nothing more (``removed``).

The old epoch's replica is dropped: a message of an older epoch is answered with an
``EpochNotice``, and a notice or a message of a newer epoch makes its receiver ask its
driver for the sender's current base (``want_base``), which it adopts with
``adopt(base)`` if that base is newer than its own. A member that missed END moves on
that way, skipping the rest of its epoch (everything in it is below END, so in the
base); a new member starts that way (an empty process is in no epoch, -1). Nothing of
an ended epoch is kept, so nothing of it needs storing either.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import msgpack

from .config import ProtocolConfig
from .messages import EpochNotice, Message


@dataclass(frozen=True)
class EpochBase:
    """Where an epoch starts: ``state`` is the executor's snapshot (None: empty)."""

    epoch: int
    members: tuple[str, ...]
    sequencer: str
    state: bytes | None = None

    def pack(self) -> bytes:
        return msgpack.packb([self.epoch, list(self.members), self.sequencer, self.state], use_bin_type=True)

    @classmethod
    def unpack(cls, data: bytes) -> "EpochBase":
        epoch, members, sequencer, state = msgpack.unpackb(data, raw=False)
        if (type(epoch) is not int or epoch < 0 or type(members) is not list or sequencer not in members
                or not (state is None or type(state) is bytes)):
            raise ValueError("malformed epoch base")
        return cls(epoch, tuple(members), sequencer, state)


NO_EPOCH = EpochBase(-1, (), "")  # a new process: it learns its epoch from a peer


class Member:
    """One named process across epochs (module docstring)."""

    def __init__(
        self,
        name: str,
        base: EpochBase | None,
        cfg: ProtocolConfig,
        new_replica: Callable[[int, ProtocolConfig, tuple | None, list | None], Any],
        records: list | None = None,
    ) -> None:
        self.name = name
        self._cfg = cfg  # timers and batching; n, sequencer and epoch come from each base
        self._new_replica = new_replica  # (index, cfg, snapshot, records) -> a core replica
        self.base = base or NO_EPOCH
        self.inner: Any = None
        self.want_base: str | None = None  # Ready-like, one-shot: fetch this peer's base
        self._notices: list[tuple[str, int, list[Message]]] = []
        self._start(self.base, records)

    # --- where we are -----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.base.epoch

    @property
    def members(self) -> tuple[str, ...]:
        return self.base.members

    @property
    def removed(self) -> bool:
        """Not a member of the epoch we know (never was, or removed by a reconfiguration)."""
        return self.inner is None

    def config_for(self, base: EpochBase) -> ProtocolConfig:
        return dataclasses.replace(self._cfg, n=len(base.members), initial_sequencer=base.members.index(base.sequencer),
                                   epoch=base.epoch, peer_order=())

    def _start(self, base: EpochBase, records: list | None, fresh: bool = False) -> None:
        self.base = base
        if self.name not in base.members or base.epoch < 0:
            self.inner = None
            return
        cfg = self.config_for(base)
        snapshot = None
        if base.state is not None:
            snapshot = ({"protocol": "sdpaxos", "n": cfg.n, "slot": 0, "exec_inst": [0] * cfg.n, "view": cfg.initial_view},
                        base.state)
        if fresh and snapshot is not None and not records and base.epoch > 0:
            # ``enter``: the epoch's first start in this process, as the runtime does it
            # (Node.open's ``fresh_epoch``, docs/membership.md): a replica built fresh
            # with the base state, whose first sequencer serves view 0 at once. A
            # restart (the constructor) takes the snapshot path and its restart rules.
            self.inner = self._new_replica(base.members.index(self.name), cfg, None, [])
            self.inner.executor.restore(base.state)
            return
        self.inner = self._new_replica(base.members.index(self.name), cfg, snapshot, records)

    # --- the epoch boundary -------------------------------------------------------------

    def close(self, end: tuple) -> EpochBase:
        """Our replica executed END (``Ready.epoch_end``): the next epoch's base, for the
        driver to store durably before ``enter``."""
        _slot, (epoch, members, sequencer) = end
        if epoch != self.epoch:
            raise ValueError(f"END of epoch {epoch} reported in epoch {self.epoch}")
        return EpochBase(epoch + 1, tuple(members), sequencer, self.inner.executor.base_state())

    def enter(self, base: EpochBase) -> None:
        """Move to ``base`` (stored durably): build its replica and re-propose what the
        old one owed."""
        if base.epoch <= self.epoch:
            return
        old, old_members, next_epoch = self.inner, self.members, base.epoch == self.epoch + 1
        owed = old.unfinished() if old is not None else []
        self._start(base, records=None, fresh=True)
        if next_epoch:
            # The newcomers know nobody: tell them (they fetch the base from us).
            for dst in base.members:
                if dst not in old_members and dst != self.name:
                    self._notices.append((dst, base.epoch, [EpochNotice(-1, base.epoch)]))
        if self.inner is None:
            return
        for client, seq, op, needs_result in owed:
            self.inner.propose(client, seq, op, needs_result)

    def adopt(self, base: EpochBase) -> bool:
        """A peer's current base (asked for with ``want_base``): move to it if it is newer."""
        if base.epoch <= self.epoch:
            return False
        self.enter(base)
        return True

    # --- messages ----------------------------------------------------------------------------

    def step(self, src: str, epoch: int, msgs: list[Message]) -> None:
        """An envelope from peer ``src`` of ``epoch``."""
        if epoch == self.epoch:
            if self.inner is not None and src in self.members:
                self.inner.step(self.members.index(src), msgs)
            return
        if epoch > self.epoch:
            self.want_base = src  # we are behind: the driver fetches src's base
        elif self.epoch >= 0 and not any(type(m) is EpochNotice for m in msgs):
            self._notices.append((src, self.epoch, [EpochNotice(-1, self.epoch)]))

    def tick(self) -> None:
        if self.inner is not None:
            self.inner.tick()

    def notices(self) -> list[tuple[str, int, list[Message]]]:
        """Notices to peers of older epochs, by name: ``(dst, epoch, msgs)``."""
        out, self._notices = self._notices, []
        return out

    def address(self, messages: list) -> list[tuple[str, int, list[Message]]]:
        """The current replica's ``Ready.messages`` (``(index, msgs)``) by name and epoch."""
        return [(self.members[dst], self.epoch, msgs) for dst, msgs in messages]
