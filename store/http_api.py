"""The scheduler's HTTP API (aiohttp), served by every replica: JSON in, JSON out.

HiveD's inspect paths and response shapes (``scheduler_state.inspect``)::

    GET /v1/inspect/affinitygroups/                      AffinityGroupList
    GET /v1/inspect/affinitygroups/{name}                AffinityGroup
    GET /v1/inspect/clusterstatus                        ClusterStatus
    GET /v1/inspect/clusterstatus/physicalcluster        PhysicalClusterStatus
    GET /v1/inspect/clusterstatus/virtualclusters/       {vc: VirtualClusterStatus}
    GET /v1/inspect/clusterstatus/virtualclusters/{vc}   VirtualClusterStatus

Reads are linearizable (the sequencer's lease, else the log); add
``?consistency=serializable`` for this replica's local state (no log, possibly stale).

Cellar's own::

    POST   /v1/groups               allocate: body = HiveD's pod scheduling spec, or
                                    {"group": SPEC, "ttl_ms"?, "wait"?, "suggestedNodes"?}
                                    201 placed, 202 queued (waiting), 409 not placeable
                                    now with "wait": false, or the name is taken
    DELETE /v1/groups/{name}        release (or cancel a pending group); 404 unknown
    POST   /v1/batch                {"requests": [{"op": "allocate", ...POST /v1/groups
                                    body...} | {"op": "release", "group": NAME}, ...]}:
                                    {"results": [{"status", "body"}, ...]}, each what
                                    its own request would answer (its own command)
    PUT    /v1/nodes/{name}/health  {"healthy": bool}; 404 unknown node
    GET    /healthz                 200 while the process serves
    GET    /readyz                  200 once the config check passed and a majority is
                                    reachable, else 503; names the view and the sequencer
    GET    /v1/status               this replica: role, view, executed slot, digest,
                                    config hash, groups, leaf cells in use;
                                    ?invariants=1 also runs the invariant checker on
                                    this replica's state ("invariants": [violations])
    GET    /v1/events?after=P       the change feed: {"from", "events", "applied"}, the
                                    events of commands after position P this replica
                                    still keeps (every one from "from" on); with
                                    &wait_s=S, waits up to S s for the first one
                                    (long poll); &limit=N (default 1000)
    GET    /metrics                 Prometheus text (store/metrics.py)

Errors are HiveD's ``WebServerError`` shape plus the field at fault:
``{"code": 400, "message": "...", "field": "group.virtualCluster"}``. Bad input
(malformed JSON, an oversized body, a spec that does not parse, an unknown VC, leaf
cell type, pinned cell or node) is refused before anything is proposed: nothing enters
the log. A replica that cannot answer (no majority reachable, config check pending, a
call timing out) answers 503 with ``Retry-After`` and ``definite``: ``false`` only when
a write may still take effect. Writes are answered only once applied.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from scheduler_state.replicated import SHARED
from store.scheduler_service import BadCommand, FeedGap, SchedulerService, Unavailable

BODY_BYTES_MAX = 1 << 20
BATCH_REQUESTS_MAX = 256  # requests in one POST /v1/batch
RETRY_AFTER_S = 1
_SPEC_FIELDS = ("virtualCluster", "priority", "pinnedCellId", "leafCellType", "leafCellNumber", "affinityGroup",
                "suggestedNodes", "lazyPreemptionEnable", "gangReleaseEnable", "ignoreK8sSuggestedNodes", "name")


class HTTPError(Exception):
    def __init__(self, code: int, message: str, field: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.body: dict[str, Any] = {"code": code, "message": message}
        if field is not None:
            self.body["field"] = field
        self.body.update(extra)


def _json(body: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(text=json.dumps(body, separators=(",", ":")), status=status,
                        content_type="application/json", headers=headers)


def _spec_field(message: str) -> str:
    """The spec field a ``RequestError`` message starts with (``group`` if none)."""
    head = message.split(" ", 1)[0]
    for f in _SPEC_FIELDS:
        if head == f or head.startswith(f + ".") or head.startswith(f + "["):
            return f"group.{head}"
    return "group"


class SchedulerAPI:
    def __init__(self, service: SchedulerService, body_bytes_max: int = BODY_BYTES_MAX) -> None:
        self.service = service
        self.body_bytes_max = body_bytes_max
        self.app = web.Application(middlewares=[self._serve], client_max_size=body_bytes_max)
        r = self.app.router
        r.add_get("/v1/inspect/affinitygroups/", self.affinity_groups)
        r.add_get("/v1/inspect/affinitygroups/{name}", self.affinity_group)
        r.add_get("/v1/inspect/clusterstatus", self.cluster_status)
        r.add_get("/v1/inspect/clusterstatus/physicalcluster", self.physical_cluster)
        r.add_get("/v1/inspect/clusterstatus/virtualclusters/", self.virtual_clusters)
        r.add_get("/v1/inspect/clusterstatus/virtualclusters/{vc}", self.virtual_cluster)
        r.add_post("/v1/groups", self.allocate)
        r.add_delete("/v1/groups/{name}", self.release)
        r.add_post("/v1/batch", self.batch)
        r.add_put("/v1/nodes/{name}/health", self.node_health)
        r.add_post("/v1/reconfigure", self.reconfigure)
        r.add_post("/v1/leases/{name}/grant", self.lease_grant)
        r.add_post("/v1/leases/{name}/renew", self.lease_renew)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/v1/status", self.status)
        r.add_get("/v1/events", self.events)
        r.add_get("/metrics", self.metrics)
        __import__("store.extender_api", fromlist=["_"]).register_extender_routes(self)  # /v1/extender/*
        self._runner: web.AppRunner | None = None
        self._json_cache: dict[int, tuple[Any, bytes]] = {}

    async def start(self, host: str, port: int, ssl_context: Any = None) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, ssl_context=ssl_context).start()  # HTTPS with TLS on

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _serve(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Errors as JSON (``HTTPError``, ``Unavailable``, aiohttp's own 404 / 405 / 413),
        then ``cellar_http_requests_total`` by route template (never the raw path). One
        middleware, not two: one coroutine layer less on every request."""
        t0 = time.perf_counter()
        status = 500
        try:
            try:
                response = await handler(request)
            except HTTPError as e:
                response = _json(e.body, e.code)
            except BadCommand as e:  # nothing was proposed
                response = _json({"code": 400, "message": str(e), "field": "body"}, 400)
            except Unavailable as e:
                response = _json({"code": 503, "message": str(e), "definite": e.definite}, 503,
                                 headers={"Retry-After": str(RETRY_AFTER_S)})
            except web.HTTPRequestEntityTooLarge:
                response = _json({"code": 413, "message": f"body larger than {self.body_bytes_max} bytes",
                                  "field": "body"}, 413)
            except web.HTTPException as e:  # aiohttp's own 404 / 405: same JSON shape
                if e.status < 400:
                    status = e.status
                    raise
                response = _json({"code": e.status, "message": e.reason}, e.status)
            status = response.status
            return response
        finally:
            metrics = getattr(self.service, "metrics", None)
            if metrics is not None:
                resource = request.match_info.route.resource
                path = resource.canonical if resource is not None else "unmatched"
                metrics.request(path, request.method, status, time.perf_counter() - t0)

    # --- helpers -----------------------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        if request.content_length is not None and request.content_length > self.body_bytes_max:
            raise HTTPError(413, f"body larger than {self.body_bytes_max} bytes", "body")
        raw = bytearray()
        while True:  # read() returns what has arrived so far: loop to the end (bounded)
            chunk = await request.content.read(self.body_bytes_max + 1 - len(raw))
            if not chunk:
                break
            raw += chunk
            if len(raw) > self.body_bytes_max:
                raise HTTPError(413, f"body larger than {self.body_bytes_max} bytes", "body")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise HTTPError(400, f"body is not valid JSON: {e}", "body") from None
        except RecursionError:  # json's decoder recurses per level: a 500 before
            raise HTTPError(400, "body is nested too deep", "body") from None

    def _inner(self) -> Any:
        """The local scheduler (for checks against the config before proposing)."""
        inner = getattr(self.service.node.machine, "inner", None)
        if inner is None or not self.service.ready:
            raise Unavailable("this replica has not yet checked its config against the cluster's", True)
        return inner

    async def _read(self, request: web.Request, op: dict[str, Any]) -> Any:
        if op.get("op") == "inspect":  # may share the result of an earlier read of the same state
            op[SHARED] = True
        consistency = request.query.get("consistency", "linearizable")
        if consistency == "serializable":
            result = self.service.local(op)
        elif consistency == "linearizable":
            result = await self.service.call(op, read=True)
        else:
            raise HTTPError(400, "consistency must be linearizable or serializable", "consistency")
        return self._unwrap(result)

    @staticmethod
    def _unwrap(result: Any) -> Any:
        if not isinstance(result, dict):
            raise HTTPError(500, f"unexpected result {str(result)[:200]}")
        if result.get("ok"):
            return result.get("result", result)
        if result.get("uninitialized"):
            raise Unavailable(result.get("error", "not initialized"), True)
        raise HTTPError(404 if result.get("not_found") else 400, str(result.get("error")))

    def _inspect_json(self, body: Any) -> web.Response:
        """``body`` as JSON, serialized once per result object: a shared read
        (``scheduler_state.replicated``) hands every reader of the same state the same
        object, and a 1,024-node cluster status is megabytes of JSON."""
        cache = self._json_cache
        hit = cache.get(id(body))
        if hit is not None and hit[0] is body:
            data = hit[1]
        else:
            data = json.dumps(body, separators=(",", ":")).encode()
            if len(cache) >= 16:
                cache.clear()
            cache[id(body)] = (body, data)  # holds body, so its id is not reused meanwhile
        return web.Response(body=data, content_type="application/json")

    # --- inspect -----------------------------------------------------------------------

    async def affinity_groups(self, request: web.Request) -> web.Response:
        return self._inspect_json(await self._read(request, {"op": "inspect", "view": "affinitygroups"}))

    async def affinity_group(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return self._inspect_json(await self._read(request, {"op": "inspect", "view": "affinitygroup", "name": name}))

    async def cluster_status(self, request: web.Request) -> web.Response:
        return self._inspect_json(await self._read(request, {"op": "inspect", "view": "clusterstatus"}))

    async def physical_cluster(self, request: web.Request) -> web.Response:
        return self._inspect_json(await self._read(request, {"op": "inspect", "view": "physicalcluster"}))

    async def virtual_clusters(self, request: web.Request) -> web.Response:
        return self._inspect_json(await self._read(request, {"op": "inspect", "view": "virtualclusters"}))

    async def virtual_cluster(self, request: web.Request) -> web.Response:
        vc = request.match_info["vc"]
        if vc not in self._inner().cluster.vc_scopes:
            raise HTTPError(404, f"VC {vc} does not exist", "vc")
        return self._inspect_json(await self._read(request, {"op": "inspect", "view": "virtualcluster", "name": vc}))

    # --- writes --------------------------------------------------------------------------

    async def allocate(self, request: web.Request) -> web.Response:
        cmd = self._allocate_command(await self._body(request))
        status, body = self._allocate_answer(await self.service.call(cmd))
        return _json(body, status)

    def _allocate_command(self, body: Any, where: str = "") -> dict[str, Any]:
        """The ``allocate`` command for a request body, checked before anything is
        proposed (``HTTPError`` naming the field, prefixed with ``where``)."""
        from scheduler_state.requests import RequestError, parse_request

        if not isinstance(body, dict):
            raise HTTPError(400, "body must be a JSON object: a pod scheduling spec or {\"group\": SPEC, ...}",
                            where + "body" if where else "body")
        if "group" in body:
            spec, prefix = body["group"], "group"
            extra = {k: body[k] for k in ("ttl_ms", "wait", "suggestedNodes") if k in body}
            unknown = sorted(set(body) - {"group", "ttl_ms", "wait", "suggestedNodes"})
            if unknown:
                raise HTTPError(400, f"unknown field(s) {', '.join(unknown)}", where + unknown[0])
        else:
            spec, prefix, extra = body, "group", {}
        try:
            req = parse_request(spec, extra.get("suggestedNodes"))
        except RequestError as e:
            field = _spec_field(str(e))
            if str(e).startswith("suggestedNodes"):
                field = "suggestedNodes"
            raise HTTPError(400, str(e), where + (field if field != "group" else prefix)) from None
        inner = self._inner()
        cl = inner.cluster
        if req.vc not in cl.vc_scopes:
            raise HTTPError(400, f"VC {req.vc} does not exist", where + "group.virtualCluster")
        if req.leaf_type is not None and req.leaf_type not in cl.chains_by_leaf_type:
            raise HTTPError(400, f"leaf cell type {req.leaf_type} does not exist in the cluster",
                            where + "group.leafCellType")
        if req.pinned_id is not None and req.pinned_id not in cl.vc_pinned[req.vc]:
            raise HTTPError(400, f"VC {req.vc} does not have pinned cell {req.pinned_id}", where + "group.pinnedCellId")
        cmd: dict[str, Any] = {"op": "allocate", "group": spec}
        if "suggestedNodes" in extra:
            cmd["suggestedNodes"] = extra["suggestedNodes"]
        if "wait" in extra:
            if not isinstance(extra["wait"], bool):
                raise HTTPError(400, "wait must be true or false", where + "wait")
            cmd["wait"] = extra["wait"]
        if "ttl_ms" in extra:
            ttl = extra["ttl_ms"]
            if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= 10 * 365 * 86_400_000:
                raise HTTPError(400, "ttl_ms must be a positive integer (milliseconds)", where + "ttl_ms")
            cmd["ttl_ms"] = ttl
            cmd["now_ms"] = int(time.time() * 1000)  # stamped here, by the proposing replica
        return cmd

    @staticmethod
    def _allocate_answer(result: Any, where: str = "") -> tuple[int, Any]:
        """HTTP status and body for an ``allocate`` result (raises for 400/409/503)."""
        if not isinstance(result, dict):
            raise HTTPError(500, f"unexpected result {str(result)[:200]}")
        if result.get("ok"):
            return 201, result
        if result.get("waiting"):
            return (202 if result.get("queued") else 409), result
        message = str(result.get("error"))
        if result.get("uninitialized"):
            raise Unavailable(message, True)
        if "already" in message:
            raise HTTPError(409, message, where + "group.name")
        raise HTTPError(400, message, where + _spec_field(message))

    async def release(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        status, body = self._release_answer(await self.service.call({"op": "release", "group": name}))
        return _json(body, status)

    def _release_answer(self, result: Any, where: str = "") -> tuple[int, Any]:
        if isinstance(result, dict) and not result.get("ok") and "does not exist" in str(result.get("error")):
            raise HTTPError(404, str(result["error"]), where + "name")
        return 200, self._unwrap(result)

    async def batch(self, request: web.Request) -> web.Response:
        """``POST /v1/batch``: ``{"requests": [{"op": "allocate", ...body of POST
        /v1/groups...} | {"op": "release", "group": NAME}, ...]}`` (at most
        ``BATCH_REQUESTS_MAX``) -> ``{"results": [{"status": S, "body": B}, ...]}``, in
        order, each exactly what its own request would have answered. Each one is its
        own command with its own result (one that is refused, or fails, changes nothing
        and does not stop the others); the valid ones are proposed together, so they
        usually share a log entry. The answer comes once every one is answered."""
        body = await self._body(request)
        if not isinstance(body, dict) or set(body) != {"requests"} or not isinstance(body["requests"], list) \
                or not 1 <= len(body["requests"]) <= BATCH_REQUESTS_MAX:
            raise HTTPError(400, f"body must be {{\"requests\": [1..{BATCH_REQUESTS_MAX} requests]}}", "requests")
        self._inner()
        return _json({"results": await asyncio.gather(
            *(self._one(i, item) for i, item in enumerate(body["requests"])))})

    async def _one(self, i: int, item: Any) -> dict[str, Any]:
        where = f"requests[{i}]."
        try:
            if not isinstance(item, dict) or item.get("op") not in ("allocate", "release"):
                raise HTTPError(400, "a request must be {\"op\": \"allocate\", ...} or "
                                     "{\"op\": \"release\", \"group\": NAME}", where + "op")
            if item["op"] == "allocate":
                cmd = self._allocate_command({k: v for k, v in item.items() if k != "op"}, where)
                status, out = self._allocate_answer(await self.service.call(cmd), where)
            else:
                name = item.get("group")
                if not isinstance(name, str) or not name or set(item) != {"op", "group"}:
                    raise HTTPError(400, "a release is {\"op\": \"release\", \"group\": NAME}", where + "group")
                status, out = self._release_answer(await self.service.call({"op": "release", "group": name}), where)
        except HTTPError as e:
            status, out = e.code, e.body
        except Unavailable as e:
            status, out = 503, {"code": 503, "message": str(e), "definite": e.definite}
        return {"status": status, "body": out}

    async def node_health(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await self._body(request)
        if not isinstance(body, dict) or not isinstance(body.get("healthy"), bool):
            raise HTTPError(400, "body must be {\"healthy\": true|false}", "healthy")
        if name not in self._inner().cluster.node_leaves:
            raise HTTPError(404, f"node {name} is not in the config", "name")
        result = await self.service.call({"op": "set_node_health", "node": name, "healthy": body["healthy"]})
        return _json(self._unwrap(result))

    async def reconfigure(self, request: web.Request) -> web.Response:
        """Work-preserving reconfiguration through the log: ``{"config": YAML text or
        mapping}`` (HiveD's format), validated here before anything is proposed."""
        from scheduler_state.config import ConfigError, load_config

        body = await self._body(request)
        if not isinstance(body, dict) or set(body) != {"config"} or not isinstance(body["config"], (str, dict)):
            raise HTTPError(400, "body must be {\"config\": HiveD config as YAML text or a mapping}", "config")
        self._inner()
        try:
            load_config(body["config"])
        except ConfigError as e:
            raise HTTPError(400, f"config: {e}", "config") from None
        result = await self.service.call({"op": "reconfigure", "config": body["config"]})
        return _json(self._unwrap(result))

    async def _lease(self, request: web.Request, op: str) -> web.Response:
        name = request.match_info["name"]
        body = await self._body(request)
        ttl = body.get("ttl_ms") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"ttl_ms"}:
            raise HTTPError(400, "body must be {\"ttl_ms\": milliseconds}", "ttl_ms")
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= 10 * 365 * 86_400_000:
            raise HTTPError(400, "ttl_ms must be a positive integer (milliseconds)", "ttl_ms")
        self._inner()
        # now_ms is stamped here, by the proposing replica (module docstring of the service)
        result = await self.service.call({"op": op, "group": name, "ttl_ms": ttl, "now_ms": int(time.time() * 1000)})
        if isinstance(result, dict) and not result.get("ok") and "does not exist" in str(result.get("error")):
            raise HTTPError(404, str(result["error"]), "name")
        return _json(self._unwrap(result))

    async def lease_grant(self, request: web.Request) -> web.Response:
        """A lease on a group (allocated or waiting): released when it ends unrenewed."""
        return await self._lease(request, "lease_grant")

    async def lease_renew(self, request: web.Request) -> web.Response:
        return await self._lease(request, "lease_renew")

    # --- probes ----------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        node = self.service.node
        if node._down:
            raise Unavailable("stopping", True)
        return _json({"ok": True, "node": node.cfg.node_id})

    async def status(self, request: web.Request) -> web.Response:
        return _json(self.service.status(invariants=request.query.get("invariants") in ("1", "true")))

    async def events(self, request: web.Request) -> web.Response:
        def number(name: str, default: float, lo: float, hi: float) -> float:
            raw = request.query.get(name)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise HTTPError(400, f"{name} must be a number", name) from None
            if not lo <= value <= hi:
                raise HTTPError(400, f"{name} must be within {lo:g}..{hi:g}", name)
            return value

        after = int(number("after", 0, 0, 2**62))
        limit = int(number("limit", 1000, 1, 10_000))
        wait_s = number("wait_s", 0, 0, 60)
        service = self.service
        body = service.history(after, limit)
        if not body["events"] and wait_s > 0 and body["from"] is not None and after + 1 >= body["from"]:
            feed = service.subscribe()
            try:
                async with asyncio.timeout(wait_s):
                    await feed.__anext__()
            except (TimeoutError, FeedGap, StopAsyncIteration):
                pass  # nothing came, or the state was replaced: answer with what is kept
            finally:
                feed.close()
            body = service.history(after, limit)
        return _json(body)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.service.metrics.render(),
                            headers={"Content-Type": self.service.metrics.content_type})

    async def readyz(self, request: web.Request) -> web.Response:
        s = self.service
        node = s.node
        st = node.replica.status()
        body = {"ready": False, "node": node.cfg.node_id, "config_checked": s.ready,
                "reachable": node.peers_reachable(), "quorum": node.quorum, "view": st.get("view"),
                "sequencer": st.get("sequencer", st.get("leader"))}
        if s.ready and not node._down and node.peers_reachable() >= node.quorum:
            body["ready"] = True
            return _json(body)
        return _json(body, 503, headers={"Retry-After": str(RETRY_AFTER_S)})
