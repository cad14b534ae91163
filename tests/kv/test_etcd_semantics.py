"""The key-value machine against etcd's v3 semantics (store/kv_machine.py, docs/kv.md):
revisions, range options, txn, compaction, leases, exactly-once retries, validation."""

from __future__ import annotations

import msgpack
import pytest

from store import kv_machine as K
from consensus.core.executor import Executor
from store.kv_machine import ALL_KEYS, KVStateMachine, validate
from consensus.runtime import clientwire


def put(key, value, **kw):
    return {"op": "put", "key": key, "value": value, **kw}


def rng(key, **kw):
    return {"op": "range", "key": key, **kw}


def dele(key, **kw):
    return {"op": "delete_range", "key": key, **kw}


def cmp(key, target, result, operand):
    field = {"value": "value", "version": "version", "create": "create_revision", "mod": "mod_revision",
             "lease": "lease"}[target]
    return {"key": key, "target": target, "result": result, field: operand}


def txn(compare, success=(), failure=()):
    return {"op": "txn", "compare": list(compare), "success": list(success), "failure": list(failure)}


def kvs(res):
    return [(kv["key"], kv.get("value"), kv["create_revision"], kv["mod_revision"], kv["version"]) for kv in res["kvs"]]


@pytest.fixture
def m():
    return KVStateMachine()


# --- revisions -------------------------------------------------------------------------


def test_revision_starts_at_one_and_each_mutation_adds_one(m):
    assert m.apply({"op": "status"})["revision"] == 1
    assert m.apply(put("a", "1")) == {"ok": True, "revision": 2}
    assert m.apply(put("b", "1"))["revision"] == 3
    assert m.apply(put("a", "2"))["revision"] == 4
    assert m.apply(["put", "c", "legacy"]) is None and m.rev == 5
    assert m.apply(["append", "c", "+"]) == "legacy+" and m.rev == 6
    assert m.apply(["cas", "c", "legacy+", "x"]) is True and m.rev == 7
    assert m.apply(dele("b"))["revision"] == 8


def test_what_does_not_bump_the_revision(m):
    m.apply(put("a", "1"))
    before = m.rev
    assert m.apply(dele("missing")) == {"ok": True, "revision": before, "deleted": 0}
    assert m.apply(dele("x/", prefix=True))["deleted"] == 0
    assert m.apply(["delete", "missing"]) is False
    assert m.apply(["cas", "a", "nope", "2"]) is False
    assert m.apply(["get", "a"]) == "1"
    assert m.apply(rng("a"))["revision"] == before
    assert m.apply(txn([cmp("a", "value", "=", "nope")], [put("a", "2")], [rng("a")]))["succeeded"] is False
    assert m.apply({"op": "lease_grant", "ttl_ms": 1000, "now_ms": 0})["revision"] == before
    assert m.apply({"op": "compact", "revision": before})["revision"] == before
    assert m.rev == before


def test_create_mod_revision_and_version(m):
    m.apply(put("k", "a"))  # 2
    m.apply(put("other", "x"))  # 3
    m.apply(put("k", "b"))  # 4
    assert kvs(m.apply(rng("k"))) == [("k", "b", 2, 4, 2)]
    m.apply(dele("k"))  # 5: a delete resets the key
    assert m.apply(rng("k"))["kvs"] == []
    m.apply(put("k", "c"))  # 6
    assert kvs(m.apply(rng("k"))) == [("k", "c", 6, 6, 1)]
    assert m.apply(put("k", "d", prev_kv=True))["prev_kv"] == {
        "key": "k", "value": "c", "create_revision": 6, "mod_revision": 6, "version": 1, "lease": 0}
    assert m.apply(put("new", "d", prev_kv=True))["prev_kv"] is None


def test_reads_at_past_revisions(m):
    for i in range(5):
        m.apply(put("k", f"v{i}"))  # revisions 2..6
    m.apply(dele("k"))  # 7
    for r in range(2, 7):
        assert kvs(m.apply(rng("k", revision=r))) == [("k", f"v{r - 2}", 2, r, r - 1)]
    assert m.apply(rng("k", revision=1))["kvs"] == []
    assert m.apply(rng("k", revision=7))["kvs"] == []
    res = m.apply(rng("k", revision=8))
    assert res["code"] == "InvalidRequest" and "future" in res["error"]
    assert m.apply(rng("k", revision=3))["revision"] == 7  # the header is the current revision


# --- range options ---------------------------------------------------------------------


def fill(m, keys):
    for k in keys:
        m.apply(put(k, f"v-{k}"))


def keys_of(res):
    return [kv["key"] for kv in res["kvs"]]


def test_range_single_prefix_interval_and_all(m):
    fill(m, ["a", "b/1", "b/2", "b/3", "ba", "c", "d"])
    assert keys_of(m.apply(rng("b/1"))) == ["b/1"]
    assert keys_of(m.apply(rng("b/", prefix=True))) == ["b/1", "b/2", "b/3"]
    assert keys_of(m.apply(rng("b", range_end="c"))) == ["b/1", "b/2", "b/3", "ba"]
    assert keys_of(m.apply(rng("b", range_end="b"))) == []
    assert keys_of(m.apply(rng("c", range_end="\0"))) == ["c", "d"]
    assert keys_of(m.apply(rng("\0", range_end="\0"))) == ["a", "b/1", "b/2", "b/3", "ba", "c", "d"]
    assert keys_of(m.apply(rng("", prefix=True))) == ["a", "b/1", "b/2", "b/3", "ba", "c", "d"]
    assert keys_of(m.apply(rng("nope"))) == []


def test_range_limit_count_keys_only_count_only(m):
    fill(m, ["p/1", "p/2", "p/3", "p/4"])
    res = m.apply(rng("p/", prefix=True, limit=2))
    assert keys_of(res) == ["p/1", "p/2"] and res["count"] == 4 and res["more"] is True
    res = m.apply(rng("p/", prefix=True, limit=4))
    assert len(res["kvs"]) == 4 and res["more"] is False
    res = m.apply(rng("p/", prefix=True, keys_only=True))
    assert all("value" not in kv for kv in res["kvs"]) and res["count"] == 4
    res = m.apply(rng("p/", prefix=True, count_only=True))
    assert res["kvs"] == [] and res["count"] == 4 and res["more"] is False


def test_prefix_range_over_prefixes_ending_in_ff(m):
    fill(m, [b"\xff\xff", b"\xff\xffz", b"\xfe\xff", b"\xff"])
    assert keys_of(m.apply(rng(b"\xff\xff", prefix=True))) == [b"\xff\xff", b"\xff\xffz"]
    assert keys_of(m.apply(rng(b"\xfe", prefix=True))) == [b"\xfe\xff"]


def test_str_and_bytes_name_one_key_ordered_by_bytes(m):
    m.apply(put(b"a", "bytes"))
    assert m.apply(["get", "a"]) == "bytes"
    m.apply(["put", "a", "str"])
    assert kvs(m.apply(rng(b"a"))) == [("a", "str", 2, 3, 2)]
    fill(m, ["\u00e9", b"\xc3", "z", b"\x80"])
    # by UTF-8 bytes: 'a' < 'z' < b'\x80' < b'\xc3' < 'é' (c3 a9)
    assert keys_of(m.apply(rng("\0", range_end="\0"))) == ["a", "z", b"\x80", b"\xc3", "\u00e9"]


def test_delete_range_forms_and_prev_kvs(m):
    fill(m, ["a", "b/1", "b/2", "c", "d"])
    res = m.apply(dele("b/", prefix=True, prev_kv=True))
    assert res["deleted"] == 2 and [kv["key"] for kv in res["prev_kvs"]] == ["b/1", "b/2"]
    rev = res["revision"]
    assert rev == 7  # one revision for both keys
    assert m.apply(dele("c", range_end="\0")) == {"ok": True, "revision": 8, "deleted": 2}
    assert m.apply(dele("a"))["deleted"] == 1
    assert m.data == {}
    assert keys_of(m.apply(rng("\0", range_end="\0", revision=6))) == ["a", "b/1", "b/2", "c", "d"]


# --- txn -------------------------------------------------------------------------------


def test_txn_compares_every_target(m):
    m.apply(put("k", "m"))  # rev 2
    m.apply({"op": "lease_grant", "id": 7, "ttl_ms": 1000, "now_ms": 0})
    m.apply(put("k", "m", lease=7))  # rev 3, version 2
    cases = [
        (cmp("k", "value", "=", "m"), True), (cmp("k", "value", "<", "n"), True), (cmp("k", "value", ">", "n"), False),
        (cmp("k", "value", "!=", "m"), False), (cmp("k", "value", "=", b"m"), True),
        (cmp("k", "version", "=", 2), True), (cmp("k", "version", ">", 2), False), (cmp("k", "version", "<", 3), True),
        (cmp("k", "create", "=", 2), True), (cmp("k", "mod", "=", 3), True), (cmp("k", "mod", "!=", 3), False),
        (cmp("k", "lease", "=", 7), True), (cmp("k", "lease", "=", 0), False),
        # a missing key: version, revisions and lease are 0; a value compare always fails
        (cmp("x", "version", "=", 0), True), (cmp("x", "create", "=", 0), True), (cmp("x", "mod", "<", 1), True),
        (cmp("x", "lease", "=", 0), True), (cmp("x", "value", "=", ""), False), (cmp("x", "value", "!=", "a"), False),
        # etcd's enum spellings
        ({"key": "k", "target": "VERSION", "result": "EQUAL", "version": 2}, True),
        ({"key": "k", "target": "MOD", "result": "GREATER", "mod_revision": 2}, True),
    ]
    for c, want in cases:
        res = m.apply(txn([c]))
        assert res["ok"] and res["succeeded"] is want, c


def test_txn_branches_are_one_atomic_revision_and_see_their_own_writes(m):
    m.apply(put("a", "1"))  # 2
    res = m.apply(txn([cmp("a", "value", "=", "1")],
                      [put("a", "2"), put("b", "x"), rng("a"), dele("zz"), rng("\0", range_end="\0", keys_only=True)],
                      [put("f", "f")]))
    assert res["ok"] and res["succeeded"] and res["revision"] == 3
    r = res["responses"]
    assert [x["revision"] for x in r] == [3] * 5
    assert kvs(r[2]) == [("a", "2", 2, 3, 2)]
    assert keys_of(r[4]) == ["a", "b"]
    assert m.apply(rng("b"))["kvs"][0]["mod_revision"] == 3
    res = m.apply(txn([cmp("a", "value", "=", "1")], [put("s", "s")], [put("f", "f"), dele("a")]))
    assert res["succeeded"] is False and res["revision"] == 4 and "a" not in m.data and m.data["f"] == "f"
    assert "s" not in m.data


def test_txn_that_fails_changes_nothing(m):
    m.apply(put("a", "1"))
    before = m.snapshot()
    res = m.apply(txn([], [put("b", "2"), put("c", "3", lease=99)]))  # the second op's lease does not exist
    assert res["code"] == "LeaseNotFound" and res["id"] == 99
    res = m.apply(txn([], [put("b", "2"), rng("a", revision=50)]))
    assert res["code"] == "InvalidRequest"
    assert m.snapshot() == before


def test_txn_may_not_write_a_key_twice(m):
    for ops in ([put("a", "1"), put("a", "2")], [put("a/1", "1"), dele("a/", prefix=True)],
                [dele("a"), put("a", "1")], [put("b", "1"), dele("a", range_end="c")]):
        res = m.apply(txn([], ops))
        assert res["code"] == "InvalidRequest" and "duplicate" in res["error"], ops
    assert m.apply(txn([], [dele("a", prefix=True), dele("a")]))["ok"]  # deletes may overlap
    assert m.apply(txn([], [put("a", "1")], [put("a", "2")]))["ok"]  # one key in each branch is fine


# --- compaction ------------------------------------------------------------------------


def test_compaction(m):
    for i in range(6):
        m.apply(put("k", str(i)))  # revisions 2..7
    m.apply(put("gone", "x"))  # 8
    m.apply(dele("gone"))  # 9
    assert m.apply({"op": "compact", "revision": 5}) == {"ok": True, "revision": 9, "compact_revision": 5}
    res = m.apply(rng("k", revision=4))
    assert res == {"ok": False, "code": "Compacted", "error": res["error"], "compact_revision": 5}
    assert kvs(m.apply(rng("k", revision=5))) == [("k", "3", 2, 5, 4)]
    assert kvs(m.apply(rng("k"))) == [("k", "5", 2, 7, 6)]
    assert [r[0] for r in m.hist["k"]] == [5, 6, 7]
    assert m.apply({"op": "compact", "revision": 5})["code"] == "Compacted"
    assert m.apply({"op": "compact", "revision": 4})["code"] == "Compacted"
    assert m.apply({"op": "compact", "revision": 10})["code"] == "InvalidRequest"
    m.apply({"op": "compact", "revision": 9})
    assert "gone" not in m.hist and [r[0] for r in m.hist["k"]] == [7]
    assert m.apply(rng("\0", range_end="\0"))["count"] == 1
    assert m.apply(txn([], [rng("k", revision=8)]))["code"] == "Compacted"


def test_the_machine_compacts_itself_deterministically(monkeypatch):
    monkeypatch.setattr(K, "HISTORY_RETAIN", 5)
    monkeypatch.setattr(K, "COMPACT_STEP", 5)
    m = KVStateMachine()
    for i in range(9):
        m.apply(put("k", str(i)))  # revisions 2..10
    assert m.compact_rev == 5  # at revision 10 = 5 + 5 past 0: compact at 10 - 5
    assert m.apply(rng("k", revision=4))["code"] == "Compacted"
    assert kvs(m.apply(rng("k", revision=5))) == [("k", "3", 2, 5, 4)]
    other = KVStateMachine()
    other.restore(m.snapshot())
    for x in (m, other):
        for i in range(5):
            x.apply(put("j", str(i)))
    assert m.compact_rev == other.compact_rev == 10 and m.digest() == other.digest()


# --- leases ----------------------------------------------------------------------------


def grant(m, ttl, now, lease=0):
    op = {"op": "lease_grant", "ttl_ms": ttl, "now_ms": now}
    if lease:
        op["id"] = lease
    return m.apply(op)


def test_lease_grant_ids_keepalive_and_expiry(m):
    assert grant(m, 1000, 100) == {"ok": True, "revision": 1, "id": 1, "ttl_ms": 1000}
    assert grant(m, 500, 100, lease=2)["id"] == 2
    assert grant(m, 500, 100)["id"] == 3  # the next free id
    assert grant(m, 500, 100, lease=2)["code"] == "InvalidRequest"
    m.apply(put("a", "1", lease=1))
    m.apply(put("b", "1", lease=2))
    m.apply(put("c", "1", lease=2))
    m.apply(put("free", "1"))
    assert kvs(m.apply(rng("a"))) == [("a", "1", 2, 2, 1)] and m.apply(rng("a"))["kvs"][0]["lease"] == 1
    assert m.apply({"op": "lease_keepalive", "id": 2, "now_ms": 400}) == {"ok": True, "revision": 5, "id": 2, "ttl_ms": 500}
    # expiries: lease 1 at 1100, 2 at 900 (kept alive at 400), 3 at 600
    assert m.expiry_due(599) is False and m.expiry_due(600) is True
    assert m.apply({"op": "lease_expire", "now_ms": 899}) == {"ok": True, "revision": 5, "expired": [3], "deleted": 0}
    res = m.apply({"op": "lease_expire", "now_ms": 1100})
    assert res == {"ok": True, "revision": 6, "expired": [1, 2], "deleted": 3}
    assert sorted(m.data) == ["free"] and m.leases == {}
    res = m.apply({"op": "lease_keepalive", "id": 1, "now_ms": 1200})
    assert res["code"] == "LeaseNotFound" and res["id"] == 1


def test_expired_lease_is_dead_but_its_keys_wait_for_the_expire_command(m):
    grant(m, 100, 0, lease=5)
    m.apply(put("k", "v", lease=5))
    m.apply({"op": "lease_keepalive", "id": 5, "now_ms": 50})  # now expires at 150
    before = m.snapshot()
    assert m.apply({"op": "lease_keepalive", "id": 5, "now_ms": 150})["code"] == "LeaseNotFound"
    assert m.snapshot() == before
    assert m.data["k"] == "v"  # still there: no expire command yet
    assert m.apply({"op": "lease_timetolive", "id": 5, "now_ms": 150})["ttl_ms"] == 0
    assert m.apply({"op": "lease_expire", "now_ms": 149})["expired"] == []
    assert m.apply(put("k2", "v", lease=5))["ok"]  # alive by the machine's time (149)
    assert m.apply({"op": "lease_expire", "now_ms": 150}) == {"ok": True, "revision": 4, "expired": [5], "deleted": 2}
    assert m.data == {}
    assert m.apply(put("k3", "v", lease=5))["code"] == "LeaseNotFound"


def test_lease_clock_moves_only_forward_and_only_by_the_sequencers_commands(m):
    grant(m, 1000, 5000, lease=1)  # a fast clock: only this lease lives longer
    assert m.now_ms == 0 and m.leases[1] == [1000, 6000]
    grant(m, 1000, 10, lease=2)
    assert m.leases[2] == [1000, 1010]
    assert m.apply({"op": "lease_expire", "now_ms": 5999})["expired"] == [2] and m.now_ms == 5999
    assert m.apply({"op": "lease_expire", "now_ms": 100})["expired"] == [] and m.now_ms == 5999  # stale stamp
    grant(m, 1000, 10, lease=3)  # a slow clock: the lease runs from the machine's time
    assert m.leases[3] == [1000, 6999]
    assert m.apply({"op": "lease_keepalive", "id": 3, "now_ms": 20}) == {"ok": True, "revision": 1, "id": 3,
                                                                         "ttl_ms": 1000}
    assert m.apply({"op": "lease_expire", "now_ms": 6000})["expired"] == [1]
    assert m.apply({"op": "lease_extend_all", "now_ms": 10})["extended"] == 1 and m.leases[3] == [1000, 7000]


def test_lease_revoke_deletes_attached_keys_in_one_revision(m):
    grant(m, 10_000, 0, lease=1)
    for k in ("x", "y", "z"):
        m.apply(put(k, "v", lease=1))  # 2, 3, 4
    m.apply(put("y", "v2"))  # 5: detached by a put without a lease
    m.apply(put("z", "v3", ignore_lease=True))  # 6: keeps lease 1
    assert m.apply({"op": "lease_timetolive", "id": 1, "keys": True, "now_ms": 4000}) == {
        "ok": True, "revision": 6, "id": 1, "ttl_ms": 6000, "granted_ttl_ms": 10_000, "keys": ["x", "z"]}
    assert m.apply({"op": "lease_revoke", "id": 1}) == {"ok": True, "revision": 7, "deleted": 2}
    assert sorted(m.data) == ["y"]
    assert m.apply({"op": "lease_revoke", "id": 1})["code"] == "LeaseNotFound"
    grant(m, 10, 0, lease=2)
    assert m.apply({"op": "lease_revoke", "id": 2}) == {"ok": True, "revision": 7, "deleted": 0}


def test_lease_extend_all_is_the_failover_rule(m):
    grant(m, 1000, 0, lease=1)
    grant(m, 5000, 0, lease=2)
    m.apply(put("k", "v", lease=1))
    # The old sequencer died at t=200; the new one takes over at t=1500 (lease 1 is past
    # its expiry on any clock, but nobody revoked it yet) and first extends everything.
    assert m.apply({"op": "lease_extend_all", "now_ms": 1500}) == {"ok": True, "revision": 2, "extended": 2}
    assert m.leases == {1: [1000, 2500], 2: [5000, 6500]}
    assert m.apply({"op": "lease_keepalive", "id": 1, "now_ms": 2000})["ok"]
    assert m.apply({"op": "lease_expire", "now_ms": 2999})["expired"] == []
    assert m.data == {"k": "v"}


def test_lease_reads(m):
    grant(m, 1000, 0, lease=9)
    grant(m, 1000, 0, lease=3)
    assert m.apply({"op": "lease_leases"}) == {"ok": True, "revision": 1, "leases": [3, 9]}
    assert m.query({"op": "lease_timetolive", "id": 3, "now_ms": 250})["ttl_ms"] == 750
    assert m.query({"op": "lease_timetolive", "id": 4})["code"] == "LeaseNotFound"
    assert m.apply({"op": "lease_keepalive", "id": 4, "now_ms": 1})["code"] == "LeaseNotFound"


# --- exactly once ----------------------------------------------------------------------


def test_retried_commands_apply_once():
    ex = Executor(KVStateMachine())
    out: list = []
    t = txn([cmp("c", "version", "=", 0)], [put("c", "1")], [put("c", "retry-ran-the-else-branch")])
    ex.run([["cl", 1, t], ["cl", 1, t], ["cl", 2, put("d", "x")], ["cl", 2, put("d", "x")], ["cl", 1, t]], out)
    assert [r[3] for r in out] == [True, False, True, False, False]
    assert out[1][2] == out[0][2] and out[0][2]["succeeded"]
    assert out[3][2] == {"ok": True, "revision": 3} and out[4][2] is None  # older than the last: no result
    assert ex.sm.rev == 3 and ex.sm.data == {"c": "1", "d": "x"}


# --- validation and limits -------------------------------------------------------------

BAD = [
    (["put", 1.5, "x"], "InvalidRequest"),
    (["put", "k", None], "InvalidRequest"),
    (["put", "k", ["list"]], "InvalidRequest"),
    (["put", "", "x"], "InvalidRequest"),
    (["put", True, "x"], "InvalidRequest"),
    (["put", 1 << 70, "x"], "InvalidRequest"),
    (["get"], "InvalidRequest"),
    (["cas", "k", "a"], "InvalidRequest"),
    (["append", "k", 1], "InvalidRequest"),
    ("put", "InvalidRequest"),
    ([], "InvalidRequest"),
    ({"op": "nope"}, "InvalidRequest"),
    ({"key": "k"}, "InvalidRequest"),
    (put(1.5, "x"), "InvalidRequest"),
    (put("k", {"a": 1}), "InvalidRequest"),
    (put("k", "v", extra=1), "InvalidRequest"),
    (put("k", "v", lease=-1), "InvalidRequest"),
    (put("k", "v", lease=1.0), "InvalidRequest"),
    (put("k", "v", prev_kv=1), "InvalidRequest"),
    (put("k", "v", ignore_value=True), "InvalidRequest"),
    (put("k", "v", ignore_lease=True, lease=3), "InvalidRequest"),
    ({"op": "put", "key": "k"}, "InvalidRequest"),
    (rng("k", prefix=True, range_end="z"), "InvalidRequest"),
    (rng("k", limit=-1), "InvalidRequest"),
    (rng(""), "InvalidRequest"),
    (rng(5, prefix=True), "InvalidRequest"),
    (txn([{"key": "k", "target": "size", "result": "=", "value": 1}]), "InvalidRequest"),
    (txn([{"key": "k", "target": "version", "result": "~", "version": 1}]), "InvalidRequest"),
    (txn([{"key": "k", "target": "version", "result": "=", "value": 1}]), "InvalidRequest"),
    (txn([], [{"op": "txn"}]), "InvalidRequest"),
    (txn([], [["put", "a", "b"]]), "InvalidRequest"),
    ({"op": "txn", "compare": {}}, "InvalidRequest"),
    ({"op": "compact"}, "InvalidRequest"),
    ({"op": "lease_grant", "ttl_ms": 0, "now_ms": 0}, "InvalidRequest"),
    ({"op": "lease_grant", "ttl_ms": 10, "now_ms": 1.5}, "InvalidRequest"),
    ({"op": "lease_grant", "ttl_ms": 10}, "InvalidRequest"),
    ({"op": "lease_keepalive", "id": 0, "now_ms": 0}, "InvalidRequest"),
    ({"op": "lease_expire"}, "InvalidRequest"),
    (put("k" * (K.MAX_KEY_BYTES + 1), "v"), "TooLarge"),
    (["put", "k", b"v" * (K.MAX_VALUE_BYTES + 1)], "TooLarge"),
    (["cas", "k", "v" * K.MAX_VALUE_BYTES, "w" * K.MAX_VALUE_BYTES], "TooLarge"),
    (txn([], [put(f"k{i}", "v" * 20_000) for i in range(60)]), "TooLarge"),
    (txn([], [put(f"k{i}", "v") for i in range(K.MAX_TXN_OPS + 1)]), "InvalidRequest"),
]


@pytest.mark.parametrize("op,code", BAD, ids=[str(i) for i in range(len(BAD))])
def test_invalid_commands_are_errors_before_and_in_the_log(op, code):
    m = KVStateMachine()
    m.apply(put("k", "old"))
    before = m.snapshot()
    err = validate(op)
    assert err is not None and err["ok"] is False and err["code"] == code, err
    assert m.apply(op) == err  # apply rejects it the same way
    assert m.snapshot() == before


def test_limits_are_inclusive_and_agree_with_the_runtime():
    assert K.MAX_REQUEST_BYTES == clientwire.MAX_COMMAND_BYTES
    key = "k" * K.MAX_KEY_BYTES
    assert validate(put(key, "v")) is None
    # The request limit binds a put: the largest value that fits beside the key and the framing.
    for shape in (lambda v: put(key, v), lambda v: ["put", key, v], lambda v: ["put", "k", v]):
        room = K.MAX_REQUEST_BYTES - (len(msgpack.packb(shape(b""), use_bin_type=True)) - 2) - 5  # bin8 -> bin32
        assert len(msgpack.packb(shape(b"v" * room), use_bin_type=True)) == K.MAX_REQUEST_BYTES
        assert validate(shape(b"v" * room)) is None
        assert validate(shape(b"v" * (room + 1)))["code"] == "TooLarge"
        m = KVStateMachine()
        assert m.apply(shape(b"v" * (room + 1)))["code"] == "TooLarge" and m.rev == 1
        assert m.apply(shape("v" * (room + 1)))["code"] == "TooLarge" and m.rev == 1  # the str fast path too
        m.apply(shape("v" * room))
        assert m.rev == 2
    # What the runtime's limit test sends: a value of MAX_COMMAND_BYTES - 64 in a legacy put.
    assert validate(["put", "ok0", "v" * (clientwire.MAX_COMMAND_BYTES - 64)]) is None
    m = KVStateMachine()
    m.apply(["put", "s", "x" * (K.MAX_VALUE_BYTES - 100)])
    assert m.apply(["append", "s", "y" * 100]) == "x" * (K.MAX_VALUE_BYTES - 100) + "y" * 100
    assert m.apply(["append", "s", "y"])["code"] == "TooLarge"  # would grow past the limit
    assert len(m.data["s"]) == K.MAX_VALUE_BYTES
    assert validate(put("\u00e9" * (K.MAX_KEY_BYTES // 2), "v")) is None  # counted in UTF-8 bytes
    assert validate(put("\u00e9" * (K.MAX_KEY_BYTES // 2 + 1), "v"))["code"] == "TooLarge"
    assert validate(put("\ud800", "v"))["code"] == "InvalidRequest"  # not encodable


GOOD = [put("k", "v"), put(b"k", b"v", lease=0, prev_kv=True), rng("k", limit=3, revision=0), dele("k", prefix=True),
        txn([cmp("k", "mod", "<", 5)], [put("a", 1)], [rng("a")]), {"op": "compact", "revision": 1},
        {"op": "lease_grant", "ttl_ms": 5, "now_ms": 0}, {"op": "lease_expire", "now_ms": 9}, {"op": "status"},
        ["put", 7, 1.5], ["get", 7], ["cas", "k", None, True], ["append", "k", "x"], ["delete", b"k"]]


@pytest.mark.parametrize("op", GOOD, ids=[str(i) for i in range(len(GOOD))])
def test_valid_commands_pass(op):
    assert validate(op) is None


# --- the sequencer's view: read_key, keys_of, query -------------------------------------


def test_read_key_keys_of_and_query(m):
    assert m.read_key(["get", b"a"]) == "a"  # canonical: one key whatever its spelling
    assert m.read_key(["get", 1.5]) is None
    for op in (rng("a"), rng("a", prefix=True), txn([], [rng("a")]), {"op": "lease_leases"}, {"op": "status"},
               {"op": "lease_timetolive", "id": 1}):
        assert m.read_key(op) == ALL_KEYS, op
        assert m.keys_of(op) == []
    for op in (put("a", "1"), dele("a"), txn([], [rng("a"), put("a", "1")]), ["put", "a", 1], ["delete", "a"]):
        assert m.read_key(op) is None
    assert m.keys_of(put(b"a", "1")) == ["a"]
    assert m.keys_of(txn([], [put("a", "1"), dele("b")], [put("a", "2"), put("c", "3")])) == ["a", "b", "c"]
    assert m.keys_of(dele("a", prefix=True)) == [ALL_KEYS]
    assert m.keys_of(txn([], [dele("a", range_end="b")])) == [ALL_KEYS]
    assert m.keys_of({"op": "lease_revoke", "id": 1}) == [ALL_KEYS]
    assert m.keys_of({"op": "lease_expire", "now_ms": 1}) == [ALL_KEYS]
    assert m.keys_of({"op": "lease_grant", "ttl_ms": 1, "now_ms": 1}) == []
    assert m.keys_of(put(1.5, "x")) == []
    m.apply(put("a", "1"))
    before = m.snapshot()
    assert m.query(put("a", "2"))["code"] == "InvalidRequest"
    assert m.query(txn([], [put("a", "2")]))["code"] == "InvalidRequest"
    assert m.query(["get", "a"]) == "1" and m.query(rng("a"))["count"] == 1
    assert m.snapshot() == before


# --- legacy ops and snapshots --------------------------------------------------------------


def test_legacy_ops_keep_their_results(m):
    assert m.apply(["put", "a", 1]) is None
    assert m.apply(["get", "a"]) == 1
    assert m.apply(["get", "missing"]) is None
    assert m.apply(["cas", "a", 2, 3]) is False
    assert m.apply(["cas", "a", 1, 3]) is True
    assert m.apply(["cas", "new", None, "x"]) is True  # None: the key is absent
    assert m.apply(["append", "s", "x"]) == "x"
    assert m.apply(["append", "s", "y"]) == "xy"
    assert m.apply(["delete", "s"]) is True
    assert m.apply(["delete", "s"]) is False
    assert m.data == {"a": 3, "new": "x"}
    assert kvs(m.apply(rng("a"))) == [("a", 3, 2, 3, 2)]


def test_format_1_snapshots_restore():
    old = msgpack.packb([["a", 1], ["b", "x"]], use_bin_type=True)
    m = KVStateMachine()
    m.restore(old)
    assert m.data == {"a": 1, "b": "x"} and m.rev == 3
    assert kvs(m.apply(rng("\0", range_end="\0"))) == [("a", 1, 2, 2, 1), ("b", "x", 3, 3, 1)]


def test_snapshot_holds_everything(m):
    grant(m, 1000, 50, lease=4)
    m.apply(put("a", "1", lease=4))
    m.apply(put("a", "2", lease=4))
    m.apply(put("b", "1"))
    m.apply(dele("b"))
    m.apply({"op": "compact", "revision": 3})
    c = KVStateMachine()
    c.restore(m.snapshot())
    assert c.snapshot() == m.snapshot() and c.digest() == m.digest()
    for x in (m, c):
        assert x.apply(rng("a", revision=2))["code"] == "Compacted"
        assert x.apply({"op": "lease_timetolive", "id": 4, "keys": True})["keys"] == ["a"]
        assert x.apply({"op": "lease_expire", "now_ms": 1050}) == {"ok": True, "revision": 6, "expired": [4], "deleted": 1}
        assert x.apply({"op": "lease_grant", "ttl_ms": 1, "now_ms": 0})["id"] == 1
    assert c.digest() == m.digest() and c.now_ms == 1050


def test_the_seam_exposes_the_validator():
    from store.machines import validator

    assert validator("kv")(["put", 1.5, "x"])["code"] == "InvalidRequest"
    assert validator("kv")(["put", "k", "x"]) is None
    assert validator("scheduler")({"op": "anything"})["code"] == "InvalidRequest"  # not a command's name
    assert validator("scheduler")({"op": "allocate", "spec": 1}) is None  # its fields: refused in apply
    assert validator("scheduler")({"op": "batch", "commands": [{"op": "release"}, {"op": ["x"]}]})["error"].startswith(
        "command 1: unknown op")
    with pytest.raises(ValueError):
        validator("nope")
