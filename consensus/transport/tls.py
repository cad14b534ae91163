"""TLS for peer, client and HTTP connections: contexts, identities, file checks.

Off by default (plaintext on loopback, and then nothing is authenticated). With
``tls_ca``/``tls_cert``/``tls_key`` set, a replica:

- between replicas, presents its node certificate and requires the peer's, signed by
  the cluster CA (mutual TLS, TLS 1.2+); the identity in the peer's certificate
  (``OU=cellar-node, CN=node-<id>``) must be the node id it claims in its hello;
  hostnames are not checked between replicas, the node id is;
- on the client port and the HTTP API, presents its certificate; a client
  certificate is optional, but when one is sent it must be signed by the CA. ADMIN
  requests need a client certificate with ``OU=cellar-admin``.

``store.certs`` (``cellar certs init``) makes a CA and certificates that follow these
conventions. Everything here is the stdlib's ``ssl``; ``cryptography`` is used only to
check files at startup (:func:`check_files`), imported then.
"""

from __future__ import annotations

import re
import ssl
from typing import Any

NODE_OU = "cellar-node"
ADMIN_OU = "cellar-admin"
CLIENT_OU = "cellar-client"
_NODE_CN = re.compile(r"node-(\d{1,9})")


class TLSError(Exception):
    """A TLS setting is unusable; the message is one line a person can act on."""


def node_common_name(node_id: int) -> str:
    return f"node-{node_id}"


def subject(peercert: dict | None) -> dict[str, str]:
    """``{"organizationalUnitName": ..., "commonName": ...}`` from ``getpeercert()``."""
    out: dict[str, str] = {}
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            out[key] = value
    return out


def node_id_of(peercert: dict | None) -> int | None:
    """The replica id a (verified) certificate names, or None if it is not a node's."""
    s = subject(peercert)
    m = _NODE_CN.fullmatch(s.get("commonName", ""))
    if s.get("organizationalUnitName") != NODE_OU or m is None:
        return None
    return int(m.group(1))


def is_admin(peercert: dict | None) -> bool:
    """Whether a (verified) client certificate carries the admin credential."""
    return subject(peercert).get("organizationalUnitName") == ADMIN_OU


def describe(peercert: dict | None) -> str:
    s = subject(peercert)
    if not s:
        return "no certificate"
    return ", ".join(f"{k}={s[k]}" for k in ("organizationalUnitName", "commonName") if k in s) or "a certificate"


def _base(purpose: ssl.Purpose, ca: str, cert: str | None, key: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise TLSError(f"CA file {ca}: {_reason(e)}") from None
    if cert:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise TLSError(f"certificate {cert} / key {key}: {_reason(e)}") from None
    return ctx


def _reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return str(e)


def peer_server_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """Accepting replicas: our node certificate, the peer's required."""
    ctx = _base(ssl.Purpose.CLIENT_AUTH, ca, cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def peer_client_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """Dialing replicas: the node id in the certificate is checked, not the hostname."""
    ctx = _base(ssl.Purpose.SERVER_AUTH, ca, cert, key)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_port_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """The client port and the HTTP API: a client certificate is optional (verified
    against the CA when sent; the admin credential is one)."""
    ctx = _base(ssl.Purpose.CLIENT_AUTH, ca, cert, key)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(ca: str, cert: str | None = None, key: str | None = None, *,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A client's: trusts the cluster CA, optionally presents a client certificate
    (``cert`` and ``key``; the admin certificate for ADMIN requests)."""
    if (cert is None) != (key is None):
        raise TLSError("a client certificate needs both --cert and --key")
    ctx = _base(ssl.Purpose.SERVER_AUTH, ca, cert, key)
    ctx.check_hostname = check_hostname
    if cert is not None:
        # With TLS 1.3 the client's handshake is over before the server has checked the
        # client certificate, so a refused one shows only as a silent close afterwards;
        # TLS 1.2 checks it inside the handshake, which then fails with a clear error.
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def check_files(ca: str, cert: str, key: str, node_id: int | None = None) -> None:
    """Startup check of a replica's TLS files: each readable, the key the
    certificate's, the certificate signed by the CA and (with ``node_id``) naming that
    replica. Raises ``TLSError`` with one line."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    def read(path: str, what: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise TLSError(f"{what} {path}: {e.strerror or e}") from None

    ca_pem, cert_pem, key_pem = read(ca, "tls_ca"), read(cert, "tls_cert"), read(key, "tls_key")
    try:
        ca_cert = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        raise TLSError(f"tls_ca {ca} is not a PEM certificate") from None
    try:
        leaf = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise TLSError(f"tls_cert {cert} is not a PEM certificate") from None
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise TLSError(f"tls_key {key} is not an unencrypted PEM private key ({str(e).splitlines()[0] if str(e) else 'unreadable'})") from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(serialization.Encoding.DER, pub) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER, pub):
        raise TLSError(f"tls_key {key} is not the key of tls_cert {cert}")
    try:
        leaf.verify_directly_issued_by(ca_cert)
    except Exception:  # ValueError (issuer name) or InvalidSignature
        raise TLSError(f"tls_cert {cert} is not signed by the CA in tls_ca {ca}") from None
    if node_id is not None:
        from cryptography.x509.oid import NameOID

        attrs = {a.oid: a.value for a in leaf.subject}
        named = {"subject": ((("organizationalUnitName", attrs.get(NameOID.ORGANIZATIONAL_UNIT_NAME, "")),),
                             (("commonName", attrs.get(NameOID.COMMON_NAME, "")),))}
        if node_id_of(named) != node_id:
            raise TLSError(f"tls_cert {cert} is not replica {node_id}'s (it names {describe(named)}; "
                           f"expected OU={NODE_OU}, CN={node_common_name(node_id)})")
    peer_server_context(ca, cert, key)  # what ssl itself says about them


def peercert_of(transport: Any) -> dict | None:
    """The verified peer certificate of an asyncio (or uvloop) TLS transport."""
    return transport.get_extra_info("peercert") if transport is not None else None


class TLSListener:
    """A TLS port that sees its failures: ``asyncio``'s ``create_server(ssl=...)``
    drops a failed handshake silently (no protocol hears of it), so this accepts plain
    sockets itself and handshakes each with ``loop.connect_accepted_socket(ssl=...)``,
    bounded by ``handshake_timeout_s``; a failure goes to ``on_refused(peername, reason)``.

    ``plain_factory``: a connection whose first byte is not a TLS handshake record is
    given to this protocol in plaintext instead (the client port answers it with a
    clear error rather than a silent close). At most ``pending_max`` handshakes at once;
    more connections are closed and reported as ``"pending-limit"``.

    The shape of an ``asyncio.Server`` that the callers use: ``sockets``, ``close()``,
    ``wait_closed()``."""

    def __init__(self, ctx: ssl.SSLContext, factory: Any, on_refused: Any, *, handshake_timeout_s: float = 5.0,
                 plain_factory: Any = None, pending_max: int = 64, backlog: int = 128) -> None:
        self.ctx = ctx
        self.factory = factory
        self.on_refused = on_refused
        self.handshake_timeout_s = handshake_timeout_s
        self.plain_factory = plain_factory
        self.pending_max = pending_max
        self.backlog = backlog
        self.sockets: list = []
        self._accept_task: Any = None
        self._pending: set = set()
        self._closed = False

    async def start(self, host: str | None, port: int | None, *, sock: Any = None) -> TLSListener:
        import asyncio
        import socket

        if sock is None:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE)
            family, _t, _p, _c, addr = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(addr)
            except OSError:
                sock.close()
                raise
        sock.listen(self.backlog)
        sock.setblocking(False)
        self.sockets = [sock]
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop(sock), name="tls-accept")
        return self

    async def _accept_loop(self, lsock: Any) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                sock, addr = await loop.sock_accept(lsock)
            except asyncio.CancelledError:
                raise
            except OSError:  # EMFILE and the like: try again shortly
                await asyncio.sleep(0.1)
                continue
            if len(self._pending) >= self.pending_max:
                sock.close()
                self.on_refused(addr, "pending-limit")
                continue
            task = loop.create_task(self._handshake(sock, addr))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _handshake(self, sock: Any, addr: Any) -> None:
        import asyncio
        import socket

        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        handed = False  # once the loop's transport owns the socket, it closes it (uvloop detaches it)
        try:
            async with asyncio.timeout(self.handshake_timeout_s):
                if self.plain_factory is not None:
                    readable = loop.create_future()
                    loop.add_reader(sock.fileno(), lambda: readable.done() or readable.set_result(None))
                    try:
                        await readable
                    finally:
                        loop.remove_reader(sock.fileno())
                    first = sock.recv(1, socket.MSG_PEEK)
                    if first and first[0] != 0x16:  # not a TLS handshake record: a plaintext client
                        handed = True
                        await loop.connect_accepted_socket(self.plain_factory, sock)
                        return
                handed = True
                await loop.connect_accepted_socket(self.factory, sock, ssl=self.ctx,
                                                   ssl_handshake_timeout=self.handshake_timeout_s)
        except asyncio.CancelledError:
            if not handed:
                sock.close()
            raise
        except TimeoutError:
            if not handed:
                sock.close()
            self.on_refused(addr, "TLS handshake timed out")
        except (OSError, ssl.SSLError) as e:  # SSLError is an OSError: the handshake failed
            if not handed:
                sock.close()
            self.on_refused(addr, handshake_failure(e))

    def close(self) -> None:
        self._closed = True
        if self._accept_task is not None:
            self._accept_task.cancel()
        for task in list(self._pending):
            task.cancel()
        for s in self.sockets:
            s.close()

    async def wait_closed(self) -> None:
        import asyncio

        tasks = [t for t in [self._accept_task, *self._pending] if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5)


def handshake_failure(e: BaseException) -> str:
    """One line for a failed TLS handshake."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"certificate refused: {e.verify_message or e.reason}"
    if isinstance(e, ssl.SSLError):
        return f"TLS handshake failed: {e.reason or e}"
    if isinstance(e, (ConnectionResetError, BrokenPipeError)):
        return "the peer closed the connection during the TLS handshake (it does not trust our certificate, or does not speak TLS)"
    return f"TLS handshake failed: {type(e).__name__}: {e.strerror or e}" if isinstance(e, OSError) else str(e)
