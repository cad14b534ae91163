"""Randomized command sequences on a config with every HiveD feature (issue 5,
acceptance 2): our examples/hived-features/fleet.yaml by default, HiveD's own design.yaml
with ``-m shared``.

A Hypothesis ``RuleBasedStateMachine`` allocates (guaranteed, opportunistic, pinned,
lazy, any size), releases (whole groups and single pods), marks nodes bad and healthy,
reconfigures between the config and two variants (quota moved between VCs; a node
removed), grants and expires leases, and round-trips snapshots. At the pod level
(issue 10, preemption over time) it places gangs pod by pod (so victims have live
pods), preempts them in HiveD's preempt phase (the preemptor becomes Preempting, the
free cells of its plan reserved for it) and deletes pods (a victim's last pod places
its preemptor on its plan; a preemptor's last pod cancels it). After every step:

- ``scheduler_state.invariants.check`` finds nothing;
- a reference model (plain bookkeeping of names, priorities and quotas) agrees with the
  machine: the allocated and waiting groups are exactly those the results announced (no
  silent preemption), every victim was legal (opportunistic, or a lower priority in the
  preemptor's VC; lazy victims had asked for it), the Preempting groups are those the
  results announced, and **VC safety** held: a guaranteed group of 1-leaf pods that
  fits what its VC's quota leaves at its priority (minus cells reserved for, or being
  preempted by, Preempting groups of that priority or above) is always placed when no
  node is bad, whatever the other VCs did;
- at the end the whole command sequence is replayed on a fresh machine: every result
  and the final snapshot bytes must be identical (determinism).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from scheduler_state import Config, SchedulerStateMachine, check, load_config
from tests.scheduler_state.helpers import example

Target = tuple[str, str | None, str | None]  # (vc, leafCellType, pinnedCellId)


@dataclass(frozen=True)
class Profile:
    """A config, its reconfiguration variants, and what the rules draw from it."""

    variants: list[dict[str, Any]]  # variants[0] is the starting config
    targets: list[Target]  # valid targets of the config, and a few errors
    contended: list[Target]  # three small scopes: 24 leaves, 2 leaves, a pinned rack
    crowd_guaranteed: int  # leafCellNumber of the 2 pods put on the pinned rack at start
    crowd_opportunistic: list[tuple[str, int, int, str, bool]]  # (type, pods, size, vc, wait)
    leaf_types: list[str | None]
    vcs: list[str]
    sizes: list[int]

    @cached_property
    def base(self) -> Config:
        return load_config(self.variants[0])

    @cached_property
    def nodes(self) -> list[str]:
        return self.base.node_names()


def fleet_profile() -> Profile:
    base = yaml.safe_load(example("fleet").read_text())
    vision = base["virtualClusters"]["vision"]["virtualCells"]
    assert vision[2] == {"cellType": "H100-NODE", "cellNumber": 2}
    v1 = copy.deepcopy(base)  # one standalone H100 node of quota moves from vision to speech
    v1["virtualClusters"]["vision"]["virtualCells"][2]["cellNumber"] = 1
    v1["virtualClusters"]["speech"]["virtualCells"].append({"cellType": "H100-NODE", "cellNumber": 1})
    v2 = copy.deepcopy(base)  # the standalone H100 node h-solo-1 leaves the cluster
    v2["physicalCluster"]["physicalCells"] = [
        c for c in v2["physicalCluster"]["physicalCells"] if c.get("cellAddress") != "h-solo-1"]
    v2["virtualClusters"]["vision"]["virtualCells"][2]["cellNumber"] = 1
    return Profile(
        variants=[base, v1, v2],
        targets=[
            ("vision", "H100", None), ("vision", None, None), ("vision", None, "VIS-T4"),
            ("vision", None, "VIS-RACK"), ("vision", None, "VIS-IB"), ("speech", "A100", None),
            ("speech", "T4", None), ("speech", None, None), ("speech", "H100", None), ("ops", None, None),
            ("audio", None, None),
        ],
        contended=[("speech", "A100", None), ("speech", "T4", None), ("vision", None, "VIS-RACK")],
        crowd_guaranteed=4,
        crowd_opportunistic=[("A100", 1, 4, "vision", False), ("T4", 1, 1, "vision", True),
                             ("H100", 2, 8, "speech", False)],
        leaf_types=[None, "T4", "T4", "A100", "A100", "H100", "IB-H100-GPU"],
        vcs=["vision", "speech", "ops"],
        sizes=[1, 1, 2, 3, 4, 8],
    )


def design_profile(hived: Path) -> Profile:
    base = yaml.safe_load((hived / "config" / "design.yaml").read_text())
    v1 = copy.deepcopy(base)  # one DGX2 node of quota moves from VC1 to VC2
    v1["virtualClusters"]["VC1"]["virtualCells"][2]["cellNumber"] = 1
    v1["virtualClusters"]["VC2"]["virtualCells"].append({"cellType": "DGX2-V100-NODE", "cellNumber": 1})
    v2 = copy.deepcopy(base)  # the DGX2 node 0.0.5.0 leaves the cluster
    v2["physicalCluster"]["physicalCells"] = [
        c for c in v2["physicalCluster"]["physicalCells"] if c.get("cellAddress") != "0.0.5.0"]
    v2["virtualClusters"]["VC1"]["virtualCells"][2]["cellNumber"] = 1
    return Profile(
        variants=[base, v1, v2],
        targets=[
            ("VC1", "DGX2-V100", None), ("VC1", None, None), ("VC1", None, "VC1-YQW-CT1"),
            ("VC1", None, "VC1-YQW-DGX2"), ("VC1", None, "VC1-YQW-IB-DGX2"), ("VC2", "DGX1-P100", None),
            ("VC2", "CT1", None), ("VC2", None, None), ("VC2", "DGX2-V100", None), ("VC3", None, None),
        ],
        contended=[("VC2", "DGX1-P100", None), ("VC2", "CT1", None), ("VC1", None, "VC1-YQW-DGX2")],
        crowd_guaranteed=8,
        crowd_opportunistic=[("DGX1-P100", 1, 4, "VC1", False), ("CT1", 1, 1, "VC1", True),
                             ("DGX2-V100", 2, 8, "VC2", False)],
        leaf_types=[None, "CT1", "CT1", "DGX1-P100", "DGX1-P100", "DGX2-V100", "IB-DGX2-V100-V100"],
        vcs=["VC1", "VC2"],
        sizes=[1, 1, 2, 4, 8, 16],
    )


def model(profile: Profile) -> type[RuleBasedStateMachine]:
    """The rule-based state machine drawing from ``profile``."""
    P = profile
    class SchedulerModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.m = SchedulerStateMachine(P.base)
            self.log: list[tuple[dict[str, Any], dict[str, Any]]] = []
            self.allocated: set[str] = set()
            self.pending: list[str] = []
            self.preempting: set[str] = set()
            self.count = 0
            self.now_ms = 0

        # -- plumbing ---------------------------------------------------------------------

        def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
            before = self.m.snapshot()
            r = self.m.apply(cmd)
            self.log.append((cmd, r))
            outcome = "error" if "error" in r else "waiting" if r.get("waiting") else "ok"
            event(f"{cmd['op']}: {outcome}")
            if r.get("preempted"):
                event("allocate: preempted others")
            if r.get("lazy_preempted"):
                event("lazily preempted others")
            if r.get("scheduled"):
                event("waiting group placed later")
            assert "internal error" not in str(r.get("error", "")), (cmd, r)
            if "error" in r or (r.get("waiting") and not r.get("queued")):
                # Rejected, or answered "waiting" without queueing (a failed attempt, maybe
                # after trying and reverting lazy preemptions): nothing may have changed.
                assert self.m.snapshot() == before, f"{cmd} -> {r} changed the state"
            if r.get("reserved_leaf_cells"):
                event("pod_preempt: cells reserved")
            if r.get("preempting"):
                event("pod_preempt: Preempting")
            if cmd["op"] in ("allocate", "pod_schedule") and r.get("ok") and r.get("preempted") is not None:
                # placed first; a waiting group of higher priority retried by the same
                # command may then preempt it (listed under ``scheduled``)
                self._victims(r["preempted"])
                if cmd["op"] == "allocate" or r.get("group_placed"):
                    self.allocated.add(r["group"])
            if cmd["op"] == "pod_preempt" and r.get("ok"):
                self._victims(r.get("preempted") or [])
                if r.get("preempting"):
                    self.preempting.add(r["group"])
            if cmd["op"] == "pod_delete" and r.get("ok"):
                if r.get("released"):
                    self.allocated.discard(r["group"])
                if r.get("preemption_cancelled"):
                    event("preemption cancelled")
                    self.preempting.discard(r["group"])
            for s in r.get("scheduled", []):
                if "preemption_cancelled" in s:
                    event("preemption cancelled")
                    self.preempting.discard(s["group"])
                    continue
                if s.get("preemption_completed"):
                    event("preemptor placed on its plan")
                    self.preempting.discard(s["group"])
                    self.allocated.add(s["group"])
                    continue
                self.pending.remove(s["group"])
                if "dropped" not in s:
                    self.allocated.add(s["group"])
                    self._victims(s["preempted"])
            return r

        def _victims(self, names: list[str]) -> None:
            for v in names:
                assert v in self.allocated, f"unknown victim {v}"
                self.allocated.discard(v)

        def name(self) -> str:
            self.count += 1
            return f"g{self.count}"

        def _group(self, name: str, where: Target, prio: int, pods: int, k: int) -> dict[str, Any]:
            """A group spec of ``pods`` x ``k`` leaf cells at ``where``."""
            vc, leaf_type, pinned = where
            group: dict[str, Any] = {"virtualCluster": vc, "priority": prio,
                                     "affinityGroup": {"name": name,
                                                       "members": [{"podNumber": pods, "leafCellNumber": k}]}}
            if leaf_type:
                group["leafCellType"] = leaf_type
            if pinned:
                group["pinnedCellId"] = pinned
            return group

        def _before(self) -> dict[str, tuple[str, int, bool, bool]]:
            return {g.name: (g.req.vc, g.priority, g.opportunistic, g.req.lazy_preemption)
                    for g in self.m.groups.values()}

        def _must_place(self, vc: str, leaf_type: str | None, pinned: str | None, prio: int,
                        pods: list[int]) -> bool:
            """VC safety as a reference: 1-leaf pods that fit what the VC's quota leaves at
            this priority must be placed (when no node is bad)."""
            cl = self.m.cluster
            if cl.bad_nodes or any(k != 1 for k in pods) or vc not in cl.vc_scopes:
                return False
            if pinned is not None:
                scope = cl.vc_pinned[vc].get(pinned)
                scopes = [scope] if scope is not None else []
            else:
                scopes = [s for s in cl.vc_scopes[vc].values() if leaf_type is None or s.chain.info.leaf_type == leaf_type]
            strong = [p for p in self.m.preemptors.values() if p.req.priority >= prio]
            for s in scopes:
                held = 0
                for g in self.m.vc_groups[vc].values():
                    if g.opportunistic or (g.priority < prio and not any(g.name in p.victims for p in strong)):
                        continue
                    held += sum(1 for pod in g.pods for v in (pod.vleaves or []) if v is not None and v.scope is s)
                for p in strong:  # cells reserved at that priority or above (virtual leaves)
                    held += sum(1 for pod in p.hold.pods for v in pod.vleaves if v is not None and v.scope is s)
                if s.leaves - held >= len(pods):
                    return True
            return False

        # -- rules --------------------------------------------------------------------------

        @initialize(lazy=st.lists(st.booleans(), min_size=4, max_size=4), k=st.sampled_from([2, 4]))
        def crowd(self, lazy: list[bool], k: int) -> None:
            """Start busy: low-priority groups (some lazy) fill the contended scopes, and
            opportunistic groups sit on the same chains, so later rules meet contention."""
            (a, b, c), guaranteed, opportunistic = P.contended, P.crowd_guaranteed, P.crowd_opportunistic
            self.allocate_guaranteed(a, 0, 2, 4, lazy[0], False)
            self.allocate_guaranteed(a, 1, 1, k, lazy[1], False)
            self.allocate_guaranteed(c, 0, 2, guaranteed, lazy[2], False)
            self.allocate_guaranteed(b, 0, 1, 1, lazy[3], True)
            for leaf_type, pods, size, vc, wait in opportunistic:
                self.allocate_opportunistic(leaf_type, pods, size, vc, wait)

        @rule(where=st.sampled_from(profile.targets), prio=st.integers(0, 3), pods=st.integers(1, 3),
              k=st.sampled_from(profile.sizes), lazy=st.booleans(), wait=st.booleans())
        def allocate_guaranteed(self, where: tuple[str, str | None, str | None], prio: int, pods: int, k: int,
                                lazy: bool, wait: bool) -> None:
            vc, leaf_type, pinned = where
            name = self.name()
            group = self._group(name, where, prio, pods, k)
            group["lazyPreemptionEnable"] = lazy
            must = self._must_place(vc, leaf_type, pinned, prio, [k] * pods)
            before = self._before()
            r = self.run({"op": "allocate", "group": group, "wait": wait})
            if must:
                assert r["ok"], f"VC safety: {vc} had room at priority {prio} but got {r}"
            if r["ok"]:
                for v in r["preempted"]:
                    vvc, vprio, vopp, _ = before[v]
                    assert vopp or v in r.get("lazy_preempted", []) or (vvc == vc and vprio < prio), (v, before[v], r)
                for v in r["lazy_preempted"]:
                    vvc, vprio, vopp, vlazy = before[v]
                    assert vvc == vc and vprio < prio and vlazy and not vopp
                    assert v not in self.m.groups or self.m.groups[v].opportunistic
            elif r.get("queued"):
                self.pending.append(name)

        # Most of the cluster is idle in short runs; this rule crowds three small scopes
        # (a VC's 24 leaves of one type, a VC's 2 leaves of another, a pinned rack) so that
        # preemption, lazy preemption and waiting happen often.
        @rule(where=st.sampled_from(profile.contended),
              prio=st.integers(0, 3), pods=st.integers(1, 3), k=st.sampled_from([1, 2, 4, 8]),
              lazy=st.booleans(), wait=st.booleans())
        def allocate_contended(self, where: tuple[str, str | None, str | None], prio: int, pods: int, k: int,
                               lazy: bool, wait: bool) -> None:
            self.allocate_guaranteed(where, prio, pods, k, lazy, wait)

        @rule(where=st.sampled_from(profile.contended + profile.targets),
              prio=st.integers(-1, 3), pods=st.integers(1, 3), k=st.sampled_from([1, 2, 4, 8]))
        def what_if(self, where: tuple[str, str | None, str | None], prio: int, pods: int, k: int) -> None:
            """The read-only filter: nothing changes, and an allocate right after (on a
            copy) does what it said: placed there, with exactly those victims, or not."""
            vc, leaf_type, pinned = where
            group: dict[str, Any] = {"virtualCluster": vc, "priority": prio,
                                     "affinityGroup": {"name": "what-if",
                                                       "members": [{"podNumber": pods, "leafCellNumber": k}]}}
            if leaf_type:
                group["leafCellType"] = leaf_type
            if pinned and prio >= 0:
                group["pinnedCellId"] = pinned
            before = self.m.snapshot()
            w = self.m.query({"op": "what_if", "group": group})
            assert self.m.snapshot() == before, f"what_if changed the state: {w}"
            event(f"what_if: {'error' if not w['ok'] else 'placeable' if w['placeable'] else 'victims' if w['victims'] else 'waiting'}")
            copy = SchedulerStateMachine(P.base)
            copy.restore(before)
            r = copy.apply({"op": "allocate", "group": group, "wait": False})
            if not w["ok"]:
                assert not r["ok"] and r.get("error") == w["error"], (w, r)
                return
            assert r["ok"] == (w["placeable"] or bool(w["victims"])), (w, r)
            if r["ok"]:
                assert r["preempted"] == [v["group"] for v in w["victims"]], (w, r)
                assert [(x["node"], x["leaf_cells"]) for x in r["placement"]] == \
                    [(x["node"], x["leaf_cells"]) for x in w["placement"]], (w, r)

        @rule(leaf_type=st.sampled_from(profile.leaf_types), pods=st.integers(1, 3), k=st.sampled_from([1, 2, 4, 8]),
              vc=st.sampled_from(profile.vcs), wait=st.booleans())
        def allocate_opportunistic(self, leaf_type: str | None, pods: int, k: int, vc: str, wait: bool) -> None:
            name = self.name()
            group: dict[str, Any] = {"virtualCluster": vc, "priority": -1,
                                     "affinityGroup": {"name": name, "members": [{"podNumber": pods, "leafCellNumber": k}]}}
            if leaf_type:
                group["leafCellType"] = leaf_type
            cl = self.m.cluster
            chains = cl.chains_by_leaf_type.get(leaf_type, []) if leaf_type else list(cl.chains.values())
            must = k == 1 and any(sum(t.oavail for t in ch.tops) >= pods for ch in chains)
            r = self.run({"op": "allocate", "group": group, "wait": wait})
            if must:
                assert r["ok"], r
            if r["ok"]:
                assert r["preempted"] == [] and r["opportunistic"]
            elif r.get("queued"):
                self.pending.append(name)

        @precondition(lambda self: self.allocated or self.pending or self.preempting)
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(sorted(self.allocated) + self.pending + sorted(self.preempting)))
            r = self.run({"op": "release", "group": name})
            assert r["ok"], r
            if name in self.pending:
                self.pending.remove(name)
            elif name in self.preempting:
                event("preemption cancelled")
                self.preempting.discard(name)  # cancelled: its reserved cells are free again
            else:
                self.allocated.discard(name)

        def _pod_free(self) -> list[str]:
            """Groups whose pod slots hold no Kubernetes pod (a partial release of a held
            slot is refused: the pod ends with pod_delete)."""
            return sorted(n for n in self.allocated if not any(self.m.groups[n].slots or ()))

        @precondition(lambda self: self._pod_free())
        @rule(data=st.data())
        def release_pods(self, data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(self._pod_free()))
            n = len(self.m.groups[name].pods)
            pods = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))
            r = self.run({"op": "release", "group": name, "pods": pods})
            assert r["ok"], r
            if r["released"]:
                self.allocated.discard(name)

        @rule(node=st.sampled_from(profile.nodes), healthy=st.booleans())
        def set_node_health(self, node: str, healthy: bool) -> None:
            r = self.run({"op": "set_node_health", "node": node, "healthy": healthy})
            if r.get("doomed_bad_cells"):
                event("doomed bad cells present")
            # A variant config drops a node; naming it then is an error.
            assert r["ok"] or (node not in self.m.cluster.node_leaves and "not in the config" in r["error"]), r

        # Several nodes going bad together make HiveD's doomed bad cells likely (a VC's
        # free cells outnumber the healthy free cells); invariant 7 checks the rule.
        @rule(nodes=st.lists(st.sampled_from(profile.nodes), min_size=2, max_size=8, unique=True),
              healthy=st.booleans())
        def node_health_burst(self, nodes: list[str], healthy: bool) -> None:
            for node in nodes:
                self.set_node_health(node, healthy)

        # -- pod level: gangs placed pod by pod, HiveD's preempt phase, pod deletion -----------

        def _pod_spec(self, name: str, where: Target, prio: int, pods: int, k: int) -> dict[str, Any]:
            return {**self._group(name, where, prio, pods, k), "leafCellNumber": k}

        @rule(where=st.sampled_from(profile.contended), prio=st.integers(0, 2), pods=st.integers(1, 3),
              k=st.sampled_from([1, 2, 4]))
        def place_pods(self, where: Target, prio: int, pods: int, k: int) -> None:
            """A gang scheduled pod by pod (filter, bind): a victim with live pods."""
            name = self.name()
            spec = self._pod_spec(name, where, prio, pods, k)
            for i in range(pods):
                uid = f"{name}-{i}"
                r = self.run({"op": "pod_schedule", "pod": {"uid": uid, "namespace": "ns", "name": uid},
                              "spec": spec})
                if not r["ok"]:
                    assert i == 0 and (r.get("waiting") or r.get("error")), r
                    return
                assert self.run({"op": "pod_bind", "pod": {"uid": uid}, "node": r["node"]})["ok"]

        @rule(where=st.sampled_from(profile.contended), prio=st.integers(1, 4), pods=st.integers(1, 2),
              k=st.sampled_from([1, 2, 4, 8]))
        def preempt_pods(self, where: Target, prio: int, pods: int, k: int, nodes: list[str] | None = None) -> None:
            """HiveD's preempt phase for the first pod of a new gang: Preempting (its
            victims Being preempted, the free cells of its plan reserved), placeable
            without victims, or waiting; lower-priority preemptions it overlaps are
            cancelled."""
            name = self.name()
            spec = self._pod_spec(name, where, prio, pods, k)
            cmd: dict[str, Any] = {"op": "pod_preempt", "pod": {"uid": f"{name}-0", "namespace": "ns",
                                                               "name": f"{name}-0"}, "spec": spec}
            if nodes is not None:
                spec["ignoreK8sSuggestedNodes"] = False
                cmd["suggestedNodes"] = nodes
            before = self._before()
            r = self.run(cmd)
            if r["ok"] and (r.get("preempting") or r.get("preempted")):
                for v in [x["group"] for x in r["victims"]] + r["preempted"]:
                    vvc, vprio, vopp, _ = before[v]
                    assert vopp or (vvc == where[0] and vprio < prio), (v, before[v], r)

        @rule(where=st.sampled_from(profile.contended), prio=st.integers(1, 4))
        def preemption_over_time(self, where: Target, prio: int) -> None:
            """A victim with a live pod, then a preemptor of its whole node (suggested
            nodes: that node): it stays Preempting, the node's free cells reserved."""
            self.place_pods(where, 0, 1, 1)
            cmd, r = self.log[-1]
            if cmd["op"] != "pod_bind" or not r["ok"]:
                return
            leaf = self.m.cluster.leaf_by_device[(r["node"], r["leaf_cells"][0])]
            node = leaf
            while not node.nodeish:
                node = node.parent
            self.preempt_pods(where, prio, 1, node.leaves, [r["node"]])

        @precondition(lambda self: self.m.pod_refs)
        @rule(data=st.data())
        def delete_pod(self, data: st.DataObject) -> None:
            uid = data.draw(st.sampled_from(sorted(self.m.pod_refs)))
            r = self.run({"op": "pod_delete", "pod": {"uid": uid}})
            assert r["ok"], r

        @rule(variant=st.integers(0, len(profile.variants) - 1))
        def reconfigure(self, variant: int) -> None:
            r = self.run({"op": "reconfigure", "config": P.variants[variant]})
            assert r["ok"], r
            self.preempting.clear()  # volatile in HiveD: reconfiguration cancels them
            for d in r["dropped"]:
                if d["group"] in self.pending:
                    self.pending.remove(d["group"])
            preempted = {v for x in r["scheduled"] for v in x.get("preempted", ())}
            for name in r["lazy_preempted"]:
                # demoted, then maybe preempted by a waiting group the same command placed
                assert self.m.groups[name].opportunistic if name in self.m.groups else name in preempted

        @precondition(lambda self: self.allocated or self.pending)
        @rule(data=st.data(), ttl=st.integers(1, 50))
        def lease_grant(self, data: st.DataObject, ttl: int) -> None:
            name = data.draw(st.sampled_from(sorted(self.allocated) + self.pending))
            assert self.run({"op": "lease_grant", "group": name, "now_ms": self.now_ms, "ttl_ms": ttl})["ok"]

        @rule(step=st.integers(0, 60))
        def lease_expire(self, step: int) -> None:
            self.now_ms += step
            r = self.run({"op": "lease_expire", "now_ms": self.now_ms})
            for name in r["expired"]:
                self.allocated.remove(name)
            for name in r["cancelled"]:
                self.pending.remove(name)

        @rule()
        def snapshot_roundtrip(self) -> None:
            snap = self.m.snapshot()
            fresh = SchedulerStateMachine(P.base)
            fresh.restore(snap)
            assert fresh.snapshot() == snap
            self.m = fresh  # carry on with the restored copy: restore must be exact

        # -- checks -----------------------------------------------------------------------------

        @invariant()
        def invariants_hold(self) -> None:
            problems = check(self.m)
            assert not problems, problems

        @invariant()
        def model_agrees(self) -> None:
            groups = self.m.apply({"op": "list_groups"})
            assert set(groups["allocated"]) == self.allocated
            assert groups["pending"] == self.pending
            assert set(self.m.preemptors) == self.preempting

        def teardown(self) -> None:
            replay = SchedulerStateMachine(P.base)
            for cmd, result in self.log:
                assert replay.apply(cmd) == result, f"replay diverged at {cmd}"
            assert replay.snapshot() == self.m.snapshot()

    return SchedulerModel


SHORT = settings(
    max_examples=10, stateful_step_count=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
LONG = settings(
    max_examples=400, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_scheduler_state_machine() -> None:
    run_state_machine_as_test(model(fleet_profile()), settings=SHORT)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_scheduler_state_machine_long() -> None:
    run_state_machine_as_test(model(fleet_profile()), settings=LONG)


@pytest.mark.shared
def test_scheduler_state_machine_on_hived_design(hived: Path) -> None:
    run_state_machine_as_test(model(design_profile(hived)), settings=SHORT)
