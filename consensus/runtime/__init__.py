"""The asyncio runtime: drives a protocol replica over real TCP and a real disk.

- ``consensus.runtime.node``: ``Node``, one replica process's event loop (ticks from a
  monotonic clock, peer and client messages in, WAL-then-send effects out).
- ``consensus.runtime.clientwire``: the client wire format (requests and replies).

Nothing of the protocol lives here: the same state machine the simulator drives.
"""
