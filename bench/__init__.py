"""Throughput and latency benchmarks (SDPaxos vs Multi-Paxos, Cellar vs peers)."""
