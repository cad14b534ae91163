"""``cellar kv put|get|del|txn|watch`` and ``cellar lease grant|keepalive|revoke|timetolive|list``:
the key-value machine from the command line, through the replicas' client ports (the
binary client, ``store.client``); ``kv watch`` through their HTTP API (``POST /v3/watch``,
``--endpoints`` are then the ``--http`` addresses, default ``$CELLAR_HTTP_ENDPOINTS`` or
``127.0.0.1:7200``), since the binary protocol has no streams.

Every command takes ``--endpoints HOST:PORT,...`` (the replicas' *client* addresses, as
``cellar up`` prints them; default ``$CELLAR_ENDPOINTS`` or ``127.0.0.1:7100``), the
same convention as ``cellar status``. A command goes to one replica and moves to the
next (same session and sequence number, so it is applied at most once) when one does
not answer, until ``--timeout`` runs out. Output is etcdctl-like text, or the
machine's result as JSON with ``--json`` (keys and values as strings; a value that is
not valid UTF-8 as ``{"base64": ...}``). An error is one line on stderr and exit
status 1 (2 for a usage error); never a traceback. Keys and values are plain strings.

    cellar kv put /registry/pods/a '{"phase": "Running"}'
    cellar kv put /locks/x holder --lease 7
    cellar kv put /configs/big < big.json     # no VALUE: read from stdin
    cellar kv get /registry/ --prefix --keys-only
    cellar kv get /registry/pods/a --rev 12
    cellar kv del /registry/ --prefix
    cellar kv txn cas.json            # {"compare": [...], "success": [...], "failure": [...]}
    cellar kv watch /registry/ --prefix --rev 12 --endpoints 127.0.0.1:7200,127.0.0.1:7201
    cellar lease grant 10             # prints the lease id
    cellar lease keepalive 7
    cellar lease timetolive 7 --keys
    cellar lease revoke 7

A txn file is the machine's ``txn`` (docs/kv.md: ops as ``{"op": "put", "key", "value"}``
dicts, compares as ``{"key", "target": "value", "result": "=", "value"}``) or etcd's JSON
gateway shape (``{"request_put": {...}}`` items, ``"target": "VALUE"``) with plain
strings; ``-`` reads it from stdin.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import sys
from typing import Any, Callable

import click

from store.admin_cli import DEFAULT_ENDPOINTS, client_ssl_context, client_tls, parse_endpoints, tls_options


class CLIError(Exception):
    """One line on stderr, exit status 1."""


def _options(f: Callable) -> Callable:
    f = tls_options(f)
    f = click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
                     help="Seconds to wait for an answer (trying each replica in turn).")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(f)
    f = click.option("--endpoints", envvar="CELLAR_ENDPOINTS", default=DEFAULT_ENDPOINTS, show_default=True,
                     metavar="HOST:PORT,...", help="Replicas' client addresses (env CELLAR_ENDPOINTS).")(f)
    return f


def _run(prog: str) -> Callable:
    def deco(coro_fn: Callable) -> Callable:
        @functools.wraps(coro_fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            from store.client import CellarError

            try:
                code = asyncio.run(coro_fn(*args, **kwargs))
            except click.ClickException:
                raise  # a usage error: click prints it, exit status 2
            except (CLIError, CellarError) as e:
                click.echo(f"{prog}: {_one_line(e)}", err=True)
                sys.exit(1)
            except KeyboardInterrupt:
                sys.exit(130)
            except Exception as e:  # never a traceback for the user
                click.echo(f"{prog}: {type(e).__name__}: {_one_line(e)}", err=True)
                sys.exit(1)
            sys.exit(code or 0)

        return wrapper

    return deco


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


async def _request(endpoints: str, timeout_s: float, kind_name: str, op: dict) -> dict:
    """One command through the binary client; the machine's successful result, else CLIError."""
    from consensus.runtime import clientwire
    from store.client import CellarClient

    addresses = parse_endpoints(endpoints)
    kind = {"call": clientwire.CALL, "read": clientwire.READ}[kind_name]
    async with CellarClient(addresses, timeout_s=min(2.0, timeout_s), deadline_s=timeout_s,
                            connect_timeout_s=min(1.0, timeout_s), **client_tls()) as cellar:
        session = cellar.session()
        try:
            result = await asyncio.wait_for(session.request(kind, op), timeout_s + 1.0)
        except asyncio.TimeoutError:
            raise CLIError(f"no replica answered within {timeout_s:g} s"
                           + ("" if kind_name == "read" else " (the command may still take effect)")) from None
    if not isinstance(result, dict):
        raise CLIError(f"unexpected answer {str(result)[:200]}")
    if not result.get("ok"):
        code = result.get("code")
        raise CLIError(f"{code}: {result.get('error')}" if code else str(result.get("error", result)))
    return result


def _plain(value: Any) -> Any:
    """A key or value for JSON output."""
    if type(value) is bytes:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode()}
    return value


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return _plain(obj)


def _text(value: Any) -> str:
    v = _plain(value)
    if isinstance(v, dict):
        return f"(base64) {v['base64']}"
    return v if type(v) is str else json.dumps(v)


def _emit_json(result: dict) -> None:
    click.echo(json.dumps(_jsonable(result), indent=2, sort_keys=True))


def _emit_kvs(kvs: list) -> None:
    for kv in kvs:
        click.echo(_text(kv["key"]))
        if "value" in kv:
            click.echo(_text(kv["value"]))


def _span(op: dict, key: str, prefix: bool, range_end: str | None) -> None:
    if prefix and range_end is not None:
        raise click.UsageError("give --prefix or --range-end, not both")
    if prefix:
        op["prefix"] = True
    elif range_end is not None:
        op["range_end"] = range_end
    elif not key:
        raise click.BadParameter("the key is empty (add --prefix for every key)", param_hint="KEY")


# --- kv -------------------------------------------------------------------------------


@click.group("kv")
def kv() -> None:
    """Keys and values: put, get, del, txn, watch (etcd's v3 semantics, docs/kv.md)."""


@kv.command("put")
@click.argument("key")
@click.argument("value", required=False)
@click.option("--lease", type=click.IntRange(0, (1 << 63) - 1), default=0, help="Attach the key to lease ID.")
@click.option("--prev-kv", is_flag=True, help="Also print the previous key-value.")
@_options
@_run("cellar kv put")
async def put(key: str, value: str | None, lease: int, prev_kv: bool, endpoints: str, as_json: bool,
              timeout_s: float) -> int:
    """Set KEY to VALUE (a new revision); without VALUE, the value is read from stdin."""
    if value is None:
        if sys.stdin.isatty():
            raise click.UsageError("give VALUE, or pipe it on stdin")
        try:
            value = sys.stdin.read()
        except UnicodeDecodeError:
            raise CLIError("the value on stdin is not UTF-8 text") from None
    op: dict[str, Any] = {"op": "put", "key": key, "value": value}
    if lease:
        op["lease"] = lease
    if prev_kv:
        op["prev_kv"] = True
    r = await _request(endpoints, timeout_s, "call", op)
    if as_json:
        _emit_json(r)
        return 0
    click.echo(f"OK (revision {r['revision']})")
    if prev_kv and r.get("prev_kv"):
        _emit_kvs([r["prev_kv"]])
    return 0


@kv.command("get")
@click.argument("key")
@click.option("--prefix", is_flag=True, help="Every key starting with KEY ('' with --prefix: every key).")
@click.option("--range-end", help="Every key in [KEY, RANGE_END).")
@click.option("--rev", "revision", type=click.IntRange(0), default=0, help="Read at this past revision.")
@click.option("--keys-only", is_flag=True, help="Print keys, not values.")
@click.option("--count-only", is_flag=True, help="Print only the number of keys.")
@click.option("--limit", type=click.IntRange(0), default=0, help="At most N keys (0: all).")
@_options
@_run("cellar kv get")
async def get(key: str, prefix: bool, range_end: str | None, revision: int, keys_only: bool, count_only: bool,
              limit: int, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Read KEY (or a prefix or range), linearizably. Exit status 1 if nothing matches
    a single KEY."""
    op: dict[str, Any] = {"op": "range", "key": key}
    _span(op, key, prefix, range_end)
    for name, v in (("revision", revision), ("limit", limit), ("keys_only", keys_only), ("count_only", count_only)):
        if v:
            op[name] = v
    r = await _request(endpoints, timeout_s, "read", op)
    if as_json:
        _emit_json(r)
    elif count_only:
        click.echo(str(r["count"]))
    else:
        _emit_kvs(r["kvs"])
        if r.get("more"):
            click.echo(f"... {r['count'] - len(r['kvs'])} more (--limit {limit})", err=True)
    single = not prefix and range_end is None
    if single and r["count"] == 0 and not as_json:
        click.echo(f"cellar kv get: key {key!r} not found", err=True)
        return 1
    return 0


@kv.command("del")
@click.argument("key")
@click.option("--prefix", is_flag=True, help="Every key starting with KEY.")
@click.option("--range-end", help="Every key in [KEY, RANGE_END).")
@click.option("--prev-kv", is_flag=True, help="Also print the deleted key-values.")
@_options
@_run("cellar kv del")
async def delete(key: str, prefix: bool, range_end: str | None, prev_kv: bool, endpoints: str, as_json: bool,
                 timeout_s: float) -> int:
    """Delete KEY (or a prefix or range); prints how many keys were deleted."""
    op: dict[str, Any] = {"op": "delete_range", "key": key}
    _span(op, key, prefix, range_end)
    if prev_kv:
        op["prev_kv"] = True
    r = await _request(endpoints, timeout_s, "call", op)
    if as_json:
        _emit_json(r)
        return 0
    click.echo(str(r["deleted"]))
    if prev_kv:
        _emit_kvs(r.get("prev_kvs", []))
    return 0


def load_txn(path: str) -> dict:
    """The machine's ``txn`` op from a JSON file (machine or etcd gateway shape)."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CLIError(f"{path} is not UTF-8 text") from None
    try:
        body = json.loads(text)
    except ValueError as e:
        raise CLIError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise CLIError(f"{path}: a txn is a JSON object with compare, success and failure lists")
    body = {k: v for k, v in body.items() if k != "op"}
    items = [s for b in ("success", "failure") for s in (body.get(b) or []) if isinstance(body.get(b), list)]
    if any(isinstance(s, dict) and any(k.startswith("request_") for k in s) for s in items):
        from store.kv_http import APIError, Codec, txn_op

        try:
            return txn_op(body, Codec(text=True))
        except APIError as e:
            raise CLIError(f"{path}: {e}") from None
    return {"op": "txn", **body}


@kv.command("txn")
@click.argument("file", metavar="FILE.json")
@_options
@_run("cellar kv txn")
async def txn(file: str, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Run the transaction in FILE.json atomically: if every compare holds, the
    success ops, else the failure ops. Prints SUCCESS or FAILURE, then each op's answer."""
    op = load_txn(file)
    r = await _request(endpoints, timeout_s, "call", op)
    if as_json:
        _emit_json(r)
        return 0
    click.echo("SUCCESS" if r["succeeded"] else "FAILURE")
    branch = op.get("success" if r["succeeded"] else "failure") or []
    for sub, res in zip(branch, r["responses"]):
        click.echo("")
        name = sub.get("op") if isinstance(sub, dict) else None
        if name == "put":
            click.echo(f"OK (revision {res['revision']})")
        elif name == "delete_range":
            click.echo(str(res["deleted"]))
        else:
            _emit_kvs(res.get("kvs", []))
    return 0


# --- watch ----------------------------------------------------------------------------

DEFAULT_HTTP_ENDPOINTS = "127.0.0.1:7200"


class _Resume(Exception):
    """This replica's stream ended without a final answer: go on on the next one."""


def _kv_text(kv: dict, field: str) -> str:
    v = kv.get(field, "")
    return f"(base64) {v}" if kv.get(f"{field}_encoding") == "base64" else v


class _Watch:
    """One ``cellar kv watch``: a stream from one replica's ``POST /v3/watch``, resumed
    on the next replica from the revision after the last one seen when a stream breaks."""

    def __init__(self, endpoints: list, create: dict, count: int, as_json: bool, prev_kv: bool) -> None:
        self.endpoints = endpoints
        self.create = create
        self.count = count
        self.as_json = as_json
        self.prev_kv = prev_kv
        self.printed = 0
        self.start = create.get("start_revision", 0)  # the next revision wanted (0: from now)
        self.seen = 0  # the last revision every event of which was printed
        self.created = False  # the current stream got its watch created
        self.ssl = client_ssl_context()  # --cacert: HTTPS

    async def run(self) -> int:
        import aiohttp

        errors: list[str] = []
        i = 0
        failures = 0  # attempts in a row that got no watch going
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                host, port = self.endpoints[i % len(self.endpoints)]
                self.created = False
                try:
                    if await self._stream(session, f"{'https' if self.ssl else 'http'}://{host}:{port}/v3/watch?encoding=text"):
                        return 0
                except BrokenPipeError:
                    raise  # our reader is gone (| head), not the replica
                except _Resume as e:
                    errors.append(f"{host}:{port}: {e}")
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as e:
                    errors.append(f"{host}:{port}: {_one_line(e) if str(e) else type(e).__name__}")
                failures = 0 if self.created else failures + 1
                if failures >= len(self.endpoints):
                    raise CLIError("no replica serves the watch (" + "; ".join(errors[-failures:]) + ")")
                i += 1
                if failures:
                    await asyncio.sleep(0.2)

    async def _stream(self, session: Any, url: str) -> bool:
        """True once done (--count events printed); ``_Resume`` when the stream
        breaks; CLIError for an answer that retrying cannot change."""
        create = dict(self.create)
        if self.seen or self.start:
            create["start_revision"] = max(self.seen + 1, self.start)
        async with session.post(url, json={"create_request": create}, ssl=self.ssl or True) as resp:
            if resp.status != 200:
                try:
                    err = await resp.json(content_type=None)
                    text = f"{err.get('reason')}: {err.get('error')}"
                except ValueError:
                    text = f"HTTP {resp.status}"
                if resp.status in (429, 502, 503, 504):
                    raise _Resume(text)
                raise CLIError(text)
            while True:
                line = await resp.content.readline()
                if not line:
                    raise _Resume("the stream ended")
                try:
                    result = json.loads(line)["result"]
                except (ValueError, KeyError, TypeError):
                    raise _Resume(f"not a watch answer: {line[:80]!r}") from None
                rev = result.get("header", {}).get("revision", 0)
                if result.get("created"):
                    self.created = True
                    if not self.seen and not self.start:
                        self.seen = rev  # from now: the events after the creation revision
                    continue
                if result.get("canceled"):
                    reason = result.get("cancel_reason", "canceled")
                    if result.get("compact_revision"):
                        raise CLIError(f"watch canceled: {reason}")
                    raise _Resume(f"canceled: {reason}")
                events = result.get("events")
                if events is None:  # progress
                    self.seen = max(self.seen, rev)
                    continue
                if rev <= self.seen:
                    continue  # never twice
                for ev in events:
                    self._print(rev, ev)
                    self.printed += 1
                    if self.count and self.printed >= self.count:
                        return True
                self.seen = rev

    def _print(self, rev: int, ev: dict) -> None:
        if self.as_json:
            click.echo(json.dumps({"revision": rev, **ev}, sort_keys=True))
            return
        click.echo(ev.get("type", "PUT"))
        if self.prev_kv and ev.get("prev_kv"):
            click.echo(_kv_text(ev["prev_kv"], "key"))
            click.echo(_kv_text(ev["prev_kv"], "value"))
        click.echo(_kv_text(ev["kv"], "key"))
        if ev.get("type", "PUT") == "PUT":
            click.echo(_kv_text(ev["kv"], "value"))
        sys.stdout.flush()


@kv.command("watch")
@click.argument("key")
@click.option("--prefix", is_flag=True, help="Every key starting with KEY ('' with --prefix: every key).")
@click.option("--range-end", help="Every key in [KEY, RANGE_END).")
@click.option("--rev", "revision", type=click.IntRange(0), default=0,
              help="Start at this revision (history first); 0: changes from now on.")
@click.option("--prev-kv", is_flag=True, help="Also print each change's previous key-value.")
@click.option("--count", type=click.IntRange(0), default=0, help="Exit after N events (0: never).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1), default=None,
              help="Stop watching after S seconds (exit status 0).  [default: never]")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event and line.")
@tls_options
@click.option("--endpoints", envvar="CELLAR_HTTP_ENDPOINTS", default=DEFAULT_HTTP_ENDPOINTS, show_default=True,
              metavar="HOST:PORT,...",
              help="Replicas' HTTP addresses (cellar serve --http), not their client ports "
                   "(env CELLAR_HTTP_ENDPOINTS).")
def watch(key: str, prefix: bool, range_end: str | None, revision: int, prev_kv: bool, count: int,
          timeout_s: float | None, as_json: bool, endpoints: str) -> None:
    """Print changes to KEY (or a prefix or range) as they are applied, in revision
    order: the type (PUT or DELETE), the key, the value. With --rev, the history from
    that revision first. Served by any replica from its applied log, through its HTTP
    API (POST /v3/watch); when a replica goes away the watch goes on on the next one
    from the revision after the last one printed. Exit status 0 after --count events,
    --timeout or Ctrl-C; 1 with one line on an error (e.g. the revision is compacted)."""
    op: dict[str, Any] = {"op": "range", "key": key}
    _span(op, key, prefix, range_end)
    create: dict[str, Any] = {"key": key}
    if prefix:
        create["prefix"] = True
    elif range_end is not None:
        create["range_end"] = range_end
    if revision:
        create["start_revision"] = revision
    if prev_kv:
        create["prev_kv"] = True
    w = _Watch(parse_endpoints(endpoints), create, count, as_json, prev_kv)

    async def main() -> int:
        if timeout_s is None:
            return await w.run()
        try:
            return await asyncio.wait_for(w.run(), timeout_s)
        except asyncio.TimeoutError:
            return 0

    try:
        code = asyncio.run(main())
    except CLIError as e:
        click.echo(f"cellar kv watch: {_one_line(e)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(0)
    except BrokenPipeError:  # | head: the reader is gone
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no noise at exit
        except OSError:
            pass
        sys.exit(0)
    except Exception as e:  # never a traceback for the user
        click.echo(f"cellar kv watch: {type(e).__name__}: {_one_line(e)}", err=True)
        sys.exit(1)
    sys.exit(code)


# --- lease ----------------------------------------------------------------------------

_LEASE_ID = click.IntRange(1, (1 << 63) - 1)


@click.group("lease")
def lease() -> None:
    """Leases on keys: grant, keepalive, revoke, timetolive, list."""


@lease.command("grant")
@click.argument("ttl_s", metavar="TTL_S", type=click.IntRange(1, 9_000_000_000))
@_options
@_run("cellar lease grant")
async def grant(ttl_s: int, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Grant a lease of TTL_S seconds; prints its id."""
    r = await _request(endpoints, timeout_s, "call", {"op": "lease_grant", "ttl_ms": ttl_s * 1000, "now_ms": 0})
    if as_json:
        _emit_json(r)
    else:
        click.echo(f"lease {r['id']} granted with TTL({r['ttl_ms'] // 1000}s)")
    return 0


@lease.command("keepalive")
@click.argument("lease_id", metavar="ID", type=_LEASE_ID)
@_options
@_run("cellar lease keepalive")
async def keepalive(lease_id: int, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Renew lease ID once (its full TTL from now)."""
    r = await _request(endpoints, timeout_s, "call", {"op": "lease_keepalive", "id": lease_id, "now_ms": 0})
    if as_json:
        _emit_json(r)
    else:
        click.echo(f"lease {r['id']} keepalived with TTL({r['ttl_ms'] // 1000}s)")
    return 0


@lease.command("revoke")
@click.argument("lease_id", metavar="ID", type=_LEASE_ID)
@_options
@_run("cellar lease revoke")
async def revoke(lease_id: int, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Revoke lease ID and delete every key attached to it."""
    r = await _request(endpoints, timeout_s, "call", {"op": "lease_revoke", "id": lease_id})
    if as_json:
        _emit_json(r)
    else:
        click.echo(f"lease {lease_id} revoked ({r['deleted']} key(s) deleted)")
    return 0


@lease.command("timetolive")
@click.argument("lease_id", metavar="ID", type=_LEASE_ID)
@click.option("--keys", is_flag=True, help="Also list the keys attached to it.")
@_options
@_run("cellar lease timetolive")
async def timetolive(lease_id: int, keys: bool, endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Remaining and granted TTL of lease ID."""
    op: dict[str, Any] = {"op": "lease_timetolive", "id": lease_id}
    if keys:
        op["keys"] = True
    r = await _request(endpoints, timeout_s, "read", op)
    if as_json:
        _emit_json(r)
        return 0
    line = f"lease {r['id']} granted with TTL({r['granted_ttl_ms'] // 1000}s), remaining({r['ttl_ms'] // 1000}s)"
    if keys:
        line += ", attached keys([" + ", ".join(_text(k) for k in r.get("keys", [])) + "])"
    click.echo(line)
    return 0


@lease.command("list")
@_options
@_run("cellar lease list")
async def list_leases(endpoints: str, as_json: bool, timeout_s: float) -> int:
    """Every lease id."""
    r = await _request(endpoints, timeout_s, "read", {"op": "lease_leases"})
    if as_json:
        _emit_json(r)
    else:
        click.echo(f"found {len(r['leases'])} leases")
        for i in r["leases"]:
            click.echo(str(i))
    return 0
