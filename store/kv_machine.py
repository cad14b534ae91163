"""The replicated key-value machine: etcd's v3 KV and lease semantics, deterministic.

Commands arrive through msgpack, so they are lists and str-keyed dicts. Two forms:

**The etcd-style API** (dicts with an ``"op"``; field names follow etcd's v3 API)::

    {"op": "put", "key", "value", "lease"=0, "prev_kv"=False, "ignore_value"=False, "ignore_lease"=False}
    {"op": "range", "key", "range_end"=None, "prefix"=False, "limit"=0, "revision"=0,
                    "keys_only"=False, "count_only"=False}
    {"op": "delete_range", "key", "range_end"=None, "prefix"=False, "prev_kv"=False}
    {"op": "txn", "compare": [cmp...], "success": [op...], "failure": [op...]}
    {"op": "compact", "revision"}
    {"op": "lease_grant", "ttl_ms", "now_ms", "id"=0}        {"op": "lease_keepalive", "id", "now_ms"}
    {"op": "lease_revoke", "id"}      {"op": "lease_expire", "now_ms"}      {"op": "lease_extend_all", "now_ms"}
    {"op": "lease_timetolive", "id", "keys"=False, "now_ms"=0}   {"op": "lease_leases"}   {"op": "status"}

**The legacy ops** (lists; the simulator, the jepsen-like checks, the bench and the
binary client's ``put/get/cas/append/delete`` use them; their results are unchanged)::

    ["put", key, value] -> None            ["get", key] -> value or None
    ["cas", key, expected, new] -> bool    (expected None: the key is absent)
    ["append", key, suffix] -> new value   ["delete", key] -> bool (it existed)

They are thin aliases of the same store: a legacy put is a put (a new revision, version
+1, no lease), a legacy delete a single-key delete_range.

Results
-------
Success: ``{"ok": True, "revision": R, ...}`` where ``R`` is the store's revision after the
command (etcd's ``header.revision``). Failure, for every op, legacy ones included:
``{"ok": False, "code": CODE, "error": "message"}``, and nothing changed. Codes:

- ``InvalidRequest``: malformed (wrong types, unknown op or field, empty key, a txn
  writing one key twice, a future revision, a put with ``ignore_value`` on a missing key).
- ``TooLarge``: a key, value or whole command over ``MAX_KEY_BYTES`` /
  ``MAX_VALUE_BYTES`` / ``MAX_REQUEST_BYTES`` (or an ``append`` that would grow past
  ``MAX_VALUE_BYTES``).
- ``Compacted``: a read at a revision below the compaction point (carries
  ``compact_revision``), or a ``compact`` at or below it.
- ``LeaseNotFound``: a lease that does not exist or has expired (carries ``id``).
- ``CompareFailed``: never returned by the machine. As in etcd, a txn whose compares
  fail is not an error (``succeeded: False``, the ``failure`` branch ran); the code is
  reserved for client helpers (``cas``) that turn that outcome into an exception.

Because values are scalars (str, bytes, int, float, bool; never None, a list or a dict),
a legacy result is unambiguous: ``get`` answers a scalar or None, and a dict is an error.

Shapes: a key-value is ``{"key", "value", "create_revision", "mod_revision", "version",
"lease"}`` (no ``"value"`` with ``keys_only``). ``put`` answers ``{"ok", "revision"}``
plus ``"prev_kv"`` (a kv or None) when asked; ``range`` ``{"ok", "revision", "kvs",
"count", "more"}``; ``delete_range`` ``{"ok", "revision", "deleted"}`` plus
``"prev_kvs"`` when asked; ``txn`` ``{"ok", "revision", "succeeded", "responses"}``
(each response is the op's own result; ``revision`` in each is the txn's final one);
``compact`` ``{"ok", "revision", "compact_revision"}``; ``lease_grant`` and
``lease_keepalive`` ``{"ok", "revision", "id", "ttl_ms"}``; ``lease_revoke``
``{"ok", "revision", "deleted"}``; ``lease_expire`` ``{"ok", "revision", "expired": [ids],
"deleted"}``; ``lease_extend_all`` ``{"ok", "revision", "extended"}``;
``lease_timetolive`` ``{"ok", "revision", "id", "ttl_ms" (remaining, 0 once expired),
"granted_ttl_ms"}`` plus ``"keys"``; ``lease_leases`` ``{"ok", "revision", "leases"}``;
``status`` ``{"ok", "revision", "compact_revision", "keys", "leases", "now_ms"}``.

Revisions (etcd's MVCC)
-----------------------
The store starts at revision 1 (as etcd); every command that changes a key's value
adds 1, whatever it changes (a txn, a prefix delete, a lease revoke or an expiry that
deletes keys: one revision). A command that changes no key (a delete of nothing, a
failed cas, a txn whose branch only reads, lease grant and keepalive, compact) does not.
Per key: ``create_revision`` (when the key was last created), ``mod_revision`` (last
change), ``version`` (changes since creation; a delete resets the key). Old revisions
stay readable (``range`` with ``revision``) until compacted: by ``compact``, or by the
machine itself, which keeps at least the last ``HISTORY_RETAIN`` revisions: when the
revision is ``HISTORY_RETAIN + COMPACT_STEP`` past the compaction point it compacts at
``revision - HISTORY_RETAIN`` (deterministic: a function of the log alone). A pass
visits only the keys written since the last one (a queue of them by revision), so each
costs about ``COMPACT_STEP`` keys, not every key written in ``2 * HISTORY_RETAIN``
revisions (20-47 ms on every replica at once, at the same slot, at 64,000 keys).

Keys are byte strings: a key arrives as str (UTF-8) or bytes and is kept as str when it
is valid UTF-8, else as bytes, so ``"a"`` and ``b"a"`` are one key. Ranges compare the
bytes. Integer keys (legacy) are their own keys, sort before every byte key and cannot
be a prefix. ``range_end`` ``"\\0"`` means "every key from ``key`` on" (etcd).

Leases
------
Time never comes from a clock inside ``apply``: grant, keepalive, expire and extend
carry ``now_ms`` (integer milliseconds, stamped by the replica that proposes them). The
machine's time ``now`` is the largest ``now_ms`` of the ``lease_expire`` and
``lease_extend_all`` commands it has applied (the sequencer proposes those): it never
goes backwards. Grant and keepalive stamps do not move it (any replica may propose
them; one with a fast clock must not expire other leases early): a lease granted or
kept alive with stamp ``t`` expires at ``max(now, t) + ttl_ms``. A lease whose expiry is
at or below ``now`` (or the keepalive's own stamp) is dead for keepalive and put (they
answer ``LeaseNotFound``) but its keys stay until a ``lease_expire`` (or
``lease_revoke``) command deletes them. ``lease_expire`` revokes every lease expired at its ``now_ms``
and deletes their keys in one revision. ``lease_extend_all`` is etcd's failover rule
(a new leader extends every lease by one TTL): each lease expires ``ttl_ms`` after the
command's time; a new sequencer proposes it before its first ``lease_expire``.
``expiry_due(now_ms)`` tells a proposer whether a ``lease_expire`` would expire anything.

Change feed: ``listener`` (None by default; ``store.kv_watch.WatchHub`` sets it) is
told each applied mutation, ``listener.kv_events(revision, [(kind, key, record,
prev)])`` once per revision, and ``listener.kv_restored(revision, compact_revision)``
after a restore. It is not replicated state (not in the snapshot or the digest), and a
listener that raises is detached; ``apply`` is the same with or without one.

Exactly-once for client retries is the executor's (``consensus.core.executor``: one
session per client, last ``seq`` and its result); the machine sees each command once.

Reads and the sequencer's history (``read_key`` / ``keys_of``): legacy ``get`` reads its
key; every etcd-style read (``range``, read-only ``txn``, lease reads, ``status``) reads
``ALL_KEYS`` (wait for every write ordered so far). Writes list their keys when they are
known before ordering; a write whose keys depend on the state (a ranged or prefix
delete, a txn with one, lease revoke and expire) lists ``ALL_KEYS``.
"""

from __future__ import annotations

import hashlib
import logging
from bisect import bisect_left, bisect_right
from collections import deque
from operator import itemgetter
from typing import Any

import msgpack

# --- limits (one place; the runtime's clientwire.MAX_COMMAND_BYTES is the same) --------
MAX_REQUEST_BYTES = 1 << 20
"""A whole command, msgpack-encoded: 1 MiB (= ``clientwire.MAX_COMMAND_BYTES``)."""
MAX_KEY_BYTES = 4 << 10
"""A key (or range end): 4 KiB of UTF-8 or bytes."""
MAX_VALUE_BYTES = MAX_REQUEST_BYTES
"""A value: 1 MiB. A value may take (almost) a whole request; ``MAX_REQUEST_BYTES``, which
also counts the key and the command around them, is the limit that binds a put."""
MAX_TXN_OPS = 128
"""Compares, and ops in each branch, of one txn (etcd's ``--max-txn-ops``)."""
MAX_LEASE_TTL_MS = 9_000_000_000 * 1000
"""etcd's MaxLeaseTTL (9e9 seconds)."""
HISTORY_RETAIN = 10_000
"""Revisions the machine keeps readable before compacting by itself (module docstring)."""
COMPACT_STEP = 1_000
"""Revisions between two of the machine's own compactions (module docstring). Part of
the replicated semantics: every replica of a cluster must run the same value."""

INVALID_REQUEST = "InvalidRequest"
COMPARE_FAILED = "CompareFailed"
COMPACTED = "Compacted"
TOO_LARGE = "TooLarge"
LEASE_NOT_FOUND = "LeaseNotFound"
CODES = (INVALID_REQUEST, COMPARE_FAILED, COMPACTED, TOO_LARGE, LEASE_NOT_FOUND)

ALL_KEYS = ("*",)
"""The key of a read that depends on everything, and of a write whose keys are not known
before it is ordered. Not a str, int or bytes, so the sequencer treats a read of it as
"wait for every slot ordered so far"."""

_log = logging.getLogger(__name__)
_SNAPSHOT_FORMAT = 2
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_ID_MAX = (1 << 63) - 1
_VALUE_TYPES = (str, bytes, int, float, bool)
_WRITE_LEGACY = ("put", "cas", "append", "delete")
_READ_OPS = frozenset(("range", "lease_timetolive", "lease_leases", "status"))
_CMP_TARGETS = {"value": "value", "version": "version", "create": "create_revision",
                "mod": "mod_revision", "lease": "lease"}
_CMP_RESULTS = {"=": "=", "equal": "=", "!=": "!=", "not_equal": "!=", "<": "<", "less": "<",
                ">": ">", "greater": ">"}
_mod = itemgetter(0)


class _Invalid(Exception):
    """Internal: a command fails validation (carries its error result)."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra


def error(code: str, message: str, **extra: Any) -> dict:
    """An error result: ``{"ok": False, "code", "error", ...extra}``."""
    res = {"ok": False, "code": code, "error": message}
    res.update(extra)
    return res


# --- keys ----------------------------------------------------------------------------


def _canon(key: Any) -> Any:
    """The key's one representation: bytes that are valid UTF-8 become str."""
    if type(key) is bytes:
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return key
    return key


def _kbytes(key: Any) -> bytes:
    return key.encode("utf-8") if type(key) is str else key


def _ord(key: Any) -> tuple:
    """Sort position of a canonical key: ints first (numerically), then by bytes."""
    if type(key) is int:
        return (0, key, key)
    return (1, _kbytes(key), key)


def _bound(key: Any) -> tuple:
    """A range bound: sorts just before the key ``key`` (canonical or not)."""
    if type(key) is int:
        return (0, key)
    return (1, _kbytes(key))


def _end_bound(end: Any) -> tuple | None:
    """The bound of a ``range_end``; None for etcd's "\\0" (no end)."""
    if type(end) is not int and _kbytes(end) == b"\x00":
        return None
    return _bound(end)


def _prefix_end(prefix: bytes) -> bytes | None:
    """The first byte string after every string starting with ``prefix`` (None: none)."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


def _check_key(key: Any, what: str = "key", empty_ok: bool = False) -> int:
    """Its size in bytes (8 for an integer)."""
    t = type(key)
    if t is str:
        if key.isascii():
            n = len(key)
        else:
            try:
                n = len(key.encode("utf-8"))
            except UnicodeEncodeError:
                raise _Invalid(INVALID_REQUEST, f"{what} is not valid UTF-8") from None
    elif t is bytes:
        n = len(key)
    elif t is int:
        if not _INT_MIN <= key <= _INT_MAX:
            raise _Invalid(INVALID_REQUEST, f"{what} is an integer out of the 64-bit range")
        return 8
    else:
        raise _Invalid(INVALID_REQUEST, f"{what} must be a string or bytes (or an integer), not {t.__name__}")
    if n == 0 and not empty_ok:
        raise _Invalid(INVALID_REQUEST, f"{what} is empty")
    if n > MAX_KEY_BYTES:
        raise _Invalid(TOO_LARGE, f"{what} of {n} bytes exceeds the limit of {MAX_KEY_BYTES} bytes")
    return n


def _value_size(value: Any, what: str = "value") -> int:
    t = type(value)
    if t is str:
        if value.isascii():
            return len(value)
        try:
            return len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise _Invalid(INVALID_REQUEST, f"{what} is not valid UTF-8") from None
    if t is bytes:
        return len(value)
    if t is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise _Invalid(INVALID_REQUEST, f"{what} is an integer out of the 64-bit range")
        return 8
    if t is float or t is bool:
        return 8
    raise _Invalid(INVALID_REQUEST, f"{what} must be a string, bytes, a number or a bool, not {t.__name__}")


def _check_value(value: Any, what: str = "value") -> int:
    """Its size in bytes (8 for a number or a bool)."""
    n = _value_size(value, what)
    if n > MAX_VALUE_BYTES:
        raise _Invalid(TOO_LARGE, f"{what} of {n} bytes exceeds the limit of {MAX_VALUE_BYTES} bytes")
    return n


def _bool(op: dict, field: str) -> bool:
    v = op.get(field, False)
    if type(v) is not bool:
        raise _Invalid(INVALID_REQUEST, f"{field} must be a bool")
    return v


def _uint(op: dict, field: str, default: int | None = 0, lo: int = 0, hi: int = _ID_MAX) -> int:
    v = op.get(field, default)
    if v is None:
        raise _Invalid(INVALID_REQUEST, f"{field} is required")
    if type(v) is not int or not lo <= v <= hi:
        raise _Invalid(INVALID_REQUEST, f"{field} must be an integer in [{lo}, {hi}]")
    return v


def _fields(op: dict, allowed: tuple) -> None:
    for f in op:
        if f not in allowed:
            raise _Invalid(INVALID_REQUEST, f"unknown field {str(f)[:40]!r} for {op['op']}")


# --- validation (pure) ---------------------------------------------------------------

_FIELDS = {
    "put": ("op", "key", "value", "lease", "prev_kv", "ignore_value", "ignore_lease"),
    "range": ("op", "key", "range_end", "prefix", "limit", "revision", "keys_only", "count_only"),
    "delete_range": ("op", "key", "range_end", "prefix", "prev_kv"),
    "txn": ("op", "compare", "success", "failure"),
    "compact": ("op", "revision"),
    "lease_grant": ("op", "id", "ttl_ms", "now_ms"),
    "lease_keepalive": ("op", "id", "now_ms"),
    "lease_revoke": ("op", "id"),
    "lease_expire": ("op", "now_ms"),
    "lease_extend_all": ("op", "now_ms"),
    "lease_timetolive": ("op", "id", "keys", "now_ms"),
    "lease_leases": ("op",),
    "status": ("op",),
}
_LEGACY_ARITY = {"put": 3, "get": 2, "cas": 4, "append": 3, "delete": 2}


def _check_range_args(op: dict) -> None:
    """key / range_end / prefix of a range or delete_range."""
    if "key" not in op:
        raise _Invalid(INVALID_REQUEST, "key is required")
    prefix = _bool(op, "prefix")
    end = op.get("range_end")
    key = op["key"]
    _check_key(key, empty_ok=prefix or end is not None)
    if end is not None:
        if prefix:
            raise _Invalid(INVALID_REQUEST, "give range_end or prefix, not both")
        _check_key(end, "range_end", empty_ok=True)
    if prefix and type(key) is int:
        raise _Invalid(INVALID_REQUEST, "an integer key cannot be a prefix")


def _check_put(op: dict) -> None:
    if "key" not in op:
        raise _Invalid(INVALID_REQUEST, "key is required")
    _check_key(op["key"])
    ignore_value = _bool(op, "ignore_value")
    ignore_lease = _bool(op, "ignore_lease")
    _bool(op, "prev_kv")
    if ignore_value:
        if op.get("value") is not None:
            raise _Invalid(INVALID_REQUEST, "value is given with ignore_value")
    elif "value" not in op:
        raise _Invalid(INVALID_REQUEST, "value is required")
    else:
        _check_value(op["value"])
    lease = _uint(op, "lease")
    if ignore_lease and lease:
        raise _Invalid(INVALID_REQUEST, "lease is given with ignore_lease")


def _check_compare(c: Any) -> None:
    if type(c) is not dict:
        raise _Invalid(INVALID_REQUEST, "a compare must be a mapping")
    target = c.get("target")
    result = c.get("result")
    t = _CMP_TARGETS.get(target.lower()) if type(target) is str else None
    if t is None:
        raise _Invalid(INVALID_REQUEST, "compare target must be value, version, create, mod or lease")
    if (_CMP_RESULTS.get(result.lower()) if type(result) is str else None) is None:
        raise _Invalid(INVALID_REQUEST, "compare result must be =, !=, < or >")
    for f in c:
        if f not in ("key", "target", "result", t):
            raise _Invalid(INVALID_REQUEST, f"unknown field {str(f)[:40]!r} in a {t} compare")
    if "key" not in c:
        raise _Invalid(INVALID_REQUEST, "a compare needs a key")
    _check_key(c["key"])
    if t not in c:
        raise _Invalid(INVALID_REQUEST, f"a {target} compare needs the field {t!r}")
    if t == "value":
        _check_value(c[t], "compare value")
    else:
        _uint(c, t, None, _INT_MIN, _ID_MAX)


def _write_span(op: dict) -> tuple:
    """The keys an op of a txn branch writes: ("put", ord) or ("del", lo, hi|None, single)."""
    key = _canon(op["key"])
    if op["op"] == "put":
        return ("put", _ord(key))
    end = op.get("range_end")
    if op.get("prefix"):
        pe = _prefix_end(_kbytes(key))
        return ("del", _bound(key), None if pe is None else (1, pe), False)
    if end is None:
        return ("del", _ord(key), None, True)
    return ("del", _bound(key), _end_bound(end), False)


def _check_branch(ops: Any, name: str) -> None:
    if type(ops) is not list:
        raise _Invalid(INVALID_REQUEST, f"txn {name} must be a list")
    if len(ops) > MAX_TXN_OPS:
        raise _Invalid(INVALID_REQUEST, f"txn {name} has {len(ops)} ops, over the limit of {MAX_TXN_OPS}")
    puts: set = set()
    dels: list = []
    for sub in ops:
        if type(sub) is not dict or sub.get("op") not in ("put", "range", "delete_range"):
            raise _Invalid(INVALID_REQUEST, f"txn {name} ops must be put, range or delete_range mappings")
        _check_dict(sub)
        if sub["op"] == "range":
            continue
        span = _write_span(sub)
        if span[0] == "put":
            if span[1] in puts:
                raise _Invalid(INVALID_REQUEST, "duplicate key given in txn request")
            puts.add(span[1])
        else:
            dels.append(span)
    for lo_key, hi, single in ((d[1], d[2], d[3]) for d in dels):
        for p in puts:
            if (p == lo_key) if single else (p >= lo_key and (hi is None or p < hi)):
                raise _Invalid(INVALID_REQUEST, "duplicate key given in txn request")


def _check_dict(op: dict) -> None:
    name = op.get("op")
    allowed = _FIELDS.get(name) if type(name) is str else None
    if allowed is None:
        raise _Invalid(INVALID_REQUEST, f"unknown op {str(name)[:40]!r}; known: {', '.join(sorted(_FIELDS))}")
    _fields(op, allowed)
    if name == "put":
        _check_put(op)
    elif name == "range":
        _check_range_args(op)
        _uint(op, "limit")
        _uint(op, "revision")
        _bool(op, "keys_only")
        _bool(op, "count_only")
    elif name == "delete_range":
        _check_range_args(op)
        _bool(op, "prev_kv")
    elif name == "txn":
        compare = op.get("compare", [])
        if type(compare) is not list:
            raise _Invalid(INVALID_REQUEST, "txn compare must be a list")
        if len(compare) > MAX_TXN_OPS:
            raise _Invalid(INVALID_REQUEST, f"txn has {len(compare)} compares, over the limit of {MAX_TXN_OPS}")
        for c in compare:
            _check_compare(c)
        _check_branch(op.get("success", []), "success")
        _check_branch(op.get("failure", []), "failure")
    elif name == "compact":
        _uint(op, "revision", None)
    elif name == "lease_grant":
        _uint(op, "id")
        _uint(op, "ttl_ms", None, 1, MAX_LEASE_TTL_MS)
        _uint(op, "now_ms", None)
    elif name in ("lease_keepalive", "lease_revoke", "lease_timetolive"):
        _uint(op, "id", None, 1)
        if name == "lease_keepalive":
            _uint(op, "now_ms", None)
        elif name == "lease_timetolive":
            _bool(op, "keys")
            _uint(op, "now_ms")
    elif name in ("lease_expire", "lease_extend_all"):
        _uint(op, "now_ms", None)


def _check_legacy(op: list) -> None:
    if not op:
        raise _Invalid(INVALID_REQUEST, "operation must be a non-empty list or a mapping with an 'op'")
    name = op[0]
    arity = _LEGACY_ARITY.get(name) if type(name) is str else None
    if arity is None or len(op) != arity:
        raise _Invalid(INVALID_REQUEST, f"unknown operation {str(name)[:40]!r} with {len(op) - 1} arguments")
    size = 16 + _check_key(op[1])  # a bound on the encoded command: 16 bytes of framing
    if name == "put" or name == "append":
        size += _check_value(op[2])
        if name == "append" and type(op[2]) is not str:
            raise _Invalid(INVALID_REQUEST, "append needs string values")
    elif name == "cas":
        if op[2] is not None:
            size += _check_value(op[2], "expected value")
        size += _check_value(op[3], "new value")
    if size > MAX_REQUEST_BYTES:
        _check_size(op)


def _check_size(op: Any) -> None:
    try:
        size = len(msgpack.packb(op, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as e:
        raise _Invalid(INVALID_REQUEST, f"operation cannot be encoded: {e}") from None
    if size > MAX_REQUEST_BYTES:
        raise _Invalid(TOO_LARGE, f"a command of {size} bytes exceeds the limit of {MAX_REQUEST_BYTES} bytes")


def _check(op: Any) -> None:
    t = type(op)
    if t is list:
        _check_legacy(op)
    elif t is dict:
        _check_dict(op)
        _check_size(op)
    else:
        raise _Invalid(INVALID_REQUEST, "operation must be a non-empty list or a mapping with an 'op'")


_STAMPED_OPS = frozenset(("lease_grant", "lease_keepalive", "lease_timetolive"))


def stamp(op: Any, now_ms: int) -> Any:
    """``op`` with ``now_ms`` set from the clock of the replica that proposes it (the
    lease commands a client sends; a client's own ``now_ms`` is replaced). Pure: the
    time is a value in the command, never a clock in ``apply``."""
    if type(op) is dict and type(op.get("op")) is str and op["op"] in _STAMPED_OPS:
        return {**op, "now_ms": now_ms}
    return op


def validate(op: Any) -> dict | None:
    """None if ``op`` is a well-formed command within the limits, else its error result.

    Pure (no state): what a server calls before proposing; ``apply`` calls it too, so an
    invalid command that reached the log anyway is answered with the same error."""
    try:
        _check(op)
    except _Invalid as e:
        return error(e.code, str(e))
    return None


def is_read_only(op: Any) -> bool:
    """True for a well-formed op that changes nothing (it may be served by ``query``)."""
    if type(op) is list:
        return len(op) == 2 and op[0] == "get"
    if type(op) is not dict:
        return False
    name = op.get("op")
    if type(name) is not str:  # a list or a map: unhashable, and no operation
        return False
    if name in _READ_OPS:
        return True
    if name == "txn":
        branches = (op.get("success", []), op.get("failure", []))
        return all(type(b) is list and all(type(s) is dict and s.get("op") == "range" for s in b) for b in branches)
    return False


# --- the machine ---------------------------------------------------------------------


class KVStateMachine:
    """Implements ``consensus.core.statemachine.ReplicatedMachine`` (module docstring).

    State: ``hist`` maps each key with a past to its records ``[mod_revision,
    create_revision, version, value, lease]``, oldest first; a delete appends a tombstone
    ``[mod_revision, 0, 0, None, 0]``. ``data`` is the current value of every live key
    (what the legacy ``get`` reads). ``_index`` is every key of ``hist`` in key order.
    """

    __slots__ = ("data", "hist", "rev", "compact_rev", "now_ms", "next_lease", "leases", "lease_keys",
                 "_index", "_fresh", "_due", "_wrev", "_changed", "listener", "_events")
    name = "kv"

    def __init__(self) -> None:
        self.data: dict[Any, Any] = {}
        self.hist: dict[Any, list] = {}
        self.rev = 1
        self.compact_rev = 0
        self.now_ms = 0
        self.next_lease = 1
        self.leases: dict[int, list] = {}  # id -> [ttl_ms, expiry_ms]
        self.lease_keys: dict[int, set] = {}  # id -> live keys attached (derived)
        self._index: list[tuple] = []  # _ord(key) of every key in hist, sorted (see _sorted_index)
        self._fresh: list = []  # keys new to hist since _index was last merged (a put's O(1))
        # (revision, key) of each record written over an older one (or a tombstone), in
        # revision order: a compaction at `at` visits the keys of the entries <= at.
        self._due: deque = deque()
        self._wrev = 0
        self._changed = False
        # The change feed (not replicated state: never in the snapshot or the digest).
        # ``listener`` is set by the service layer (store.kv_watch.WatchHub); while it is
        # None, nothing is recorded. Each applied command that changes keys reports
        # ``listener.kv_events(revision, events)`` once, after the revision moved; an
        # event is ``(kind, key, record, prev)``: kind "PUT" or "DELETE", ``record`` the
        # key's new record ``(mod_revision, create_revision, version, value, lease)``
        # (a delete's is the tombstone ``(revision, 0, 0, None, 0)``), ``prev`` its
        # previous live record or None. ``restore`` keeps the listener and reports
        # ``listener.kv_restored(revision, compact_revision)`` (the revision jumped).
        self.listener: Any = None
        self._events: list = []

    # --- ReplicatedMachine ------------------------------------------------------------

    def apply(self, op: Any) -> Any:
        if type(op) is list and len(op) == 3 and op[0] == "put":  # the hot path: a legacy put
            key, value = op[1], op[2]
            if (type(key) is str and type(value) is str and 0 < len(key) <= MAX_KEY_BYTES
                    and len(key) + len(value) <= MAX_REQUEST_BYTES - 16 and key.isascii() and value.isascii()):
                self._wrev = self.rev + 1
                self._put_rec(key, value, 0)
                self._end()
                return None
        elif type(op) is list and len(op) == 2 and op[0] == "get":
            key = op[1]
            if type(key) is str and 0 < len(key) <= MAX_KEY_BYTES and key.isascii():
                return self.data.get(key)
        try:
            _check(op)
            if type(op) is list:
                return self._legacy(op)
            return self._dispatch(op)
        except _Invalid as e:
            return self._fail(e)

    def query(self, op: Any) -> Any:
        """Read-only operations (lease reads and serializable reads); anything else is an
        ``InvalidRequest`` and changes nothing."""
        if not is_read_only(op):
            return error(INVALID_REQUEST, "not a read-only operation")
        return self.apply(op)

    @staticmethod
    def read_key(op: Any) -> Any | None:
        """Legacy ``get``: its key; every etcd-style read: ``ALL_KEYS``; writes: None."""
        if not is_read_only(op) or validate(op) is not None:
            return None
        if type(op) is list:
            return _canon(op[1])
        return ALL_KEYS

    @staticmethod
    def keys_of(op: Any) -> list:
        """Keys a command may write (the sequencer's history table, paper §3.5)."""
        if type(op) is list:
            if len(op) >= 2 and type(op[0]) is str and op[0] in _WRITE_LEGACY and type(op[1]) in (str, bytes, int):
                return [_canon(op[1])]
            return []
        if type(op) is not dict or is_read_only(op) or validate(op) is not None:
            return []
        name = op["op"]
        if name in ("put", "delete_range"):
            ops = [op]
        elif name == "txn":
            ops = [s for b in ("success", "failure") for s in op.get(b, []) if s["op"] != "range"]
        elif name in ("lease_revoke", "lease_expire"):
            return [ALL_KEYS]
        else:
            return []
        keys = []
        for s in ops:
            if s["op"] == "delete_range" and (s.get("prefix") or s.get("range_end") is not None):
                return [ALL_KEYS]
            k = _canon(s["key"])
            if k not in keys:
                keys.append(k)
        return keys

    def snapshot(self) -> bytes:
        hist = self.hist
        return msgpack.packb({
            "format": _SNAPSHOT_FORMAT,
            "revision": self.rev,
            "compact_revision": self.compact_rev,
            "now_ms": self.now_ms,
            "next_lease": self.next_lease,
            "keys": [[e[2], hist[e[2]]] for e in self._sorted_index()],
            "leases": [[i, *self.leases[i]] for i in sorted(self.leases)],
        }, use_bin_type=True)

    def restore(self, data: bytes) -> None:
        state = msgpack.unpackb(data, raw=False, strict_map_key=False)
        listener = self.listener
        self.__init__()
        try:
            self._restore(state)
        finally:
            self.listener = listener
        if listener is not None:
            try:
                listener.kv_restored(self.rev, self.compact_rev)
            except Exception:  # the feed never touches the replicated state
                _log.exception("kv change-feed listener failed on restore; detaching it")
                self.listener = None

    def _restore(self, state: Any) -> None:
        if type(state) is list:  # format 1: sorted [key, value] pairs, no history
            for k, v in state:
                self._begin()
                self._put_rec(k, v, 0)
                self._end()
            return
        if state.get("format") != _SNAPSHOT_FORMAT:
            raise ValueError(f"unknown kv snapshot format {state.get('format')!r}")
        self.rev = state["revision"]
        self.compact_rev = state["compact_revision"]
        self.now_ms = state["now_ms"]
        self.next_lease = state["next_lease"]
        for i, ttl, expiry in state["leases"]:
            self.leases[i] = [ttl, expiry]
            self.lease_keys[i] = set()
        due = []
        for key, recs in state["keys"]:
            self.hist[key] = recs = [tuple(r) for r in recs]
            self._index.append(_ord(key))
            last = recs[-1]
            # The queue as the writes left it: each record written over an older one
            # (all above the compaction point; a key never starts with a tombstone).
            due.extend((r[0], key) for r in recs[1:])
            if last[1]:
                self.data[key] = last[3]
                if last[4]:
                    self.lease_keys[last[4]].add(key)
        self._index.sort()
        due.sort(key=_mod)  # stable: the order within a revision does not matter
        self._due.extend(due)

    def digest(self) -> str:
        return hashlib.sha256(self.snapshot()).hexdigest()[:16]

    # --- helpers for the runtime (pure) -----------------------------------------------

    def expiry_due(self, now_ms: int) -> bool:
        """Would ``{"op": "lease_expire", "now_ms": now_ms}`` expire a lease?"""
        now = max(self.now_ms, now_ms)
        return any(lease[1] <= now for lease in self.leases.values())

    def _sorted_index(self) -> list:
        """``_index`` with the keys new since the last merge: an appended run sorted in,
        O(k log k + n) (timsort merges the two runs). The same list whatever the order
        the keys came in, so replicas and snapshots agree."""
        if self._fresh:
            fresh, self._fresh = self._fresh, []
            self._index.extend(_ord(k) for k in fresh)
            self._index.sort()
        return self._index

    # --- writes: one revision per command ---------------------------------------------

    def _begin(self) -> None:
        self._wrev = self.rev + 1
        self._changed = False
        if self._events:
            self._events = []

    def _end(self) -> None:
        if self._changed:
            self.rev = self._wrev
            self._changed = False
            if self.rev - self.compact_rev >= HISTORY_RETAIN + COMPACT_STEP:
                self._compact(self.rev - HISTORY_RETAIN)
            if self._events:
                events, self._events = self._events, []
                listener = self.listener
                if listener is not None:
                    try:
                        listener.kv_events(self.rev, events)
                    except Exception:  # the feed never touches the replicated state
                        _log.exception("kv change-feed listener failed; detaching it")
                        self.listener = None

    def _fail(self, e: _Invalid) -> dict:
        if e.code == COMPACTED:
            e.extra["compact_revision"] = self.compact_rev
        return error(e.code, str(e), **e.extra)

    def _put_rec(self, key: Any, value: Any, lease: int) -> list | None:
        """Write ``key`` at the pending revision; the previous live record (or None)."""
        w = self._wrev
        recs = self.hist.get(key)
        prev = None
        if recs is None:
            self.hist[key] = [(w, w, 1, value, lease)]
            self._fresh.append(key)  # merged into _index when a read or compaction needs it
        else:
            last = recs[-1]
            if last[1]:
                prev = last
                new = (w, last[1], last[2] + 1, value, lease)
                if last[4] and last[4] != lease:
                    self._detach(last[4], key)
            else:
                new = (w, w, 1, value, lease)
            if last[0] == w:
                recs[-1] = new
            else:
                recs.append(new)
                self._due.append((w, key))
        if lease and (prev is None or prev[4] != lease):
            self.lease_keys[lease].add(key)
        self.data[key] = value
        self._changed = True
        if self.listener is not None:
            self._events.append(("PUT", key, self.hist[key][-1], prev))
        return prev

    def _del_rec(self, key: Any) -> list | None:
        """Delete ``key`` at the pending revision; its last live record (None: absent)."""
        recs = self.hist.get(key)
        if recs is None or not recs[-1][1]:
            return None
        last = recs[-1]
        tomb = (self._wrev, 0, 0, None, 0)
        if last[0] == self._wrev:
            recs[-1] = tomb
        else:
            recs.append(tomb)
        self._due.append((self._wrev, key))
        if last[4]:
            self._detach(last[4], key)
        del self.data[key]
        self._changed = True
        if self.listener is not None:
            self._events.append(("DELETE", key, tomb, last))
        return last

    def _detach(self, lease: int, key: Any) -> None:
        keys = self.lease_keys.get(lease)
        if keys is not None:
            keys.discard(key)

    def _compact(self, at: int) -> None:
        """Forget every record not needed to read at revision ``at`` or later: the keys
        of the queued writes at or below ``at`` (any other key has nothing to drop)."""
        hist = self.hist
        due = self._due
        gone = set()
        while due and due[0][0] <= at:  # bounded by the queue
            key = due.popleft()[1]
            recs = hist.get(key)
            if recs is None:
                continue  # dropped by an earlier entry of this pass
            i = bisect_right(recs, at, key=_mod)
            if i == 0:
                continue  # an earlier entry of this pass dropped everything <= at
            keep = i - 1 if recs[i - 1][1] else i
            if keep:
                del recs[:keep]
            if not recs:
                del hist[key]
                gone.add(key)
        if gone:
            self._index = [e for e in self._sorted_index() if e[2] not in gone]
        self.compact_rev = at

    # --- reads ------------------------------------------------------------------------

    def _at(self, key: Any, rev: int) -> list | None:
        """The live record of ``key`` at revision ``rev`` (0: now), or None."""
        recs = self.hist.get(key)
        if recs is None:
            return None
        if rev == 0:
            rec = recs[-1]
        else:
            i = bisect_right(recs, rev, key=_mod)
            if i == 0:
                return None
            rec = recs[i - 1]
        return rec if rec[1] else None

    def _check_rev(self, rev: int) -> None:
        if rev:
            if rev > self.rev:
                raise _Invalid(INVALID_REQUEST, f"revision {rev} is a future revision (current {self.rev})")
            if rev < self.compact_rev:
                raise _Invalid(COMPACTED, f"revision {rev} has been compacted (compacted at {self.compact_rev})")

    def _select(self, op: dict, rev: int) -> list:
        """[(key, record)] matching the key/range_end/prefix of ``op`` at ``rev``, in key order."""
        key = _canon(op["key"])
        end = op.get("range_end")
        if op.get("prefix"):
            pe = _prefix_end(_kbytes(key))
            lo, hi = _bound(key), (None if pe is None else (1, pe))
        elif end is None:
            rec = self._at(key, rev)
            return [] if rec is None else [(key, rec)]
        else:
            lo, hi = _bound(key), _end_bound(end)
        index = self._sorted_index()
        i = bisect_left(index, lo)
        j = len(index) if hi is None else bisect_left(index, hi)
        out = []
        for e in index[i:j]:
            rec = self._at(e[2], rev)
            if rec is not None:
                out.append((e[2], rec))
        return out

    @staticmethod
    def _kv(key: Any, rec: list, keys_only: bool = False) -> dict:
        kv = {"key": key, "create_revision": rec[1], "mod_revision": rec[0], "version": rec[2], "lease": rec[4]}
        if not keys_only:
            kv["value"] = rec[3]
        return kv

    # --- the etcd-style ops -----------------------------------------------------------

    def _dispatch(self, op: dict) -> dict:
        name = op["op"]
        if name in ("put", "delete_range"):
            self._precheck(op)
            self._begin()
            res = self._do(op)
            self._end()
            res["revision"] = self.rev
            return res
        if name == "range":
            self._precheck(op)
            res = self._do(op)
            res["revision"] = self.rev
            return res
        return getattr(self, "_op_" + name)(op)

    def _precheck(self, op: dict) -> None:
        """The state-dependent checks of a put / range / delete_range, before any write."""
        name = op["op"]
        if name == "put":
            lease = op.get("lease", 0)
            if lease and not self._live(lease):
                raise _Invalid(LEASE_NOT_FOUND, f"lease {lease} not found", id=lease)
            if op.get("ignore_value") or op.get("ignore_lease"):
                if _canon(op["key"]) not in self.data:
                    raise _Invalid(INVALID_REQUEST, "key not found (ignore_value / ignore_lease need an existing key)")
        elif name == "range":
            self._check_rev(op.get("revision", 0))

    def _live(self, lease: int) -> bool:
        entry = self.leases.get(lease)
        return entry is not None and entry[1] > self.now_ms

    def _do(self, op: dict) -> dict:
        """Run a checked put / range / delete_range (inside ``_begin``/``_end`` for writes)."""
        name = op["op"]
        if name == "put":
            key = _canon(op["key"])
            cur = self.hist[key][-1] if key in self.data else None
            value = cur[3] if op.get("ignore_value") else op["value"]
            lease = cur[4] if op.get("ignore_lease") else op.get("lease", 0)
            prev = self._put_rec(key, value, lease)
            res: dict = {"ok": True, "revision": 0}
            if op.get("prev_kv"):
                res["prev_kv"] = None if prev is None else self._kv(key, prev)
            return res
        if name == "range":
            rev = op.get("revision", 0)
            found = self._select(op, rev)
            count = len(found)
            limit = op.get("limit", 0)
            if op.get("count_only"):
                return {"ok": True, "revision": 0, "kvs": [], "count": count, "more": False}
            if limit and count > limit:
                found = found[:limit]
            keys_only = op.get("keys_only", False)
            return {"ok": True, "revision": 0, "kvs": [self._kv(k, r, keys_only) for k, r in found], "count": count,
                    "more": len(found) < count}
        # delete_range
        found = self._select(op, 0)
        for k, _ in found:
            self._del_rec(k)
        res = {"ok": True, "revision": 0, "deleted": len(found)}
        if op.get("prev_kv"):
            res["prev_kvs"] = [self._kv(k, r) for k, r in found]
        return res

    def _compare(self, c: dict) -> bool:
        target = _CMP_TARGETS[c["target"].lower()]
        result = _CMP_RESULTS[c["result"].lower()]
        key = _canon(c["key"])
        rec = self._at(key, 0)
        want = c[target]
        if target == "value":
            if rec is None:
                return False  # etcd: a value compare on a missing key always fails
            have = rec[3]
            if type(have) is bytes or type(want) is bytes:
                if type(have) not in (str, bytes) or type(want) not in (str, bytes):
                    return result == "!="
                have, want = _kbytes(have), _kbytes(want)
            elif (type(have) is str) != (type(want) is str):
                return result == "!="
        else:
            have = 0 if rec is None else rec[{"version": 2, "create_revision": 1, "mod_revision": 0, "lease": 4}[target]]
        try:
            if result == "=":
                return have == want
            if result == "!=":
                return have != want
            if result == "<":
                return have < want
            return have > want
        except TypeError:  # values restored from a format-1 snapshot may be of any type
            return result == "!="

    def _op_txn(self, op: dict) -> dict:
        ok = all(self._compare(c) for c in op.get("compare", []))
        branch = op.get("success" if ok else "failure", [])
        for sub in branch:
            self._precheck(sub)
        self._begin()
        responses = [self._do(sub) for sub in branch]
        self._end()
        for r in responses:
            r["revision"] = self.rev
        return {"ok": True, "revision": self.rev, "succeeded": ok, "responses": responses}

    def _op_compact(self, op: dict) -> dict:
        at = op["revision"]
        if at > self.rev:
            raise _Invalid(INVALID_REQUEST, f"revision {at} is a future revision (current {self.rev})")
        if at <= self.compact_rev:
            raise _Invalid(COMPACTED, f"revision {at} has been compacted (compacted at {self.compact_rev})")
        self._compact(at)
        return {"ok": True, "revision": self.rev, "compact_revision": at}

    def _op_status(self, op: dict) -> dict:
        return {"ok": True, "revision": self.rev, "compact_revision": self.compact_rev, "keys": len(self.data),
                "leases": len(self.leases), "now_ms": self.now_ms}

    # --- leases -----------------------------------------------------------------------

    def _tick(self, now_ms: int) -> int:
        if now_ms > self.now_ms:
            self.now_ms = now_ms
        return self.now_ms

    def _op_lease_grant(self, op: dict) -> dict:
        lease = op.get("id", 0)
        if lease and lease in self.leases:
            raise _Invalid(INVALID_REQUEST, f"lease {lease} already exists")
        now = max(self.now_ms, op["now_ms"])  # the stamp sets the expiry, not the machine's time
        if not lease:
            lease = self.next_lease
            while lease in self.leases:
                lease += 1
            if lease > _ID_MAX:
                raise _Invalid(INVALID_REQUEST, "no lease id left")
            self.next_lease = lease + 1
        ttl = op["ttl_ms"]
        self.leases[lease] = [ttl, now + ttl]
        self.lease_keys[lease] = set()
        return {"ok": True, "revision": self.rev, "id": lease, "ttl_ms": ttl}

    def _op_lease_keepalive(self, op: dict) -> dict:
        lease = op["id"]
        now = max(self.now_ms, op["now_ms"])
        entry = self.leases.get(lease)
        if entry is None or entry[1] <= now:
            raise _Invalid(LEASE_NOT_FOUND, f"lease {lease} not found", id=lease)
        entry[1] = now + entry[0]
        return {"ok": True, "revision": self.rev, "id": lease, "ttl_ms": entry[0]}

    def _revoke(self, leases: list) -> int:
        """Delete the keys of ``leases`` (in key order) in one revision; drop the leases."""
        keys = sorted((k for i in leases for k in self.lease_keys[i]), key=_ord)
        self._begin()
        for k in keys:
            self._del_rec(k)
        self._end()
        for i in leases:
            del self.leases[i]
            del self.lease_keys[i]
        return len(keys)

    def _op_lease_revoke(self, op: dict) -> dict:
        lease = op["id"]
        if lease not in self.leases:
            raise _Invalid(LEASE_NOT_FOUND, f"lease {lease} not found", id=lease)
        deleted = self._revoke([lease])
        return {"ok": True, "revision": self.rev, "deleted": deleted}

    def _op_lease_expire(self, op: dict) -> dict:
        now = self._tick(op["now_ms"])
        expired = sorted(i for i, entry in self.leases.items() if entry[1] <= now)
        deleted = self._revoke(expired) if expired else 0
        return {"ok": True, "revision": self.rev, "expired": expired, "deleted": deleted}

    def _op_lease_extend_all(self, op: dict) -> dict:
        now = self._tick(op["now_ms"])
        for entry in self.leases.values():
            entry[1] = now + entry[0]
        return {"ok": True, "revision": self.rev, "extended": len(self.leases)}

    def _op_lease_timetolive(self, op: dict) -> dict:
        lease = op["id"]
        entry = self.leases.get(lease)
        if entry is None:
            raise _Invalid(LEASE_NOT_FOUND, f"lease {lease} not found", id=lease)
        now = max(self.now_ms, op.get("now_ms", 0))
        res = {"ok": True, "revision": self.rev, "id": lease, "ttl_ms": max(0, entry[1] - now),
               "granted_ttl_ms": entry[0]}
        if op.get("keys"):
            res["keys"] = sorted(self.lease_keys[lease], key=_ord)
        return res

    def _op_lease_leases(self, op: dict) -> dict:
        return {"ok": True, "revision": self.rev, "leases": sorted(self.leases)}

    # --- legacy list ops --------------------------------------------------------------

    def _legacy(self, op: list) -> Any:
        name = op[0]
        key = _canon(op[1])
        data = self.data
        if name == "get":
            return data.get(key)
        if name == "put":
            self._begin()
            self._put_rec(key, op[2], 0)
            self._end()
            return None
        if name == "cas":
            if data.get(key) != op[2]:
                return False
            self._begin()
            self._put_rec(key, op[3], 0)
            self._end()
            return True
        if name == "append":
            value = data.get(key, "")
            if type(value) is not str:
                raise _Invalid(INVALID_REQUEST, "append needs string values")
            value += op[2]
            _check_value(value)
            self._begin()
            self._put_rec(key, value, 0)
            self._end()
            return value
        # delete
        self._begin()
        existed = self._del_rec(key) is not None
        self._end()
        return existed
