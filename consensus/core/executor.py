"""Applies committed command batches to the replicated state machine, exactly once.

Each command is ``[client, seq, op]``. Clients issue one command at a time with
increasing ``seq`` and may resend it (to the same or another replica) after a
timeout, so the same command can be committed twice. The executor keeps a session
per client (its last executed ``seq`` and result) and skips anything not newer, the
way Raft's client sessions do. Sessions are part of the replicated state: every
replica skips the same duplicates, so they stay identical.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .statemachine import StateMachine


class Executor:
    __slots__ = ("sm", "sessions", "applied")

    def __init__(self, sm: StateMachine) -> None:
        self.sm = sm
        # client -> [last executed seq, its result]
        self.sessions: dict[Any, list] = {}
        self.applied = 0

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
            result = apply(op)
            if session is None:
                sessions[client] = [seq, result]
            else:
                session[0] = seq
                session[1] = result
            self.applied += 1
            out.append((client, seq, result, True))

    def snapshot(self) -> bytes:
        """The state machine and the sessions, deterministically encoded."""
        sessions = sorted(([k, v[0], v[1]] for k, v in self.sessions.items()), key=lambda e: (str(type(e[0])), e[0]))
        return msgpack.packb([self.sm.snapshot(), sessions, self.applied], use_bin_type=True)

    def restore(self, data: bytes) -> None:
        sm_bytes, sessions, applied = msgpack.unpackb(data, raw=False, strict_map_key=False)
        self.sm.restore(sm_bytes)
        self.sessions = {k: [s, r] for k, s, r in sessions}
        self.applied = applied
