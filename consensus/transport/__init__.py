"""Peer transport for the replica runtime.

- ``consensus.transport.framing``: sans-I/O length-prefixed msgpack frames and the
  peer handshake (``FrameDecoder``, ``encode_frame``, ``Handshake``, ``PeerStream``,
  ``ProtocolError``). No sockets; tested as bytes in, messages out.
- ``consensus.transport.tcp``: ``PeerTransport``, the asyncio shell: one connection
  per peer pair, write coalescing, bounded send queues, reconnect with backoff.

Messages are opaque msgpack-able objects here; the protocol core defines them.
"""

from consensus.transport.framing import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    REASONS,
    FrameDecoder,
    Handshake,
    PeerStream,
    ProtocolError,
    encode_frame,
    encode_frames,
)

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "REASONS",
    "FrameDecoder",
    "Handshake",
    "PeerStream",
    "ProtocolError",
    "encode_frame",
    "encode_frames",
]
