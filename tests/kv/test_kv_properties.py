"""Hypothesis properties of the key-value machine: against a naive reference model (one
full copy of the store per revision), snapshot/restore at any point, monotonic
revisions, and digests that do not depend on how a replica got its state."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.kv_machine import KVStateMachine

KEYS = ["a", "a/1", "a/2", "ab", "b", "b/1", "c"]
VALUES = st.sampled_from(["", "x", "y", "zz"])
KEY = st.sampled_from(KEYS)


# --- the reference: every revision's whole state, copied -------------------------------


class Err(str):
    """An expected error code (the model's answer for a refused command)."""


class Model:
    """revision -> {key: (value, create_revision, mod_revision, version)}."""

    def __init__(self) -> None:
        self.rev = 1
        self.compacted = 0
        self.states = {1: {}}

    def span(self, op: dict) -> list:
        key = op["key"]
        if op.get("prefix"):
            return [k for k in KEYS if k.startswith(key)]
        if "range_end" in op:
            end = op["range_end"]
            return [k for k in KEYS if key <= k and (end == "\0" or k < end)]
        return [key]

    def range(self, state: dict, op: dict, rev: int) -> dict:
        found = [(k, state[k]) for k in sorted(self.span(op)) if k in state]
        count = len(found)
        if op.get("count_only"):
            return {"ok": True, "revision": rev, "kvs": [], "count": count, "more": False}
        if op.get("limit"):
            found = found[: op["limit"]]
        kvs = []
        for k, (v, c, m, ver) in found:
            kv = {"key": k, "create_revision": c, "mod_revision": m, "version": ver, "lease": 0}
            if not op.get("keys_only"):
                kv["value"] = v
            kvs.append(kv)
        return {"ok": True, "revision": rev, "kvs": kvs, "count": count, "more": len(kvs) < count}

    def write(self, state: dict, op: dict, rev: int) -> tuple[dict, bool]:
        """Apply a put/delete to ``state`` at ``rev``; (result, changed)."""
        if op["op"] == "put":
            k = op["key"]
            old = state.get(k)
            state[k] = (op["value"], old[1] if old else rev, rev, old[3] + 1 if old else 1)
            res = {"ok": True, "revision": rev}
            if op.get("prev_kv"):
                res["prev_kv"] = None if old is None else {"key": k, "create_revision": old[1], "mod_revision": old[2],
                                                           "version": old[3], "lease": 0, "value": old[0]}
            return res, True
        gone = [k for k in sorted(self.span(op)) if k in state]
        res = {"ok": True, "revision": rev, "deleted": len(gone)}
        if op.get("prev_kv"):
            res["prev_kvs"] = [{"key": k, "create_revision": state[k][1], "mod_revision": state[k][2],
                                "version": state[k][3], "lease": 0, "value": state[k][0]} for k in gone]
        for k in gone:
            del state[k]
        return res, bool(gone)

    def commit(self, state: dict, changed: bool) -> None:
        if changed:
            self.rev += 1
            self.states[self.rev] = state

    def compare(self, c: dict) -> bool:
        cur = self.states[self.rev].get(c["key"])
        if c["target"] == "value":
            if cur is None:
                return False
            have, want = cur[0], c["value"]
        else:
            have = 0 if cur is None else cur[3]
            want = c["version"]
        return {"=": have == want, "!=": have != want, "<": have < want, ">": have > want}[c["result"]]

    def apply(self, op):
        if type(op) is list:
            return self.legacy(op)
        name = op["op"]
        cur = self.states[self.rev]
        if name == "range":
            rev = op.get("revision", 0)
            if rev > self.rev:
                return Err("InvalidRequest")
            if rev and rev < self.compacted:
                return Err("Compacted")
            return self.range(self.states[rev or self.rev], op, self.rev)
        if name == "compact":
            r = op["revision"]
            if r > self.rev:
                return Err("InvalidRequest")
            if r <= self.compacted:
                return Err("Compacted")
            self.compacted = r
            return {"ok": True, "revision": self.rev, "compact_revision": r}
        if name in ("put", "delete_range"):
            state = dict(cur)
            res, changed = self.write(state, op, self.rev + 1)
            self.commit(state, changed)
            res["revision"] = self.rev
            return res
        # txn: neither branch may write a key twice (checked before anything runs)
        for b in (op["success"], op["failure"]):
            puts = [s["key"] for s in b if s["op"] == "put"]
            deleted = {k for s in b if s["op"] == "delete_range" for k in self.span(s)}
            if len(set(puts)) < len(puts) or deleted & set(puts):
                return Err("InvalidRequest")
        branch = op["success"] if all(self.compare(c) for c in op["compare"]) else op["failure"]
        state, changed, out = dict(cur), False, []
        for s in branch:  # every range is checked before anything is written
            r = s.get("revision", 0) if s["op"] == "range" else 0
            if r > self.rev:
                return Err("InvalidRequest")
            if r and r < self.compacted:
                return Err("Compacted")
        for s in branch:
            if s["op"] == "range":
                r = s.get("revision", 0)
                out.append(self.range(self.states[r] if r else state, s, 0))
            else:
                res, ch = self.write(state, s, self.rev + 1)
                changed |= ch
                out.append(res)
        self.commit(state, changed)
        for r in out:
            r["revision"] = self.rev
        return {"ok": True, "revision": self.rev, "succeeded": branch is op["success"], "responses": out}

    def legacy(self, op):
        cur = self.states[self.rev]
        k = op[1]
        old = cur.get(k)
        if op[0] == "get":
            return None if old is None else old[0]
        if op[0] == "delete":
            self.apply({"op": "delete_range", "key": k})
            return old is not None
        if op[0] == "cas":
            if (None if old is None else old[0]) != op[2]:
                return False
            self.apply({"op": "put", "key": k, "value": op[3]})
            return True
        self.apply({"op": "put", "key": k, "value": op[2]})
        return None


# --- command strategies ---------------------------------------------------------------


def spans():
    return st.one_of(
        st.builds(lambda k: {"key": k}, KEY),
        st.builds(lambda k: {"key": k, "prefix": True}, st.sampled_from(["a", "a/", "b", ""])),
        st.builds(lambda k, e: {"key": k, "range_end": e}, KEY, st.sampled_from(["a/2", "b", "c", "\0"])),
    )


puts = st.builds(lambda k, v, p: {"op": "put", "key": k, "value": v, **({"prev_kv": True} if p else {})},
                 KEY, VALUES, st.booleans())
deletes = st.builds(lambda s, p: {"op": "delete_range", **s, **({"prev_kv": True} if p else {})}, spans(), st.booleans())
ranges = st.builds(
    lambda s, limit, back, ko, co: {"op": "range", **s, "limit": limit, "keys_only": ko, "count_only": co,
                                    "revision": back},
    spans(), st.integers(0, 3), st.integers(0, 12), st.booleans(), st.booleans())
compares = st.one_of(
    st.builds(lambda k, r, v: {"key": k, "target": "value", "result": r, "value": v}, KEY,
              st.sampled_from(["=", "!=", "<", ">"]), VALUES),
    st.builds(lambda k, r, v: {"key": k, "target": "version", "result": r, "version": v}, KEY,
              st.sampled_from(["=", "!=", "<", ">"]), st.integers(0, 3)),
)
branch = st.lists(st.one_of(puts, deletes, ranges), max_size=4)
txns = st.builds(lambda c, s, f: {"op": "txn", "compare": c, "success": s, "failure": f},
                 st.lists(compares, max_size=2), branch, branch)
legacy = st.one_of(
    st.builds(lambda k, v: ["put", k, v], KEY, VALUES),
    st.builds(lambda k: ["get", k], KEY),
    st.builds(lambda k: ["delete", k], KEY),
    st.builds(lambda k, e, v: ["cas", k, e, v], KEY, st.one_of(st.none(), VALUES), VALUES),
)
compacts = st.builds(lambda r: {"op": "compact", "revision": r}, st.integers(0, 14))
kv_ops = st.lists(st.one_of(puts, puts, deletes, ranges, txns, legacy, compacts), max_size=40)

leases = st.one_of(
    st.builds(lambda i, t, n: {"op": "lease_grant", "id": i, "ttl_ms": t, "now_ms": n},
              st.integers(0, 3), st.integers(1, 50), st.integers(0, 200)),
    st.builds(lambda i, n: {"op": "lease_keepalive", "id": i, "now_ms": n}, st.integers(1, 3), st.integers(0, 200)),
    st.builds(lambda i: {"op": "lease_revoke", "id": i}, st.integers(1, 3)),
    st.builds(lambda n: {"op": "lease_expire", "now_ms": n}, st.integers(0, 250)),
    st.builds(lambda n: {"op": "lease_extend_all", "now_ms": n}, st.integers(0, 250)),
    st.builds(lambda k, v, i: {"op": "put", "key": k, "value": v, "lease": i}, KEY, VALUES, st.integers(1, 3)),
    st.builds(lambda i: {"op": "lease_timetolive", "id": i, "keys": True}, st.integers(1, 3)),
    st.just({"op": "lease_leases"}),
)
all_ops = st.lists(st.one_of(puts, deletes, ranges, txns, legacy, compacts, leases, leases), max_size=50)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def absolute(op, rev):
    """Ranges carry ``revision`` as "this far back" in the strategy; make it absolute."""
    if type(op) is dict and op["op"] == "range" and op.get("revision"):
        return {**op, "revision": max(0, rev - op["revision"] + 1)}
    return op


@SETTINGS
@given(kv_ops)
def test_the_machine_matches_the_reference_model(ops):
    m, ref = KVStateMachine(), Model()
    for op in ops:
        op = absolute(op, m.rev)
        got = m.apply(op)
        want = ref.apply(op)
        if isinstance(want, Err):
            assert type(got) is dict and got["ok"] is False and got["code"] == want, (op, got)
        else:
            assert got == want, op
        assert m.rev == ref.rev


@SETTINGS
@given(all_ops, st.integers(0, 50))
def test_snapshot_restore_gives_the_same_digest_and_answers(ops, cut):
    a = KVStateMachine()
    for op in ops[:cut]:
        a.apply(absolute(op, a.rev))
    b = KVStateMachine()
    b.restore(a.snapshot())
    assert b.snapshot() == a.snapshot()
    for op in ops[cut:]:
        op = absolute(op, a.rev)
        assert b.apply(op) == a.apply(op), op
        assert b.digest() == a.digest()
        assert b.data == a.data and b.leases == a.leases and b.lease_keys == a.lease_keys


@SETTINGS
@given(all_ops)
def test_revision_and_clock_never_go_back_and_reads_change_nothing(ops):
    m = KVStateMachine()
    for op in ops:
        op = absolute(op, m.rev)
        rev, now, before = m.rev, m.now_ms, m.snapshot()
        res = m.apply(op)
        assert rev <= m.rev <= rev + 1 and now <= m.now_ms
        if type(res) is dict and res.get("ok") is False:
            assert m.snapshot() == before, op  # a refused command changes nothing
        if m.read_key(op) is not None:
            assert m.snapshot() == before and m.query(op) == res
        if m.rev > rev:
            assert m.keys_of(op), op  # a command that wrote lists what it may write
    # every live key's lease exists and lists it
    for k, recs in m.hist.items():
        if recs[-1][1] and recs[-1][4]:
            assert k in m.lease_keys[recs[-1][4]]
