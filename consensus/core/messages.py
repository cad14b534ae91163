"""Protocol messages and the one msgpack codec they travel in.

Every message is a small frozen, slotted dataclass. On the wire a message is a list
``[code, field, field, ...]`` and an *envelope* (what one network send carries) is
``[src, [msg, msg, ...]]``: all messages a replica produces for one destination during
one ``ready()`` go out together, which is how O-messages ride on C-messages (the
paper's message merging) and how batching saves packets.

Naming follows the SDPaxos paper (``../shared/papers``):

- C-instances (replication): ``CAccept`` / ``CAck`` / ``CCommit`` / ``CRequest``,
  and for recovery of another leader's instances ``CPrepare`` / ``CPromise``.
- O-instances (ordering): ``OAccept`` (a batch of consecutive slots) / ``OAck``
  (cumulative: "I accepted every slot below ``prefix`` in this view") / ``OCommit``
  (cumulative committed prefix, carrying the values a peer may lack).
- Multi-Paxos baseline: ``Forward`` / ``MAccept`` / ``MAck`` / ``MCommit``.
- Catch-up: ``Fetch`` asks for committed state a replica lacks; ``Compacted``
  answers anything that needs log entries a snapshot replaced ("fetch my snapshot").

``decode_envelope`` validates shape and field types and raises
``RemoteProtocolError`` on anything malformed, so a runtime can close only the
offending connection (h11's habit), never crash.

A command inside ``cmds`` is ``[client_id, seq, op]``: ``client_id`` is an int or
str, ``seq`` an int, ``op`` any msgpack value the state machine understands.
``cmds`` is ``None`` for a no-op (recovered C-instance with nothing chosen).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import msgpack


class RemoteProtocolError(Exception):
    """A peer sent something that is not a valid message (close that connection)."""


# Field kinds used for validation on decode.
_INT = "int"
_BOOL = "bool"
_LIST = "list"
_OPT_LIST = "list?"
_ANY = "any"


def _check(kind: str, value: Any) -> bool:
    if kind == _INT:
        return type(value) is int
    if kind == _BOOL:
        return type(value) is bool
    if kind == _LIST:
        return type(value) is list
    if kind == _OPT_LIST:
        return value is None or type(value) is list
    return True


class Message:
    """Base class: every message names the sender's ``view``."""

    code: ClassVar[int]
    kinds: ClassVar[tuple[str, ...]]
    __slots__ = ()


_REGISTRY: dict[int, type] = {}


def _message(code: int, *kinds: str):
    def wrap(cls):
        cls = dataclass(frozen=True, slots=True)(cls)
        assert len(fields(cls)) == len(kinds), cls
        cls.code = code
        cls.kinds = kinds
        assert code not in _REGISTRY
        _REGISTRY[code] = cls
        return cls

    return wrap


# --- C-instances -----------------------------------------------------------------


@_message(1, _INT, _INT, _INT, _INT, _OPT_LIST)
class CAccept(Message):
    """Phase 2a of C-instance ``inst`` of ``leader`` at ``ballot``."""

    view: int
    leader: int
    inst: int
    ballot: int
    cmds: list | None


@_message(2, _INT, _INT, _INT, _INT, _BOOL)
class CAck(Message):
    """Phase 2b reply; ``ok`` False carries the higher ballot that was promised."""

    view: int
    leader: int
    inst: int
    ballot: int
    ok: bool


@_message(3, _INT, _INT, _INT, _INT, _BOOL, _OPT_LIST)
class CCommit(Message):
    """C-instance chosen. ``full`` False: the receiver acked this ballot, no cmds sent."""

    view: int
    leader: int
    inst: int
    ballot: int
    full: bool
    cmds: list | None


@_message(4, _INT, _INT, _INT, _LIST)
class CRequest(Message):
    """Ask the sequencer to order ``leader``'s instances up to ``inst`` (keys: for reads)."""

    view: int
    leader: int
    inst: int
    keys: list


@_message(5, _INT, _INT, _INT, _INT, _INT)
class CPrepare(Message):
    """Phase 1a over ``leader``'s instances ``>= from_inst`` at ``ballot`` (recovery)."""

    view: int
    leader: int
    from_inst: int
    ballot: int
    upto_inst: int


@_message(6, _INT, _INT, _INT, _BOOL, _LIST)
class CPromise(Message):
    """Phase 1b: ``accepted`` is ``[[inst, ballot, cmds, committed], ...]``."""

    view: int
    leader: int
    ballot: int
    ok: bool
    accepted: list


# --- O-instances -----------------------------------------------------------------


@_message(10, _INT, _INT, _LIST, _BOOL, _INT)
class OAccept(Message):
    """Phase 2a of O-slots ``start .. start+len(leaders)-1`` at ballot ``view``.

    ``leaders[k]`` is the command leader assigned to slot ``start+k`` (or NOCL).
    ``serving``: the sequencer serves this view (a majority took its recovery
    O-accepts); only then may a command leader named here commit on it alone (the
    N = 5 fast path), since only then does every later majority know the view.
    ``recover_end``: the end of the sequencer's recovered log; a replica takes the view
    as its ``o_view`` only once it holds every slot below it (the log may come in
    several messages).
    """

    view: int
    start: int
    leaders: list
    serving: bool
    recover_end: int


@_message(11, _INT, _INT)
class OAck(Message):
    """Cumulative phase 2b: every O-slot below ``prefix`` is accepted in ``view``."""

    view: int
    prefix: int


@_message(12, _INT, _INT, _INT, _LIST)
class OCommit(Message):
    """Every O-slot below ``upto`` is chosen; values for ``start ..`` are included."""

    view: int
    upto: int
    start: int
    leaders: list


# --- Multi-Paxos baseline ----------------------------------------------------------


@_message(20, _INT, _LIST)
class Forward(Message):
    """A non-leader hands client commands to the leader."""

    view: int
    cmds: list


@_message(21, _INT, _INT, _LIST)
class MAccept(Message):
    """Phase 2a of log slots ``start ..`` (one batch of commands per slot)."""

    view: int
    start: int
    batches: list


@_message(22, _INT, _INT)
class MAck(Message):
    """Cumulative phase 2b: every slot below ``prefix`` accepted in ``view``."""

    view: int
    prefix: int


@_message(23, _INT, _INT, _INT, _LIST)
class MCommit(Message):
    """Every slot below ``upto`` is chosen; batches for ``start ..`` included."""

    view: int
    upto: int
    start: int
    batches: list


# --- Catch-up ----------------------------------------------------------------------


@_message(30, _INT, _INT, _INT)
class Fetch(Message):
    """Ask a peer for C-instance ``inst`` of ``leader`` (committed value) — catch-up."""

    view: int
    leader: int
    inst: int


@_message(31, _INT, _INT, _INT, _INT)
class Compacted(Message):
    """The sender's log below its snapshot floor is gone: O-slots below ``slot`` and
    C-instances of ``leader`` below ``inst`` (``leader`` -1: the notice is about
    O-slots only). Everything below is chosen and executed there; a receiver that
    has not executed through ``slot`` must fetch the sender's snapshot, never treat
    the silence as "nothing accepted"."""

    view: int
    slot: int
    leader: int
    inst: int


# --- Views, leases, reads, straggler detection ------------------------------------


@_message(40, _INT, _INT)
class VRequest(Message):
    """Candidate for ``view`` (its sequencer is ``view & 31``) asks for votes.

    Doubles as the O-prepare (Multi-Paxos: phase 1a) of every slot ``>= from_slot``.
    """

    view: int
    from_slot: int


@_message(41, _INT, _INT, _LIST, _LIST, _INT, _LIST)
class Vote(Message):
    """A vote for ``view``: the voter's accepted slots ``>= from_slot`` and C-state.

    ``slots``: SDPaxos ``[[slot, leader, view_accepted, committed], ...]``;
    Multi-Paxos ``[[slot, view_accepted, batch, committed], ...]``.
    ``c_max``: per command leader, the highest C-instance accepted here (-1: none).
    Multi-Paxos: ``[start, upto]``, the range this vote reports whole: every slot the
    voter holds in [start, upto) (``upto`` -1: every one from ``start``). A vote is cut
    by bytes; the candidate asks again from ``upto`` (``VRequest.from_slot``) and counts
    the voter once its chunks reach -1 (``[]``, as votes built by hand in tests: one whole
    report from the candidate's base).
    ``o_view``: the highest view whose sequencer's O-accepts the voter took (SDPaxos,
    Fig. 7: tells the candidate which sequencer may have proposed slots it cannot see).
    ``c_own``: per command leader l, the highest C-instance that l is known here to
    have taken: accepted at a ballot of l's own, or chosen (SDPaxos N = 5: the bound
    of the phantom instances; a recoverer's no-op raises ``c_max`` but not this).
    """

    view: int
    committed: int
    slots: list
    c_max: list
    o_view: int
    c_own: list


@_message(42, _INT, _INT)
class Ping(Message):
    """``tick`` >= 0: the sequencer's (leader's) heartbeat, sent at its ``tick``; it also
    asks for a lease until ``tick + lease``. ``tick`` -1: a notice of ``view`` to a
    replica that is behind or spoke in an older view (answered, not a heartbeat).
    ``tick`` -2 (``replica.ALIVE``): any replica's "I am alive", for thrifty quorums and
    for suspecting dead command leaders."""

    view: int
    tick: int


@_message(43, _INT, _INT)
class Pong(Message):
    """Lease granted for the ping sent at the sequencer's ``tick``."""

    view: int
    tick: int


@_message(50, _INT, _INT)
class Probe(Message):
    """How near are you? ``stamp`` is the sender's tick (``consensus.core.nearness``)."""

    view: int
    stamp: int


@_message(51, _INT, _INT)
class Echo(Message):
    """The answer to a ``Probe``, sent at once, with its ``stamp``."""

    view: int
    stamp: int


@_message(44, _INT, _INT, _ANY)
class RRequest(Message):
    """Read of ``key``: which slot must I execute through? (paper §3.5)"""

    view: int
    rid: int
    key: object


@_message(45, _INT, _INT, _INT)
class RReply(Message):
    """``slot`` >= -1: execute through ``slot`` (-1: nothing to wait for) and read
    locally. ``slot`` -2 (``sdpaxos.READ_VIA_LOG``): no lease, send the read through
    the log."""

    view: int
    rid: int
    slot: int


@_message(46, _INT, _INT)
class Handover(Message):
    """The sequencer steps down in favour of ``target``, releasing its lease."""

    view: int
    target: int


@_message(47, _INT, _BOOL)
class Straggler(Message):
    """Straggler detection: ``slow`` says whether the sender judges the sequencer slow."""

    view: int
    slow: bool


@_message(48, _INT)
class PreVote(Message):
    """Would you vote for me in ``view``? (Raft's pre-vote.) Changes nothing at the
    receiver: a replica cut off from a healthy majority never raises its view."""

    view: int


@_message(49, _INT, _BOOL)
class PreVoteReply(Message):
    """Answer to the pre-vote for ``view`` (``ok``: I have not heard from a live
    sequencer for an election timeout, and no lease promise holds me back)."""

    view: int
    ok: bool


# --- membership (docs/membership.md) -------------------------------------------------


@_message(52, _INT, _INT)
class EpochNotice(Message):
    """The sender is in ``epoch``, newer than the receiver's: fetch its base."""

    view: int
    epoch: int


def encode_message(msg: Message) -> list:
    return [msg.code, *[getattr(msg, f) for f in msg.__slots__]]


def decode_message(raw: Any) -> Message:
    if type(raw) is not list or not raw or type(raw[0]) is not int:
        raise RemoteProtocolError("message is not a [code, ...] list")
    cls = _REGISTRY.get(raw[0])
    if cls is None:
        raise RemoteProtocolError(f"unknown message code {raw[0]}")
    kinds = cls.kinds
    if len(raw) != len(kinds) + 1:
        raise RemoteProtocolError(f"{cls.__name__}: expected {len(kinds)} fields, got {len(raw) - 1}")
    for kind, value in zip(kinds, raw[1:]):
        if not _check(kind, value):
            raise RemoteProtocolError(f"{cls.__name__}: bad field value {value!r:.40}")
    return cls(*raw[1:])


def encode_envelope(src: int, msgs: list[Message]) -> bytes:
    """One encode per network send: ``[src, [msg, ...]]`` as msgpack bytes."""
    return msgpack.packb([src, [encode_message(m) for m in msgs]], use_bin_type=True)


def decode_envelope(data: bytes) -> tuple[int, list[Message]]:
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for garbage
        raise RemoteProtocolError(f"undecodable envelope: {exc}") from None
    if type(raw) is not list or len(raw) != 2 or type(raw[0]) is not int or type(raw[1]) is not list:
        raise RemoteProtocolError("envelope is not [src, [msgs]]")
    return raw[0], [decode_message(m) for m in raw[1]]
