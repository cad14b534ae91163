"""Fault-injection harness: histories, models, a linearizability checker, nemeses."""
