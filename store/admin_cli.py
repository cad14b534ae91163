"""``cellar status`` and ``cellar sequencer transfer``: the replicas' client ports from
the command line (the binary client wire, ``consensus.runtime.clientwire``).

Both take ``--endpoints HOST:PORT,...`` (the replicas' *client* addresses, as
``cellar up`` prints them; default ``$CELLAR_ENDPOINTS`` or ``127.0.0.1:7100``).
``status`` asks every endpoint (each describes itself) and prints a table, or JSON
with ``--json``; a replica that does not answer is a row with its error. ``sequencer
transfer --to ID`` finds the serving sequencer, asks it to hand over (a planned
handover: it stops serving lease reads, ``ID`` takes the next view), then waits,
bounded, until the endpoints agree on the new sequencer. An error is one line on
stderr and exit status 1 (2 for a usage error); never a traceback.

TLS (replicas started with ``--tls-ca/--tls-cert/--tls-key``): ``--cacert`` the
cluster CA, and for admin commands (``sequencer transfer``) ``--cert``/``--key`` the
admin client certificate (``cellar certs init`` writes ``admin.pem``; also
``cellar snapshot save``); env
``CELLAR_CACERT``, ``CELLAR_CERT``, ``CELLAR_KEY``. Every command that takes
``--endpoints`` takes them (``tls_options``). Without the admin certificate a
transfer is refused: ``PermissionDenied: ...``, exit status 1, nothing changed.

    cellar status --endpoints 127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102
    cellar sequencer transfer --to 2 --endpoints 127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from typing import Any, Callable

import click

DEFAULT_ENDPOINTS = "127.0.0.1:7100"


class CLIError(Exception):
    """One line on stderr, exit status 1."""


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``--endpoints`` as the client parses addresses (``store.client.parse_addresses``),
    a bad one a usage error."""
    from store.client import parse_addresses

    try:
        return parse_addresses(text)
    except ValueError as e:
        raise click.BadParameter(f"{e} (expected HOST:PORT,...)", param_hint="--endpoints") from None


def _remember_tls(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"cellar_tls_{param.name}"] = value
    return value


def tls_options(f: Callable) -> Callable:
    """``--cacert``, ``--cert``, ``--key`` (env CELLAR_CACERT, CELLAR_CERT, CELLAR_KEY),
    kept in the click context for ``client_tls()``; the command's signature is unchanged."""
    for name, env, text in (("--key", "CELLAR_KEY", "TLS: the client certificate's private key."),
                            ("--cert", "CELLAR_CERT", "TLS: a client certificate (the admin one for admin commands)."),
                            ("--cacert", "CELLAR_CACERT", "TLS: the cluster CA certificate; turns TLS on.")):
        f = click.option(name, "tls_" + name[2:], envvar=env, type=click.Path(dir_okay=False), expose_value=False,
                         callback=_remember_tls, help=text)(f)
    return f


def client_tls() -> dict:
    """``CellarClient`` keyword arguments for the command's ``--cacert/--cert/--key``."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    ca, cert, key = meta.get("cellar_tls_tls_cacert"), meta.get("cellar_tls_tls_cert"), meta.get("cellar_tls_tls_key")
    if (cert is None) != (key is None):
        raise click.BadParameter("a client certificate needs both --cert and --key", param_hint="--cert/--key")
    if ca is None:
        if cert is not None:
            raise click.BadParameter("--cert/--key need --cacert (TLS)", param_hint="--cacert")
        return {}
    return {"tls": ca, "tls_cert": cert, "tls_key": key}


def client_ssl_context() -> Any:
    """An ``ssl.SSLContext`` for ``--cacert/--cert/--key`` (HTTP clients), or None."""
    kw = client_tls()
    if not kw:
        return None
    from consensus.transport import tls

    try:
        return tls.client_context(kw["tls"], kw["tls_cert"], kw["tls_key"])
    except tls.TLSError as e:
        raise click.BadParameter(str(e), param_hint="--cacert") from None


def _options(f: Callable) -> Callable:
    f = tls_options(f)
    f = click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=3.0, show_default=True,
                     help="Seconds to wait for one replica's answer.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)
    f = click.option("--endpoints", envvar="CELLAR_ENDPOINTS", default=DEFAULT_ENDPOINTS, show_default=True,
                     metavar="HOST:PORT,...", help="Replicas' client addresses (env CELLAR_ENDPOINTS).")(f)
    return f


def _run(prog: str) -> Callable:
    def deco(coro_fn: Callable) -> Callable:
        @functools.wraps(coro_fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            try:
                code = asyncio.run(coro_fn(*args, **kwargs))
            except click.ClickException:
                raise  # a usage error: click prints it, exit status 2
            except CLIError as e:
                click.echo(f"{prog}: {e}", err=True)
                sys.exit(1)
            except KeyboardInterrupt:
                sys.exit(130)
            except Exception as e:  # never a traceback for the user
                click.echo(f"{prog}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", err=True)
                sys.exit(1)
            sys.exit(code or 0)

        return wrapper

    return deco


async def _statuses(addresses: list[tuple[str, int]], timeout_s: float) -> list[dict]:
    from store.client import CellarClient

    async with CellarClient(addresses, timeout_s=timeout_s, connect_timeout_s=timeout_s, **client_tls()) as cellar:
        return await cellar.statuses()


def _row(st: dict) -> dict:
    """The fields an operator reads first, from one replica's status."""
    if "error" in st:
        return {"endpoint": st["endpoint"], "error": st["error"]}
    if st.get("retired"):
        return {"endpoint": st["endpoint"], "role": "removed", "member": st.get("name"), "epoch": st.get("epoch")}
    lead = st.get("sequencer", st.get("leader"))
    return {
        "endpoint": st["endpoint"], "id": st.get("id"), "member": st.get("member"), "epoch": st.get("epoch"),
        "protocol": st.get("protocol"),
        "role": "sequencer" if lead == st.get("id") else "replica", "view": st.get("view"), "sequencer": lead,
        "phase": st.get("phase"), "lease": st.get("lease"), "exec_slot": st.get("exec_slot"),
        "digest": (st.get("digest") or "")[:12], "connected": st.get("connected"),
        "loop_lag_max_ms_60s": (st.get("loop") or {}).get("lag_max_ms_60s"),
        "nearness": st.get("nearness"), "asks": _asks(st.get("nearness")),
    }


def _asks(near: dict | None) -> str | None:
    """Peers in the order this replica asks them, with the round trips it measured:
    ``0 (20 ms), 2 (50 ms)``."""
    if not near:
        return None
    rtt = near.get("rtt_ms") or {}
    return ", ".join(f"{p} ({'?' if rtt.get(str(p)) is None else f'{rtt[str(p)]:g} ms'})"
                     for p in near.get("live_order") or [])


@click.command("status")
@_options
@_run("cellar status")
async def status(endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Each replica's role, view, sequencer, executed slot, digest and loop lag."""
    addresses = parse_endpoints(endpoints)
    rows = [_row(st) for st in await _statuses(addresses, timeout_s)]
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Cellar replicas")
        cols = ["endpoint", "id", "member", "epoch", "role", "view", "sequencer", "phase", "lease", "exec_slot", "digest", "connected",
                "loop_lag_max_ms_60s", "asks"]
        for c in cols:
            table.add_column(c.replace("loop_lag_max_ms_60s", "lag ms (60 s)").replace("asks", "asks (round trip)"))
        for r in rows:
            if "error" in r:
                table.add_row(r["endpoint"], "-", f"[red]{r['error']}[/red]", *[""] * (len(cols) - 3))
            else:
                table.add_row(*["" if r.get(c) is None else str(r.get(c)) for c in cols])
        Console(highlight=False, width=None if sys.stdout.isatty() else 160).print(table)
        digests = {r.get("digest") for r in rows if "error" not in r and r.get("role") != "removed"}
        slots = {r.get("exec_slot") for r in rows if "error" not in r and r.get("role") != "removed"}
        if len(slots) == 1 and len(digests) == 1:
            click.echo("every answering replica holds the same state")
    return 1 if all("error" in r for r in rows) else 0


@click.group("sequencer")
def sequencer() -> None:
    """Where the sequencer lives (SDPaxos)."""


@sequencer.command("transfer")
@click.option("--to", "target", type=click.IntRange(0, 30), required=True, help="Replica id of the new sequencer.")
@click.option("--wait", "wait_s", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Seconds to wait for the replicas to agree on the new sequencer.")
@_options
@_run("cellar sequencer transfer")
async def transfer(target: int, wait_s: float, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Planned handover of the sequencer role to replica TO (the paper's advice: the
    site closest to the others)."""
    from consensus.runtime import clientwire
    from store.client import CellarClient

    addresses = parse_endpoints(endpoints)
    answers = await _statuses(addresses, timeout_s)
    rows = [st for st in answers if "error" not in st]
    if not rows:
        raise CLIError("no replica answered")
    if rows[0].get("protocol") != "sdpaxos":
        raise CLIError(f"{rows[0].get('protocol')} has no sequencer to transfer")
    n = max(len(addresses), max(r.get("id", 0) for r in rows) + 1)
    by_id = {st.get("id"): i for i, st in enumerate(answers) if "error" not in st}
    current = max(rows, key=lambda r: r.get("view", -1)).get("sequencer")
    if target == current:
        result = {"ok": True, "sequencer": target, "changed": False}
    else:
        if target >= n:
            raise CLIError(f"replica {target} is not one of the {n} replicas")
        if current not in by_id:
            raise CLIError(f"the sequencer (replica {current}) is not among --endpoints")
        t0 = time.monotonic()
        async with CellarClient(addresses, timeout_s=timeout_s, connect_timeout_s=timeout_s, **client_tls()) as cellar:
            answer = await cellar.call_once(by_id[current], clientwire.ADMIN, f"admin-{time.time_ns()}", 1,
                                            ["transfer_sequencer", target])
            if not answer.get("ok"):
                raise CLIError(f"replica {current} refused the handover (not serving as sequencer right now: "
                               "retry in a moment)")
            deadline = t0 + wait_s
            while True:
                now_rows = [st for st in await _statuses(addresses, timeout_s) if "error" not in st]
                seqs = {st.get("sequencer") for st in now_rows}
                serving = [st for st in now_rows if st.get("id") == target and st.get("phase") == "normal"]
                if seqs == {target} and serving:
                    break
                if time.monotonic() > deadline:
                    raise CLIError(f"the replicas did not agree on sequencer {target} within {wait_s:g} s "
                                   f"(they report {sorted(seqs, key=str)})")
                await asyncio.sleep(0.05)
        result = {"ok": True, "sequencer": target, "changed": True, "from": current,
                  "seconds": round(time.monotonic() - t0, 3)}
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
    elif result["changed"]:
        click.echo(f"sequencer moved from replica {result['from']} to replica {target} in {result['seconds']} s")
    else:
        click.echo(f"replica {target} is already the sequencer")
    return 0
