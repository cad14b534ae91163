"""An HTTP client for the scheduler replicas' API, with failover (the CLI and the demo).

``SchedulerHTTP(["127.0.0.1:8200", "127.0.0.1:8201", ...])`` sends each request to
the replica that answered last and, when that one cannot answer, to the next:

- **connection failure** (refused, reset, DNS): nothing reached the replica; the next
  one is tried for every method;
- **503** (no majority, config check pending, a call timing out): the next one is
  tried. A write that timed out on the replica (``definite: false``) may still
  commit: retrying ``allocate`` under the same group name is safe, since a second
  allocate of a placed group answers 409 "already allocated" (the caller sees that);
- **no answer in time** from a replica that accepted the request: a read is tried on
  the next replica; a write is not (it may have taken effect) and raises
  ``Indefinite``.

Every other status is an answer and is returned as is: ``(status, body, endpoint)``.
When no replica answers, ``Unreachable`` names what each one said.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

SAFE_METHODS = frozenset({"GET", "HEAD"})


class SchedulerClientError(Exception):
    """One line for the user: no replica could answer."""


class Unreachable(SchedulerClientError):
    pass


class Indefinite(SchedulerClientError):
    """A write was sent and no answer came: it may or may not have taken effect."""


def parse_endpoints(text: str | list[str], scheme: str = "http") -> list[str]:
    """``host:port,host:port`` (or a list) -> base URLs ``http://host:port`` (``scheme``)."""
    items = text if isinstance(text, list) else [t for t in str(text).split(",")]
    out = []
    for raw in items:
        e = raw.strip()
        if not e:
            continue
        if not e.startswith(("http://", "https://")):
            host, sep, port = e.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise SchedulerClientError(f"endpoint {e!r} must be HOST:PORT")
            e = f"{scheme}://" + e
        out.append(e.rstrip("/"))
    if not out:
        raise SchedulerClientError("no endpoint given (--endpoints HOST:PORT,...)")
    return out


class SchedulerHTTP:
    def __init__(self, endpoints: str | list[str], timeout_s: float = 10.0, ssl: Any = None) -> None:
        # ssl: an ssl.SSLContext trusting the cluster CA (replicas with TLS on): HTTPS.
        self.ssl = ssl
        self.endpoints = parse_endpoints(endpoints, "https" if ssl is not None else "http")
        self.timeout_s = timeout_s
        self._current = 0
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SchedulerHTTP:
        connector = aiohttp.TCPConnector(ssl=self.ssl) if self.ssl is not None else None
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s), connector=connector)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def one(self, endpoint: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request to one endpoint (no failover); raises aiohttp/asyncio errors."""
        assert self._http is not None, "use `async with SchedulerHTTP(...)`"
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        async with self._http.request(method, endpoint + path, data=data, headers=headers) as r:
            text = await r.text()
            try:
                parsed: Any = json.loads(text) if text else None
            except ValueError:
                parsed = text
            return r.status, parsed

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any, str]:
        """``(status, body, endpoint)`` from the first replica that answers (module
        docstring for what counts as an answer)."""
        failures: list[str] = []
        n = len(self.endpoints)
        for k in range(n):  # bounded: each endpoint once
            i = (self._current + k) % n
            endpoint = self.endpoints[i]
            try:
                status, parsed = await self.one(endpoint, method, path, body)
            except (aiohttp.ClientConnectionError, OSError) as e:
                if isinstance(e, aiohttp.ServerDisconnectedError) and method not in SAFE_METHODS:
                    raise Indefinite(f"{endpoint} closed the connection before answering {method} {path}; "
                                     f"it may or may not have taken effect") from None
                failures.append(f"{endpoint}: {short_error(e)}")
                continue
            except asyncio.TimeoutError:
                if method not in SAFE_METHODS:
                    raise Indefinite(f"{endpoint} did not answer {method} {path} within {self.timeout_s:g} s; "
                                     f"it may or may not have taken effect") from None
                failures.append(f"{endpoint}: no answer within {self.timeout_s:g} s")
                continue
            if status == 503:
                msg = parsed.get("message") if isinstance(parsed, dict) else str(parsed)
                failures.append(f"{endpoint}: 503 {msg}")
                continue
            self._current = i
            return status, parsed, endpoint
        raise Unreachable("no replica could answer: " + "; ".join(failures))


def short_error(e: BaseException) -> str:
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"cannot connect ({e.os_error.strerror or e.os_error})"
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:200]


def error_message(status: int, body: Any) -> str:
    """One line from an error answer (HiveD's ``{"code", "message", "field"?}``)."""
    if isinstance(body, dict):
        msg = str(body.get("message") or body.get("error") or body)
        field = body.get("field")
        return f"{status}: {msg}" + (f" (field {field})" if field else "")
    return f"{status}: {str(body)[:200]}"
