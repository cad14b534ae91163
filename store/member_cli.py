"""``cellar member list``: the cluster's members as the replicas see them (issue 13).

Each replica knows the whole membership (its ``--peers``, fixed at start: online
add/remove/replace is not built yet, see docs/operations.md); this asks every
endpoint and prints one row per member id: the peer address the replicas hold for it,
whether it answers, its role and how far it has executed. Members that no endpoint
answers for are listed from the others' view (``peers`` in their status).
"""

from __future__ import annotations

import json

import click

from store.admin_cli import CLIError, _options, _run, _statuses, parse_endpoints


@click.group("member")
def member() -> None:
    """The cluster's members (list; add/remove/replace are not built yet)."""


@member.command("list")
@_options
@_run("cellar member list")
async def list_members(endpoints: str, as_json: bool, timeout_s: float) -> int:
    """One row per member: id, peer address, reachable, role, view, executed slot."""
    addresses = parse_endpoints(endpoints)
    answers = await _statuses(addresses, timeout_s)
    live = [st for st in answers if "error" not in st]
    if not live:
        raise CLIError("no replica answered: " + "; ".join(st["error"] for st in answers))
    newest = max(live, key=lambda st: st.get("view", -1))
    lead = newest.get("sequencer", newest.get("leader"))
    peers: dict[int, str] = {}
    for st in live:
        for k, addr in (st.get("peers") or {}).items():
            peers.setdefault(int(k), addr if isinstance(addr, str) else f"{addr[0]}:{addr[1]}")
    n = max([len(peers)] + [st.get("replicas", 0) or 0 for st in live] + [max(st.get("id", 0) for st in live) + 1])
    by_id = {st.get("id"): st for st in live}
    rows = []
    for i in range(n):
        st = by_id.get(i)
        rows.append({"id": i, "peer": peers.get(i), "reachable": st is not None,
                     "role": ("sequencer" if i == lead else "replica") if st is not None else None,
                     "view": st.get("view") if st else None, "exec_slot": st.get("exec_slot") if st else None,
                     "endpoint": st.get("endpoint") if st else None})
    if as_json:
        click.echo(json.dumps(rows, sort_keys=True))
        return 0
    click.echo(f"{'id':>3}  {'peer address':24} {'reachable':9} {'role':9} {'view':>6} {'exec slot':>10}  endpoint")
    for r in rows:
        click.echo(f"{r['id']:>3}  {str(r['peer'] or '?'):24} {'yes' if r['reachable'] else 'NO':9} "
                   f"{str(r['role'] or '-'):9} {str(r['view'] if r['view'] is not None else '-'):>6} "
                   f"{str(r['exec_slot'] if r['exec_slot'] is not None else '-'):>10}  {r['endpoint'] or '-'}")
    return 0
