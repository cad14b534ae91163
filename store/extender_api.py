"""The Kubernetes scheduler extender endpoints of the scheduler's HTTP API.

HiveD runs as a K8s scheduler extender (``pkg/webserver/webserver.go`` and
``pkg/scheduler/scheduler.go`` in microsoft/hivedscheduler); Cellar serves the same
paths on every replica, with the decisions taken in the replicated log
(``scheduler_state.pods``)::

    POST /v1/extender/filter   ExtenderArgs -> ExtenderFilterResult
    POST /v1/extender/bind     ExtenderBindingArgs -> ExtenderBindingResult
    POST /v1/extender/preempt  ExtenderPreemptionArgs -> ExtenderPreemptionResult
    GET  /v1/inspect/pods/{uid}   Cellar's: one tracked pod (state, node, leaf cells,
                                  HiveD's bind annotations); 404 if not tracked

JSON field names are those the K8s scheduler sends and reads for the extender types
(Go's encoding of ``k8s.io/kubernetes/pkg/scheduler/api``): ``Pod``, ``Nodes``,
``NodeNames``, ``FailedNodes``, ``Error``, ``PodName``, ``PodNamespace``, ``PodUID``,
``Node``, ``NodeNameToVictims``, ``NodeNameToMetaVictims``, ``Pods``, ``UID``,
``NumPDBViolations``. As with Go's decoder, request keys match case-insensitively
(``nodenames`` works too); the Pod itself is a K8s ``v1.Pod`` (``metadata.uid``,
``metadata.name``, ``metadata.namespace``, ``metadata.annotations``). Its annotation
``hivedscheduler.microsoft.com/pod-scheduling-spec`` holds HiveD's spec (YAML).

- **filter** first reads ``what_if`` (the dry run: would the pod be placed, where, with
  which victims; no log slot) and proposes ``pod_schedule`` with ``NodeNames`` as the
  suggested nodes only when that changes the state (a new group placed, a slot taken, a
  pod joining a Preempting group); a pod that must wait is answered from the read. Placed:
  ``NodeNames: [node]`` (the pod is now Binding: its slot is taken). Needs preemption:
  ``FailedNodes`` with, per node holding victims, HiveD's reason ``node(N) is waiting
  for victim Pod(s) to be preempted: uid(ns/name), ...``. Must wait: ``FailedNodes:
  {"hivedscheduler": "Pod is waiting for preemptible or free resource to appear: ..."}``.
- **bind** proposes ``pod_bind`` (node and leaf cells recorded in the log): ``{"Error":
  ""}`` plus Cellar's ``Node``, ``LeafCellIsolation`` and ``Annotations`` (HiveD's
  ``pod-bind-info`` YAML and ``pod-leaf-cell-isolation``, the values HiveD writes on the
  pod at bind time).
- **preempt** proposes ``pod_preempt`` with the nodes of ``NodeNameToMetaVictims`` (or
  ``NodeNameToVictims``) as suggested nodes: ``NodeNameToMetaVictims`` with every pod
  of every victim group by node (HiveD's whole-group preemption); empty (null) when no
  preemption is needed or possible.

Errors: malformed JSON or a missing / ill-typed field or a spec that does not parse ->
400 ``{"code", "message", "field", "Error"}`` (``Error`` so that the K8s scheduler
reports the message), and nothing is proposed. A state conflict (pod already bound,
bind to another node, pod not binding) -> 409 (404 for a pod the scheduler does not
track). No majority -> 503 (``store.http_api``'s middleware).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from scheduler_state.pods import ANNOTATION_SPEC, parse_pod_spec
from scheduler_state.requests import RequestError
from store.http_api import HTTPError, _json

if TYPE_CHECKING:
    from store.http_api import SchedulerAPI

COMPONENT = "hivedscheduler"  # HiveD's si.ComponentName, the key of its wait reason in FailedNodes
SPEC_FIELD = f"Pod.metadata.annotations[{ANNOTATION_SPEC}]"
NODES_MAX = 100_000


def register_extender_routes(api: SchedulerAPI) -> ExtenderAPI:
    """Add the extender routes to ``api``'s aiohttp app (same middlewares, same service)."""
    ext = ExtenderAPI(api)
    r = api.app.router
    r.add_post("/v1/extender/filter", ext.filter)
    r.add_post("/v1/extender/bind", ext.bind)
    r.add_post("/v1/extender/preempt", ext.preempt)
    r.add_get("/v1/inspect/pods/{uid}", ext.pod)
    return ext


def _get(obj: dict[str, Any], key: str) -> Any:
    """Go's encoding/json field matching: the exact key, else a case-insensitive one."""
    if key in obj:
        return obj[key]
    low = key.lower()
    for k in sorted(obj):
        if isinstance(k, str) and k.lower() == low:
            return obj[k]
    return None


def _bad(message: str, field: str, code: int = 400) -> HTTPError:
    return HTTPError(code, message, field, Error=message)


class ExtenderAPI:
    def __init__(self, api: SchedulerAPI) -> None:
        self.api = api
        self.service = api.service

    # --- input ---------------------------------------------------------------------

    async def _args(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await self.api._body(request)
        except HTTPError as e:
            e.body.setdefault("Error", e.body.get("message"))
            raise
        if not isinstance(body, dict):
            raise _bad("body must be a JSON object", "body")
        return body

    def _pod(self, args: dict[str, Any]) -> tuple[dict[str, str], str, Any]:
        """(pod identity, spec text, parsed request) of ``args.Pod``, checked against the
        local config (unknown VC, leaf type, pinned cell: refused before proposing)."""
        pod = _get(args, "Pod")
        if not isinstance(pod, dict):
            raise _bad("Pod field should be a K8s Pod object", "Pod")
        meta = pod.get("metadata")
        if not isinstance(meta, dict):
            raise _bad("Pod.metadata must be an object", "Pod.metadata")
        ident = {}
        for key, default in (("uid", None), ("name", None), ("namespace", "default")):
            v = meta.get(key, default)
            if v is None and default is not None:
                v = default
            if not isinstance(v, str) or not v:
                raise _bad(f"Pod.metadata.{key} must be a non-empty string", f"Pod.metadata.{key}")
            ident[key] = v
        ann = meta.get("annotations")
        if ann is not None and not isinstance(ann, dict):
            raise _bad("Pod.metadata.annotations must be an object", "Pod.metadata.annotations")
        text = (ann or {}).get(ANNOTATION_SPEC)
        if not isinstance(text, str) or not text.strip():
            raise _bad(f"Pod annotation {ANNOTATION_SPEC}: Annotation does not exist or is empty", SPEC_FIELD)
        try:
            req, _ = parse_pod_spec(text, ident["namespace"], ident["name"])
        except RequestError as e:
            head = str(e).split(" ", 1)[0]
            field = SPEC_FIELD + ("." + head if head[:1].isalpha() and head[:1].islower() and head != "malformed"
                                  else "")
            raise _bad(f"Pod annotation {ANNOTATION_SPEC}: {e}", field) from None
        inner = self.api._inner()
        try:
            inner._candidates(req)  # read-only: unknown VC, leaf type, pinned cell, too large
        except RequestError as e:
            raise _bad(f"Pod annotation {ANNOTATION_SPEC}: {e}", SPEC_FIELD) from None
        return ident, text, req

    @staticmethod
    def _names(v: Any, field: str) -> list[str]:
        if not isinstance(v, list) or len(v) > NODES_MAX or not all(isinstance(n, str) and n for n in v):
            raise _bad(f"{field} must be a list of node names", field)
        return v

    def _node_names(self, args: dict[str, Any]) -> list[str]:
        names = _get(args, "NodeNames")
        if names is not None:
            return self._names(names, "NodeNames")
        nodes = _get(args, "Nodes")
        if nodes is None:
            return []  # HiveD's defaulting
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if not isinstance(items, list):
            raise _bad("Nodes must be a K8s NodeList ({\"items\": [...]})", "Nodes")
        out = []
        for i, n in enumerate(items):
            name = n.get("metadata", {}).get("name") if isinstance(n, dict) and isinstance(n.get("metadata"), dict) \
                else None
            if not isinstance(name, str) or not name:
                raise _bad(f"Nodes.items[{i}].metadata.name must be a non-empty string", f"Nodes.items[{i}]")
            out.append(name)
        return out

    @staticmethod
    def _conflict(result: Any) -> HTTPError:
        message = str(result.get("error")) if isinstance(result, dict) else f"unexpected result {str(result)[:200]}"
        if isinstance(result, dict) and result.get("uninitialized"):
            from store.scheduler_service import Unavailable

            raise Unavailable(message, True)
        code = 404 if isinstance(result, dict) and result.get("not_found") else 409
        return _bad(message, "Pod", code)

    # --- handlers ------------------------------------------------------------------------

    async def filter(self, request: web.Request) -> web.Response:
        args = await self._args(request)
        ident, text, _ = self._pod(args)
        nodes = self._node_names(args)
        op = {"pod": ident, "spec": text, "suggestedNodes": nodes}
        # The dry run first (a read, no log slot): only a filter that changes the state
        # (places the group, takes a slot, joins a Preempting group) is proposed.
        result = await self.service.call({"op": "what_if", **op}, read=True)
        if isinstance(result, dict) and result.get("ok") and result.get("changes_state"):
            result = await self.service.call({"op": "pod_schedule", **op})
        elif isinstance(result, dict) and result.get("ok") and not result.get("placeable"):
            result = {**result, "ok": False}  # waiting: answered from the dry run
        elif not isinstance(result, dict) or not result.get("ok"):
            raise self._conflict(result)  # refused (e.g. already bound): nothing to propose
        # else already Binding: the same answer again (HiveD insists on it)
        if not isinstance(result, dict):
            raise self._conflict(result)
        if result.get("ok"):
            return _json({"Nodes": None, "NodeNames": [result["node"]], "FailedNodes": None, "Error": ""})
        if not result.get("waiting"):
            raise self._conflict(result)
        failed: dict[str, str] = {}
        for v in result.get("victims") or ():
            keys = [f"{p['uid']}({p['namespace']}/{p['name']})" for p in v["pods"]]
            by_node: dict[str, list[str]] = {}
            for p, key in zip(v["pods"], keys):
                by_node.setdefault(p["node"], []).append(key)
            for node in v["nodes"]:
                names = by_node.get(node) or [f"affinity group {v['group']}"]
                if node in failed:
                    failed[node] += ", " + ", ".join(names)
                else:
                    failed[node] = f"node({node}) is waiting for victim Pod(s) to be preempted: {', '.join(names)}"
        if not failed:
            failed[COMPONENT] = "Pod is waiting for preemptible or free resource to appear: " + str(
                result.get("reason") or "")
        return _json({"Nodes": None, "NodeNames": None, "FailedNodes": failed, "Error": ""})

    async def bind(self, request: web.Request) -> web.Response:
        args = await self._args(request)
        vals = {}
        for key in ("PodName", "PodNamespace", "PodUID", "Node"):
            v = _get(args, key)
            if not isinstance(v, str) or not v:
                raise _bad(f"ExtenderBindingArgs: {key} must be a non-empty string", key)
            vals[key] = v
        cmd: dict[str, Any] = {"op": "pod_bind", "node": vals["Node"],
                               "pod": {"uid": vals["PodUID"], "name": vals["PodName"],
                                       "namespace": vals["PodNamespace"]}}
        ref = self.api._inner().pod_refs.get(vals["PodUID"])
        if ref is not None and ref.state == "Binding":
            # the bind info enters the log with the command (checked by the machine)
            g = self.api._inner().groups.get(ref.group)
            if g is not None and g.pods[ref.slot].devices[0][0] == vals["Node"]:
                cmd["leaf_cells"] = [idx for _, idx, _ in g.pods[ref.slot].devices]
        result = await self.service.call(cmd)
        if not isinstance(result, dict) or not result.get("ok"):
            raise self._conflict(result)
        return _json({"Error": "", "Node": result["node"], "LeafCellIsolation": result["leaf_cells"],
                      "Annotations": result["annotations"]})

    async def preempt(self, request: web.Request) -> web.Response:
        args = await self._args(request)
        ident, text, _ = self._pod(args)
        nodes: list[str] = []
        for key in ("NodeNameToMetaVictims", "NodeNameToVictims"):
            v = _get(args, key)
            if v is None:
                continue
            if not isinstance(v, dict) or len(v) > NODES_MAX or not all(isinstance(n, str) and n for n in v):
                raise _bad(f"{key} must map node names to victims", key)
            nodes = sorted(v)
            break
        result = await self.service.call({"op": "pod_preempt", "pod": ident, "spec": text, "suggestedNodes": nodes})
        if not isinstance(result, dict):
            raise self._conflict(result)
        if not result.get("ok") and not result.get("waiting"):
            raise self._conflict(result)
        victims: dict[str, dict[str, Any]] = {}
        if result.get("ok") and result.get("preempting"):
            for v in result.get("victims") or ():
                for p in v["pods"]:
                    victims.setdefault(p["node"], {"Pods": [], "NumPDBViolations": 0})["Pods"].append(
                        {"UID": p["uid"]})
        return _json({"NodeNameToMetaVictims": victims or None})

    async def pod(self, request: web.Request) -> web.Response:
        uid = request.match_info["uid"]
        return _json(await self.api._read(request, {"op": "pod_status", "pod": {"uid": uid}}))
