"""``cellar certs init DIR --nodes N``: a local CA and the certificates to try TLS.

::

    cellar certs init certs --nodes 3            # certs/ca.pem, ca-key.pem,
                                                 # node0.pem + node0-key.pem, ...,
                                                 # admin.pem + admin-key.pem,
                                                 # client.pem + client-key.pem
    cellar certs init certs --nodes 3 --host 10.0.0.5 --host db1.example   # more SANs
    cellar certs init certs --nodes 3 --json     # the paths, as JSON

Identities are in the subject (``consensus.transport.tls``): a replica's certificate
has ``OU=cellar-node, CN=node-<id>``, the admin client's ``OU=cellar-admin``, a plain
client's ``OU=cellar-client``. Every leaf is signed by the CA, valid for
``--days`` (default 825), with SANs ``127.0.0.1`` and ``localhost`` (plus ``--host``)
and both serverAuth and clientAuth usages (a replica dials and is dialed). Private
keys (EC P-256) are written with mode 0600, created that way (never world-readable
for a moment). An existing file is never overwritten unless ``--force``.

This is a CA for trying Cellar out and for tests; a production cluster would use the
operator's own CA with the same subject conventions.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import sys

import click

from consensus.transport.tls import ADMIN_OU, CLIENT_OU, NODE_OU, node_common_name

CA_FILE, CA_KEY_FILE = "ca.pem", "ca-key.pem"


class CertError(Exception):
    """One line on stderr, exit status 1."""


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str, ou: str | None = None):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cellar")]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _write(path: str, data: bytes, private: bool, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600 if private else 0o644)
    except FileExistsError:
        raise CertError(f"{path} exists (use --force to overwrite, or another DIR)") from None
    except OSError as e:
        raise CertError(f"cannot write {path}: {e.strerror or e}") from None
    with os.fdopen(fd, "wb") as f:
        if private:
            os.fchmod(f.fileno(), 0o600)  # an overwritten file keeps its old mode otherwise
        f.write(data)


def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(cluster: str = "cellar", days: int = 825):
    """A fresh CA: (certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    name = _name(f"Cellar CA ({cluster})")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def make_leaf(ca_cert, ca_key, cn: str, ou: str, hosts: list[str], days: int = 825):
    """A certificate signed by the CA: (certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    sans: list = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder().subject_name(_name(cn, ou)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def init_certs(directory: str, nodes: int, *, hosts: list[str] | None = None, days: int = 825,
               cluster: str = "cellar", force: bool = False) -> dict:
    """Write the CA, ``nodes`` node certificates, an admin and a client certificate
    into ``directory``; returns their paths (``{"ca": ..., "nodes": {id: {"cert", "key"}}, ...}``)."""
    if not 1 <= nodes <= 1000:
        raise CertError(f"--nodes {nodes}: between 1 and 1000")
    if days < 1:
        raise CertError(f"--days {days}: at least 1")
    names = ["127.0.0.1", "localhost", *(hosts or [])]
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CertError(f"cannot create {directory}: {e.strerror or e}") from None
    p = lambda name: os.path.join(directory, name)  # noqa: E731
    # Refuse before writing anything, so a half-written directory is never left behind.
    wanted = [CA_FILE, CA_KEY_FILE, "admin.pem", "admin-key.pem", "client.pem", "client-key.pem"]
    wanted += [f"node{i}{s}" for i in range(nodes) for s in (".pem", "-key.pem")]
    if not force:
        existing = [w for w in wanted if os.path.exists(p(w))]
        if existing:
            raise CertError(f"{p(existing[0])} exists (use --force to overwrite, or another DIR)")
    ca_cert, ca_key = make_ca(cluster, days)
    _write(p(CA_KEY_FILE), _pem_key(ca_key), True, force)
    _write(p(CA_FILE), _pem_cert(ca_cert), False, force)
    out: dict = {"dir": os.path.abspath(directory), "ca": os.path.abspath(p(CA_FILE)),
                 "ca_key": os.path.abspath(p(CA_KEY_FILE)), "nodes": {}}

    def leaf(stem: str, cn: str, ou: str) -> dict:
        cert, key = make_leaf(ca_cert, ca_key, cn, ou, names, days)
        _write(p(f"{stem}-key.pem"), _pem_key(key), True, force)
        _write(p(f"{stem}.pem"), _pem_cert(cert), False, force)
        return {"cert": os.path.abspath(p(f"{stem}.pem")), "key": os.path.abspath(p(f"{stem}-key.pem"))}

    for i in range(nodes):
        out["nodes"][i] = leaf(f"node{i}", node_common_name(i), NODE_OU)
    out["admin"] = leaf("admin", "admin", ADMIN_OU)
    out["client"] = leaf("client", "client", CLIENT_OU)
    return out


@click.group("certs")
def certs() -> None:
    """Certificates for TLS (a local CA to try it out)."""


@certs.command("init")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--nodes", type=int, required=True, help="Number of replicas (node0 .. node{N-1}).")
@click.option("--host", "hosts", multiple=True, metavar="NAME|IP",
              help="Another subject alternative name for every certificate (127.0.0.1 and localhost are always in).")
@click.option("--days", type=int, default=825, show_default=True, help="Validity of every certificate.")
@click.option("--cluster", default="cellar", show_default=True, help="Named in the CA's subject.")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@click.option("--json", "as_json", is_flag=True, help="Print the paths as JSON.")
def init(directory: str, nodes: int, hosts: tuple[str, ...], days: int, cluster: str, force: bool,
         as_json: bool) -> None:
    """Create a CA in DIRECTORY, one certificate+key per replica (its id in the subject),
    an admin client certificate (may run admin commands such as sequencer transfer)
    and a plain client certificate. Keys are written mode 0600."""
    try:
        out = init_certs(directory, nodes, hosts=list(hosts), days=days, cluster=cluster, force=force)
    except CertError as e:
        click.echo(f"cellar certs init: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
        return
    d = out["dir"]
    click.echo(f"CA and {nodes} node certificate(s) in {d}")
    click.echo(f"  serve:  cellar serve ... --tls-ca {d}/ca.pem --tls-cert {d}/node<ID>.pem --tls-key {d}/node<ID>-key.pem")
    click.echo(f"  admin:  cellar sequencer transfer --to 1 --cacert {d}/ca.pem --cert {d}/admin.pem --key {d}/admin-key.pem ...")
    click.echo(f"  client: cellar kv get k --cacert {d}/ca.pem --endpoints ...   (client.pem/client-key.pem optional)")
