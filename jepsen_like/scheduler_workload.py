"""The scheduler workload (issue 14): affinity groups allocated and released through the
scheduler service's HTTP API (``cellar serve --machine scheduler``, store/http_api.py,
docs/scheduler_service.md) by several sessions, and the checks of the result.

Client (``HttpScheduler``): ``allocate`` is ``POST /v1/groups`` with ``"wait": false``
(201 placed: ok, with its placement; 409 not placeable: fail; 503 ``definite``: fail;
a 503 without ``definite``, a timeout or a lost connection: info, the group may or may
not be placed), ``release`` is ``DELETE /v1/groups/{name}`` (200 ok, 404 fail, no answer
info), ``read`` is the linearizable ``GET /v1/inspect/affinitygroups/{name}`` (200
found, 404 absent, anything else fail).

Generator (``run_scheduler_workload``): closed-loop sessions, each allocating groups of
its own (unique names, one or two pods of 1, 2 or 4 K80 leaf cells, in vc-a or vc-b of
examples/hived-small.yaml, all at the same priority so that nothing is preempted), and
releasing and reading them; a session retires its process after an info, as Jepsen does.

Checks (``check_scheduler``), after the heal, on every replica's final state:

- **invariants**: ``scheduler_state.invariants.check`` on each replica (``GET
  /v1/status?invariants=1``) finds nothing;
- **final states agree**: every replica lists the same groups with the same placements;
- **acknowledged allocations survive**: a group whose allocate was ok and that was never
  asked to be released is present, with the placement it was acknowledged with; one
  whose release was ok is absent; one whose allocate failed definitely is absent; every
  present group was asked for (its allocate was ok or info);
- **no cell allocated twice**: no (node, leaf) in two groups' final placements, and in
  the history no acknowledged placement overlaps another group's acknowledged placement
  unless that group's release was invoked before the later allocate completed;
- **reads**: a read of a group invoked after its allocate was acknowledged and before any
  release of it was invoked finds it; one invoked after its release was acknowledged
  does not.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .client import FAIL, INFO, OK, Outcome, Recorder, WorkloadStats

__all__ = ["HttpScheduler", "check_scheduler", "default_hived_config", "final_state", "run_scheduler_workload"]

VCS = ("vc-a", "vc-b")
PRIORITY = 1
LEAF_TYPE = "K80"


def default_hived_config() -> str:
    return str(Path(__file__).resolve().parents[1] / "examples" / "hived-small.yaml")


class HttpScheduler:
    """Every replica's scheduler HTTP API (``urls``: ``http://host:port``)."""

    def __init__(self, urls: list[str], *, timeout_s: float = 5.0) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.nodes = len(self.urls)
        self.timeout_s = timeout_s
        self._session: Any = None

    async def __aenter__(self) -> HttpScheduler:
        import aiohttp

        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256),
                                              timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, method: str, node: int, path: str, body: Any = None) -> tuple[int | None, Any, str | None]:
        import aiohttp

        try:
            async with self._session.request(method, self.urls[node] + path,
                                             data=None if body is None else json.dumps(body),
                                             headers={"Content-Type": "application/json"}) as r:
                text = await r.text()
                status = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OSError) as e:
            return None, None, f"{type(e).__name__}: {e}"[:200]
        try:
            return status, json.loads(text) if text else None, None
        except ValueError:
            return status, None, f"HTTP {status} with a body that is not JSON: {text[:100]!r}"

    @staticmethod
    def _unavailable(status: int | None, body: Any, error: str | None, read: bool) -> Outcome:
        """A non-2xx answer, or none: fail if nothing can have happened, else info."""
        b = body if isinstance(body, dict) else {}
        msg = error or f"{status} {str(b.get('message', b.get('reason', '')))[:200]}"
        if status is None:
            return Outcome(FAIL if read else INFO, error=msg, move=True)
        if status == 503:
            return Outcome(FAIL if (read or b.get("definite") is True) else INFO, error=msg, move=True)
        if 400 <= status < 500 and status not in (404, 409):
            return Outcome(FAIL, error=msg, invalid=True)
        return Outcome(FAIL if read else INFO, error=msg, move=True)

    async def allocate(self, name: str, vc: str, members: list[tuple[int, int]], node: int) -> Outcome:
        body = {"group": {"virtualCluster": vc, "priority": PRIORITY, "leafCellType": LEAF_TYPE,
                          "affinityGroup": {"name": name, "members": [{"podNumber": p, "leafCellNumber": k}
                                                                     for p, k in members]}},
                "wait": False}
        status, answer, error = await self._call("POST", node, "/v1/groups", body)
        if status == 201 and isinstance(answer, dict) and answer.get("ok"):
            return Outcome(OK, placement_of(answer))
        if status == 409 and isinstance(answer, dict):
            if "already" in str(answer.get("message", "")):
                # our names are unique: an earlier attempt of ours placed it. Never happens
                # without retries; say so rather than guess.
                return Outcome(INFO, error=f"409 {answer.get('message')}")
            return Outcome(FAIL, error=f"409 {str(answer.get('reason', answer.get('message', '')))[:120]}")
        return self._unavailable(status, answer, error, read=False)

    async def release(self, name: str, node: int) -> Outcome:
        status, answer, error = await self._call("DELETE", node, f"/v1/groups/{name}")
        if status == 200 and isinstance(answer, dict) and answer.get("released"):
            return Outcome(OK)
        if status == 404:
            return Outcome(FAIL, error="404 no such group")
        return self._unavailable(status, answer, error, read=False)

    async def read(self, name: str, node: int) -> Outcome:
        status, answer, error = await self._call("GET", node, f"/v1/inspect/affinitygroups/{name}")
        if status == 200 and isinstance(answer, dict):
            return Outcome(OK, _physical(answer.get("status", {}).get("physicalPlacement")))
        if status == 404:
            return Outcome(OK, None)  # absent
        return self._unavailable(status, answer, error, read=True)

    async def groups(self, node: int, consistency: str = "linearizable") -> dict[str, list] | None:
        q = "" if consistency == "linearizable" else "?consistency=serializable"
        status, answer, _error = await self._call("GET", node, f"/v1/inspect/affinitygroups/{q}")
        if status != 200 or not isinstance(answer, dict):
            return None
        return {g["metadata"]["name"]: _physical(g.get("status", {}).get("physicalPlacement"))
                for g in answer.get("items", []) if g.get("status", {}).get("state") == "Allocated"}

    async def status(self, node: int) -> dict | None:
        status, answer, _error = await self._call("GET", node, "/v1/status?invariants=1")
        return answer if status == 200 and isinstance(answer, dict) else None


def placement_of(answer: dict) -> list:
    """An allocate answer's placement as sorted [node, leaf] pairs."""
    cells = []
    for pod in answer.get("placement") or []:
        if not pod.get("released"):
            cells += [[pod["node"], leaf] for leaf in pod.get("leaf_cells", [])]
    return sorted(cells)


def _physical(pp: Any) -> list:
    if not isinstance(pp, dict):
        return []
    return sorted([node, leaf] for node, leaves in pp.items() for leaf in leaves)


async def run_scheduler_workload(client: HttpScheduler, recorder: Recorder, *, sessions: int = 8,
                                 seconds: float = 10.0, seed: int = 1, pause_s: float = 0.0) -> WorkloadStats:
    """``sessions`` closed-loop sessions for ``seconds``: allocate (half the time while a
    session holds fewer than three groups), release one of its groups, read one."""
    stats = WorkloadStats(processes=sessions)
    deadline = time.monotonic() + seconds
    t_start = time.monotonic()

    async def session(idx: int) -> None:
        rng = random.Random(seed * 1_000_003 + idx)
        process = idx
        node = idx % client.nodes
        held: list[str] = []  # acknowledged (or maybe) allocated, not yet released
        k = 0
        while time.monotonic() < deadline:
            r = rng.random()
            if not held or (len(held) < 3 and r < 0.5):
                k += 1
                name = f"s{idx}-g{k}"
                vc = rng.choice(VCS)
                members = [(rng.choice((1, 1, 2)), rng.choice((1, 2, 4)))]
                f, value = "allocate", (name, {"vc": vc, "members": members})
                recorder.invoke(process, f, value)
                out = await client.allocate(name, vc, members, node)
                if out.type in (OK, INFO):
                    held.append(name)
                done_value = (name, out.value if out.type == OK else None)
            elif r < 0.8:
                name = held.pop(rng.randrange(len(held)))
                f, value = "release", (name, None)
                recorder.invoke(process, f, value)
                out = await client.release(name, node)
                done_value = value
            else:
                name = rng.choice(held)
                f, value = "read", (name, None)
                recorder.invoke(process, f, value)
                out = await client.read(name, node)
                done_value = (name, out.value if out.type == OK else None)
            recorder.complete(process, out.type, f, done_value, out.error)
            stats.counts[(f, out.type)] += 1
            if out.invalid:
                stats.invalid.append(f"{f} {value}: {out.error}")
            if out.error:
                stats.errors[out.error[:60]] += 1
            if out.type == INFO:
                process += sessions  # retired: its op may still take effect
                stats.processes += 1
            if out.move:
                node = (node + 1) % client.nodes
            if pause_s:
                await asyncio.sleep(rng.random() * pause_s)

    await asyncio.gather(*(session(i) for i in range(sessions)))
    stats.seconds = time.monotonic() - t_start
    return stats


async def final_state(client: HttpScheduler, *, attempts: int = 40, retry_s: float = 0.25) -> dict[str, Any]:
    """Every replica's groups (linearizable read) and status with invariants, retried (bounded)."""
    groups: dict[int, dict | None] = {}
    statuses: dict[int, dict | None] = {}

    async def on(node: int) -> None:
        for _ in range(attempts):
            g = await client.groups(node)
            if g is not None:
                groups[node] = g
                break
            await asyncio.sleep(retry_s)
        for _ in range(attempts):
            st = await client.status(node)
            if st is not None:
                statuses[node] = st
                break
            await asyncio.sleep(retry_s)

    await asyncio.gather(*(on(n) for n in range(client.nodes)))
    return {"groups": {n: groups.get(n) for n in range(client.nodes)},
            "statuses": {n: statuses.get(n) for n in range(client.nodes)}}


def _pairs(ops: list) -> list[tuple[Any, Any]]:
    """(invocation, completion) of every completed client operation, in completion order."""
    open_: dict[Any, Any] = {}
    out = []
    for op in ops:
        if op.process == "nemesis":
            continue
        if op.type == "invoke":
            open_[op.process] = op
            continue
        inv = open_.pop(op.process, None)
        if inv is not None:
            out.append((inv, op))
    # invocations never completed (the run ended): info
    for inv in open_.values():
        out.append((inv, None))
    return out


def check_scheduler(ops: list, final: dict[str, Any], nodes: int) -> dict[str, Any]:
    """The checks of the module docstring; ``valid`` True when every one holds."""
    problems: dict[str, list[str]] = defaultdict(list)
    pairs = _pairs(ops)
    alloc: dict[str, tuple[Any, Any]] = {}  # group -> (invocation, completion or None)
    releases: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    reads: list[tuple[Any, Any]] = []
    for inv, done in pairs:
        name = inv.value[0]
        if inv.f == "allocate":
            alloc[name] = (inv, done)
        elif inv.f == "release":
            releases[name].append((inv, done))
        elif inv.f == "read" and done is not None and done.type == OK:
            reads.append((inv, done))

    def typ(done: Any) -> str:
        return INFO if done is None else done.type

    # every replica's invariants
    statuses = final.get("statuses", {})
    for n in range(nodes):
        st = statuses.get(n)
        if st is None:
            problems["invariants"].append(f"node {n}: no status")
        elif st.get("invariants"):
            problems["invariants"].append(f"node {n}: {st['invariants'][:5]}")
    # every replica's final groups agree
    groups = final.get("groups", {})
    views = [groups.get(n) for n in range(nodes)]
    if any(v is None for v in views):
        problems["final_states_agree"].append(f"no final state from node(s) {[n for n, v in enumerate(views) if v is None]}")
    elif len({json.dumps(v, sort_keys=True) for v in views}) != 1:
        problems["final_states_agree"].append("replicas list different groups or placements")
    final_groups: dict[str, list] = next((v for v in views if v is not None), {}) or {}
    # acknowledged allocations and releases
    for name, (inv, done) in alloc.items():
        rel = releases.get(name, [])
        present = name in final_groups
        if typ(done) == OK and not rel:
            if not present:
                problems["acknowledged_allocations_survive"].append(f"{name}: acknowledged, never released, missing")
            elif final_groups[name] != done.value[1]:
                problems["acknowledged_allocations_survive"].append(
                    f"{name}: acknowledged at {done.value[1]}, now at {final_groups[name]}")
        if typ(done) == FAIL and present:
            problems["acknowledged_allocations_survive"].append(f"{name}: allocate failed ({done.error}) yet present")
        if any(typ(d) == OK for _i, d in rel) and present:
            problems["acknowledged_allocations_survive"].append(f"{name}: release acknowledged yet present")
    for name in final_groups:
        if name not in alloc:
            problems["acknowledged_allocations_survive"].append(f"{name}: present but never asked for")
    # no cell twice: in the final state ...
    owner: dict[tuple, str] = {}
    for name, cells in final_groups.items():
        for node, leaf in cells:
            if (node, leaf) in owner:
                problems["no_cell_twice"].append(f"{node}/{leaf} held by {owner[(node, leaf)]} and {name}")
            owner[(node, leaf)] = name
    # ... and in real time: B's acknowledged placement overlaps A's, A acknowledged first
    # (A's allocate completed before B's was invoked): A's release must have been invoked
    # before B's allocate completed.
    acked = [(name, inv, done) for name, (inv, done) in alloc.items() if typ(done) == OK]
    by_cell: dict[tuple, list] = defaultdict(list)
    for name, inv, done in acked:
        for node, leaf in done.value[1]:
            by_cell[(node, leaf)].append((name, inv, done))
    seen_pairs: set[tuple[str, str]] = set()
    for cell, holders in by_cell.items():
        for a_name, _a_inv, a_done in holders:
            for b_name, b_inv, b_done in holders:
                if a_name == b_name or a_done.time >= b_inv.time or (a_name, b_name) in seen_pairs:
                    continue
                released_before = any(r_inv.time < b_done.time and typ(r_done) != FAIL
                                      for r_inv, r_done in releases.get(a_name, []))
                if not released_before:
                    seen_pairs.add((a_name, b_name))
                    problems["no_cell_twice"].append(
                        f"{cell[0]}/{cell[1]}: {b_name} acknowledged while {a_name} held it (never released before)")
    # reads
    for inv, done in reads:
        name, found = inv.value[0], done.value[1]
        a = alloc.get(name)
        if a is None:
            continue
        a_inv, a_done = a
        rel = releases.get(name, [])
        if found is None and typ(a_done) == OK and a_done.time < inv.time and not any(r.time < done.time for r, _d in rel):
            problems["reads"].append(f"{name}: read at {inv.time:.3f} s found nothing; acknowledged at {a_done.time:.3f} s")
        if found is not None and any(typ(d) == OK and d.time < inv.time for _r, d in rel):
            problems["reads"].append(f"{name}: read at {inv.time:.3f} s found it after its release was acknowledged")
    names = ("invariants", "final_states_agree", "acknowledged_allocations_survive", "no_cell_twice", "reads")
    counts = Counter(typ(d) for _i, d in pairs)
    return {"valid": not any(problems.values()), **{n: not problems.get(n) for n in names},
            "problems": {n: problems[n][:20] for n in names if problems.get(n)},
            "groups_final": len(final_groups), "allocations_acknowledged": len(acked),
            "ops": dict(counts)}
