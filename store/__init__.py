"""Cellar's replicated state-machine layer: the durable key-value store, the server
process, the client, the HTTP API and the ``cellar`` command line."""
