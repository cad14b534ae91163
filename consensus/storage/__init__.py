"""The log's durability, below the runtime that needs it: the write-ahead log with group
commit (``wal``) and snapshot files (``snapshot``). Nothing here knows a protocol or a
state machine; ``consensus.runtime`` uses both, and the services (``store``) only
through the runtime."""
