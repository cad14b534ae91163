"""A client's operation is untrusted input. Whatever value arrives in a client frame
(any msgpack value: an ``op`` that is a list or a map, keys that are lists, nested
junk), the machines' client-facing functions answer it and never raise: a raise in
the stamper, the validator or ``read_key`` on the client path stopped the replica
that took the frame, and the client, retrying on the next replica, stopped them all
(one request took down a 3-replica cluster, kv and scheduler alike, 2026-11-28);
``keys_of`` runs on the proposal path and ``apply`` on every replica.

The property: for every value, ``stamp``, ``validate``, ``read_key``, ``keys_of``,
``query`` and ``apply`` (on a fresh machine and on one holding state) return. The
real-process test sends the values that killed the cluster and then a good command."""

from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from store.machines import make_machine, stamper, validator
from store.server import LocalCluster

HIVED = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "hived-small.yaml")

_names = st.sampled_from(["put", "get", "cas", "append", "delete", "range", "txn", "lease_grant", "lease_keepalive",
                          "lease_timetolive", "lease_revoke", "lease_leases", "status", "deleterange", "compact",
                          "allocate", "release", "inspect", "cluster_status", "vc_status", "batch", "init",
                          "what_if", "pod_schedule", "set_node_health", "reconfigure", "lease_expire", "x"])
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                     st.text(max_size=8), st.binary(max_size=8), _names)
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.text(max_size=6), _names, st.integers(-3, 3)), inner, max_size=4)),
    max_leaves=12)
_fields = st.sampled_from(["op", "key", "value", "range_end", "lease", "ttl", "id", "compare", "success", "failure",
                           "commands", "name", "spec", "group", "node", "healthy", "view", "now_ms", "prev_kv",
                           "ignore_value", "limit", "revision"])
# Commands shaped like real ones (an "op" name or a junk op, fields with junk values),
# beside arbitrary values and legacy lists.
_ops = st.one_of(
    st.dictionaries(_fields, _values, max_size=5).flatmap(
        lambda d: st.one_of(_names, _values).map(lambda name: {**d, "op": name})),
    st.lists(st.one_of(_names, _values), max_size=4),
    _values,
)


def _machines():
    with open(HIVED) as f:
        hived = f.read()
    kv = make_machine("kv")
    kv.apply({"op": "put", "key": "k", "value": "v"})
    sched = make_machine("scheduler", hived)
    return {"kv": (kv, make_machine("kv")), "scheduler": (sched, make_machine("scheduler", hived))}


MACHINES = None


def _all_calls(name: str, machine, op) -> None:
    stamp = stamper(name)
    if stamp is not None:
        op = stamp(op, 1_000)
    validator(name)(op)
    machine.read_key(op)
    machine.keys_of(op)
    machine.query(op)
    machine.apply(op)


@seed(20261128)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=_ops)
def test_no_client_value_makes_a_machine_raise(op):
    global MACHINES
    if MACHINES is None:
        MACHINES = _machines()
    for name, (busy, fresh) in MACHINES.items():
        for machine in (busy, fresh):
            _all_calls(name, machine, op)


def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


_SPEC = {"name": "g", "vc": "vc-a", "priority": 1, "pods": [{"count": 1, "gpus": 1}]}

KILLERS = [{"op": ["x"]}, {"op": {"a": 1}}, [["x"], "k"], ["put", ["k"], "v"], {"op": "range", "key": ["k"]},
           {"op": "txn", "compare": [{"x": ["y"]}]}, {"op": "batch", "commands": [{"op": ["x"]}]},
           # 1,000 levels deep in a field nobody checks: raised in the core's batch sizing
           {"op": "allocate", "group": {**_SPEC, "zzz": _deep(1000)}},
           {"op": "put", "key": "k", "value": "v", "zzz": _deep(1000)}]


@pytest.mark.parametrize("op", [
    {"op": "allocate", "group": {**_SPEC, "zzz": _deep(1000)}},
    {"op": "allocate", "group": {**_SPEC, "zzz": 10**30}},  # in-process callers: not msgpack
    {"op": "allocate", "group": {**_SPEC, "zzz": {1, 2}}},
    {"op": "batch", "commands": [{"op": "release", "group": "g", "zzz": 2**64}]},
])
def test_the_scheduler_refuses_what_it_could_not_carry(op):
    error = validator("scheduler")(op)
    assert error is not None and error["code"] == "InvalidRequest", error


def test_a_clients_clock_never_reaches_the_scheduler():
    """``now_ms`` is the proposing replica's: a client's 2**62 would have moved the
    machine's clock past every lease, for good."""
    stamp = stamper("scheduler")
    assert stamp({"op": "lease_expire", "now_ms": 2**62}, 1_000) == {"op": "lease_expire", "now_ms": 1_000}
    assert stamp({"op": "release", "group": "g"}, 1_000) == {"op": "release", "group": "g"}
    batch = {"op": "batch", "commands": [{"op": "release", "group": "g"}, {"op": "lease_expire", "now_ms": 2**62}]}
    assert stamp(batch, 7)["commands"] == [{"op": "release", "group": "g"}, {"op": "lease_expire", "now_ms": 7}]


@pytest.mark.parametrize("machine", ["kv", "scheduler"])
def test_a_malformed_operation_is_refused_and_the_cluster_serves_on(tmp_path, machine):
    from store.client import CellarClient, InvalidRequest

    extra = ["--machine", "scheduler", "--hived-config", HIVED] if machine == "scheduler" else []
    cluster = LocalCluster(str(tmp_path), 3, extra_args=extra)
    try:
        cluster.start_all()
        cluster.wait_ready()

        async def drive() -> None:
            client = CellarClient(cluster.client_addresses)
            try:
                async with asyncio.timeout(30):
                    for op in KILLERS:  # refused (kv) or answered with an error result (scheduler)
                        try:
                            result = await client.call(op)
                        except InvalidRequest:
                            continue
                        assert isinstance(result, dict) and not result.get("ok", False), (op, result)
                    good = ({"op": "put", "key": "a", "value": "b"} if machine == "kv"
                            else {"op": "cluster_status"})
                    result = await client.call(good)
                    assert isinstance(result, dict) and result.get("ok", True), result
            finally:
                await client.close()

        asyncio.run(drive())
        assert all(p.poll() is None for p in cluster.procs.values()), "a replica stopped"
    finally:
        cluster.stop_all()
