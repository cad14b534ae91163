"""``cellar scheduler status|vcs|groups|allocate|release|health``: the replicas' HTTP API
from the command line.

Every command takes ``--endpoints HOST:PORT,...`` (any replicas; default
``$CELLAR_SCHEDULER_ENDPOINTS`` or ``127.0.0.1:8200``): requests go to one replica
and move to the next on a connection failure or a 503 (``store.scheduler_client``).
``status`` asks every endpoint, since it describes each replica. Output is a table
(rich), or the API's JSON with ``--json``. An error is one line on stderr and exit
status 1 (2 for a usage error); never a traceback.

    cellar scheduler status  --endpoints 127.0.0.1:8200,127.0.0.1:8201,127.0.0.1:8202
    cellar scheduler allocate examples/job-gang.json
    cellar scheduler groups
    cellar scheduler vcs
    cellar scheduler health node-3 off
    cellar scheduler release job1/workers
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import click

DEFAULT_ENDPOINTS = "127.0.0.1:8200"


class CLIError(Exception):
    """One line on stderr, exit status 1."""


def _options(f: Callable) -> Callable:
    from store.admin_cli import tls_options

    f = tls_options(f)  # --cacert/--cert/--key: HTTPS to replicas with TLS on
    f = click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
                     help="Seconds to wait for one replica's answer.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer.")(f)
    f = click.option("--endpoints", envvar="CELLAR_SCHEDULER_ENDPOINTS", default=DEFAULT_ENDPOINTS,
                     show_default=True, metavar="HOST:PORT,...",
                     help="Replicas' HTTP addresses (env CELLAR_SCHEDULER_ENDPOINTS); the next is tried when one "
                          "cannot answer.")(f)
    return f


def _run(coro_fn: Callable) -> Callable:
    """Run the async body; turn every failure into one line and exit status 1."""

    @functools.wraps(coro_fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        from store.scheduler_client import SchedulerClientError

        try:
            code = asyncio.run(coro_fn(*args, **kwargs))
        except (CLIError, SchedulerClientError) as e:
            click.echo(f"cellar scheduler: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as e:  # never a traceback for the user
            click.echo(f"cellar scheduler: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", err=True)
            sys.exit(1)
        sys.exit(code or 0)

    return wrapper


def _console() -> Any:
    from rich.console import Console

    width = None if sys.stdout.isatty() else 160  # a log or a pipe: no wrapping at 80 columns
    return Console(highlight=False, width=width)


def _print_json(body: Any) -> None:
    click.echo(json.dumps(body, indent=2, sort_keys=True))


async def _call(endpoints: str, timeout_s: float, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    from store.scheduler_client import SchedulerHTTP

    async with SchedulerHTTP(endpoints, timeout_s, ssl=_ssl()) as http:
        status, answer, _ = await http.request(method, path, body)
    return status, answer


def _ssl() -> Any:
    from store.admin_cli import client_ssl_context

    return client_ssl_context()


def _fail_unless(status: int, body: Any, ok: tuple[int, ...] = (200,)) -> None:
    from store.scheduler_client import error_message

    if status not in ok:
        raise CLIError(error_message(status, body))


# --- status -------------------------------------------------------------------------------


@click.command()
@_options
@click.option("--invariants", is_flag=True, help="Also run the invariant checker on each replica's state.")
@_run
async def status(endpoints: str, as_json: bool, timeout_s: float, invariants: bool) -> int:
    """Every replica: role, view, executed slot, digest, groups, GPUs in use.

    Exit status 1 if no replica is ready (or, with --invariants, one breaks one)."""
    import aiohttp

    from store.scheduler_client import SchedulerHTTP, short_error

    rows: list[dict[str, Any]] = []
    async with SchedulerHTTP(endpoints, timeout_s, ssl=_ssl()) as http:
        async def one(endpoint: str) -> dict[str, Any]:
            try:
                code, body = await http.one(endpoint, "GET", "/v1/status" + ("?invariants=1" if invariants else ""))
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                return {"endpoint": endpoint, "error": short_error(e) if not isinstance(e, asyncio.TimeoutError)
                        else f"no answer within {timeout_s:g} s"}
            if code != 200 or not isinstance(body, dict):
                return {"endpoint": endpoint, "error": f"HTTP {code}"}
            return dict(body, endpoint=endpoint)

        rows = list(await asyncio.gather(*(one(e) for e in http.endpoints)))
    bad_inv = any(r.get("invariants") for r in rows)
    ready = any(r.get("ready") for r in rows)
    if as_json:
        _print_json(rows)
        return 0 if ready and not bad_inv else 1
    if all("error" in r for r in rows):
        raise CLIError("no replica answered: " + "; ".join(f"{r['endpoint']}: {r['error']}" for r in rows))
    from rich.table import Table

    t = Table(title="scheduler replicas", title_justify="left")
    for col in ("replica", "endpoint", "ready", "role", "view", "slot", "digest", "groups", "pending", "GPUs used",
                "bad nodes"):
        t.add_column(col, justify="right" if col in ("view", "slot", "groups", "pending") else "left")
    if invariants:
        t.add_column("invariants")
    digests = {r.get("digest") for r in rows if "digest" in r}
    for r in rows:
        ep = r["endpoint"].removeprefix("http://")
        if "error" in r:
            t.add_row("?", ep, f"[red]down[/] ({r['error']})", *([""] * (8 + invariants)))
            continue
        role = "sequencer" if r.get("is_sequencer") else "replica"
        used = r.get("leaf_cells_used")
        total = (used or 0) + (r.get("leaf_cells_free") or 0)
        row = [str(r.get("node")), ep, "[green]yes[/]" if r.get("ready") else "[red]no[/]", role,
               str(r.get("view")), str(r.get("exec_slot")), str(r.get("digest")), str(r.get("groups", "")),
               str(r.get("pending", "")), f"{used}/{total}" if used is not None else "",
               ",".join(r.get("bad_nodes") or []) or "-"]
        if invariants:
            inv = r.get("invariants") or []
            row.append("[green]hold[/]" if not inv else f"[red]{len(inv)} broken[/]: {inv[0]}")
        t.add_row(*row)
    console = _console()
    console.print(t)
    up = [r for r in rows if "error" not in r]
    if up:
        same = len(digests) == 1
        console.print(f"{len(up)} of {len(rows)} replicas answered; digests "
                      + ("[green]identical[/]" if same else "[yellow]differ (a replica may be behind)[/]"))
    if not ready:
        raise CLIError("no replica is ready (config check pending, or no majority reachable)")
    return 1 if bad_inv else 0


# --- vcs, groups -----------------------------------------------------------------------------


def _leaves(cells: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(leaf cells, used, unhealthy) under a list of HiveD cell statuses."""
    total = used = bad = 0
    stack = list(cells)
    while stack:  # bounded by the tree
        c = stack.pop()
        children = c.get("cellChildren")
        if children:
            stack.extend(children)
            continue
        total += 1
        used += c.get("cellState") == "Used"
        bad += c.get("cellHealthiness") not in (None, "Healthy")
    return total, used, bad


@click.command()
@_options
@_run
async def vcs(endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Virtual clusters: their cells and leaf cells (GPUs) in use."""
    code, body = await _call(endpoints, timeout_s, "GET", "/v1/inspect/clusterstatus/virtualclusters/")
    _fail_unless(code, body)
    if as_json:
        _print_json(body)
        return 0
    from rich.table import Table

    t = Table(title="virtual clusters", title_justify="left")
    for col in ("VC", "cells", "cell types", "leaf cells", "used", "free", "unhealthy"):
        t.add_column(col, justify="left" if col in ("VC", "cell types") else "right")
    for vc in sorted(body):
        cells = body[vc]
        total, used, bad = _leaves(cells)
        types = sorted({c.get("cellType", "?") for c in cells})
        t.add_row(vc, str(len(cells)), ", ".join(types), str(total), str(used), str(total - used), str(bad))
    _console().print(t)
    return 0


def _placement(status: dict[str, Any]) -> str:
    phys = status.get("physicalPlacement") or {}
    return "  ".join(f"{node}:{','.join(str(x) for x in leaves)}" for node, leaves in sorted(phys.items())) or "-"


@click.command()
@_options
@_run
async def groups(endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Affinity groups: allocated (in order), then pending."""
    code, body = await _call(endpoints, timeout_s, "GET", "/v1/inspect/affinitygroups/")
    _fail_unless(code, body)
    if as_json:
        _print_json(body)
        return 0
    from rich.table import Table

    items = body.get("items", []) if isinstance(body, dict) else []
    t = Table(title=f"affinity groups ({len(items)})", title_justify="left")
    for col in ("name", "VC", "priority", "state", "placement (node:leaf cells)"):
        t.add_column(col, justify="right" if col == "priority" else "left")
    for g in items:
        s = g.get("status", {})
        state = s.get("state", "?")
        if s.get("lazyPreemptionStatus"):
            state += " (lazy-preempted)"
        t.add_row(g.get("metadata", {}).get("name", "?"), str(s.get("vc")), str(s.get("priority")),
                  f"[green]{state}[/]" if state.startswith("Allocated") else f"[yellow]{state}[/]", _placement(s))
    _console().print(t)
    return 0


# --- writes ------------------------------------------------------------------------------------


def _load_spec(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise CLIError(f"{path}: {e.strerror or e}") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
        return json.loads(text)
    except Exception as e:  # yaml.YAMLError, ValueError
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CLIError(f"{path}: not valid {'YAML' if path.suffix.lower() in ('.yaml', '.yml') else 'JSON'}: "
                       f"{first}") from None


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@_options
@click.option("--ttl-ms", type=click.IntRange(1), help="Lease: release the group this many ms after now.")
@click.option("--no-wait", is_flag=True, help="Fail (409) instead of queueing when it cannot be placed now.")
@_run
async def allocate(spec: Path, endpoints: str, as_json: bool, timeout_s: float, ttl_ms: int | None,
                   no_wait: bool) -> int:
    """Allocate an affinity group: SPEC is HiveD's pod scheduling spec (.json or .yaml)."""
    body: Any = _load_spec(spec)
    if ttl_ms is not None or no_wait:
        if not isinstance(body, dict):
            raise CLIError(f"{spec}: must be a mapping (a pod scheduling spec)")
        if "group" not in body:
            body = {"group": body}
        if ttl_ms is not None:
            body["ttl_ms"] = ttl_ms
        if no_wait:
            body["wait"] = False
    code, answer = await _call(endpoints, timeout_s, "POST", "/v1/groups", body)
    if as_json and code in (201, 202, 409):
        _print_json(answer)
        return 0 if code in (201, 202) else 1
    if code == 201:
        lines = [f"placed {answer.get('group')} (VC {answer.get('vc')}, priority {answer.get('priority')}, "
                 f"chain {answer.get('chain')})"]
        for i, pod in enumerate(answer.get("placement", [])):
            lines.append(f"  pod {i}: {pod.get('node')} leaf cells {pod.get('leaf_cells')}")
        for v in answer.get("preempted") or ():
            lines.append(f"  preempted {v}")
        for v in answer.get("lazy_preempted") or ():
            lines.append(f"  lazily preempted {v} (keeps its cells as opportunistic)")
        click.echo("\n".join(lines))
        return 0
    if code == 202:
        click.echo(f"queued {answer.get('group')}: {answer.get('reason')} (it is placed when cells free up)")
        return 0
    if code == 409 and isinstance(answer, dict) and answer.get("waiting"):
        raise CLIError(f"{answer.get('group')} cannot be placed now: {answer.get('reason')}")
    _fail_unless(code, answer)
    return 0


@click.command()
@click.argument("name")
@_options
@_run
async def release(name: str, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Release an affinity group (or cancel a pending one)."""
    code, answer = await _call(endpoints, timeout_s, "DELETE", "/v1/groups/" + quote(name, safe=""))
    _fail_unless(code, answer)
    if as_json:
        _print_json(answer)
        return 0
    what = "cancelled" if answer.get("cancelled") else "released"
    click.echo(f"{what} {name}")
    for s in answer.get("scheduled") or ():
        click.echo(f"  then placed {s.get('group')} (it was waiting)")
    return 0


@click.command()
@click.argument("node")
@click.argument("state", type=click.Choice(["on", "off"]))
@_options
@_run
async def health(node: str, state: str, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Mark NODE healthy (on) or bad (off): bad nodes get no new groups."""
    code, answer = await _call(endpoints, timeout_s, "PUT", "/v1/nodes/" + quote(node, safe="") + "/health",
                               {"healthy": state == "on"})
    _fail_unless(code, answer)
    if as_json:
        _print_json(answer)
        return 0
    changed = "" if answer.get("changed", True) else " (already so)"
    click.echo(f"node {node} marked {'healthy' if state == 'on' else 'bad'}{changed}")
    for s in answer.get("scheduled") or ():
        click.echo(f"  then placed {s.get('group')} (it was waiting)")
    return 0


COMMANDS = (status, vcs, groups, allocate, release, health)
