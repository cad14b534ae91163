"""Sans-I/O frame codec and peer handshake: bytes in, messages out, no sockets.

A frame is a 4-byte big-endian length followed by that many bytes of one msgpack
value. Messages are opaque msgpack-able objects at this layer.

Encoding::

    encode_frame(obj, max_frame_bytes=MAX_FRAME_BYTES) -> bytes
    encode_frames(objs, max_frame_bytes=MAX_FRAME_BYTES) -> bytes   # one buffer, one write

Decoding::

    dec = FrameDecoder(max_frame_bytes)
    objs = dec.feed(data)     # every complete frame in order; raises ProtocolError
    dec.eof()                 # raises ProtocolError("truncated") if a partial frame is left

Handshake: the first frame each way is ``{"t": "hello", "cluster": str, "node": int,
"version": int, "inc": int}``. ``inc`` (optional; a peer without it is accepted) is the
sender's *incarnation*: a number drawn once per process start, so the other side can
tell a reconnect of the same process from a restarted one::

    hs = Handshake(cluster_id, my_node_id, known_node_ids, version=PROTOCOL_VERSION,
                   incarnation=None)
    hs.hello_frame() -> bytes
    hs.check(obj, expected_peer_id=None) -> peer id      # raises ProtocolError

One connection's inbound side, hello then messages (h11's shape: ``b""`` is EOF)::

    stream = PeerStream(hs, expected_peer_id=None, max_frame_bytes=MAX_FRAME_BYTES)
    msgs = stream.receive_data(data)   # messages after the hello; stream.peer_id once known
    stream.receive_data(b"")           # EOF
    stream.peer_incarnation            # the hello's "inc", or None

``ProtocolError.reason`` is one of ``REASONS``: ``"oversized"`` (decided from the length
prefix alone, before the body is buffered), ``"malformed"`` (not msgpack, extra bytes,
an empty frame), ``"truncated"`` (EOF inside a frame), ``"bad-handshake"`` (first
frame is not a hello), ``"wrong-cluster"``, ``"unknown-node"``, ``"version"``. It is
always the *peer's* fault: the caller closes that connection only and counts the
reason. After an error a decoder or stream stays failed and re-raises it.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable
from typing import Any

import msgpack

PROTOCOL_VERSION = 6  # 2: OAccept.serving, keepalive frames; 3: Vote.c_own; 4: Probe/Echo (issue 15);
# 5: Multi-Paxos votes in chunks (Vote.c_max [start, upto]: a version-4 candidate would take a chunk for a whole vote);
# 6: EpochNotice (membership change, docs/membership.md)
MAX_FRAME_BYTES = 8 << 20
FRAME_PREFIX_BYTES = 4
_PREFIX = struct.Struct(">I")

REASONS = ("oversized", "malformed", "truncated", "bad-handshake", "wrong-cluster", "unknown-node", "version")


class ProtocolError(Exception):
    """The remote peer broke the framing or handshake protocol; close that connection."""

    def __init__(self, reason: str, detail: str = "") -> None:
        assert reason in REASONS, reason
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


def encode_frame(obj: Any, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """One frame. Raises ``ValueError`` if the body would exceed ``max_frame_bytes``
    (the peer would refuse it) and ``TypeError`` if ``obj`` is not msgpack-able."""
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > max_frame_bytes:
        raise ValueError(f"frame body of {len(body)} bytes exceeds max_frame_bytes {max_frame_bytes}")
    return _PREFIX.pack(len(body)) + body


def encode_frames(objs: Iterable[Any], max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Several frames in one buffer: one encode per message, one write for all."""
    return b"".join([encode_frame(obj, max_frame_bytes) for obj in objs])


def _unpack(body: bytes | bytearray) -> Any:
    try:
        return msgpack.unpackb(body, raw=False)
    except Exception as e:  # msgpack raises several types (FormatError, ExtraData, Unicode...)
        raise ProtocolError("malformed", f"{type(e).__name__}: {e}") from None


class FrameDecoder:
    """Incremental decoder of length-prefixed msgpack frames.

    Memory is bounded by ``max_frame_bytes`` plus one ``feed`` argument: a frame's
    prefix is checked as soon as its 4 bytes are in, before its body is buffered.
    Work is linear in the bytes fed: data is appended to one bytearray and consumed
    frames are removed from its front once per ``feed`` (CPython makes that
    amortized O(1)), so a large frame split into many pieces is not copied per piece.
    """

    __slots__ = ("max_frame_bytes", "_buf", "_error")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 1:
            raise ValueError("max_frame_bytes must be >= 1")
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._error: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview, sizes: list[int] | None = None) -> list[Any]:
        """The frames completed by ``data``; with ``sizes``, each one's body length is
        appended to it (a server that limits single requests checks only big frames)."""
        if self._error is not None:
            raise self._error
        self._buf += data
        buf = self._buf
        out: list[Any] = []
        pos = 0
        try:
            # Bounded: each pass consumes one whole frame or leaves the loop.
            while len(buf) - pos >= FRAME_PREFIX_BYTES:
                (length,) = _PREFIX.unpack_from(buf, pos)
                if length > self.max_frame_bytes:
                    raise ProtocolError("oversized", f"frame of {length} bytes, max {self.max_frame_bytes}")
                if length == 0:
                    raise ProtocolError("malformed", "empty frame")
                end = pos + FRAME_PREFIX_BYTES + length
                if end > len(buf):
                    break
                out.append(_unpack(buf[pos + FRAME_PREFIX_BYTES : end]))
                if sizes is not None:
                    sizes.append(length)
                pos = end
        except ProtocolError as e:
            self._error = e
            self._buf = bytearray()
            raise
        if pos:
            del buf[:pos]
        return out

    def eof(self) -> None:
        """The peer finished sending; a partial frame left over is an error."""
        if self._error is not None:
            raise self._error
        if self._buf:
            self._error = ProtocolError("truncated", f"{len(self._buf)} bytes of an unfinished frame at EOF")
            raise self._error


def hello(cluster_id: str, node_id: int, version: int = PROTOCOL_VERSION,
          incarnation: int | None = None) -> dict[str, Any]:
    h: dict[str, Any] = {"t": "hello", "cluster": cluster_id, "node": node_id, "version": version}
    if incarnation is not None:
        h["inc"] = incarnation
    return h


class Handshake:
    """Our identity and the rules for accepting a peer's hello."""

    __slots__ = ("cluster_id", "node_id", "known_node_ids", "version", "incarnation")

    def __init__(self, cluster_id: str, my_node_id: int, known_node_ids: Collection[int],
                 version: int = PROTOCOL_VERSION, incarnation: int | None = None) -> None:
        self.cluster_id = cluster_id
        self.node_id = my_node_id
        self.known_node_ids = frozenset(known_node_ids) - {my_node_id}
        self.version = version
        self.incarnation = incarnation

    def hello_frame(self) -> bytes:
        return encode_frame(hello(self.cluster_id, self.node_id, self.version, self.incarnation))

    def check(self, obj: Any, expected_peer_id: int | None = None) -> int:
        """Validate a peer's hello; returns its node id."""
        if not (isinstance(obj, dict) and obj.get("t") == "hello"):
            raise ProtocolError("bad-handshake", "first frame is not a hello")
        cluster, node, version = obj.get("cluster"), obj.get("node"), obj.get("version")
        if type(cluster) is not str or type(node) is not int or type(version) is not int:
            raise ProtocolError("bad-handshake", "hello fields have the wrong types")
        if version != self.version:
            raise ProtocolError("version", f"peer speaks version {version}, we speak {self.version}")
        if cluster != self.cluster_id:
            raise ProtocolError("wrong-cluster", f"peer is in cluster {cluster!r}, we are in {self.cluster_id!r}")
        if node not in self.known_node_ids:
            raise ProtocolError("unknown-node", f"node {node} is not a known peer")
        if expected_peer_id is not None and node != expected_peer_id:
            raise ProtocolError("unknown-node", f"dialed node {expected_peer_id}, node {node} answered")
        if type(obj.get("inc", 0)) is not int:
            raise ProtocolError("bad-handshake", "hello incarnation is not an integer")
        return node


class PeerStream:
    """The inbound half of one peer connection: a hello, then messages."""

    __slots__ = ("handshake", "expected_peer_id", "peer_id", "peer_incarnation", "_decoder", "_error")

    def __init__(self, handshake: Handshake, *, expected_peer_id: int | None = None,
                 max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.handshake = handshake
        self.expected_peer_id = expected_peer_id
        self.peer_id: int | None = None
        self.peer_incarnation: int | None = None
        self._decoder = FrameDecoder(max_frame_bytes)
        self._error: ProtocolError | None = None

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Messages decoded from ``data`` (the hello is consumed, not returned);
        ``b""`` means EOF."""
        if self._error is not None:
            raise self._error
        try:
            if not data:
                self._decoder.eof()
                return []
            objs = self._decoder.feed(data)
            if self.peer_id is None and objs:
                self.peer_id = self.handshake.check(objs[0], self.expected_peer_id)
                self.peer_incarnation = objs[0].get("inc")
                del objs[0]
        except ProtocolError as e:
            self._error = e
            raise
        return objs
