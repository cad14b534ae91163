"""``cellar member list|add|remove``: the cluster's members (issue 13).

``list`` asks every endpoint and prints one row per member id: the peer address the
replicas hold for it, whether it answers, its role and how far it has executed.
Members that no endpoint answers for are listed from the others' view (``peers`` in
their status).

``add NAME=HOST:PORT --client HOST:PORT`` and ``remove NAME`` change the members
through the log (docs/membership.md): the current members are read from the
endpoints (each replica's own entry: name, peer and client address), the new list is
proposed as one admin request (``["reconfig", members, sequencer, epoch]``, the admin
certificate with TLS), which closes the epoch; every member then moves to the next.
``add`` first needs the new member running: ``cellar serve --join ENDPOINT --name
NAME --listen HOST:PORT --client HOST:PORT --data-dir DIR`` (it waits for the
members to name it, and answers ``joining`` meanwhile: ``add`` checks its name, peer
address and cluster id before proposing anything); ``add`` then waits, bounded, until
it and a majority of the new list serve the new epoch. The request names the epoch the
members were read at: a member of a newer epoch refuses it as stale (another change
came first). A member that stays but does not answer needs ``--client-of NAME=HOST:PORT``
(the new epoch tells it where its base is when it is back).
Removing the sequencer names another member sequencer of the next epoch. A replaced
machine is ``add`` of the new one, then ``remove`` of the old (or the other order).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import click

from store.admin_cli import CLIError, _options, _run, _statuses, client_tls, parse_endpoints


@click.group("member")
def member() -> None:
    """The cluster's members: list, add, remove, replace, promote."""


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


async def _epochs(addresses: list, timeout_s: float) -> list[dict]:
    """Each endpoint's ``["epoch"]`` answer (or its error)."""
    from consensus.runtime import clientwire
    from store.client import CellarClient

    async with CellarClient(addresses, timeout_s=timeout_s, connect_timeout_s=timeout_s, **client_tls()) as cellar:
        async def one(i: int) -> dict:
            try:
                return await cellar.call_once(i, clientwire.ADMIN, f"member-{time.time_ns()}", 1, ["epoch"])
            except Exception as e:
                return {"error": f"{type(e).__name__}: {e}", "endpoint": "%s:%d" % addresses[i]}

        return list(await asyncio.gather(*(one(i) for i in range(len(addresses)))))


async def _current(addresses: list, timeout_s: float) -> tuple[int, list[str], str | None, list[dict]]:
    """The newest epoch the endpoints serve: its number, its members (each with its
    client address where a member reported it) and its sequencer."""
    answers = await _epochs(addresses, timeout_s)
    live = [a for a in answers if "error" not in a and not a.get("retired") and not a.get("joining")]
    if not live:
        raise CLIError("no member answered: " + "; ".join(a.get("error", "removed") for a in answers))
    epoch = max(a["epoch"] for a in live)
    live = [a for a in live if a["epoch"] == epoch]
    own = {a["name"]: a["member"] for a in live}
    members = [own.get(m.partition("=")[0], m) for m in live[0]["members"]]
    seq = live[0].get("sequencer")
    sequencer = next((m for m in members if seq and m.partition("=")[0] == seq.partition("=")[0]), None)
    return epoch, members, sequencer, answers


def _same_members(a: list[str], b: list[str]) -> bool:
    """The same names at the same peer addresses, in the same order (client parts aside)."""
    from consensus.runtime.membership import MembershipError, parse_member

    try:
        return [parse_member(m) for m in a] == [parse_member(m) for m in b]
    except MembershipError:
        return False


async def _propose(addresses: list, members: list[str], sequencer: str, epoch: int, timeout_s: float,
                   wait_s: float, added: tuple = ()) -> dict:
    """Propose ``members`` as read at ``epoch`` (the request names that epoch: a member
    of a newer one refuses it as stale, so a list computed before another change never
    undoes it), then wait until a majority of ``members`` and each of ``added`` serve
    the next epoch."""
    from consensus.runtime import clientwire
    from store.client import CellarClient, CellarError

    t0 = time.monotonic()
    taken = False
    async with CellarClient(addresses, timeout_s=max(timeout_s, 5.0), connect_timeout_s=timeout_s,
                            **client_tls()) as cellar:
        last = None
        # One client id and seq for every attempt (as a session retries): if an attempt
        # whose answer was lost executed, the next gets its answer from the client
        # session instead of "epoch e already ends with a reconfiguration".
        client_id = f"member-{os.getpid()}-{time.time_ns()}"
        for i in range(len(addresses)):
            try:
                result = await cellar.call_once(i, clientwire.ADMIN, client_id, 1,
                                                ["reconfig", members, sequencer, epoch])
            except CellarError as e:
                if str(e).startswith(("busy", "moved")) or "stale:" in str(e):
                    last = e
                    if "stale:" in str(e):
                        break  # the cluster moved on: below, by our change (an answer lost) or another's
                    continue
                raise CLIError(str(e)) from None
            except (OSError, TimeoutError, asyncio.TimeoutError, ConnectionError) as e:
                last = e
                continue
            if not result.get("ok"):
                raise CLIError(f"refused: {result.get('error')}")
            taken = True
            break
    if not taken:
        # An attempt may have been executed with its answer lost (a timeout, or "moving"
        # because it closed the epoch): ours if the next epoch has exactly our members.
        try:
            now, now_members, _, _ = await _current(addresses, timeout_s)
        except CLIError:
            now, now_members = epoch, []
        if now == epoch + 1 and _same_members(now_members, members):
            pass
        elif now > epoch:
            raise CLIError(f"the members changed meanwhile (epoch {now}: "
                           f"{', '.join(m.partition('=')[0] for m in now_members)}), not to the list this change "
                           "computed: read them again (cellar member list) and retry")
        elif isinstance(last, (OSError, TimeoutError, asyncio.TimeoutError, ConnectionError)):
            raise CLIError(f"no member answered the change ({type(last).__name__}: {last}); it may still take "
                           "effect once a majority is back (cellar member list)")
        else:
            raise CLIError(f"no member took the change: {last}")
    # Wait until a majority of the new list, and every member added, serve the next epoch.
    deadline = t0 + wait_s
    from consensus.runtime.membership import client_of, member_name

    need = {member_name(m) for m in added}
    targets = [client_of(m) for m in members if client_of(m) is not None]
    while True:
        answers = await _epochs(targets or addresses, min(timeout_s, 1.0))
        serving = [a for a in answers if "error" not in a and not a.get("retired") and not a.get("joining")
                   and a.get("epoch", -1) > epoch]
        missing = sorted(need - {a.get("name") for a in serving})
        if len(serving) > len(members) // 2 and not missing:
            break
        if time.monotonic() > deadline:
            if missing:
                raise CLIError(f"the change to epoch {epoch + 1} is in the log, but {', '.join(missing)} did not "
                               f"join it within {wait_s:g} s (is `cellar serve --join` running there, with this "
                               f"cluster's --cluster-id?); `cellar member remove` takes it out again")
            raise CLIError(f"the change to epoch {epoch + 1} is in the log, but a majority of its members did not "
                           f"report serving it within {wait_s:g} s (cellar member list to follow it)")
        await asyncio.sleep(0.05)
    return {"ok": True, "epoch": epoch + 1, "members": members, "sequencer": sequencer,
            "seconds": round(time.monotonic() - t0, 3)}


async def _check_joiners(add: list[str], cluster_id: str | None, timeout_s: float, wait_s: float) -> None:
    """Each member to add must be waiting to join (``cellar serve --join``: its client
    port answers ``joining``) under its name and peer address, for this cluster. One
    just started may not listen yet: a newcomer that does not answer is asked again for
    10 s, or ``--wait`` if that is shorter."""
    from consensus.runtime.membership import client_of, parse_member

    deadline = time.monotonic() + min(max(timeout_s, 10.0), wait_s)
    for entry in add:
        name, host, port = parse_member(entry)
        addr = client_of(entry)
        while True:
            a = (await _epochs([addr], timeout_s))[0]
            if "error" not in a or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        where = "%s:%d" % addr
        if "error" in a:
            raise CLIError(f"{name} does not answer at {where} ({a['error']}): start it first with "
                           f"`cellar serve --join ... --name {name} --listen {host}:{port} --client {where}`")
        if not a.get("joining"):
            raise CLIError(f"{where} is not a member waiting to join (it is {a.get('name')!r} of epoch "
                           f"{a.get('epoch')})")
        if a.get("name") != name or a.get("member", "").partition(",")[0] != entry.partition(",")[0]:
            raise CLIError(f"{where} waits to join as {a.get('member')!r}, not {entry.partition(',')[0]!r}")
        if cluster_id is not None and a.get("cluster_id") != cluster_id:
            raise CLIError(f"{name} at {where} waits to join cluster {a.get('cluster_id')!r}, not {cluster_id!r} "
                           "(its --cluster-id)")


def _report(result: dict, as_json: bool, what: str) -> None:
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
    else:
        click.echo(f"{what}: epoch {result['epoch']}, {len(result['members'])} members "
                   f"({', '.join(m.partition('=')[0] for m in result['members'])}), sequencer "
                   f"{result['sequencer'].partition('=')[0]}, in {result['seconds']} s")


def _entries(new: tuple, client: str | None) -> list[str]:
    """NEW arguments -> full member entries (NAME=HOST:PORT,CLIENTHOST:CLIENTPORT)."""
    from consensus.runtime.membership import MembershipError, client_of, member_entry, parse_member
    from store.server import parse_address

    out = []
    try:
        for text in new:
            name, host, port = parse_member(text)
            if client_of(text) is None:
                if client is None or len(new) > 1:
                    raise MembershipError(f"{text}: give its client address (NAME=HOST:PORT,CLIENTHOST:CLIENTPORT, "
                                          "or --client with one member)")
                out.append(member_entry(name, (host, port), parse_address(client, "--client")))
            else:
                out.append(text)
    except Exception as e:
        raise click.BadParameter(str(e), param_hint="NEW") from None
    return out


def _client_addresses(given: tuple) -> dict[str, str]:
    """``--client-of NAME=HOST:PORT`` -> {name: "HOST:PORT"}."""
    from consensus.runtime.membership import MembershipError, _address

    out = {}
    for text in given:
        name, _, addr = text.partition("=")
        try:
            _address(addr, text)
        except MembershipError as e:
            raise click.BadParameter(str(e), param_hint="--client-of") from None
        if not name:
            raise click.BadParameter(f"{text!r}: NAME=HOST:PORT", param_hint="--client-of")
        out[name] = addr
    return out


async def _change(endpoints: str, timeout_s: float, wait_s: float, add: list[str], drop: tuple,
                  client_of: tuple = ()) -> dict:
    from consensus.runtime.membership import client_of as client_part

    addresses = parse_endpoints(endpoints)
    epoch, members, sequencer, answers = await _current(addresses, timeout_s)
    protocols = {a.get("protocol") for a in answers if "error" not in a and not a.get("retired")} - {None}
    if protocols - {"sdpaxos"}:
        raise CLIError(f"{', '.join(sorted(protocols - {'sdpaxos'}))} does not change membership (SDPaxos does)")
    given = _client_addresses(client_of)
    members = [f"{m},{given[m.partition('=')[0]]}" if client_part(m) is None and m.partition("=")[0] in given else m
               for m in members]
    names = [m.partition("=")[0] for m in members]
    for d in drop:
        if d not in names:
            raise CLIError(f"{d} is not a member of epoch {epoch} ({', '.join(names)})")
    for a in add:
        if a.partition("=")[0] in names:  # also one being removed: a new process needs a new name
            raise CLIError(f"{a.partition('=')[0]} is already a member of epoch {epoch}: a new member needs a new "
                           "name")
    new = [m for m in members if m.partition("=")[0] not in drop] + add
    if len(new) < 3 or len(new) % 2 == 0:
        raise CLIError(f"that leaves {len(new)} members: a configuration has an odd number, at least 3 "
                       "(add or remove two at once, or replace one)")
    # A member that stays must be reachable for the epoch notice when it is back: one
    # that did not answer (its client address unknown) would stay in the old epoch.
    unknown = [m.partition("=")[0] for m in new if client_part(m) is None]
    if unknown:
        raise CLIError(f"{', '.join(unknown)} did not answer, so its client address is unknown and it could not be "
                       f"told of the new epoch when it is back: give it (--client-of {unknown[0]}=HOST:PORT) or "
                       "start it first")
    from consensus.runtime.membership import MembershipError, check_members

    try:
        check_members(new)  # distinct names and addresses, before any newcomer is looked for
    except MembershipError as e:
        raise CLIError(str(e)) from None
    if sequencer is None or sequencer.partition("=")[0] in drop:
        sequencer = new[0]
    else:
        sequencer = next(m for m in new if m.partition("=")[0] == sequencer.partition("=")[0])
    ids = {a.get("cluster_id") for a in answers if "error" not in a and a.get("epoch") == epoch}
    await _check_joiners(add, ids.pop() if len(ids) == 1 else None, timeout_s, wait_s)
    return await _propose(addresses, new, sequencer, epoch, timeout_s, wait_s, tuple(add))


_CLIENT_OF = click.option("--client-of", "client_of", multiple=True, metavar="NAME=HOST:PORT",
                          help="The client address of a member that stays but does not answer now (repeatable).")

_WAIT = click.option("--wait", "wait_s", type=click.FloatRange(0.1, 600), default=30.0, show_default=True,
                     help="Seconds to wait until a majority of the new members serve the next epoch (and, "
                     "at most 10 of them, for a newcomer to answer).")


@member.command("add")
@click.argument("new", nargs=-1, required=True)
@click.option("--client", "client", metavar="HOST:PORT", help="The new member's client address (one NEW).")
@_WAIT
@_CLIENT_OF
@_options
@_run("cellar member add")
async def add(new: tuple, client: str | None, wait_s: float, client_of: tuple, endpoints: str, as_json: bool,
              timeout_s: float) -> int:
    """Add members NEW... (NAME=HOST:PORT[,CLIENTHOST:CLIENTPORT]: the peer and client
    addresses), each started first with ``cellar serve --join``. Members come in odd
    numbers: 3 -> 5 adds two at once."""
    result = await _change(endpoints, timeout_s, wait_s, _entries(new, client), (), client_of)
    _report(result, as_json, "added " + ", ".join(n.partition("=")[0] for n in new))
    return 0


@member.command("remove")
@click.argument("names", nargs=-1, required=True)
@_WAIT
@_CLIENT_OF
@_options
@_run("cellar member remove")
async def remove(names: tuple, wait_s: float, client_of: tuple, endpoints: str, as_json: bool,
                 timeout_s: float) -> int:
    """Remove members NAMES... (5 -> 3 removes two; the sequencer too: another member
    becomes the next epoch's sequencer). A removed process retires: it refuses
    writes, even restarted."""
    result = await _change(endpoints, timeout_s, wait_s, [], names, client_of)
    _report(result, as_json, "removed " + ", ".join(names))
    return 0


@member.command("replace")
@click.argument("old")
@click.argument("new")
@click.option("--client", "client", metavar="HOST:PORT", help="The new member's client address.")
@_WAIT
@_CLIENT_OF
@_options
@_run("cellar member replace")
async def replace(old: str, new: str, client: str | None, wait_s: float, client_of: tuple, endpoints: str,
                  as_json: bool, timeout_s: float) -> int:
    """Replace member OLD (e.g. a dead machine) by NEW (NAME=HOST:PORT, started with
    ``cellar serve --join``) in one change."""
    result = await _change(endpoints, timeout_s, wait_s, _entries((new,), client), (old,), client_of)
    _report(result, as_json, f"replaced {old} by {new.partition('=')[0]}")
    return 0


@member.command("promote")
@click.argument("name")
@click.option("--wait", "wait_s", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Seconds to wait for the replicas to agree on the new sequencer.")
@_options
@_run("cellar member promote")
async def promote(name: str, wait_s: float, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Make member NAME the sequencer (a planned handover, as ``cellar sequencer
    transfer`` by the member's name: its replica id changes with the member list)."""
    from store.admin_cli import transfer

    addresses = parse_endpoints(endpoints)
    epoch, members, _seq, _ = await _current(addresses, timeout_s)
    names = [m.partition("=")[0] for m in members]
    if name not in names:
        raise CLIError(f"{name} is not a member of epoch {epoch} ({', '.join(names)})")
    return await transfer.callback.__wrapped__(names.index(name), wait_s, endpoints, as_json, timeout_s)
