"""The client wire format: length-prefixed msgpack frames (``consensus.transport.framing``).

A client frame is a list of requests, a reply frame a list of replies, so a client
that multiplexes many logical sessions over one connection pays one frame per loop
turn, not one per command::

    request  [kind, client, seq, op]           client: int or str, seq: int
    reply    [client, seq, status, result]     status: OK | ERROR

Kinds: ``WRITE`` (answered once the command can no longer be lost: SDPaxos's
"ready"), ``CALL`` (answered with the result of executing it), ``READ`` (a read-only
``op``; served under the sequencer lease when possible), ``STATUS`` (the node's status
and the digest of its state; ``op`` ``{"digest": false}`` leaves the digest out, a pass
over the whole state), ``ADMIN`` (operator actions, below).

A request that is not of this shape closes the connection (like a malformed peer
frame): the node cannot tell whom to answer. A request whose ``op`` encodes to more
than ``MAX_COMMAND_BYTES`` is answered ``ERROR`` with a message that starts with
``TooLarge`` and changes nothing.
"""

from __future__ import annotations

from typing import Any

WRITE, CALL, READ, STATUS, ADMIN = 0, 1, 2, 3, 4
# ADMIN ops: ["transfer_sequencer", target]: the sequencer hands over to ``target``
# (answered {"ok": bool, "sequencer": id}; ok false if this node is not the serving
# sequencer or the target is not a replica).
# The largest command (its ``op``, msgpack-encoded) a node accepts; a bigger one is
# answered ``TOO_LARGE`` and never enters the log. Far below a frame (8 MiB), so a
# C-accept always fits: the core batches by bytes too (ProtocolConfig.batch_bytes_max).
MAX_COMMAND_BYTES = 1 << 20
TOO_LARGE = "TooLarge"
# With TLS on, an ADMIN request from a client without the admin certificate is
# answered ERROR "PermissionDenied: ..." and changes nothing.
PERMISSION_DENIED = "PermissionDenied"
KINDS = (WRITE, CALL, READ, STATUS, ADMIN)
OK, ERROR = 0, 1


class BadRequest(Exception):
    """A client sent a frame that is not a list of well-formed requests."""


def parse_requests(frame: Any) -> list[list]:
    if type(frame) is not list:
        raise BadRequest("a client frame must be a list of requests")
    for req in frame:
        if type(req) is not list or len(req) != 4:
            raise BadRequest("a request is [kind, client, seq, op]")
        kind, client, seq, _op = req
        if kind not in KINDS or type(kind) is not int:
            raise BadRequest(f"unknown request kind {kind!r:.20}")
        if type(client) not in (int, str) or type(seq) is not int:
            raise BadRequest("client must be an int or str and seq an int")
    return frame
