"""Applies committed command batches to the replicated state machine, exactly once.

Each command is ``[client, seq, op]``. Clients issue one command at a time with
increasing ``seq`` and may resend it (to the same or another replica) after a
timeout, so the same command can be committed twice. The executor keeps a session
per client (its last executed ``seq`` and result) and skips anything not newer, the
way Raft's client sessions do. Sessions are part of the replicated state: every
replica skips the same duplicates, so they stay identical.

The executor also takes the one command the core itself understands: a membership
change, ``[RECONFIG, epoch, members, sequencer]`` (docs/membership.md). The first valid
one executed in this epoch becomes the epoch's pending reconfiguration (``reconfig``,
in the snapshot); the state machine never sees it.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .statemachine import StateMachine


RECONFIG = "cellar.reconfig"
MEMBERS_MAX = 31  # ballots name proposers in 5 bits (consensus.core.config.MAX_REPLICAS)


def check_reconfig(op: Any, epoch: int) -> str | None:
    """Why ``op`` (a ``[RECONFIG, epoch, members, sequencer]`` command) cannot close
    epoch ``epoch``, or None. Pure: every replica decides the same."""
    if type(op) not in (list, tuple) or len(op) != 4:
        return "a reconfiguration is [RECONFIG, epoch, members, sequencer]"
    _tag, e, members, sequencer = op
    if type(e) is not int or e != epoch:
        return f"the reconfiguration names epoch {e!r}, the current epoch is {epoch}"
    if type(members) not in (list, tuple) or not all(type(m) is str and 0 < len(m) <= 255 for m in members):
        return "members must be a list of member names (non-empty strings)"
    if len(set(members)) != len(members):
        return "members must be distinct"
    if not 3 <= len(members) <= MEMBERS_MAX or len(members) % 2 == 0:
        return f"a configuration has an odd number of members from 3 to {MEMBERS_MAX}, not {len(members)}"
    if sequencer not in members:
        return f"the sequencer {sequencer!r} is not a member"
    return None


class Executor:
    __slots__ = ("sm", "sessions", "applied", "epoch", "reconfig")

    def __init__(self, sm: StateMachine, epoch: int | None = 0) -> None:
        self.sm = sm
        # client -> [last executed seq, its result]
        self.sessions: dict[Any, list] = {}
        self.applied = 0
        self.epoch = epoch  # None: the protocol cannot change membership
        # The epoch's pending reconfiguration: [epoch, members, sequencer], or None.
        self.reconfig: list | None = None

    def run(self, cmds: list | None, out: list) -> None:
        """Apply a batch; append ``(client, seq, result, fresh)`` for each command.

        ``fresh`` is False for a duplicate, whose result is the cached one when it is
        the latest command of that client, else None.
        """
        if not cmds:
            return
        sessions = self.sessions
        apply = self.sm.apply
        for cmd in cmds:
            client, seq, op = cmd[0], cmd[1], cmd[2]
            session = sessions.get(client)
            if session is not None and seq <= session[0]:
                out.append((client, seq, session[1] if seq == session[0] else None, False))
                continue
            if type(op) is list and op and op[0] == RECONFIG:
                result = self._reconfigure(op)
            else:
                result = apply(op)
            if session is None:
                sessions[client] = [seq, result]
            else:
                session[0] = seq
                session[1] = result
            self.applied += 1
            out.append((client, seq, result, True))

    def _reconfigure(self, op: list) -> dict:
        if self.epoch is None:
            return {"ok": False, "error": "this protocol does not change membership (SDPaxos does)"}
        why = check_reconfig(op, self.epoch)
        if why is None and self.reconfig is not None:
            why = f"epoch {self.epoch} already ends with a reconfiguration to {self.reconfig[1]}"
        if why is not None:
            return {"ok": False, "error": why}
        self.reconfig = [op[1], list(op[2]), op[3]]
        return {"ok": True, "epoch": self.epoch + 1, "members": list(op[2]), "sequencer": op[3]}

    def base_state(self) -> bytes:
        """The state the next epoch starts from (docs/membership.md): the snapshot
        without this epoch's pending reconfiguration."""
        pending, self.reconfig = self.reconfig, None
        try:
            return self.snapshot()
        finally:
            self.reconfig = pending

    def snapshot(self) -> bytes:
        """The state machine and the sessions, deterministically encoded."""
        sessions = sorted(([k, v[0], v[1]] for k, v in self.sessions.items()), key=lambda e: (str(type(e[0])), e[0]))
        out = [self.sm.snapshot(), sessions, self.applied]
        if self.reconfig is not None:
            out.append(self.reconfig)
        return msgpack.packb(out, use_bin_type=True)

    def restore(self, data: bytes) -> None:
        parts = msgpack.unpackb(data, raw=False, strict_map_key=False)
        sm_bytes, sessions, applied = parts[:3]
        self.sm.restore(sm_bytes)
        self.sessions = {k: [s, r] for k, s, r in sessions}
        self.applied = applied
        self.reconfig = parts[3] if len(parts) > 3 else None
