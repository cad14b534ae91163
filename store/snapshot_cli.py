"""``cellar snapshot save|restore``: a replica's state as one file, and a new cluster
made from it (issue 13).

``save FILE``: asks a replica (``--node``, default the first that answers) to take a
snapshot now (unless ``--latest``: its latest stored one), fetches its file image in
1 MiB chunks over the client port, verifies it (checksums, metadata) and writes FILE
atomically (temporary file, fsync, rename). The image is the replica's snapshot file
as it stores it: the state machine and client sessions at one executed slot.

``restore FILE --data-dir DIR --id I --peers ...``: offline, before the first start of
replica I of a *new* cluster: checks the snapshot (protocol, replica count against
``--peers``) and writes it into DIR as that replica's latest snapshot, so that
``cellar serve`` with the same DIR starts from it. Do it for every replica of the new
cluster (same FILE); DIR must be empty or absent. The new cluster starts at the
snapshot's slot and view, with no log above it; its sequencer is elected afresh.

    cellar snapshot save backup.snap --endpoints 127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102
    for i in 0 1 2; do cellar snapshot restore backup.snap --data-dir new/n$i --id $i --peers $P; done
"""

from __future__ import annotations

import json
import os
import time

import click

from store.admin_cli import CLIError, _options, _run, client_tls, parse_endpoints

CHUNK_ATTEMPTS = 3


@click.group("snapshot")
def snapshot() -> None:
    """Save a replica's state to a file; restore a new cluster from it."""


@snapshot.command("save")
@click.argument("file", type=click.Path(dir_okay=False, writable=True))
@click.option("--node", type=click.IntRange(0, 1000), default=None, help="Index in --endpoints (default: the first that answers).")
@click.option("--latest", is_flag=True, help="The replica's latest stored snapshot, not a new one.")
@click.option("--wait", "wait_s", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True,
              help="Seconds to wait for the new snapshot to be stored.")
@_options
@_run("cellar snapshot save")
async def save(file: str, node: int | None, latest: bool, wait_s: float, endpoints: str, as_json: bool,
               timeout_s: float) -> int:
    """Save a replica's snapshot to FILE."""
    from consensus.runtime import clientwire
    from store.client import CellarClient
    from consensus.storage.snapshot import SnapshotCorrupt, decode_snapshot, write_file_synced

    addresses = parse_endpoints(endpoints)
    if node is not None and node >= len(addresses):
        raise click.BadParameter(f"{node} is not an index of the {len(addresses)} endpoints", param_hint="--node")
    t0 = time.monotonic()
    seq = [0]

    async def admin(cellar: CellarClient, i: int, op: list) -> dict:
        seq[0] += 1
        return await cellar.call_once(i, clientwire.ADMIN, f"snapshot-{os.getpid()}-{t0}", seq[0], op)

    async with CellarClient(addresses, timeout_s=timeout_s, connect_timeout_s=timeout_s, **client_tls()) as cellar:
        candidates = [node] if node is not None else list(range(len(addresses)))
        info, chosen, errors = None, None, []
        for i in candidates:
            try:
                info = await admin(cellar, i, ["snapshot_info"])
                chosen = i
                break
            except Exception as e:
                errors.append(f"{addresses[i][0]}:{addresses[i][1]}: {e}")
        if chosen is None or info is None:
            raise CLIError("no replica answered: " + "; ".join(errors))
        if not latest:
            wanted = info["exec_slot"]
            deadline = t0 + wait_s
            while True:
                if info["slot"] is not None and info["slot"] >= wanted and not info.get("taking"):
                    break
                if not info.get("taking"):
                    await admin(cellar, chosen, ["snapshot_take"])
                if time.monotonic() > deadline:
                    raise CLIError(f"replica {chosen} stored no snapshot of slot {wanted} or later within {wait_s:g} s")
                await _sleep(0.1)
                info = await admin(cellar, chosen, ["snapshot_info"])
        if info["slot"] is None:
            raise CLIError(f"replica {chosen} has stored no snapshot yet (drop --latest to take one)")
        slot, total, parts, offset = info["slot"], info["bytes"], [], 0
        while offset < total:
            for attempt in range(CHUNK_ATTEMPTS):
                try:
                    piece = await admin(cellar, chosen, ["snapshot_chunk", slot, offset])
                    break
                except TimeoutError:
                    if attempt == CHUNK_ATTEMPTS - 1:
                        raise
            if piece["slot"] != slot or piece["bytes"] != total or not piece["data"]:
                raise CLIError(f"replica {chosen} replaced its snapshot meanwhile: run the command again")
            parts.append(piece["data"])
            offset += len(piece["data"])
    image = b"".join(parts)
    try:
        snap = decode_snapshot(image, f"replica {chosen}'s snapshot")
    except SnapshotCorrupt as e:
        raise CLIError(str(e)) from None
    import msgpack

    meta = msgpack.unpackb(snap.meta, raw=False, strict_map_key=False)
    tmp = f"{file}.tmp-{os.getpid()}"
    try:
        write_file_synced(tmp, image)
        os.replace(tmp, file)
    except OSError as e:
        raise CLIError(f"cannot write {file}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    result = {"file": file, "node": chosen, "slot": meta.get("slot"), "view": meta.get("view"), "bytes": len(image),
              "protocol": meta.get("protocol"), "replicas": meta.get("n"), "seconds": round(time.monotonic() - t0, 3)}
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
    else:
        click.echo(f"saved replica {chosen}'s snapshot of slot {result['slot']} ({len(image):,} bytes, "
                   f"{result['replicas']} replicas, {result['protocol']}) to {file}")
    return 0


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


@snapshot.command("restore")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--data-dir", type=click.Path(file_okay=False), required=True, help="The new replica's data directory.")
@click.option("--id", "node_id", type=click.IntRange(0, 1000), required=True, help="The new replica's id.")
@click.option("--peers", required=True, help="Every replica of the new cluster: 0=HOST:PORT,1=HOST:PORT,...")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def restore(file: str, data_dir: str, node_id: int, peers: str, as_json: bool) -> None:
    """Seed a new replica's data directory with the snapshot in FILE (offline)."""
    import msgpack

    from store.server import NodeError, parse_peers
    from consensus.storage.snapshot import Snapshot, SnapshotCorrupt, decode_snapshot, write_snapshot

    def fail(text: str) -> None:
        click.echo(f"cellar snapshot restore: {text}", err=True)
        raise SystemExit(1)

    try:
        peer_map = parse_peers(peers)
    except NodeError as e:
        raise click.BadParameter(str(e), param_hint="--peers") from None
    if node_id not in peer_map:
        raise click.BadParameter(f"{node_id} is not in --peers {sorted(peer_map)}", param_hint="--id")
    try:
        with open(file, "rb") as f:
            image = f.read()
        snap = decode_snapshot(image, file)
        meta = msgpack.unpackb(snap.meta, raw=False, strict_map_key=False)
    except (OSError, SnapshotCorrupt, ValueError) as e:
        fail(f"{file} is not a usable snapshot: {e}")
    if not isinstance(meta, dict) or not isinstance(meta.get("slot"), int) or meta.get("protocol") != "sdpaxos":
        fail(f"{file}: not an SDPaxos snapshot with a slot (metadata {str(meta)[:120]})")
    if meta.get("n") != len(peer_map):
        fail(f"{file} is a snapshot of a {meta.get('n')}-replica cluster; --peers names {len(peer_map)} "
             "(membership changes are not restored from snapshots)")
    if os.path.exists(data_dir) and os.listdir(data_dir):
        fail(f"{data_dir} is not empty: restore only into a new replica's data directory")
    try:
        path = write_snapshot(os.path.join(data_dir, "snapshots"), Snapshot(0, snap.meta, snap.body, slot=meta["slot"]),
                              keep=1)
    except OSError as e:
        fail(f"cannot write into {data_dir}: {e.strerror or e}")
    result = {"data_dir": data_dir, "id": node_id, "slot": meta["slot"], "view": meta.get("view"), "snapshot": path}
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
    else:
        click.echo(f"replica {node_id}'s data dir {data_dir} starts from slot {meta['slot']}: "
                   f"cellar serve --id {node_id} --peers {peers} --data-dir {data_dir}")
