"""Membership change on real processes: one node incarnation per epoch (docs/membership.md, part 3).

The core closes an epoch with an END slot and reports it (``Ready.epoch_end``); every
member then holds the same ``EpochBase`` (``consensus.core.epochs``): the next epoch's
members, sequencer and the state after END. The runtime moves a process to the next
epoch by ending the node of the old epoch and starting a new one, on the same ports,
from that base:

- **Members are ``NAME=HOST:PORT``** (the peer address): a reconfiguration names
  everything a peer needs to connect. Epoch 0's members are the configured peers, named
  by their ids (``0=127.0.0.1:7000``); a new member picks a new name.
- **Storage per epoch.** Epoch 0 is the data dir itself (as before membership existed);
  epoch ``e >= 1`` is ``<data dir>/epochs/<e>/``, a complete node data dir whose first
  snapshot is the base (slot 0), next to ``BASE`` (the packed base, written synced and
  renamed into place last: an epoch directory without ``BASE`` is incomplete and
  ignored). The newest complete epoch is the current one; older epochs' directories are
  deleted once the next one is complete.
- **Epochs do not mix.** A node of epoch ``e`` uses the cluster id ``<id>@e<e>`` on its
  peer connections, so the transport's handshake refuses a peer of another epoch.
- **A member that missed END** (down or cut off while the others moved on) is told by
  the new epoch's members (``epoch_notice`` on its client port, repeated until it
  answers with the new epoch), fetches the base from the one that told it
  (``epoch_base``) and moves on: everything it missed is below END, so in the base.
- **A removed member** writes ``REMOVED`` (the base that left it out) and retires: its
  client port answers status and the base (a newcomer of a disjoint move may still need
  it) and refuses everything else with ``moved: ...``, which sends a client to the other
  endpoints. Restarted with its old data it retires again: it never rejoins and never
  accepts a write.
- **A new member** starts with ``cellar serve --join HOST:PORT`` on an empty data dir:
  it asks that replica for its epoch's base until one names it, stores it, and starts in
  that epoch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from typing import Any

import msgpack

from consensus.core.config import make_ballot
from consensus.core.epochs import EpochBase
from consensus.runtime import clientwire
from consensus.storage.snapshot import Snapshot, encode_snapshot, write_file_synced
from consensus.storage.wal import fsync_dir, makedirs_durable
from consensus.transport.framing import MAX_FRAME_BYTES, FrameDecoder, ProtocolError, encode_frame

log = logging.getLogger("cellar.membership")

BASE_FILE = "BASE"
REMOVED_FILE = "REMOVED"
PREV_FILE = "PREV"  # in an epoch's dir: the members of the epoch this process left for it (to notify)
MEMBER_FILE = "MEMBER"  # the member name this data dir serves under (written before its first base)
MOVED = "moved"  # the error prefix that sends a client to another endpoint


class MembershipError(ValueError):
    """A malformed member list or membership request: the message is one line."""


def _address(text: str, whole: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    # isascii: "²".isdigit() is true and int("²") raises (out of the node's client frame
    # handler, which is crash-only: review R8)
    if not host or not (port.isascii() and port.isdigit()) or len(port) > 5 or not 0 < int(port) < 65536:
        raise MembershipError(f"member {whole!r:.80}: an address must be HOST:PORT")
    return host, int(port)


def parse_member(text: Any) -> tuple[str, str, int]:
    """``NAME=HOST:PORT[,CLIENTHOST:CLIENTPORT]`` -> (name, peer host, peer port)."""
    if type(text) is not str or "=" not in text:
        raise MembershipError(f"a member is NAME=HOST:PORT[,CLIENTHOST:CLIENTPORT], not {text!r:.80}")
    name, _, addrs = text.partition("=")
    if not name or not name.isascii() or not name.replace("-", "").replace("_", "").isalnum() or len(name) > 64:
        raise MembershipError(f"member name {name!r:.80}: letters, digits, - and _ only (at most 64)")
    peer, _, client = addrs.partition(",")
    host, port = _address(peer, text)
    if client:
        _address(client, text)
    return name, host, port


def client_of(member: str) -> tuple[str, int] | None:
    """The client address a member entry names (None: not given)."""
    client = member.partition("=")[2].partition(",")[2]
    return _address(client, member) if client else None


def member_entry(name: str, peer: tuple[str, int], client: tuple[str, int]) -> str:
    return f"{name}={peer[0]}:{peer[1]},{client[0]}:{client[1]}"


def check_members(members: Any) -> list[str]:
    """The member list of a reconfiguration, checked: distinct names and addresses."""
    if type(members) not in (list, tuple) or not members:
        raise MembershipError("members must be a non-empty list of NAME=HOST:PORT")
    parsed = [parse_member(m) for m in members]
    if len({p[0] for p in parsed}) != len(parsed):
        raise MembershipError("member names must be distinct")
    if len({(p[1], p[2]) for p in parsed}) != len(parsed):
        raise MembershipError("member addresses must be distinct")
    return list(members)


def epoch0_members(peers: dict[int, tuple[str, int]]) -> tuple[str, ...]:
    return tuple(f"{i}={peers[i][0]}:{peers[i][1]}" for i in sorted(peers))


def member_name(member: str) -> str:
    return member.partition("=")[0]


def tls_id(name: str) -> int | None:
    """With TLS, the replica id a member name stands for (its certificate names
    ``node-<id>``): the name must be that id's canonical decimal, at most 9 digits (a
    certificate's CN allows no more). ``"03"`` is refused: next to ``"3"`` both would take
    the certificate ``node-3``, and its holder could claim either index (review60 F1)."""
    if not (name.isascii() and name.isdigit()) or len(name) > 9 or str(int(name)) != name:
        return None
    return int(name)


def epoch_cluster_id(cluster_id: str, epoch: int) -> str:
    return cluster_id if epoch == 0 else f"{cluster_id}@e{epoch}"


def base_meta(n: int, sequencer_index: int) -> dict:
    """The snapshot meta of an epoch's start (slot 0), as ``Member._start`` makes it."""
    return {"protocol": "sdpaxos", "n": n, "slot": 0, "exec_inst": [0] * n, "view": make_ballot(0, sequencer_index)}


class EpochStore:
    """Where a process's epochs live (module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.epochs_dir = os.path.join(root, "epochs")

    def epoch_dir(self, epoch: int) -> str:
        return self.root if epoch == 0 else os.path.join(self.epochs_dir, str(epoch))

    def current(self) -> EpochBase | None:
        """The newest complete epoch's base; None: epoch 0 (or nothing yet)."""
        if not os.path.isdir(self.epochs_dir):
            return None
        best = None
        for name in os.listdir(self.epochs_dir):
            if not name.isdigit():
                continue
            path = os.path.join(self.epochs_dir, name, BASE_FILE)
            if not os.path.exists(path):
                continue  # incomplete: its BASE is renamed into place last
            with open(path, "rb") as f:
                base = EpochBase.unpack(f.read())
            if base.epoch != int(name):
                raise MembershipError(f"{path} holds the base of epoch {base.epoch}")
            if best is None or base.epoch > best.epoch:
                best = base
        return best

    def removed(self) -> EpochBase | None:
        path = os.path.join(self.root, REMOVED_FILE)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return EpochBase.unpack(f.read())

    def previous(self, epoch: int) -> tuple:
        """The members this process left for ``epoch`` (PREV; () if none): the new
        epoch's node notifies them also after a restart (review R9)."""
        try:
            with open(os.path.join(self.epoch_dir(epoch), PREV_FILE), "rb") as f:
                prev = msgpack.unpackb(f.read(), raw=False)
        except (OSError, ValueError, msgpack.UnpackException):
            return ()
        return tuple(m for m in prev if type(m) is str) if type(prev) is list else ()

    def store(self, base: EpochBase, prev: tuple = ()) -> str:
        """Make epoch ``base.epoch``'s data dir complete: its first snapshot is the base;
        ``BASE`` is renamed into place last, so a crash leaves it incomplete (ignored,
        redone from the base the old epoch's members still hold)."""
        d = self.epoch_dir(base.epoch)
        if os.path.isdir(d) and not os.path.exists(os.path.join(d, BASE_FILE)):
            shutil.rmtree(d)  # an earlier attempt's leftovers
        snaps = os.path.join(d, "snapshots")
        makedirs_durable(snaps)
        if base.state is not None:
            n = len(base.members)
            meta = base_meta(n, base.members.index(base.sequencer))
            image = encode_snapshot(Snapshot(0, msgpack.packb(meta, use_bin_type=True), base.state, slot=0))
            path = os.path.join(snaps, "snap-slot-" + "0" * 20 + ".snap")
            write_file_synced(path + ".tmp", image)
            os.replace(path + ".tmp", path)
            fsync_dir(snaps)
        if prev:
            write_file_synced(os.path.join(d, PREV_FILE), msgpack.packb(list(prev), use_bin_type=True))
        packed = base.pack()
        tmp = os.path.join(d, BASE_FILE + ".tmp")
        write_file_synced(tmp, packed)
        os.replace(tmp, os.path.join(d, BASE_FILE))
        fsync_dir(d)
        return d

    def member(self) -> str | None:
        """The member name recorded for this data dir (None: none yet)."""
        try:
            with open(os.path.join(self.root, MEMBER_FILE), encoding="utf-8") as f:
                return f.read().strip() or None
        except FileNotFoundError:
            return None

    def record_member(self, name: str) -> None:
        """Record ``name`` (before the first base is stored: a restart under another
        name is then refused instead of being taken for a removal)."""
        if self.member() == name:
            return
        makedirs_durable(self.root)
        tmp = os.path.join(self.root, MEMBER_FILE + ".tmp")
        write_file_synced(tmp, name.encode())
        os.replace(tmp, os.path.join(self.root, MEMBER_FILE))
        fsync_dir(self.root)

    def mark_removed(self, base: EpochBase) -> None:
        tmp = os.path.join(self.root, REMOVED_FILE + ".tmp")
        write_file_synced(tmp, base.pack())
        os.replace(tmp, os.path.join(self.root, REMOVED_FILE))
        fsync_dir(self.root)

    def drop_before(self, epoch: int) -> None:
        """Delete the ended epochs' logs (>= 1; epoch 0's files in the root: its WAL and
        snapshots) once ``epoch`` is complete: nothing of an ended epoch is needed."""
        if os.path.isdir(self.epochs_dir):
            for name in os.listdir(self.epochs_dir):
                if name.isdigit() and int(name) < epoch:
                    shutil.rmtree(os.path.join(self.epochs_dir, name), ignore_errors=True)
        if epoch >= 1:
            for sub in ("wal", "snapshots"):
                shutil.rmtree(os.path.join(self.root, sub), ignore_errors=True)


class _AnsweringPort(asyncio.Protocol):
    """A client port that answers each request itself (``answer``), frame by frame."""

    decoder: FrameDecoder
    transport: asyncio.Transport | None

    def answer(self, req: list) -> list:
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            frames = self.decoder.feed(data)
            replies = [self.answer(req) for frame in frames for req in clientwire.parse_requests(frame)]
        except (ProtocolError, clientwire.BadRequest):
            self.transport.abort()
            return
        if replies:
            self.transport.write(encode_frame(replies))


class RetiredPort(_AnsweringPort):
    """The client port of a removed member (module docstring)."""

    def __init__(self, base: EpochBase, name: str, removed_at: int, tls: bool = False) -> None:
        self.base = base
        self.name = name
        self.removed_at = removed_at
        self.tls = tls  # the base (the whole state) only for the admin or a replica (review60 F4)
        self.decoder = FrameDecoder(MAX_FRAME_BYTES)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def status(self) -> dict:
        return {"retired": True, "name": self.name, "epoch": self.removed_at, "members": list(self.base.members),
                "sequencer": self.base.sequencer, "role": "removed"}

    def answer(self, req: list) -> list:
        kind, client, seq, op = req
        if kind == clientwire.STATUS:
            return [client, seq, clientwire.OK, self.status()]
        if kind == clientwire.ADMIN and type(op) is list and op and op[0] == "epoch":
            return [client, seq, clientwire.OK, self.status()]
        if kind == clientwire.ADMIN and type(op) is list and op and op[0] == "epoch_base":
            if self.tls:
                from consensus.transport import tls

                cert = tls.peercert_of(self.transport)
                if not (tls.is_admin(cert) or tls.node_id_of(cert) is not None):
                    return [client, seq, clientwire.ERROR, clientwire.PERMISSION_DENIED + ": the base needs the admin "
                            "or a replica's certificate"]
            return [client, seq, clientwire.OK, {"epoch": self.base.epoch, "base": self.base.pack()}]
        if kind == clientwire.ADMIN and type(op) is list and op and op[0] == "epoch_notice":
            return [client, seq, clientwire.OK, {"epoch": self.base.epoch, "retired": True}]
        return [client, seq, clientwire.ERROR, moved_message(self.name, self.base)]


class JoiningPort(_AnsweringPort):
    """The client port of a new member waiting to be added (``serve --join``): it
    answers status and ``["epoch"]`` with ``joining`` (its entry and cluster id, which
    ``cellar member add`` checks before it proposes anything) and sends everything
    else to the members with ``moved: ...``."""

    def __init__(self, name: str, entry: str, cluster_id: str, conns: set, notified: set | None = None) -> None:
        self.info = {"joining": True, "name": name, "member": entry, "cluster_id": cluster_id, "epoch": -1,
                     "role": "joining"}
        self.conns = conns
        self.notified = notified  # client addresses of members that told us an epoch began: ask them too
        self.decoder = FrameDecoder(MAX_FRAME_BYTES)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.conns.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conns.discard(self.transport)

    def answer(self, req: list) -> list:
        kind, client, seq, op = req
        if kind == clientwire.STATUS or (kind == clientwire.ADMIN and type(op) is list and op and op[0] == "epoch"):
            return [client, seq, clientwire.OK, dict(self.info)]
        if kind == clientwire.ADMIN and type(op) is list and op and op[0] == "epoch_notice":
            if (self.notified is not None and len(op) == 3 and type(op[2]) is list and len(op[2]) == 2
                    and type(op[2][0]) is str and type(op[2][1]) is int and len(self.notified) < 64):
                self.notified.add((op[2][0], op[2][1]))
            return [client, seq, clientwire.OK, {"epoch": -1}]
        return [client, seq, clientwire.ERROR, f"{MOVED}: {self.info['name']} is not a member yet (it waits to be "
                                               "added)"]


def moved_message(name: str, base: EpochBase) -> str:
    return (f"{MOVED}: {name} is not a member of epoch {base.epoch}; its members are "
            f"{', '.join(base.members)}")


async def ask(addr: tuple[str, int], op: list, *, ssl: Any = None, timeout_s: float = 2.0,
              peer: list | None = None) -> Any:
    """One ADMIN request to a replica's client port; its result (raises on an error).
    With TLS, ``peer`` (a list) gets the server's verified certificate."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(addr[0], addr[1], ssl=ssl)
        if peer is not None:
            peer.append(writer.get_extra_info("peercert"))
        try:
            writer.write(encode_frame([[clientwire.ADMIN, f"member-{os.getpid()}", 1, op]]))
            await writer.drain()
            decoder = FrameDecoder(MAX_FRAME_BYTES)
            while True:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    raise ConnectionError("closed")
                frames = decoder.feed(chunk)
                if frames:
                    _client, _seq, status, result = frames[0][0]
                    if status != clientwire.OK:
                        raise MembershipError(str(result))
                    return result
        finally:
            writer.close()


async def fetch_base(addr: tuple[str, int], *, ssl: Any = None, cluster_id: str | None = None) -> EpochBase | None:
    """The base of the epoch ``addr``'s replica is in (None: epoch 0 or unreachable).
    Raises ``MembershipError`` if that replica is of another cluster than ``cluster_id``."""
    try:
        peer: list = []
        result = await ask(addr, ["epoch_base"], ssl=ssl, peer=peer)
        if cluster_id is not None and result.get("cluster_id", cluster_id) != cluster_id:
            raise MembershipError(f"{addr[0]}:{addr[1]} serves cluster {result.get('cluster_id')!r}, not {cluster_id!r} "
                                  f"(--cluster-id)")
        base = EpochBase.unpack(result["base"])
        if ssl is not None:
            # Any CA-signed certificate verifies (cellar certs init gives the client and
            # admin ones serverAuth too), and a notice names any address: take a base
            # only from a replica's certificate (review60 F3). Not only a member's of
            # that base: a removed member serves the base that removed it.
            from consensus.transport import tls

            if tls.node_id_of(peer[0] if peer else None) is None:
                log.warning("no base from %s:%d: its certificate (%s) is not a replica's", addr[0], addr[1],
                            tls.describe(peer[0] if peer else None))
                return None
        return base
    except MembershipError as e:
        if "serves cluster" in str(e):
            raise
        log.debug("no base from %s:%d: %s", addr[0], addr[1], e)
        return None
    except (OSError, ConnectionError, TimeoutError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.debug("no base from %s:%d: %s", addr[0], addr[1], e)
        return None
