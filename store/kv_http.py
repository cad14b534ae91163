"""The key-value machine's HTTP API (aiohttp), shaped like etcd's v3 JSON gateway.

Served by every KV replica beside its binary client port: ``cellar serve --http
HOST:PORT`` (``--machine kv``, the default). Every endpoint is a ``POST`` whose body
is one JSON object (an empty body is ``{}``); field names are etcd's::

    POST /v3/kv/put            {key, value, lease, prev_kv, ignore_value, ignore_lease}
                               -> {header, prev_kv?}
    POST /v3/kv/range          {key, range_end, limit, revision, keys_only, count_only,
                                serializable, sort_order, sort_target, prefix*}
                               -> {header, kvs, more, count}
    POST /v3/kv/deleterange    {key, range_end, prev_kv, prefix*} -> {header, deleted, prev_kvs?}
    POST /v3/kv/txn            {compare: [...], success: [...], failure: [...]}
                               -> {header, succeeded, responses}
    POST /v3/kv/compaction     {revision, physical} -> {header, compact_revision*}
    POST /v3/lease/grant       {TTL (seconds), ID} -> {header, ID, TTL}
    POST /v3/lease/keepalive   {ID} -> {result: {header, ID, TTL}}
    POST /v3/lease/revoke      {ID} -> {header, deleted*}
    POST /v3/lease/timetolive  {ID, keys} -> {header, ID, TTL, grantedTTL, keys?}
    POST /v3/lease/leases      {} -> {header, leases: [{ID}]}
    POST /v3/watch             {create_request: {key, range_end, prefix*, start_revision, prev_kv,
                                progress_notify, filters, watch_id}}
                               -> a stream of JSON objects, one per line (below)
    GET  /healthz              200 while the process serves
    GET  /readyz               200 while a majority of replicas is reachable, else 503
    GET  /metrics              Prometheus text

(``*``: Cellar's additions to etcd's messages.) The ``/v3/kv/lease/{revoke,timetolive,
leases}`` aliases etcd also serves work too. ``header`` is ``{cluster_id, member_id,
revision, raft_term}`` (``raft_term``: the protocol's view).

**Keys and values are base64** (standard alphabet), as in etcd's gateway, in requests
and answers. With ``?encoding=text`` they are plain JSON strings instead (UTF-8), both
ways; a stored key or value that is not valid UTF-8 is then answered in base64 and
its kv carries ``"key_encoding": "base64"`` / ``"value_encoding": "base64"``. A value
that decodes to valid UTF-8 is stored as text (what the binary client's ``get`` gives
back as ``str``), else as bytes. Values stored by the binary client as numbers or
booleans are answered as their JSON text. Integers (revisions, lease ids, TTLs) are
accepted as JSON integers or decimal strings (etcd's gateway sends int64 as strings)
and answered as JSON integers.

Commands go through the node like any client's (``Node.submit``, a pool of sessions):
writes are answered once applied, with their result; ``range`` is linearizable (the
sequencer's lease, else through the log) unless ``"serializable": true``, which reads
this replica's applied state (``Node.local_query``; possibly stale). A ``txn`` whose
branches only read is sent as a linearizable read.

Errors are ``{"error": MESSAGE, "code": GRPC_CODE, "message": MESSAGE, "reason":
CELLAR_CODE}`` (etcd's gateway shape, plus ``reason``) and change nothing:

=====  ====================  ==========================================================
HTTP   ``reason``            when
=====  ====================  ==========================================================
400    ``InvalidRequest``    malformed JSON, not an object, an unknown or unsupported
                             field, a wrong type (a number for a key, a float for a
                             revision), bad base64, anything ``store.kv_machine.validate``
                             refuses (checked before anything is proposed)
400    ``Compacted``         a read at a compacted revision (carries compact_revision)
404    ``LeaseNotFound``     a lease that does not exist or has expired
404    ``NotFound``          an unknown path (405 for a wrong method)
413    ``TooLarge``          a body over ``BODY_BYTES_MAX``, or a key, value or command
                             over the machine's limits (docs/kv.md)
429    ``TooManyWatchers``   ``POST /v3/watch`` beyond ``watchers_max`` watchers on this
                             replica (with ``Retry-After``)
503    ``Unavailable``       fewer than a majority reachable, the node stopping or busy,
                             or no answer within the call timeout; with ``Retry-After``
                             and ``definite``: false when a write may still take effect
=====  ====================  ==========================================================

Nothing is acknowledged that was not applied: a 200 for a write is sent only once the
node answered it with the machine's result.

**Watch** (``POST /v3/watch``, etcd's gateway stream; ``store/kv_watch.py`` does the
work): any replica serves it from its own applied log, without a majority. One
``create_request`` per POST; the answer is ``200`` and a chunked stream of JSON objects,
one per line::

    {"result": {"header": {..., "revision": R}, "watch_id": W, "created": true}}
    {"result": {"header": {..., "revision": r}, "watch_id": W,
                "events": [{"type": "PUT"|"DELETE", "kv": {...}, "prev_kv"?: {...}}]}}
    {"result": {"header": {..., "revision": r}, "watch_id": W}}            (progress)
    {"result": {"header": ..., "watch_id": W, "canceled": true, "cancel_reason": "...",
                "compact_revision"?: C}}                                   (then the end)

One events message per revision, every event of that revision in it (in key order),
revisions increasing; ``header.revision`` is that revision, so a client that resumes
from ``header.revision + 1`` of the last message it read misses nothing and sees
nothing twice (on any replica). From ``start_revision`` the history comes from the
machine's MVCC store, then live events, with no gap; 0 means from the next revision.
A DELETE's kv is ``{key, mod_revision}`` (other numbers 0, no value). ``filters``:
``NOPUT`` / ``NODELETE`` (names or etcd's numbers 0 / 1). ``progress_notify``: a
header-only message after ``progress_interval_s`` (10 s) without one, carrying the
revision the watcher has seen everything up to (only when it is not behind).
Cancellation: a ``start_revision`` at or below the compaction point ``C``
(``compact_revision: C``; watch from ``C + 1`` at the earliest), history compacted
under a watcher that is behind, a snapshot restore past what it can replay, the replica
stopping, or a client that reads nothing for ``write_stall_s`` (30 s; the stream is
then cut). A slow client never holds the node up: its queue is bounded
(``store.kv_watch``), past the bound it reads the history again. Closing the stream
cancels the watcher. A bad request gets the JSON error above before any streaming;
more than ``watchers_max`` (1024) watchers on a replica: ``429`` ``TooManyWatchers``
with ``Retry-After``; a stopping replica: ``503``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import os
import time
from typing import Any, Callable

from aiohttp import web

from consensus.runtime import clientwire
from store.kv_watch import NODELETE, NOPUT, TooManyWatchers, WatchCanceled, WatchHub


BODY_BYTES_MAX = 2 << 20  # a 1 MiB value is 1.4 MB of base64: the machine's own limit binds first
CALL_TIMEOUT_S = 5.0
SESSIONS_MAX = 1024
RETRY_AFTER_S = 1
WATCHERS_MAX = 1024  # watch streams one replica serves at once (429 beyond)
PROGRESS_INTERVAL_S = 10.0  # a progress_notify watcher idle this long gets a header-only message
WRITE_STALL_S = 30.0  # a watch stream whose client reads nothing this long is canceled

# gRPC codes (etcd's gateway puts them in "code")
G_INVALID, G_NOT_FOUND, G_OUT_OF_RANGE, G_UNAVAILABLE, G_INTERNAL = 3, 5, 11, 14, 13
G_RESOURCE_EXHAUSTED = 8
_MACHINE_ERRORS = {  # store.kv_machine error code -> (HTTP status, gRPC code)
    "InvalidRequest": (400, G_INVALID),
    "TooLarge": (413, G_INVALID),
    "Compacted": (400, G_OUT_OF_RANGE),
    "LeaseNotFound": (404, G_NOT_FOUND),
    "CompareFailed": (400, 9),
}
_INT64_MAX = (1 << 63) - 1
# etcd's enums, by name and by number
_CMP_RESULT = {"EQUAL": "=", "GREATER": ">", "LESS": "<", "NOT_EQUAL": "!=", 0: "=", 1: ">", 2: "<", 3: "!="}
_CMP_TARGET = {"VERSION": ("version", "version"), "CREATE": ("create", "create_revision"),
               "MOD": ("mod", "mod_revision"), "VALUE": ("value", "value"), "LEASE": ("lease", "lease")}
_CMP_TARGET.update({i: _CMP_TARGET[n] for i, n in enumerate(("VERSION", "CREATE", "MOD", "VALUE", "LEASE"))})

_counter = itertools.count()


SEND_BYTES = 256 << 10  # a watch stream is written in pieces of about this many bytes


def _approx(e: Any) -> int:
    """About the bytes of a watch event's key and values."""
    n = 64
    for kv in (e.kv, e.prev_kv):
        if kv is not None:
            for f in ("key", "value"):
                v = kv.get(f)
                n += len(v) if type(v) in (str, bytes) else 8
    return n


class _Stalled(Exception):
    """A watch stream's client read nothing for ``write_stall_s``."""


class APIError(Exception):
    def __init__(self, status: int, message: str, reason: str = "InvalidRequest", grpc: int = G_INVALID,
                 headers: dict | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.body: dict[str, Any] = {"error": message, "code": grpc, "message": message, "reason": reason, **extra}


def bad(message: str) -> APIError:
    return APIError(400, message)


def unavailable(message: str, definite: bool) -> APIError:
    return APIError(503, message, "Unavailable", G_UNAVAILABLE, headers={"Retry-After": str(RETRY_AFTER_S)},
                    definite=definite)


def _json(body: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(text=json.dumps(body, separators=(",", ":")), status=status,
                        content_type="application/json", headers=headers)


# --- request decoding -----------------------------------------------------------------


class Codec:
    """Keys and values between JSON and the machine: base64 (etcd) or ``text``."""

    def __init__(self, text: bool) -> None:
        self.text = text

    def decode(self, obj: dict, field: str, *, required: bool = False, default: Any = None) -> Any:
        """A key or value field: str when the bytes are valid UTF-8, else bytes."""
        if field not in obj or obj[field] is None:
            if required:
                raise bad(f"{field} is required")
            return default
        raw = obj[field]
        if type(raw) is not str:
            kind = "a string" if self.text else "a base64 string"
            raise bad(f"{field} must be {kind}, not {_json_type(raw)}")
        if self.text:
            return raw
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            try:
                data = base64.urlsafe_b64decode(raw)
            except (binascii.Error, ValueError):
                raise bad(f"{field} is not valid base64 (add ?encoding=text to send plain strings)") from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data

    def encode(self, value: Any) -> tuple[str, bool]:
        """(JSON string, is base64) for a stored key or value."""
        if type(value) is str:
            return (value, False) if self.text else (base64.b64encode(value.encode("utf-8")).decode(), True)
        if type(value) is bytes:
            if self.text:
                try:
                    return value.decode("utf-8"), False
                except UnicodeDecodeError:
                    pass
            return base64.b64encode(value).decode(), True
        return self.encode(json.dumps(value))  # a number or bool a binary client stored

    def kv(self, kv: dict) -> dict:
        out: dict[str, Any] = {}
        out["key"], b64 = self.encode(kv["key"])
        if self.text and b64:
            out["key_encoding"] = "base64"
        out.update(create_revision=kv["create_revision"], mod_revision=kv["mod_revision"], version=kv["version"],
                   lease=kv["lease"])
        if "value" in kv:
            out["value"], b64 = self.encode(kv["value"])
            if self.text and b64:
                out["value_encoding"] = "base64"
        return out


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number with a fraction", str: "a string",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def _fields(obj: Any, allowed: tuple, what: str) -> dict:
    if not isinstance(obj, dict):
        raise bad(f"{what} must be a JSON object, not {_json_type(obj)}")
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)} in {what} (known: {', '.join(allowed)})")
    return obj


def _int(obj: dict, field: str, default: int | None = 0, lo: int = 0, hi: int = _INT64_MAX) -> int:
    """An int64 field: a JSON integer or a decimal string (etcd's gateway sends strings)."""
    v = obj.get(field)
    if v is None:
        if default is None:
            raise bad(f"{field} is required")
        return default
    if type(v) is str and v.strip().lstrip("-").isdigit():
        v = int(v)
    if type(v) is not int:
        raise bad(f"{field} must be an integer, not {_json_type(v)}")
    if not lo <= v <= hi:
        raise bad(f"{field} must be in [{lo}, {hi}]")
    return v


def _bool(obj: dict, field: str) -> bool:
    v = obj.get(field, False)
    if v is None:
        return False
    if type(v) is not bool:
        raise bad(f"{field} must be true or false, not {_json_type(v)}")
    return v


def _enum(obj: dict, field: str, table: dict, default: Any) -> Any:
    v = obj.get(field)
    if v is None:
        return table[default]
    if type(v) is str:
        v = v.strip().upper()
        if v.isdigit():
            v = int(v)
    hit = table.get(v) if type(v) in (str, int) else None
    if hit is None:
        names = ", ".join(k for k in table if type(k) is str)
        raise bad(f"{field} must be one of {names}")
    return hit


_PUT = ("key", "value", "lease", "prev_kv", "ignore_value", "ignore_lease")
_RANGE = ("key", "range_end", "limit", "revision", "keys_only", "count_only", "serializable", "sort_order",
          "sort_target", "prefix")
_DELETE = ("key", "range_end", "prev_kv", "prefix")


def put_op(body: Any, c: Codec, what: str = "put request") -> dict:
    b = _fields(body, _PUT, what)
    op: dict[str, Any] = {"op": "put", "key": c.decode(b, "key", required=True)}
    if _bool(b, "ignore_value"):
        if b.get("value") not in (None, ""):
            raise bad("value is given with ignore_value")
        op["ignore_value"] = True
    else:
        op["value"] = c.decode(b, "value", default="")  # protobuf's default: empty bytes
    lease = _int(b, "lease")
    if lease:
        op["lease"] = lease
    for f in ("prev_kv", "ignore_lease"):
        if _bool(b, f):
            op[f] = True
    return op


def _span(b: dict, c: Codec, op: dict) -> None:
    op["key"] = c.decode(b, "key", required=True)
    end = c.decode(b, "range_end")
    if end not in (None, ""):
        op["range_end"] = end
    if _bool(b, "prefix"):
        op["prefix"] = True


def range_op(body: Any, c: Codec, what: str = "range request") -> tuple[dict, bool]:
    """(the machine's range op, serializable)."""
    b = _fields(body, _RANGE, what)
    op: dict[str, Any] = {"op": "range"}
    _span(b, c, op)
    for f in ("limit", "revision"):
        v = _int(b, f)
        if v:
            op[f] = v
    for f in ("keys_only", "count_only"):
        if _bool(b, f):
            op[f] = True
    order = b.get("sort_order")
    if order not in (None, 0, 1, "0", "1", "NONE", "ASCEND") or b.get("sort_target") not in (None, 0, "0", "KEY"):
        raise bad("sorting other than by key, ascending, is not supported (keys come in byte order)")
    return op, _bool(b, "serializable")


def delete_op(body: Any, c: Codec, what: str = "deleterange request") -> dict:
    b = _fields(body, _DELETE, what)
    op: dict[str, Any] = {"op": "delete_range"}
    _span(b, c, op)
    if _bool(b, "prev_kv"):
        op["prev_kv"] = True
    return op


def compare_op(body: Any, c: Codec) -> dict:
    b = _fields(body, ("key", "target", "result", "value", "version", "create_revision", "mod_revision", "lease",
                       "range_end"), "compare")
    if b.get("range_end") not in (None, ""):
        raise bad("a compare over a range (range_end) is not supported")
    target, operand = _enum(b, "target", _CMP_TARGET, "VERSION")
    others = [f for f in ("value", "version", "create_revision", "mod_revision", "lease") if f != operand and f in b]
    if others:
        raise bad(f"a {target} compare takes {operand}, not {', '.join(others)}")
    cmp: dict[str, Any] = {"key": c.decode(b, "key", required=True), "target": target,
                           "result": _enum(b, "result", _CMP_RESULT, "EQUAL")}
    if operand == "value":
        cmp["value"] = c.decode(b, "value", default="")
    else:
        cmp[operand] = _int(b, operand, 0, -_INT64_MAX - 1)  # protobuf omits zeros: absent is 0
    return cmp


_REQUESTS: dict[str, Callable] = {
    "request_put": put_op,
    "request_range": lambda b, c, what: range_op(b, c, what)[0],
    "request_delete_range": delete_op,
}


def txn_op(body: Any, c: Codec) -> dict:
    b = _fields(body, ("compare", "success", "failure"), "txn request")
    op: dict[str, Any] = {"op": "txn"}
    for field in ("compare", "success", "failure"):
        items = b.get(field) or []
        if type(items) is not list:
            raise bad(f"{field} must be a list, not {_json_type(items)}")
        out = []
        for i, item in enumerate(items):
            if field == "compare":
                out.append(compare_op(item, c))
                continue
            req = _fields(item, tuple(_REQUESTS) + ("request_txn",), f"{field}[{i}]")
            if len(req) != 1:
                raise bad(f"{field}[{i}] must hold exactly one of {', '.join(_REQUESTS)}")
            (name, inner), = req.items()
            if name == "request_txn":
                raise bad("nested txn (request_txn) is not supported")
            out.append(_REQUESTS[name](inner, c, f"{field}[{i}].{name}"))
        op[field] = out
    return op


def _read_only_txn(op: dict) -> bool:
    return all(s["op"] == "range" for s in op["success"] + op["failure"])


_WATCH_CREATE = ("key", "range_end", "start_revision", "progress_notify", "filters", "prev_kv", "watch_id",
                 "fragment", "prefix")
_FILTERS = {"NOPUT": NOPUT, "NODELETE": NODELETE, 0: NOPUT, 1: NODELETE}


def watch_op(body: Any, c: Codec) -> dict:
    """A watch create request: ``{key, range_end, prefix, start_revision, prev_kv,
    progress_notify, filters, watch_id}`` (``range_end``/``prefix`` as in a range)."""
    b = _fields(body, ("create_request", "cancel_request", "progress_request"), "watch request")
    if "cancel_request" in b or "progress_request" in b:
        raise bad("only create_request is supported: one watch per POST /v3/watch stream; close the stream "
                  "to cancel it, ask for progress_notify for progress")
    if b.get("create_request") is None:
        raise bad("create_request is required")
    cr = _fields(b["create_request"], _WATCH_CREATE, "create_request")
    key = c.decode(cr, "key", default="")
    end = c.decode(cr, "range_end")
    if end == "":
        end = None
    prefix = _bool(cr, "prefix")
    if prefix and end is not None:
        raise bad("give range_end or prefix, not both")
    if key == "" and end is None and not prefix:
        raise bad("key is required (an empty key needs range_end or prefix)")
    filters = cr.get("filters") or []
    if type(filters) is not list:
        raise bad(f"filters must be a list, not {_json_type(filters)}")
    fs = set()
    for f in filters:
        hit = _FILTERS.get(f.strip().upper() if type(f) is str else f) if type(f) in (str, int) else None
        if hit is None:
            raise bad("filters must be NOPUT or NODELETE")
        fs.add(hit)
    if _bool(cr, "fragment"):
        raise bad("fragment is not supported (each revision's events come in one message)")
    return {"key": key, "range_end": end, "prefix": prefix, "start_revision": _int(cr, "start_revision"),
            "prev_kv": _bool(cr, "prev_kv"), "progress_notify": _bool(cr, "progress_notify"),
            "filters": tuple(sorted(fs)), "watch_id": _int(cr, "watch_id")}


# --- the API --------------------------------------------------------------------------


class KVAPI:
    """One replica's HTTP API; ``await start(host, port)``, later ``await stop()``."""

    def __init__(self, node: Any, *, call_timeout_s: float = CALL_TIMEOUT_S,
                 body_bytes_max: int = BODY_BYTES_MAX, watchers_max: int = WATCHERS_MAX,
                 progress_interval_s: float = PROGRESS_INTERVAL_S, write_stall_s: float = WRITE_STALL_S,
                 **hub_options: Any) -> None:
        from store.machines import validator

        self.node = node
        self.call_timeout_s = call_timeout_s
        self.body_bytes_max = body_bytes_max
        self.progress_interval_s = progress_interval_s
        self.write_stall_s = write_stall_s
        # watch: served from this replica's applied log (store/kv_watch.py)
        self.hub = WatchHub(node.machine, watchers_max=watchers_max, **hub_options)
        self.validate = validator("kv")
        self._free: list[list] = []  # [client id, last seq] sessions not in use
        self._sessions = asyncio.Semaphore(SESSIONS_MAX)
        self._nonce = f"{os.getpid():x}.{time.time_ns() & 0xFFFFFFFFFF:x}"
        self.stats = {"calls": 0, "timeouts": 0, "refused_no_quorum": 0, "watch_stalled": 0}
        self.metrics = KVMetrics(self)
        self.app = web.Application(middlewares=[self._count, self._errors], client_max_size=body_bytes_max)
        r = self.app.router
        for path, handler in (("/v3/kv/put", self.put), ("/v3/kv/range", self.range),
                              ("/v3/kv/deleterange", self.deleterange), ("/v3/kv/txn", self.txn),
                              ("/v3/kv/compaction", self.compaction), ("/v3/lease/grant", self.lease_grant),
                              ("/v3/lease/keepalive", self.lease_keepalive), ("/v3/lease/revoke", self.lease_revoke),
                              ("/v3/lease/timetolive", self.lease_timetolive), ("/v3/lease/leases", self.lease_leases),
                              ("/v3/kv/lease/revoke", self.lease_revoke),
                              ("/v3/kv/lease/timetolive", self.lease_timetolive),
                              ("/v3/kv/lease/leases", self.lease_leases)):
            r.add_post(path, handler)
        r.add_post("/v3/watch", self.watch)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics_text)
        self._runner: web.AppRunner | None = None
        self._watchdog_task: asyncio.Future | None = None
        self._writing: dict[int, tuple] = {}  # watch writes in progress: id(resp) -> (since, watcher, request)
        self._stalled: set[int] = set()

    async def start(self, host: str, port: int, ssl_context: Any = None) -> None:
        self._watchdog_task = asyncio.ensure_future(self._watchdog())
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5.0)  # streams end at hub.close
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, ssl_context=ssl_context).start()  # HTTPS with TLS on

    async def stop(self) -> None:
        self.hub.close("this replica is stopping; watch again on another replica")
        if self._watchdog_task is not None:
            self._watchdog_task.cancel()
            self._watchdog_task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- middlewares ------------------------------------------------------------------

    @web.middleware
    async def _count(self, request: web.Request, handler: Any) -> web.StreamResponse:
        t0 = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            resource = request.match_info.route.resource
            path = resource.canonical if resource is not None else "unmatched"
            self.metrics.request(path, request.method, status, time.perf_counter() - t0)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except APIError as e:
            return _json(e.body, e.status, e.headers)
        except web.HTTPRequestEntityTooLarge:
            return _json(self._too_large().body, 413)
        except web.HTTPException as e:  # aiohttp's own 404 / 405: the same JSON shape
            if e.status < 400:
                raise
            reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(e.status, "InvalidRequest")
            grpc = {404: 12}.get(e.status, G_INVALID)  # UNIMPLEMENTED for an unknown path
            return _json({"error": e.reason, "code": grpc, "message": e.reason, "reason": reason}, e.status)

    def _too_large(self) -> APIError:
        return APIError(413, f"body larger than {self.body_bytes_max} bytes", "TooLarge")

    # --- plumbing ---------------------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        if request.content_length is not None and request.content_length > self.body_bytes_max:
            raise self._too_large()
        chunks: list[bytes] = []
        size = 0
        while True:  # StreamReader.read(n) answers what has arrived so far: read to the end
            chunk = await request.content.read(self.body_bytes_max + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > self.body_bytes_max:
                raise self._too_large()
        raw = b"".join(chunks)
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"body is not valid JSON: {e}") from None
        except RecursionError:  # json's decoder recurses per level: a 500 before
            raise bad("body is nested too deep") from None

    @staticmethod
    def _codec(request: web.Request) -> Codec:
        enc = request.query.get("encoding", "base64")
        if enc not in ("base64", "text"):
            raise bad("encoding must be base64 or text")
        return Codec(enc == "text")

    def _header(self, revision: int) -> dict:
        node = self.node
        return {"cluster_id": node.cfg.cluster_id, "member_id": node.cfg.node_id, "revision": revision,
                "raft_term": getattr(node.replica, "view", 0)}

    def _check(self, op: dict) -> None:
        """The machine's own validation (types, sizes), before anything is proposed."""
        err = self.validate(op)
        if err is not None:
            raise self._machine_error(err)

    @staticmethod
    def _machine_error(result: dict) -> APIError:
        code = result.get("code")
        status, grpc = _MACHINE_ERRORS.get(code, (500, G_INTERNAL))
        extra = {k: v for k, v in result.items() if k in ("compact_revision", "id")}
        return APIError(status, str(result.get("error")), str(code), grpc, **extra)

    def _serving(self) -> None:
        node = self.node
        if node._down:
            raise unavailable("this replica is stopping", True)
        if node.peers_reachable() < node.quorum:
            self.stats["refused_no_quorum"] += 1
            raise unavailable(f"this replica reaches {node.peers_reachable()} of {len(node.cfg.peers)} replicas, "
                              f"fewer than a majority ({node.quorum}); try another replica", True)

    async def call(self, op: dict, read: bool = False) -> dict:
        """``op`` through the node (a linearizable read with ``read``): its result, or
        an ``APIError``. Only a result the machine produced is returned."""
        self._check(op)
        self._serving()
        node = self.node
        kind = clientwire.READ if read else clientwire.CALL
        async with self._sessions:
            session = self._free.pop() if self._free else [f"http/{node.cfg.node_id}/{self._nonce}/"
                                                           f"{next(_counter)}", 0]
            session[1] += 1
            client, seq = session
            self.stats["calls"] += 1
            try:
                fut = node.submit(kind, client, seq, op)
                status, result = await asyncio.wait_for(fut, self.call_timeout_s)
            except asyncio.TimeoutError:
                node.forget(client, seq)
                self.stats["timeouts"] += 1
                self._free.append(session)
                raise unavailable(f"no answer within {self.call_timeout_s:g} s (no majority, or a view change); "
                                  + ("safe to retry" if read else "the command may still take effect"),
                                  read) from None
            except ConnectionError as e:
                raise unavailable(f"{e}; " + ("safe to retry" if read else "the command may still take effect"),
                                  read) from None
            self._free.append(session)
        if status != clientwire.OK:
            if isinstance(result, dict):
                raise self._machine_error(result)
            text = str(result)
            if text.startswith(clientwire.TOO_LARGE):
                raise APIError(413, text, "TooLarge")
            raise unavailable(f"replica answered: {text}", True)  # busy: nothing was proposed
        if not isinstance(result, dict):
            raise APIError(500, f"unexpected result {str(result)[:200]}", "Internal", G_INTERNAL)
        if not result.get("ok"):
            raise self._machine_error(result)
        return result

    def local(self, op: dict) -> dict:
        """A serializable read of this replica's applied state."""
        self._check(op)
        if self.node._down:
            raise unavailable("this replica is stopping", True)
        result = self.node.local_query(op)
        if not isinstance(result, dict) or not result.get("ok"):
            raise self._machine_error(result if isinstance(result, dict) else {"error": str(result)})
        return result

    # --- kv ---------------------------------------------------------------------------

    def _range_answer(self, c: Codec, r: dict) -> dict:
        return {"kvs": [c.kv(kv) for kv in r["kvs"]], "more": r["more"], "count": r["count"]}

    def _delete_answer(self, c: Codec, r: dict) -> dict:
        out: dict[str, Any] = {"deleted": r["deleted"]}
        if "prev_kvs" in r:
            out["prev_kvs"] = [c.kv(kv) for kv in r["prev_kvs"]]
        return out

    def _put_answer(self, c: Codec, r: dict) -> dict:
        return {"prev_kv": c.kv(r["prev_kv"])} if r.get("prev_kv") else {}

    async def put(self, request: web.Request) -> web.Response:
        c = self._codec(request)
        r = await self.call(put_op(await self._body(request), c))
        return _json({"header": self._header(r["revision"]), **self._put_answer(c, r)})

    async def range(self, request: web.Request) -> web.Response:
        c = self._codec(request)
        op, serializable = range_op(await self._body(request), c)
        r = self.local(op) if serializable else await self.call(op, read=True)
        return _json({"header": self._header(r["revision"]), **self._range_answer(c, r)})

    async def deleterange(self, request: web.Request) -> web.Response:
        c = self._codec(request)
        r = await self.call(delete_op(await self._body(request), c))
        return _json({"header": self._header(r["revision"]), **self._delete_answer(c, r)})

    async def txn(self, request: web.Request) -> web.Response:
        c = self._codec(request)
        op = txn_op(await self._body(request), c)
        r = await self.call(op, read=_read_only_txn(op))
        branch = op["success"] if r["succeeded"] else op["failure"]
        responses = []
        for sub, res in zip(branch, r["responses"]):
            h = {"header": self._header(res["revision"])}
            if sub["op"] == "put":
                responses.append({"response_put": {**h, **self._put_answer(c, res)}})
            elif sub["op"] == "range":
                responses.append({"response_range": {**h, **self._range_answer(c, res)}})
            else:
                responses.append({"response_delete_range": {**h, **self._delete_answer(c, res)}})
        return _json({"header": self._header(r["revision"]), "succeeded": r["succeeded"], "responses": responses})

    async def compaction(self, request: web.Request) -> web.Response:
        b = _fields(await self._body(request), ("revision", "physical"), "compaction request")
        _bool(b, "physical")  # accepted; compaction here is always complete when answered
        r = await self.call({"op": "compact", "revision": _int(b, "revision", None, 1)})
        return _json({"header": self._header(r["revision"]), "compact_revision": r["compact_revision"]})

    # --- leases -----------------------------------------------------------------------

    @staticmethod
    def _seconds(ms: int) -> int:
        return -(-ms // 1000)

    async def lease_grant(self, request: web.Request) -> web.Response:
        b = _fields(await self._body(request), ("TTL", "ID"), "lease grant request")
        ttl = _int(b, "TTL", None, 1, 9_000_000_000)
        op: dict[str, Any] = {"op": "lease_grant", "ttl_ms": ttl * 1000, "now_ms": int(time.time() * 1000)}
        lease = _int(b, "ID")
        if lease:
            op["id"] = lease
        r = await self.call(op)
        return _json({"header": self._header(r["revision"]), "ID": r["id"], "TTL": self._seconds(r["ttl_ms"])})

    async def _lease_id(self, request: web.Request, allowed: tuple, what: str) -> tuple[dict, int]:
        b = _fields(await self._body(request), allowed, what)
        return b, _int(b, "ID", None, 1)

    async def lease_keepalive(self, request: web.Request) -> web.Response:
        _, lease = await self._lease_id(request, ("ID",), "lease keepalive request")
        r = await self.call({"op": "lease_keepalive", "id": lease, "now_ms": int(time.time() * 1000)})
        return _json({"result": {"header": self._header(r["revision"]), "ID": r["id"],
                                 "TTL": self._seconds(r["ttl_ms"])}})

    async def lease_revoke(self, request: web.Request) -> web.Response:
        _, lease = await self._lease_id(request, ("ID",), "lease revoke request")
        r = await self.call({"op": "lease_revoke", "id": lease})
        return _json({"header": self._header(r["revision"]), "deleted": r["deleted"]})

    async def lease_timetolive(self, request: web.Request) -> web.Response:
        c = self._codec(request)
        b, lease = await self._lease_id(request, ("ID", "keys"), "lease timetolive request")
        op: dict[str, Any] = {"op": "lease_timetolive", "id": lease, "now_ms": int(time.time() * 1000)}
        if _bool(b, "keys"):
            op["keys"] = True
        r = await self.call(op, read=True)
        out = {"header": self._header(r["revision"]), "ID": r["id"], "TTL": r["ttl_ms"] // 1000,
               "grantedTTL": self._seconds(r["granted_ttl_ms"])}
        if "keys" in r:
            out["keys"] = [c.encode(k)[0] for k in r["keys"]]
        return _json(out)

    async def lease_leases(self, request: web.Request) -> web.Response:
        _fields(await self._body(request), (), "lease leases request")
        r = await self.call({"op": "lease_leases"}, read=True)
        return _json({"header": self._header(r["revision"]), "leases": [{"ID": i} for i in r["leases"]]})

    # --- watch ------------------------------------------------------------------------

    async def watch(self, request: web.Request) -> web.StreamResponse:
        """``POST /v3/watch``: one watcher, streamed as JSON objects, one per line."""
        c = self._codec(request)
        spec = watch_op(await self._body(request), c)
        span: dict[str, Any] = {"op": "range", "key": spec["key"]}
        if spec["range_end"] is not None:
            span["range_end"] = spec["range_end"]
        if spec["prefix"]:
            span["prefix"] = True
        self._check(span)  # key sizes and types, as a range
        if self.node._down:
            raise unavailable("this replica is stopping", True)
        try:
            w = self.hub.watch(spec["key"], spec["range_end"], prefix=spec["prefix"],
                               start_revision=spec["start_revision"], prev_kv=spec["prev_kv"],
                               filters=spec["filters"])
        except TooManyWatchers as e:
            raise APIError(429, str(e), "TooManyWatchers", G_RESOURCE_EXHAUSTED,
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except WatchCanceled as e:
            raise unavailable(e.reason, True) from None
        wid = spec["watch_id"] or w.id
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await resp.prepare(request)
            await self._send(request, resp, w, [{"result": {"header": self._header(self.hub.revision),
                                                             "watch_id": wid, "created": True}}])
            idle_since = time.monotonic()
            tick = max(0.05, min(1.0, self.progress_interval_s))
            while True:
                try:
                    batches = await w.next(tick)
                except WatchCanceled as e:
                    msg: dict[str, Any] = {"header": self._header(self.hub.revision), "watch_id": wid,
                                           "canceled": True, "cancel_reason": e.reason}
                    if e.compact_revision:
                        msg["compact_revision"] = e.compact_revision
                    await self._send(request, resp, w, [{"result": msg}])
                    break
                if batches:
                    msgs: list = []
                    size = 0
                    for b in batches:  # written in pieces of about SEND_BYTES: a long history is never one blob
                        msgs.append({"result": {"header": self._header(b.revision), "watch_id": wid,
                                                "events": [self._event(c, e) for e in b.events]}})
                        size += sum(_approx(e) for e in b.events)
                        if size >= SEND_BYTES:
                            await self._send(request, resp, w, msgs)
                            msgs, size = [], 0
                    if msgs:
                        await self._send(request, resp, w, msgs)
                    idle_since = time.monotonic()
                    continue
                transport = request.transport
                if transport is None or transport.is_closing():
                    break  # the client went away
                if spec["progress_notify"] and time.monotonic() - idle_since >= self.progress_interval_s:
                    rev = w.progress_revision()
                    if rev is not None:
                        await self._send(request, resp, w, [{"result": {"header": self._header(rev),
                                                                         "watch_id": wid}}])
                        idle_since = time.monotonic()
        except _Stalled:
            pass
        except (ConnectionError, RuntimeError):  # the client went away mid-write
            pass
        finally:
            self.hub.cancel(w, "the stream was closed")
        return resp

    async def _send(self, request: web.Request, resp: web.StreamResponse, w: Any, msgs: list) -> None:
        """Write ``msgs`` (one JSON line each). A write still waiting for the client
        after ``write_stall_s`` is cut by ``_watchdog`` (no timer per write: a
        ``wait_for`` cost more than encoding the message)."""
        data = b"".join(json.dumps(m, separators=(",", ":")).encode() + b"\n" for m in msgs)
        key = id(resp)
        self._writing[key] = (time.monotonic(), w, request)
        try:
            await resp.write(data)
        finally:
            self._writing.pop(key, None)
            stalled = key in self._stalled
            self._stalled.discard(key)
        if stalled:
            raise _Stalled

    async def _watchdog(self) -> None:
        """Cut the watch streams whose client read nothing for ``write_stall_s``."""
        period = max(0.05, min(1.0, self.write_stall_s / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for key, (since, w, request) in list(self._writing.items()):
                if now - since >= self.write_stall_s and key not in self._stalled:
                    self._stalled.add(key)
                    self.stats["watch_stalled"] += 1
                    self.hub.cancel(w, f"the client read nothing for {self.write_stall_s:g} s")
                    if request.transport is not None:
                        request.transport.abort()

    @staticmethod
    def _event(c: Codec, e: Any) -> dict:
        out: dict[str, Any] = {"type": e.kind, "kv": c.kv(e.kv)}
        if e.prev_kv is not None:
            out["prev_kv"] = c.kv(e.prev_kv)
        return out

    # --- health -----------------------------------------------------------------------

    def ready(self) -> bool:
        node = self.node
        return not node._down and node.peers_reachable() >= node.quorum

    async def healthz(self, request: web.Request) -> web.Response:
        if self.node._down:
            return _json({"health": "false", "reason": "stopping"}, 503)
        return _json({"health": "true"})

    async def readyz(self, request: web.Request) -> web.Response:
        node = self.node
        st = node.replica.status()
        body = {"ready": self.ready(), "member_id": node.cfg.node_id, "reachable": node.peers_reachable(),
                "replicas": len(node.cfg.peers), "quorum": node.quorum, "view": st.get("view"),
                "sequencer": st.get("sequencer", st.get("leader"))}
        if body["ready"]:
            return _json(body)
        return _json(body, 503, {"Retry-After": str(RETRY_AFTER_S)})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})


# --- metrics --------------------------------------------------------------------------


class _NodeView:
    """What ``store.metrics.ReplicaCollector`` reads of a service (the KV machine has no
    config check, so ``ready`` is always true there; majority reachability is its own)."""

    ready = True

    def __init__(self, node: Any) -> None:
        self.node = node


class _KVCollector:
    def __init__(self, api: KVAPI) -> None:
        self.api = api

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        node = self.api.node
        rid = str(node.cfg.node_id)

        def fam(cls: Any, name: str, doc: str, value: float) -> Any:
            m = cls(name, doc, labels=["replica"])
            m.add_metric([rid], value)
            return m

        machine = node.machine
        if hasattr(machine, "rev"):
            yield fam(GaugeMetricFamily, "cellar_kv_revision", "The KV store's revision.", machine.rev)
            yield fam(GaugeMetricFamily, "cellar_kv_compact_revision", "The KV store's compaction point.",
                      machine.compact_rev)
            yield fam(GaugeMetricFamily, "cellar_kv_keys", "Live keys.", len(machine.data))
            yield fam(GaugeMetricFamily, "cellar_kv_leases", "Leases granted and not yet revoked or expired.",
                      len(machine.leases))
        yield fam(GaugeMetricFamily, "cellar_requests_waiting", "Client requests waiting for an answer (the node's "
                  "queue of commands in flight, HTTP and binary).", len(node._waiters))
        yield fam(GaugeMetricFamily, "cellar_backlog", "Commands the core holds not yet ordered or executed.",
                  getattr(node.replica, "backlog", 0))
        yield fam(GaugeMetricFamily, "cellar_client_connections", "Binary client connections open.",
                  len(node._clients))
        yield fam(CounterMetricFamily, "cellar_http_call_timeouts", "HTTP commands that got no answer in time.",
                  self.api.stats["timeouts"])
        hub = self.api.hub
        yield fam(GaugeMetricFamily, "cellar_watchers", "Watchers this replica serves.", len(hub.watchers))
        yield fam(CounterMetricFamily, "cellar_watchers_created", "Watchers created.", hub.stats["created"])
        yield fam(CounterMetricFamily, "cellar_watchers_compacted",
                  "Watchers canceled because the revisions they needed were compacted.", hub.stats["compacted"])
        yield fam(CounterMetricFamily, "cellar_watchers_refused", "Watch requests refused: too many watchers.",
                  hub.stats["refused"])
        yield fam(CounterMetricFamily, "cellar_watch_fallbacks",
                  "Times a slow watcher's queue overflowed and it went back to reading the history.",
                  hub.stats["fallbacks"])
        yield fam(CounterMetricFamily, "cellar_watch_stalled",
                  "Watch streams canceled because their client read nothing for the stall limit.",
                  self.api.stats["watch_stalled"])
        yield fam(CounterMetricFamily, "cellar_http_refused_no_quorum",
                  "HTTP commands refused because fewer than a majority was reachable.",
                  self.api.stats["refused_no_quorum"])


class KVMetrics:
    """One registry per API (never the process-global one)."""

    def __init__(self, api: KVAPI) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        from store.metrics import HTTP_BUCKETS_S, ReplicaCollector

        self.content_type = CONTENT_TYPE_LATEST
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ReplicaCollector(_NodeView(api.node)))  # type: ignore[arg-type]
        self.registry.register(_KVCollector(api))  # type: ignore[arg-type]
        self.http_requests = Counter("cellar_http_requests", "HTTP requests by route, method and status.",
                                     ["path", "method", "status"], registry=self.registry)
        self.http_seconds = Histogram("cellar_http_request_seconds", "HTTP request time by route.", ["path"],
                                      buckets=HTTP_BUCKETS_S, registry=self.registry)

    def request(self, path: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(path, method, str(status)).inc()
        self.http_seconds.labels(path).observe(seconds)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
