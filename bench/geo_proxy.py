"""The delaying proxy of ``cellar bench geo``: ``DelayProxy`` is the forwarding core of
``jepsen_like.proxy`` (one copy of the forwarding code, which the fault proxy of the
Jepsen harness shares), with fixed delays and no faults. See that module's docstring."""

from jepsen_like.proxy import DelayProxy, ProxyStats, check_loopback, link_seed

__all__ = ["DelayProxy", "ProxyStats", "check_loopback", "link_seed"]
