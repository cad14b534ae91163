"""``cellar serve`` (one replica process) and ``cellar up`` (a local cluster).

``cellar serve`` takes a TOML file or flags::

    cellar serve --id 0 --listen 127.0.0.1:7000 --client 127.0.0.1:7100 \\
        --peers 0=127.0.0.1:7000,1=127.0.0.1:7001,2=127.0.0.1:7002 --data-dir data/n0

    # node0.toml
    id = 0
    cluster_id = "prod-a"
    data_dir = "data/n0"
    client = "127.0.0.1:7100"
    protocol = "sdpaxos"      # or "multipaxos"
    fsync = "batch"           # always | batch | never
    machine = "scheduler"     # or "kv" (the default)
    hived_config = "examples/hived-small.yaml"   # the scheduler's HiveD config
    http = "127.0.0.1:7200"   # the HTTP API (store/kv_http.py; the scheduler's: store/http_api.py)
    tls_ca = "certs/ca.pem"   # TLS on peer, client and HTTP ports (all three or none;
    tls_cert = "certs/node0.pem"      # cellar certs init makes them; relative to this file)
    tls_key = "certs/node0-key.pem"
    [peers]
    0 = "127.0.0.1:7000"
    1 = "127.0.0.1:7001"
    2 = "127.0.0.1:7002"

TLS (``consensus.transport.tls``, docs/operations.md "TLS") is off by default: then
nothing is authenticated, which is meant for loopback only. With ``tls_ca``, ``tls_cert``
and ``tls_key`` (flags ``--tls-ca --tls-cert --tls-key``) replicas authenticate each
other by certificate (the node id in it must be the one claimed), clients and HTTP
get TLS, and admin requests need the admin client certificate. Each file is checked
at startup (missing, unreadable key, key not the certificate's, certificate not
signed by the CA or not this replica's), one line and exit status 2.

Flags override the file. Every configuration error is one line on stderr and exit
status 2. So is a scheduler replica whose HiveD config differs from the one the
cluster was initialized with (``store.scheduler_service``: the config enters the log
as the first ``init`` command; each replica compares its file's hash with it). SIGTERM and SIGINT stop the node cleanly (the WAL is synced and closed).
A replica that stops on its own (crash-only, ``consensus.runtime.node``: the core
raised, a WAL write or fsync failed) prints one line and exits with status 1::

    cellar serve: replica 1 stopped: core raised SafetyViolation: ... (in step) (traceback in D/crash.log)

Test-only clock knob: ``--clock-control FILE`` makes the replica tick at the rate
written in FILE (``consensus.runtime.clock_control``; the Jepsen clock nemesis). Never
use it outside tests.

Test-only fault hook: ``CELLAR_TEST_CORE_FAULT=CALL:N`` (CALL one of ``step``,
``tick``, ``propose``, ``ready``) makes the replica's core raise ``SafetyViolation``
on its (N+1)-th CALL, so tests can check the crash-only path on a real process.
Never set it outside tests.

``cellar up --replicas 3`` starts that many ``cellar serve`` processes on 127.0.0.1
with data under one folder, prints where each listens, and stops them on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from typing import Any

import click

from consensus.runtime.node import Node, NodeConfig, NodeError
from store.machines import MACHINES, machine_factory, stamper, validator

log = logging.getLogger("cellar.server")


def parse_address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not host:
        raise NodeError(f"{what} {text!r} must be HOST:PORT")
    try:
        value = int(port)
    except ValueError:
        raise NodeError(f"{what} {text!r}: port {port!r} is not a number") from None
    if not 0 <= value <= 65535:
        raise NodeError(f"{what} {text!r}: port out of range")
    return host, value


def parse_peers(spec: Any) -> dict[int, tuple[str, int]]:
    """``0=h:p,1=h:p`` or a TOML table ``{"0": "h:p"}``."""
    items: list[tuple[str, str]]
    if isinstance(spec, dict):
        items = [(str(k), str(v)) for k, v in spec.items()]
    else:
        items = []
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            node, sep, addr = part.partition("=")
            if not sep:
                raise NodeError(f"peer {part!r} must be ID=HOST:PORT")
            items.append((node.strip(), addr.strip()))
    peers: dict[int, tuple[str, int]] = {}
    for node, addr in items:
        try:
            nid = int(node)
        except ValueError:
            raise NodeError(f"peer id {node!r} is not a number") from None
        if nid in peers:
            raise NodeError(f"peer {nid} is listed twice")
        peers[nid] = parse_address(addr, f"peer {nid} address")
    if not peers:
        raise NodeError("no peers given (--peers 0=HOST:PORT,1=HOST:PORT,...)")
    if len(peers) < 3 or len(peers) % 2 == 0:
        raise NodeError(f"{len(peers)} replicas listed in the peers: a cluster has an odd number of replicas, 3 or more (3, 5, 7, ...)")
    return peers


def build_config(config_file: str | None, overrides: dict[str, Any]) -> NodeConfig:
    raw: dict[str, Any] = {}
    if config_file:
        try:
            with open(config_file, "rb") as f:
                raw = tomllib.load(f)
        except OSError as e:
            raise NodeError(f"cannot read config {config_file}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise NodeError(f"config {config_file} is not valid TOML: {e}") from None
    known = {"id", "listen", "client", "peers", "data_dir", "protocol", "fsync", "cluster_id", "tick_ms",
             "heartbeat_ms", "election_ms", "lease_ms", "batch_max", "inflight_max", "snapshot_every",
             "sequencer", "machine", "hived_config", "http", "clients_max", "client_idle_s", "client_frame_s",
             "snapshot_fork", "tls_ca", "tls_cert", "tls_key", "clock_control", "straggler_floor_ms",
             "early_send", "fsync_worker", "fsync_thread", "defer_execution"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise NodeError(f"config {config_file}: unknown setting(s) {', '.join(unknown)}")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    for required in ("id", "peers", "data_dir"):
        if required not in raw:
            raise NodeError(f"missing setting {required!r} (flag --{required.replace('_', '-')} or the config file)")
    peers = parse_peers(raw["peers"])
    try:
        node_id = int(raw["id"])
    except (TypeError, ValueError):
        raise NodeError(f"id {raw['id']!r} is not a number") from None
    if node_id not in peers:
        raise NodeError(f"node {node_id} is not in the peer list {sorted(peers)} (unknown peer)")
    if "listen" in raw:  # may differ from the advertised address (e.g. 0.0.0.0)
        peers[node_id] = parse_address(raw["listen"], "listen address")
    host, port = peers[node_id]
    client = parse_address(raw["client"], "client address") if raw.get("client") else (host, port + 100)
    cfg = NodeConfig(node_id=node_id, peers=peers, client_address=client, data_dir=str(raw["data_dir"]))
    for key, attr, typ in TOML_SETTINGS:
        if key in raw:
            try:
                setattr(cfg, attr, typ(raw[key]))
            except (TypeError, ValueError):
                raise NodeError(f"setting {key} = {raw[key]!r} is not a valid {typ.__name__}") from None
    for flag in ("snapshot_fork", "early_send", "fsync_thread", "defer_execution"):
        if flag in raw:
            if type(raw[flag]) is not bool:
                raise NodeError(f"setting {flag} = {raw[flag]!r} is not true or false")
            if flag == "fsync_thread":  # the older spelling: true = "thread", false = "loop"
                given = overrides_given(overrides)
                if "fsync_worker" in raw and ("fsync_worker" in given) == ("fsync_thread" in given):
                    raise NodeError("fsync_thread and fsync_worker both given: keep fsync_worker")
                if "fsync_worker" not in given:  # a flag beats the file
                    cfg.fsync_worker = "thread" if raw[flag] else "loop"
            else:
                setattr(cfg, flag, raw[flag])
    if raw.get("hived_config") is not None:
        if cfg.machine != "scheduler":
            raise NodeError("hived_config is a setting of the scheduler machine (add --machine scheduler)")
        path = str(raw["hived_config"])
        if config_file and not os.path.isabs(path) and "hived_config" not in overrides_given(overrides):
            path = os.path.join(os.path.dirname(os.path.abspath(config_file)), path)
        cfg.extra["hived_config"] = path
    elif cfg.machine == "scheduler":
        raise NodeError("the scheduler machine needs --hived-config FILE (or hived_config in the config file)")
    for key in ("tls_ca", "tls_cert", "tls_key"):
        if raw.get(key) is not None:
            path = str(raw[key])
            if config_file and not os.path.isabs(path) and key not in overrides_given(overrides):
                path = os.path.join(os.path.dirname(os.path.abspath(config_file)), path)
            setattr(cfg, key, path)
    if raw.get("clock_control") is not None:  # TESTING ONLY: consensus.runtime.clock_control
        cfg.extra["clock_control"] = str(raw["clock_control"])
    if raw.get("http") is not None:  # the machine's HTTP API: store/http_api.py or store/kv_http.py
        cfg.extra["http"] = parse_address(raw["http"], "HTTP address")
    if raw.get("name") is not None:  # a member's name (serve --join; membership.py)
        cfg.extra["name"] = str(raw["name"])
    cfg.validate()
    if cfg.machine not in MACHINES:
        raise NodeError(f"unknown machine {cfg.machine!r} ({', '.join(MACHINES)})")
    return cfg


def make_node(cfg: NodeConfig) -> Node:
    """The replica of ``cfg``, given the machine ``cfg.machine`` names (``store.machines``:
    its factory from ``cfg.machine_config``, its pre-proposal check and its stamper):
    the runtime resolves no machine name itself."""
    try:
        factory = machine_factory(cfg.machine, cfg.machine_config)
    except ValueError as e:  # an unknown name, or e.g. scheduler_state.ConfigError
        raise NodeError(f"machine {cfg.machine}: {e}") from None
    return Node(cfg, factory, validate=validator(cfg.machine), stamp=stamper(cfg.machine))


def overrides_given(overrides: dict[str, Any]) -> set[str]:
    return {k for k, v in overrides.items() if v is not None}


def load_hived_config(path: str) -> Any:
    """The scheduler's config, parsed and validated (one-line NodeError otherwise)."""
    from scheduler_state.config import ConfigError, load_config

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise NodeError(f"cannot read --hived-config {path}: {e.strerror or e}") from None
    try:
        return load_config(text)
    except ConfigError as e:
        raise NodeError(f"--hived-config {path}: {e}") from None


GC_THRESHOLDS = (10_000, 100, 1000)

# The TOML file's valued settings: (key in the file, NodeConfig attribute, type).
TOML_SETTINGS = (("protocol", "protocol", str), ("fsync", "fsync", str), ("cluster_id", "cluster_id", str),
                 ("tick_ms", "tick_ms", float), ("heartbeat_ms", "heartbeat_ms", float),
                 ("election_ms", "election_ms", float), ("lease_ms", "lease_ms", float),
                 ("batch_max", "batch_max", int), ("inflight_max", "inflight_max", int),
                 ("snapshot_every", "snapshot_every", int), ("sequencer", "initial_sequencer", int),
                 ("machine", "machine", str), ("clients_max", "clients_max", int),
                 ("client_idle_s", "client_idle_s", float), ("client_frame_s", "client_frame_s", float),
                 ("straggler_floor_ms", "straggler_floor_ms", float), ("fsync_worker", "fsync_worker", str))


def tune_gc() -> None:
    """Collections that never walk the state: what start-up recovered is frozen
    (``gc.freeze``: out of the collector's reach; it is still freed by reference
    counting) and a node freezes again after each snapshot (``Node.gc_freeze``), so
    the state and the log, which grow between snapshots, reach an older generation
    only until the next snapshot. A young collection (``GC_THRESHOLDS[0]`` new
    container objects, most of them the log's and the state's, which survive it)
    costs a few ms; at 50,000 it cost 10-20 ms of CPU and 30-130 ms of wall time on a
    loaded machine. ``GC_THRESHOLDS[1]``: a middle collection every 100 young ones
    (1,000,000 objects), which a snapshot's freeze normally comes before
    (docs/runtime.md, "Garbage collection")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


TEST_CORE_FAULT_ENV = "CELLAR_TEST_CORE_FAULT"
TEST_CORE_FAULT_CALLS = ("step", "tick", "propose", "ready")


def parse_test_core_fault(spec: str) -> tuple[str, int]:
    call, _, count = spec.partition(":")
    if call not in TEST_CORE_FAULT_CALLS or not count.isdigit():
        raise NodeError(f"{TEST_CORE_FAULT_ENV}={spec!r}: expected CALL:N with CALL one of "
                        f"{', '.join(TEST_CORE_FAULT_CALLS)}")
    return call, int(count)


def install_test_core_fault(replica: Any, spec: str) -> None:
    """TEST ONLY (``CELLAR_TEST_CORE_FAULT=CALL:N``): the first N calls of the core's
    CALL method run normally, the next one raises ``SafetyViolation``."""
    from consensus.core.sdpaxos import SafetyViolation

    call, count = parse_test_core_fault(spec)
    real = getattr(replica, call)
    left = [count]

    def faulty(*args: Any, **kwargs: Any) -> Any:
        if left[0] == 0:
            raise SafetyViolation(f"test fault injected by {TEST_CORE_FAULT_ENV}={spec}")
        left[0] -= 1
        return real(*args, **kwargs)

    setattr(replica, call, faulty)  # shadows the method on this instance only


class _Lifetime:
    """What outlives one epoch's node in ``run_node``: the stop request, the node now
    serving, and the base a notice told us to move to."""

    def __init__(self) -> None:
        self.stopping = False
        self.node: Node | None = None
        self.moved_to: Any = None  # an EpochBase newer than the node's epoch
        self.ready_written = False

    def stop(self) -> None:
        self.stopping = True
        if self.node is not None:
            asyncio.get_running_loop().create_task(self.node.stop())


def epoch_config(cfg: NodeConfig, base: Any, name: str) -> NodeConfig:
    """``cfg`` for epoch ``base.epoch`` (membership.py): our index among its members,
    their peer addresses, the epoch's data dir and cluster id."""
    from consensus.runtime import membership

    store = membership.EpochStore(cfg.data_dir)
    names = [membership.member_name(m) for m in base.members]
    if name not in names:
        raise NodeError(f"{name} is not a member of epoch {base.epoch} ({', '.join(base.members)})")
    peers = {}
    for i, m in enumerate(base.members):
        _n, host, port = membership.parse_member(m)
        peers[i] = (host, port)
    me = names.index(name)
    ecfg = dataclasses.replace(cfg, node_id=me, peers=peers, data_dir=store.epoch_dir(base.epoch),
                               cluster_id=membership.epoch_cluster_id(cfg.cluster_id, base.epoch),
                               initial_sequencer=base.members.index(base.sequencer), epoch=base.epoch,
                               members=tuple(base.members), epoch_base=base.pack(), extra=dict(cfg.extra))
    return ecfg


async def run_node(cfg: NodeConfig, ready_file: str | None = None) -> int | str:
    """Run until stopped: 0 after SIGTERM/SIGINT, or the one-line reason the node
    stopped on its own. One node per epoch (consensus/runtime/membership.py): when the
    cluster's members change, this process's node of the ended epoch stops and one of
    the next starts, on the same ports; removed, the process retires."""
    from consensus.runtime import membership

    name = cfg.extra.get("name") or str(cfg.node_id)
    store = membership.EpochStore(cfg.data_dir)
    life = _Lifetime()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, life.stop)
    try:
        recorded = store.member()
        removed = store.removed()
        base = store.current()
    except OSError as e:  # e.g. a file where the dir should be: as Node.open says it
        raise NodeError(f"data dir {cfg.data_dir} is not writable: {e.strerror or e}") from None
    except ValueError as e:
        raise NodeError(f"data dir {cfg.data_dir}: unreadable membership state: {e}") from None
    fresh = False
    if recorded is not None and recorded != name:
        # Not a removal: a typo in --name/--id must not retire this member for good.
        raise NodeError(f"data dir {cfg.data_dir} is member {recorded}'s, not {name}'s: start it with --name "
                        f"{recorded} (or --id {recorded} for one of the first members)")
    if removed is None and base is None and cfg.extra.get("join"):
        base = await _join(cfg, name, life, store)
        if base is None:
            return 0  # stopped while waiting
        store.store(base)
        fresh = True
    if removed is None and base is not None and name not in [membership.member_name(m) for m in base.members]:
        store.mark_removed(base)  # a crash between storing the base that left us out and this
        removed = base
    prev_members: tuple = store.previous(base.epoch) if base is not None and removed is None else ()
    while removed is None:
        ecfg = cfg if base is None else epoch_config(cfg, base, name)
        if fresh:
            ecfg.extra["fresh_epoch"] = True  # stored by this process, never started: Node.open
        fresh = False
        outcome = await _run_epoch(ecfg, ready_file, life, prev_members)
        if type(outcome) is not membership.EpochBase:
            return outcome
        prev_members = ecfg.member_list()
        store.record_member(name)  # this dir has served as ``name``: a restart under another is refused
        store.store(outcome, prev_members)
        store.drop_before(outcome.epoch)
        if name not in [membership.member_name(m) for m in outcome.members]:
            store.mark_removed(outcome)
            removed = outcome
            break
        base = outcome
        fresh = True
        if life.stopping:
            return 0
    return await _retire(cfg, name, removed, ready_file, life)


async def _join(cfg: NodeConfig, name: str, life: _Lifetime, store: Any) -> Any:
    """``serve --join HOST:PORT``: ask that replica for its epoch's base until one names
    us (the operator's ``cellar member add`` comes after this starts); None if stopped."""
    from consensus.runtime import membership

    addrs = cfg.extra["join"]
    ssl = _client_ssl(cfg)
    # A joiner must be new in the epoch it joins. Under the name of a current member (one
    # that lost its disk, say) it would run with an empty log and forget that member's
    # promises: so first learn the members as they are, refuse a name they already
    # have, claim this data dir for the name (MEMBER), and then take only a base of a
    # later epoch. A dir this joiner claimed before (restarted while waiting, or after
    # it was added but before it stored its base) never ran a node: any base naming it
    # is safe to take.
    seen = -1 if store.member() == name else None
    while seen is None and not life.stopping:
        # Every endpoint, and the newest epoch any of them knows: a removed member (it
        # answers with the members it was removed by) or a laggard knows older members,
        # which may lack a name a later change added (review60 F2).
        newest = None
        for addr in addrs:
            try:
                a = await membership.ask(addr, ["epoch"], ssl=ssl)
            except (OSError, ConnectionError, TimeoutError, membership.MembershipError, ValueError) as e:
                log.debug("join: no members from %s:%d: %s", addr[0], addr[1], e)
                continue
            if (type(a) is not dict or a.get("joining") or type(a.get("epoch")) is not int
                    or type(a.get("members")) is not list):
                continue
            if a.get("cluster_id", cfg.cluster_id) != cfg.cluster_id:
                raise NodeError(f"{addr[0]}:{addr[1]} serves cluster {a.get('cluster_id')!r}, not {cfg.cluster_id!r} "
                                "(--cluster-id)")
            if newest is None or a["epoch"] > newest["epoch"]:
                newest = a
        if newest is None:
            await asyncio.sleep(0.2)
            continue
        if name in [membership.member_name(m) for m in newest["members"] if type(m) is str]:
            raise NodeError(f"{name} is already a member of epoch {newest['epoch']}: a new member needs a name the "
                            f"members do not have (if {name} lost its data dir, replace it: cellar member replace "
                            f"{name} NEWNAME=HOST:PORT,CLIENTHOST:CLIENTPORT)")
        seen = newest["epoch"]
    if seen is None:
        return None
    store.record_member(name)
    me = (cfg.peers[cfg.node_id][0], cfg.peers[cfg.node_id][1])
    # Our client port answers ``joining`` meanwhile: ``cellar member add`` checks that
    # we run, under the name, peer address and cluster id it is about to propose.
    host, port = cfg.client_address
    server_ssl = None
    if cfg.tls:
        from consensus.transport import tls

        server_ssl = tls.client_port_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)
    entry = membership.member_entry(name, cfg.peers[cfg.node_id], cfg.client_address)
    conns: set = set()
    notified: set = set()  # members that sent us an epoch notice (the --join endpoints may be gone)
    try:
        server = await asyncio.get_running_loop().create_server(
            lambda: membership.JoiningPort(name, entry, cfg.cluster_id, conns, notified), host, port, ssl=server_ssl)
    except OSError as e:
        raise NodeError(f"cannot listen for clients on {host}:{port}: {e.strerror or e}") from None
    sys.stderr.write(f"cellar serve: {name} waits to be added (asking {', '.join('%s:%d' % a for a in addrs)} "
                     f"for the members)\n")
    sys.stderr.flush()
    try:
        while not life.stopping:
            for addr in list(addrs) + sorted(notified - set(addrs)):
                try:
                    base = await membership.fetch_base(addr, ssl=ssl, cluster_id=cfg.cluster_id)
                except membership.MembershipError as e:
                    raise NodeError(str(e)) from None
                named = [m for m in (base.members if base is not None else ()) if membership.member_name(m) == name]
                if named and base.epoch > seen:
                    if membership.parse_member(named[0])[1:] != me:
                        raise NodeError(f"epoch {base.epoch} names {named[0]}, but this {name} listens on "
                                        f"{me[0]}:{me[1]} (--listen)")
                    return base
            await asyncio.sleep(0.2)
        return None
    finally:
        server.close()
        for t in list(conns):
            t.abort()
        await server.wait_closed()


def _client_ssl(cfg: NodeConfig) -> Any:
    """A client context for talking to other replicas' client ports (TLS on), as the
    node itself: its certificate is the cluster's."""
    if not cfg.tls:
        return None
    from consensus.transport import tls

    return tls.peer_client_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)


async def _retire(cfg: NodeConfig, name: str, removed: Any, ready_file: str | None, life: _Lifetime) -> int:
    """A removed member: its client port answers status and the base, and refuses the
    rest with ``moved:`` until stopped (membership.RetiredPort)."""
    from consensus.runtime import membership

    loop = asyncio.get_running_loop()
    host, port = cfg.client_address
    ssl = None
    if cfg.tls:
        from consensus.transport import tls

        ssl = tls.client_port_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)
    try:
        server = await loop.create_server(lambda: membership.RetiredPort(removed, name, removed.epoch,
                                                                         tls=ssl is not None), host, port, ssl=ssl)
    except OSError as e:
        raise NodeError(f"cannot listen for clients on {host}:{port}: {e.strerror or e}") from None
    sys.stderr.write(f"cellar serve: {name} was removed from the cluster at epoch {removed.epoch} (members now "
                     f"{', '.join(removed.members)}); it refuses writes, answers status on {host}:{port}, and "
                     f"keeps its data in {cfg.data_dir} (delete it to reuse the dir)\n")
    sys.stderr.flush()
    _write_ready(ready_file, cfg, life)
    try:
        while not life.stopping:
            await asyncio.sleep(0.1)
    finally:
        server.close()
    return 0


def _write_ready(ready_file: str | None, cfg: NodeConfig, life: _Lifetime) -> None:
    if ready_file and not life.ready_written:
        life.ready_written = True
        tmp = ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "client": list(cfg.client_address), "peer": list(cfg.peers[cfg.node_id])}, f)
        os.replace(tmp, ready_file)


async def _notify(node: Node, targets: list[str], life: _Lifetime) -> None:
    """Tell the members of this epoch and of the one before that it began (each until
    it answers with this epoch or later): one that missed END fetches our base."""
    from consensus.runtime import membership

    cfg = node.cfg
    ssl = _client_ssl(cfg)
    me = list(cfg.client_address)
    pending = {t for t in targets if membership.client_of(t) is not None}
    while pending and not life.stopping and not node.stopped.is_set():
        for t in list(pending):
            try:
                answer = await membership.ask(membership.client_of(t), ["epoch_notice", cfg.epoch, me], ssl=ssl)
                if answer.get("epoch", -1) >= cfg.epoch or answer.get("retired"):
                    pending.discard(t)
            except (OSError, ConnectionError, TimeoutError, membership.MembershipError, AttributeError):
                pass
        await asyncio.sleep(0.5)


async def _run_epoch(cfg: NodeConfig, ready_file: str | None, life: _Lifetime, prev_members: tuple) -> Any:
    """One epoch's node, until stopped (0), failed (the reason) or the epoch ended (the
    next epoch's base)."""
    from consensus.runtime import membership

    fault = os.environ.get(TEST_CORE_FAULT_ENV)
    if fault:
        parse_test_core_fault(fault)  # a typo is a configuration error, before anything opens
    hived = load_hived_config(cfg.extra["hived_config"]) if cfg.machine == "scheduler" else None
    node = make_node(cfg)  # a scheduler starts empty: its config arrives through the log
    life.node = node
    ended: list = []

    def on_end(base: Any) -> None:
        ended.append(base)
        asyncio.get_running_loop().create_task(node.stop())

    async def adopt(epoch: int, addr: tuple) -> None:
        try:
            base = await membership.fetch_base(addr, ssl=_client_ssl(cfg), cluster_id=cfg.cluster_id.rpartition("@e")[0]
                                               if cfg.epoch else cfg.cluster_id)
        except membership.MembershipError as e:
            log.warning("node %d: ignoring an epoch notice: %s", cfg.node_id, e)
            return
        if base is not None and base.epoch > cfg.epoch and not ended and node.epoch_ended is None:
            log.info("node %d: epoch %d began without us (notice from %s:%d): moving on", cfg.node_id, base.epoch,
                     addr[0], addr[1])
            ended.append(base)
            await node.stop()

    node.on_epoch_end = on_end
    node.on_epoch_notice = lambda epoch, addr: asyncio.get_running_loop().create_task(adopt(epoch, addr))
    node.open()
    if fault:
        install_test_core_fault(node.replica, fault)
    tune_gc()
    node.gc_freeze = True
    await node.start()
    service = api = leases = None
    https = node.client_ssl_context() if cfg.tls else None  # the HTTP API's, with TLS on
    if cfg.machine == "kv":
        from store.kv_service import KVLeaseService

        leases = KVLeaseService(node)  # proposes lease expiry and the failover extension
        leases.start()
        if cfg.extra.get("http"):
            from store.kv_http import KVAPI

            api = KVAPI(node)
            host, port = cfg.extra["http"]
            try:
                await api.start(host, port, ssl_context=https)
            except OSError as e:
                await leases.stop()
                await node.stop()
                raise NodeError(f"cannot serve HTTP on {host}:{port}: {e.strerror or e}") from None
    if hived is not None:
        from store.scheduler_service import SchedulerService

        service = SchedulerService(node, hived, f"--hived-config {cfg.extra['hived_config']}")
        service.start()
        if cfg.extra.get("http"):
            from store.http_api import SchedulerAPI

            api = SchedulerAPI(service)
            host, port = cfg.extra["http"]
            try:
                await api.start(host, port, ssl_context=https)
            except OSError as e:
                await service.stop()
                await node.stop()
                raise NodeError(f"cannot serve HTTP on {host}:{port}: {e.strerror or e}") from None
    if life.stopping:
        await node.stop()
    notices = None
    if cfg.epoch > 0:
        mine = cfg.member_list()[cfg.node_id]
        targets = [m for m in dict.fromkeys(cfg.member_list() + tuple(prev_members)) if m != mine]
        notices = asyncio.get_running_loop().create_task(_notify(node, targets, life))
    st = node.replica.status()
    peer_host, peer_port = cfg.peers[cfg.node_id]
    client_host, client_port = cfg.client_address
    http = f", http {cfg.extra['http'][0]}:{cfg.extra['http'][1]}" if cfg.extra.get("http") else ""
    epoch = f", epoch {cfg.epoch}" if cfg.epoch else ""
    build = ""
    if cfg.machine == "scheduler":
        import scheduler_state

        build = " compiled" if scheduler_state.COMPILED else " pure Python"
    sys.stderr.write(f"cellar serve: replica {cfg.node_id} of {len(cfg.peers)}{epoch} ({cfg.protocol}, {cfg.machine}{build}, "
                     f"fsync {cfg.fsync}): peers {peer_host}:{peer_port}, clients {client_host}:{client_port}{http}; "
                     f"data {cfg.data_dir}; recovered to slot {st.get('exec_slot', 0)}, view {st.get('view')}\n")
    sys.stderr.flush()
    _write_ready(ready_file, cfg, life)
    await node.stopped.wait()
    if notices is not None:
        notices.cancel()
    if leases is not None:
        await leases.stop()
    if api is not None:
        await api.stop()
    if service is not None:
        await service.stop()
        if service.mismatch is not None:
            raise NodeError(service.mismatch)
    if node._failed is not None:
        return node.failure or repr(node._failed)
    if ended and not life.stopping:
        return ended[0]
    return 0


def exit_with_parent(pid: int) -> None:
    """Linux: have the kernel send us SIGTERM when our parent exits, however it exits
    (a ``cellar up`` or a test killed with SIGKILL must not orphan its replicas); if it
    is already gone (it died before this line), stop now. Elsewhere: nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != pid:
        click.echo(f"cellar serve: the process that started us ({pid}) is gone; not starting", err=True)
        sys.exit(2)


def install_loop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


@click.command("serve")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--id", "node_id", type=int, help="This replica's id (0..N-1).")
@click.option("--listen", help="Peer address HOST:PORT (default: this id's entry in --peers).")
@click.option("--client", "client", help="Client address HOST:PORT (default: peer port + 100).")
@click.option("--peers", help="Every replica: 0=HOST:PORT,1=HOST:PORT,...")
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--protocol", type=click.Choice(["sdpaxos", "multipaxos"]))
@click.option("--fsync", type=click.Choice(["always", "batch", "never"]))
@click.option("--cluster-id", help="Refuse peers and data dirs of another cluster.")
@click.option("--sequencer", type=int, help="Initial sequencer (leader) id.")
@click.option("--snapshot-every", type=click.IntRange(0), help="Executed slots between snapshots (0: never).")
@click.option("--machine", type=click.Choice(["kv", "scheduler"]), help="The replicated machine (default kv).")
@click.option("--hived-config", type=click.Path(dir_okay=False), help="The scheduler's HiveD config file.")
@click.option("--http", "http", help="Serve the machine's HTTP API on HOST:PORT (KV: store/kv_http.py).")
@click.option("--tls-ca", type=click.Path(dir_okay=False), help="TLS: the cluster CA certificate (PEM).")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="TLS: this replica's certificate (cellar certs init).")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="TLS: this replica's private key.")
@click.option("--clock-control", type=click.Path(dir_okay=False),
              help="TESTING ONLY: tick at the rate written in this file (1.02: 2 % fast; "
                   "consensus/runtime/clock_control.py). Rates that differ by more than the lease's "
                   "drift bound (5 %) between replicas break the read lease. Never in production.")
@click.option("--early-send/--no-early-send", "early_send", default=None,
              help="SDPaxos: a command leader's accepts leave before its own record is durable "
                   "(default on; docs/early-send.md).")
@click.option("--fsync-worker", type=click.Choice(["loop", "process", "thread"]), default=None,
              help="fsync=batch: where each loop turn's fsync runs: loop (default: on the loop at the "
                   "end of the turn), process (a child process, while the loop goes on) or thread (a "
                   "worker thread, the path before 2026-11-27); docs/runtime.md.")
@click.option("--fsync-thread/--fsync-inline", "fsync_thread", default=None, hidden=True,
              help="The older spelling of --fsync-worker thread / --fsync-worker loop.")
@click.option("--execute-after-send/--execute-inline", "defer_execution", default=None,
              help="A replica applies what it committed after sending the commit to its peers, so "
                   "the replicas apply in parallel (default on; --execute-inline: apply first, the "
                   "path before 2026-11-27; docs/runtime.md).")
@click.option("--join", "join", help="A new member: ask these replicas (client HOST:PORT,...) for the cluster's "
                                    "members until `cellar member add` names us (with --name, --listen, --client).")
@click.option("--name", "name", help="This member's name (--join; default: its id).")
@click.option("--ready-file", type=click.Path(dir_okay=False), hidden=True)
@click.option("--exit-with-parent", "parent_pid", type=int, hidden=True,
              help="Stop (as on SIGTERM) when process PID, our parent, dies (Linux): a local cluster's launcher.")
@click.option("--log-level", default="warning", show_default=True)
def serve(config_file, node_id, listen, client, peers, data_dir, protocol, fsync, cluster_id, sequencer,
          snapshot_every, machine, hived_config, http, tls_ca, tls_cert, tls_key, clock_control, early_send, fsync_worker,
          fsync_thread, defer_execution,
          join, name, ready_file, parent_pid, log_level) -> None:
    """Run one replica."""
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    logging.basicConfig(level=getattr(logging, str(log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if join is not None:
            if not (name and listen) or node_id is not None or peers is not None:
                raise NodeError("--join needs --name and --listen (this member's peer address), and no --id or --peers")
            from consensus.runtime.membership import MembershipError, parse_member

            try:
                parse_member(f"{name}={listen}")
            except MembershipError as e:
                raise NodeError(str(e)) from None
            # A joiner never runs epoch 0: these peers are placeholders until the base
            # it fetches names the members (run_node, _join).
            node_id, peers = 0, f"0={listen},1=127.0.0.1:1,2=127.0.0.1:2"
        cfg = build_config(config_file, {
            "id": node_id, "listen": listen, "client": client, "peers": peers, "data_dir": data_dir,
            "protocol": protocol, "fsync": fsync, "cluster_id": cluster_id, "sequencer": sequencer,
            "snapshot_every": snapshot_every, "machine": machine, "hived_config": hived_config, "http": http,
            "tls_ca": tls_ca, "tls_cert": tls_cert, "tls_key": tls_key, "clock_control": clock_control,
            "early_send": early_send, "fsync_worker": fsync_worker, "fsync_thread": fsync_thread,
            "defer_execution": defer_execution, "name": name,
        })
        if join is not None:
            from store.client import parse_addresses

            try:
                cfg.extra["join"] = parse_addresses(join)
            except ValueError as e:
                raise NodeError(f"--join {join}: {e}") from None
        install_loop()
        outcome = asyncio.run(run_node(cfg, ready_file))
    except NodeError as e:
        click.echo(f"cellar serve: {e}", err=True)
        sys.exit(2)
    if outcome != 0:
        click.echo(f"cellar serve: replica {cfg.node_id} stopped: {outcome}", err=True)
        sys.exit(1)
    sys.exit(0)


# --- local clusters -------------------------------------------------------------------


def stop_processes(procs: Any, timeout_s: float = 10.0) -> None:
    """SIGTERM every live process of ``procs`` (``subprocess.Popen``) at once, then wait
    for each; SIGKILL past ``timeout_s``. Our own children only (we hold their Popen)."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


class LocalCluster:
    """``cellar serve`` processes on loopback (used by ``up``, ``demo``, ``bench``, the
    Jepsen harness's db and tests). All on 127.0.0.1 by default; with ``hosts``, node
    ``i`` listens on ``hosts[i]`` (say 127.0.0.20+i), with the same three ports on every
    address, and dials its peers from it."""

    def __init__(self, root: str, replicas: int = 3, *, base_port: int | None = None, protocol: str = "sdpaxos",
                 fsync: str = "batch", cluster_id: str = "local", extra_args: list[str] | None = None,
                 log_level: str = "warning", http: bool = False, tls_dir: str | None = None,
                 hosts: list[str] | None = None) -> None:
        self.root = root
        # TLS: a folder made by ``cellar certs init`` (ca.pem, node<i>.pem, node<i>-key.pem).
        self.tls_dir = tls_dir
        self.n = replicas
        self.protocol = protocol
        self.fsync = fsync
        self.cluster_id = cluster_id
        self.extra_args = extra_args or []
        self.log_level = log_level
        if hosts is not None and len(hosts) != replicas:
            raise ValueError(f"{len(hosts)} hosts for {replicas} replicas")
        self.hosts = list(hosts) if hosts is not None else ["127.0.0.1"] * replicas
        if hosts is not None:
            ports = [p for p in free_ports_on(self.hosts, 3) for _ in range(replicas)]
        elif base_port is None:
            ports = free_ports(3 * replicas)
        else:
            ports = [base_port + i for i in range(replicas)] + [base_port + 100 + i for i in range(replicas)] + [
                base_port + 200 + i for i in range(replicas)]
        self.peer_ports = ports[:replicas]
        self.client_ports = ports[replicas:2 * replicas]
        # --http HOST:PORT per node (the machine's HTTP API) when asked for
        self.http_ports = ports[2 * replicas:] if http else []
        self.procs: dict[int, subprocess.Popen] = {}

    @property
    def peers_spec(self) -> str:
        return ",".join(f"{i}={self.hosts[i]}:{p}" for i, p in enumerate(self.peer_ports))

    def peers_spec_for(self, i: int) -> str:
        """Node ``i``'s ``--peers``: where it dials each peer (``peers_spec`` for every
        node here; ``cellar bench geo`` points them at its delaying proxies)."""
        return self.peers_spec

    @property
    def client_addresses(self) -> list[tuple[str, int]]:
        return [(self.hosts[i], p) for i, p in enumerate(self.client_ports)]

    @property
    def urls(self) -> list[str]:
        """The HTTP APIs (``http=True``)."""
        return [f"http://{self.hosts[i]}:{p}" for i, p in enumerate(self.http_ports)]

    def data_dir(self, i: int) -> str:
        return os.path.join(self.root, f"node{i}")

    def command(self, i: int) -> list[str]:
        return [sys.executable, "-m", "store.cli", "serve", "--id", str(i), "--peers", self.peers_spec_for(i),
                "--client", f"{self.hosts[i]}:{self.client_ports[i]}", "--data-dir", self.data_dir(i),
                "--protocol", self.protocol, "--fsync", self.fsync, "--cluster-id", self.cluster_id,
                "--ready-file", self._ready_file(i), "--exit-with-parent", str(os.getpid()),
                "--log-level", self.log_level, *self.tls_args(i), *self.extra_args,
                *(["--http", f"{self.hosts[i]}:{self.http_ports[i]}"] if self.http_ports else [])]

    def tls_args(self, i: int) -> list[str]:
        if self.tls_dir is None:
            return []
        d = self.tls_dir
        return ["--tls-ca", os.path.join(d, "ca.pem"), "--tls-cert", os.path.join(d, f"node{i}.pem"),
                "--tls-key", os.path.join(d, f"node{i}-key.pem")]

    def _ready_file(self, i: int) -> str:
        return os.path.join(self.root, f"node{i}.ready")

    def start(self, i: int) -> None:
        os.makedirs(self.root, exist_ok=True)
        try:
            os.unlink(self._ready_file(i))
        except FileNotFoundError:
            pass
        logf = open(self.log_path(i), "ab")
        self.procs[i] = subprocess.Popen(self.command(i), stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()

    def start_all(self) -> None:
        for i in range(self.n):
            self.start(i)

    def wait_ready(self, i: int | None = None, timeout_s: float = 20.0) -> None:
        nodes = range(self.n) if i is None else [i]
        deadline = time.monotonic() + timeout_s
        for j in nodes:
            while not os.path.exists(self._ready_file(j)):
                proc = self.procs.get(j)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"node {j} exited with status {proc.returncode}: {self.log_tail(j)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"node {j} did not start within {timeout_s} s: {self.log_tail(j)}")
                time.sleep(0.02)

    async def await_ready(self, i: int | None = None, timeout_s: float = 20.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.wait_ready, i, timeout_s)

    def log_path(self, i: int) -> str:
        return os.path.join(self.root, f"node{i}.log")

    def log_tail(self, i: int, lines: int = 5) -> str:
        try:
            with open(self.log_path(i), errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(i)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=10)

    def stop(self, i: int, timeout_s: float = 10.0) -> None:
        proc = self.procs.get(i)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused node cannot act on SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every node at once, then wait for each (SIGKILL past the timeout)."""
        stop_processes(self.procs.values(), timeout_s)

    def alive(self, i: int) -> bool:
        proc = self.procs.get(i)
        return proc is not None and proc.poll() is None


def free_ports_on(hosts: list[str], count: int, tries: int = 200) -> list[int]:
    """``count`` consecutive port numbers free on every one of ``hosts`` at once, from
    20000-30000: below the ephemeral range (Linux: 32768 and up), so no outgoing
    connection takes one while a node is down."""
    import random
    import socket

    def free(port: int) -> bool:
        for host in hosts:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((host, port))
                except OSError:
                    return False
        return True

    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(20000, 30000)
        ports = [base + k for k in range(count)]
        if all(free(p) for p in ports):
            return ports
    raise RuntimeError(f"no {count} ports free on all of {', '.join(hosts)}")


def free_ports(count: int) -> list[int]:
    """``count`` ports free on 127.0.0.1 now (``free_ports_on``: below the ephemeral
    range). Not ports the kernel hands out: a node restarted later on one could find it
    taken by some outgoing connection's local end (a suite run on 3 workers failed that
    way, 2026-11-27)."""
    return free_ports_on(["127.0.0.1"], count)


@click.command("up")
@click.option("--replicas", type=click.IntRange(3, 31), default=3, show_default=True,
              help="An odd number of replicas: 3, 5, 7, ...")
@click.option("--dir", "root", type=click.Path(file_okay=False), help="Folder for data dirs and logs (default: a new temp dir).")
@click.option("--base-port", type=int, default=7000, show_default=True,
              help="Peers on BASE+i, clients on BASE+100+i, HTTP on BASE+200+i.")
@click.option("--protocol", type=click.Choice(["sdpaxos", "multipaxos"]), default="sdpaxos", show_default=True)
@click.option("--fsync", type=click.Choice(["always", "batch", "never"]), default="batch", show_default=True)
@click.option("--tls", "tls", is_flag=True, help="TLS everywhere, with a new CA and certificates in DIR/certs.")
def up(replicas, root, base_port, protocol, fsync, tls) -> None:
    """Start a local cluster on 127.0.0.1 until Ctrl-C."""
    if replicas % 2 == 0:
        raise click.BadParameter(f"{replicas}: a cluster has an odd number of replicas (3, 5, 7, ...)", param_hint="--replicas")
    root = root or tempfile.mkdtemp(prefix="cellar-up-")
    tls_dir = None
    if tls:
        from store.certs import CertError, init_certs

        tls_dir = os.path.join(root, "certs")
        try:
            init_certs(tls_dir, replicas + 8, force=True)  # 8 more for newcomers (grow, replace)
        except CertError as e:
            click.echo(f"cellar up: {e}", err=True)
            sys.exit(2)
    cluster = LocalCluster(root, replicas, base_port=base_port, protocol=protocol, fsync=fsync, http=True,
                           tls_dir=tls_dir)
    cluster.start_all()
    try:
        cluster.wait_ready()
    except (RuntimeError, TimeoutError) as e:
        cluster.stop_all()
        click.echo(f"cellar up: {e}", err=True)
        sys.exit(2)
    click.echo(f"Cellar cluster of {replicas} ({protocol}, fsync={fsync}{', TLS' if tls_dir else ''}); data and logs in {root}")
    for i in range(replicas):
        click.echo(f"  node {i}: pid {cluster.procs[i].pid}, clients 127.0.0.1:{cluster.client_ports[i]}, "
                   f"peers 127.0.0.1:{cluster.peer_ports[i]}, http 127.0.0.1:{cluster.http_ports[i]}")
    addrs = ",".join(f"127.0.0.1:{p}" for p in cluster.client_ports)
    https = ",".join(f"127.0.0.1:{p}" for p in cluster.http_ports)
    t = f" --cacert {tls_dir}/ca.pem" if tls_dir else ""
    click.echo(f"Use it: cellar kv put k v{t} --endpoints {addrs}; cellar kv watch k{t} --endpoints {https}")
    if tls_dir:
        click.echo(f'Reach it from Python: from store.client import SyncClient; SyncClient("{addrs}", tls="{tls_dir}/ca.pem")')
        click.echo(f"Admin: cellar sequencer transfer --to 1{t} --cert {tls_dir}/admin.pem --key {tls_dir}/admin-key.pem "
                   f"--endpoints {addrs}")
    else:
        click.echo(f'Reach it from Python: from store.client import SyncClient; SyncClient("{addrs}")')
    click.echo(f"Look at it: cellar status{t} --endpoints {addrs}")
    from store.up_members import COMMANDS, UpMembers

    changes = UpMembers(cluster, tls_dir) if protocol == "sdpaxos" else None
    stdin_open = changes is not None and not sys.stdin.closed
    typed: queue.Queue = queue.Queue()
    if stdin_open:
        # Lines typed are read by a thread (select() on sys.stdin misses lines already in
        # its buffer when several arrive at once); None marks the end of input.
        def read_stdin() -> None:
            for line in iter(sys.stdin.readline, ""):
                typed.put(line)
            typed.put(None)

        threading.Thread(target=read_stdin, name="cellar-up-stdin", daemon=True).start()
        click.echo(f"Change the members live: type {COMMANDS} (docs/operations.md, \"Members\").")
    click.echo("Ctrl-C (or SIGTERM) stops every node.")

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)  # stop the replicas too, never orphan them
    # Ctrl-C too, even if whoever started us ignores SIGINT (a background job of a
    # script, or a test runner whose SIGINT was set aside): Python keeps an inherited
    # SIG_IGN, and `cellar up` would then never stop on Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    reported: set[int] = set()
    try:
        # One replica exiting does not stop the others (a majority keeps serving);
        # the cluster stops when every replica has exited or on Ctrl-C / SIGTERM.
        while any(cluster.alive(i) for i in range(replicas)):
            for i in range(replicas):
                if i not in reported and not cluster.alive(i):
                    reported.add(i)
                    code = cluster.procs[i].returncode
                    click.echo(f"node {i} exited with status {code}: {cluster.log_tail(i, 1)}", err=True)
            if stdin_open:
                try:
                    line = typed.get(timeout=0.2)
                except queue.Empty:
                    continue
                if line is None:
                    stdin_open = False  # end of input: keep serving until Ctrl-C
                else:
                    try:
                        changes.run(line)  # type: ignore[union-attr]
                    except (click.ClickException, OSError, subprocess.SubprocessError) as e:
                        click.echo(f"  {e}", err=True)
            else:
                time.sleep(0.2)
        click.echo("cellar up: every node exited", err=True)
        exit_code = 1
    except KeyboardInterrupt:
        click.echo("stopping...")
        exit_code = 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if changes is not None:
            changes.stop()
        cluster.stop_all()
    sys.exit(exit_code)
