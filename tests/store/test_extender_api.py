"""The Kubernetes scheduler extender endpoints (store/extender_api.py) with
Kubernetes-shaped JSON: filter -> bind -> inspect, preemption victims, a gang of 4 pods
placed one filter/bind at a time, and bad input refused before anything is proposed.

Two set-ups: an in-memory service (every proposed command recorded: "the log") for the
error paths, and a 3-replica cluster in this test's event loop (``EmbeddedScheduler``
with its HTTP API, the real replication path) for the round trips.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from scheduler_state import SchedulerStateMachine, check, load_config
from scheduler_state.pods import ANNOTATION_BIND_INFO, ANNOTATION_ISOLATION, ANNOTATION_SPEC
from scheduler_state.replicated import ReplicatedScheduler
from store.embed import EmbeddedScheduler
from store.http_api import SchedulerAPI
from store.scheduler_service import Unavailable
from store.server import free_ports

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = EXAMPLES / "hived-small.yaml"
DEMO = EXAMPLES / "hived-demo.yaml"


def spec_yaml(group: str, vc: str, prio: int, pods: int, gpus: int, **extra) -> str:
    """The pod-scheduling-spec annotation, as a HiveD user writes it."""
    s = {"virtualCluster": vc, "priority": prio, "leafCellNumber": gpus,
         "affinityGroup": {"name": group, "members": [{"podNumber": pods, "leafCellNumber": gpus}]}, **extra}
    return yaml.safe_dump(s, sort_keys=False)


def k8s_pod(uid: str, name: str, spec: str, ns: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "annotations": {ANNOTATION_SPEC: spec}},
            "spec": {"schedulerName": "hivedscheduler", "priority": 10, "containers": [
                {"name": "main", "resources": {"limits": {"hivedscheduler.microsoft.com/pod-scheduling-enable": 1}}}]}}


def node_names(cfg: Path) -> list[str]:
    m = SchedulerStateMachine(load_config(cfg))
    return sorted(m.cluster.node_leaves)


# --- in-memory service: error paths, nothing proposed -------------------------------------


class FakeService:
    def __init__(self, cfg: Path) -> None:
        self.machine = ReplicatedScheduler(load_config(cfg))
        self.node = SimpleNamespace(machine=self.machine, _down=False, cfg=SimpleNamespace(node_id=0),
                                    quorum=2, peers_reachable=lambda: self.reachable)
        self.reachable = 3
        self.ready = True
        self.proposed: list = []

    async def call(self, op, read=False):
        if self.reachable < 2:
            raise Unavailable("fewer than a majority", True)
        if not read:
            self.proposed.append(op)
            return self.machine.apply(op)
        return self.machine.query(op)

    def local(self, op):
        return self.machine.query(op)


@pytest.fixture
async def fake():
    service = FakeService(SMALL)
    client = TestClient(TestServer(SchedulerAPI(service).app))
    await client.start_server()
    yield client, service
    await client.close()


async def test_bad_input_is_refused_before_the_log(fake):
    client, service = fake
    good = spec_yaml("j/g", "vc-a", 10, 1, 2)
    cases = [
        (b"{not json", "body"),
        (json.dumps([1, 2]).encode(), "body"),
        (json.dumps({"NodeNames": ["node-0"]}).encode(), "Pod"),
        (json.dumps({"Pod": {"metadata": {"name": "p", "annotations": {ANNOTATION_SPEC: good}}}}).encode(),
         "Pod.metadata.uid"),
        (json.dumps({"Pod": k8s_pod("u1", "p", "")}).encode(), f"Pod.metadata.annotations[{ANNOTATION_SPEC}]"),
        (json.dumps({"Pod": k8s_pod("u1", "p", "virtualCluster: [unclosed")}).encode(),
         f"Pod.metadata.annotations[{ANNOTATION_SPEC}]"),
        (json.dumps({"Pod": k8s_pod("u1", "p", spec_yaml("j/g", "vc-a", 5000, 1, 2))}).encode(),
         f"Pod.metadata.annotations[{ANNOTATION_SPEC}].priority"),
        (json.dumps({"Pod": k8s_pod("u1", "p", spec_yaml("j/g", "vc-nope", 1, 1, 2))}).encode(),
         f"Pod.metadata.annotations[{ANNOTATION_SPEC}]"),
        (json.dumps({"Pod": k8s_pod("u1", "p", "virtualCluster: vc-a\npriority: 1\n")}).encode(),
         f"Pod.metadata.annotations[{ANNOTATION_SPEC}].leafCellNumber"),
        (json.dumps({"Pod": k8s_pod("u1", "p", good), "NodeNames": "node-0"}).encode(), "NodeNames"),
    ]
    for body, field in cases:
        r = await client.post("/v1/extender/filter", data=body, headers={"Content-Type": "application/json"})
        out = await r.json()
        assert r.status == 400, (body, out)
        assert out["field"] == field and out["Error"] == out["message"], (body, out)
    r = await client.post("/v1/extender/bind", json={"PodName": "p", "PodNamespace": "default", "Node": "node-0"})
    assert r.status == 400 and (await r.json())["field"] == "PodUID"
    r = await client.post("/v1/extender/preempt", json={"Pod": k8s_pod("u1", "p", good), "NodeNameToMetaVictims": []})
    assert r.status == 400 and (await r.json())["field"] == "NodeNameToMetaVictims"
    assert service.proposed == []
    # state-dependent refusals go through the log but change nothing
    before = service.machine.digest()
    r = await client.post("/v1/extender/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "u9",
                                                    "Node": "node-0"})
    assert r.status == 404 and "without a scheduling placement" in (await r.json())["Error"]
    assert service.machine.digest() == before
    # no majority: 503, nothing proposed
    service.reachable = 1
    n = len(service.proposed)
    r = await client.post("/v1/extender/filter", json={"Pod": k8s_pod("u1", "p", good), "NodeNames": ["node-0"]})
    assert r.status == 503 and r.headers.get("Retry-After") and len(service.proposed) == n


async def test_filter_bind_mismatch_and_go_style_keys(fake):
    client, service = fake
    pod = k8s_pod("u1", "p0", spec_yaml("j/one", "vc-b", 1, 1, 2), ns="team")
    # Go's decoder matches keys case-insensitively: the v1 JSON tags (pod, nodenames) work too
    r = await client.post("/v1/extender/filter", json={"pod": pod, "nodenames": node_names(SMALL)})
    out = await r.json()
    assert r.status == 200 and out == {"Nodes": None, "NodeNames": [out["NodeNames"][0]], "FailedNodes": None,
                                       "Error": ""}
    node = out["NodeNames"][0]
    other = next(n for n in node_names(SMALL) if n != node)
    r = await client.post("/v1/extender/bind", json={"PodName": "p0", "PodNamespace": "team", "PodUID": "u1",
                                                    "Node": other})
    assert r.status == 409 and "Pod binding node mismatch" in (await r.json())["Error"]
    r = await client.post("/v1/extender/bind", json={"PodName": "p0", "PodNamespace": "team", "PodUID": "u1",
                                                    "Node": node})
    assert r.status == 200 and (await r.json())["Error"] == ""
    assert service.proposed[-1]["leaf_cells"] == (await r.json())["LeafCellIsolation"]  # bind info in the log
    r = await client.post("/v1/extender/filter", json={"Pod": pod, "NodeNames": [node]})
    assert r.status == 409 and "already been bound" in (await r.json())["Error"]
    assert check(service.machine.inner) == []


# --- a 3-replica cluster in this loop ------------------------------------------------------


@pytest.fixture
async def trio(tmp_path, request):
    cfg = getattr(request, "param", SMALL)
    ports = free_ports(9)
    peers = {i: f"127.0.0.1:{ports[i]}" for i in range(3)}
    reps = [EmbeddedScheduler(i, peers, tmp_path / f"s{i}", str(cfg), client=f"127.0.0.1:{ports[3 + i]}",
                              http=f"127.0.0.1:{ports[6 + i]}", fsync="never", lease_check_s=0.2)
            for i in range(3)]
    await asyncio.gather(*(r.start(ready_timeout_s=None) for r in reps))
    await asyncio.gather(*(r.wait_ready(30) for r in reps))
    yield reps, [f"http://127.0.0.1:{ports[6 + i]}" for i in range(3)]
    for r in reps:
        await r.stop()


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict]:
    async with session.post(url, json=body) as r:
        return r.status, await r.json()


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with session.get(url) as r:
        return r.status, await r.json()


async def filter_bind(s, base: str, pod: dict, nodes: list[str], bind_base: str | None = None) -> dict:
    status, out = await post(s, f"{base}/v1/extender/filter", {"Pod": pod, "NodeNames": nodes})
    assert status == 200 and out["NodeNames"] and out["FailedNodes"] is None, out
    meta = pod["metadata"]
    status, bound = await post(s, f"{bind_base or base}/v1/extender/bind",
                               {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                                "Node": out["NodeNames"][0]})
    assert status == 200 and bound["Error"] == "" and bound["Node"] == out["NodeNames"][0], bound
    return bound


async def test_round_trip_filter_bind_inspect_preempt(trio):
    reps, urls = trio
    nodes = node_names(SMALL)
    async with aiohttp.ClientSession() as s:
        low = spec_yaml("job-low/workers", "vc-b", 1, 2, 2)
        bound = [await filter_bind(s, urls[i], k8s_pod(f"low-{i}", f"job-low-{i}", low), nodes, urls[2 - i])
                 for i in range(2)]
        ann = bound[0]["Annotations"]
        info = yaml.safe_load(ann[ANNOTATION_BIND_INFO])
        assert ann[ANNOTATION_ISOLATION] == ",".join(map(str, bound[0]["LeafCellIsolation"]))
        assert info["node"] == bound[0]["Node"] and info["leafCellIsolation"] == bound[0]["LeafCellIsolation"]
        assert [len(m["podPlacements"]) for m in info["affinityGroupBindInfo"]] == [2]
        # inspect (any replica, linearizable): the pod bound with its leaf cells, the group's pods
        status, pod = await get(s, f"{urls[1]}/v1/inspect/pods/low-0")
        assert status == 200 and pod["state"] == "Bound" and pod["leaf_cells"] == bound[0]["LeafCellIsolation"]
        assert pod["annotations"] == ann
        status, g = await get(s, f"{urls[2]}/v1/inspect/affinitygroups/job-low%2Fworkers")
        assert g["status"]["state"] == "Allocated" and g["status"]["allocatedPods"] == ["low-0", "low-1"]
        assert g["status"]["physicalPlacement"] == {bound[0]["Node"]: sorted(
            bound[0]["LeafCellIsolation"] + bound[1]["LeafCellIsolation"])}
        # a higher-priority pod of vc-b (1 node) must preempt: filter names the victims by node
        high = k8s_pod("high-0", "job-high-0", spec_yaml("job-high/main", "vc-b", 50, 1, 4))
        status, out = await post(s, f"{urls[0]}/v1/extender/filter", {"Pod": high, "NodeNames": nodes})
        victim_node = bound[0]["Node"]
        assert status == 200 and out["NodeNames"] is None
        assert out["FailedNodes"] == {victim_node: f"node({victim_node}) is waiting for victim Pod(s) to be "
                                                   f"preempted: low-0(default/job-low-0), low-1(default/job-low-1)"}
        # preempt: every pod of the victim group, by node (K8s passes the nodes it considers)
        status, out = await post(s, f"{urls[1]}/v1/extender/preempt",
                                 {"Pod": high, "NodeNameToMetaVictims": {n: {"Pods": [], "NumPDBViolations": 0}
                                                                         for n in nodes}})
        assert status == 200 and out == {"NodeNameToMetaVictims": {victim_node: {
            "Pods": [{"UID": "low-0"}, {"UID": "low-1"}], "NumPDBViolations": 0}}}
        status, g = await get(s, f"{urls[2]}/v1/inspect/affinitygroups/job-high%2Fmain")
        assert g["status"]["state"] == "Preempting" and g["status"]["preemptingPods"] == ["high-0"]
        status, g = await get(s, f"{urls[0]}/v1/inspect/affinitygroups/job-low%2Fworkers")
        assert g["status"]["state"] == "BeingPreempted"
        # K8s deletes the victims (the informer's delete, here through the embedding API)
        for uid in ("low-0", "low-1"):
            r = await reps[0].service.call({"op": "pod_delete", "pod": {"uid": uid}})
            assert r["ok"]
        bound_high = await filter_bind(s, urls[2], high, nodes)
        assert bound_high["Node"] == victim_node and sorted(bound_high["LeafCellIsolation"]) == [0, 1, 2, 3]
    for _ in range(50):  # every replica reaches the same state; invariants hold on each
        if len({r.service.node.machine.inner.digest() for r in reps}) == 1:
            break
        await asyncio.sleep(0.1)
    assert len({r.service.node.machine.inner.digest() for r in reps}) == 1
    assert all(check(r.service.node.machine.inner) == [] for r in reps)


@pytest.mark.parametrize("trio", [DEMO], indirect=True)
async def test_gang_of_four_pod_by_pod_lands_where_the_group_placement_puts_it(trio):
    reps, urls = trio
    nodes = node_names(DEMO)
    gang = spec_yaml("train/workers", "vc-prod", 100, 4, 4)
    reference = SchedulerStateMachine(load_config(DEMO))
    ref = reference.apply({"op": "allocate", "group": yaml.safe_load(gang)})
    assert ref["ok"]
    want = [(p["node"], p["leaf_cells"]) for p in ref["placement"]]
    async with aiohttp.ClientSession() as s:
        got = []
        for i in range(4):  # one filter/bind at a time, on different replicas
            b = await filter_bind(s, urls[i % 3], k8s_pod(f"w-{i}", f"train-w-{i}", gang), nodes, urls[(i + 1) % 3])
            got.append((b["Node"], b["LeafCellIsolation"]))
        assert got == want
        status, g = await get(s, f"{urls[0]}/v1/inspect/affinitygroups/train%2Fworkers")
        phys: dict[str, list[int]] = {}
        for node, leaves in want:
            phys.setdefault(node, []).extend(leaves)
        assert g["status"]["physicalPlacement"] == {n: sorted(v) for n, v in phys.items()}
        assert g["status"]["allocatedPods"] == ["w-0", "w-1", "w-2", "w-3"]
        # a fifth pod of the same group has no slot left (HiveD's message)
        status, out = await post(s, f"{urls[0]}/v1/extender/filter",
                                 {"Pod": k8s_pod("w-4", "train-w-4", gang), "NodeNames": nodes})
        assert status == 409 and "more pods than the configured number" in out["Error"]
