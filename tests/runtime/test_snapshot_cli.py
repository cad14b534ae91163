"""``cellar snapshot save`` and ``restore`` (issue 13): a running cluster's state to a
file, and a new cluster (other ports, other data dirs) started from it, holding every
key and accepting writes; bad restores are one line and change nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from store.client import CellarClient
from store.server import LocalCluster

from .conftest import converged


def _cellar(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, timeout=120)


async def test_save_then_restore_a_new_cluster(make_cluster, tmp_path):
    old = make_cluster(3)
    old.start_all()
    await old.await_ready()
    endpoints = ",".join(f"{h}:{p}" for h, p in old.client_addresses)
    async with CellarClient(old.client_addresses, deadline_s=30) as cellar:
        s = cellar.session()
        for i in range(50):
            await s.put(f"k{i}", f"v{i}")
    backup = tmp_path / "backup.snap"
    out = _cellar("snapshot", "save", str(backup), "--endpoints", endpoints, "--json")
    assert out.returncode == 0, out.stderr
    saved = json.loads(out.stdout)
    assert saved["slot"] >= 50 and saved["replicas"] == 3 and backup.stat().st_size == saved["bytes"]
    old.stop_all()

    new: LocalCluster = make_cluster(3)
    peers = new.peers_spec
    for i in range(3):
        r = _cellar("snapshot", "restore", str(backup), "--data-dir", new.data_dir(i), "--id", str(i), "--peers", peers)
        assert r.returncode == 0, r.stderr
    again = _cellar("snapshot", "restore", str(backup), "--data-dir", new.data_dir(0), "--id", "0", "--peers", peers)
    assert again.returncode == 1 and "not empty" in again.stderr and "Traceback" not in again.stderr
    five = ",".join(f"{i}=127.0.0.1:{20000 + i}" for i in range(5))
    wrong = _cellar("snapshot", "restore", str(backup), "--data-dir", str(tmp_path / "x"), "--id", "0", "--peers", five)
    assert wrong.returncode == 1 and "3-replica cluster" in wrong.stderr and not os.path.exists(tmp_path / "x")
    junk = tmp_path / "junk.snap"
    junk.write_bytes(b"not a snapshot at all")
    bad = _cellar("snapshot", "restore", str(junk), "--data-dir", str(tmp_path / "y"), "--id", "0", "--peers", peers)
    assert bad.returncode == 1 and "not a usable snapshot" in bad.stderr

    new.start_all()
    await new.await_ready()
    async with CellarClient(new.client_addresses, deadline_s=30) as cellar:
        s = cellar.session(node=2)
        for i in range(50):
            assert await s.get(f"k{i}") == f"v{i}"
        await s.put("after", "restore")
        assert await cellar.session(node=0).get("after") == "restore"
        sts = await converged(cellar, [0, 1, 2])
        assert all(st["snapshot_slot"] == saved["slot"] for st in sts)


async def test_member_list(make_cluster):
    cluster = make_cluster(3)
    cluster.start_all()
    await cluster.await_ready()
    endpoints = ",".join(f"{h}:{p}" for h, p in cluster.client_addresses[:2])  # replica 2 not asked
    async with CellarClient(cluster.client_addresses, deadline_s=30) as cellar:
        await cellar.session().put("k", "v")
    cluster.stop(2)
    out = _cellar("member", "list", "--endpoints", endpoints, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert [r["peer"] for r in rows] == [f"127.0.0.1:{p}" for p in cluster.peer_ports]
    assert [r["reachable"] for r in rows] == [True, True, False]
    assert sum(r["role"] == "sequencer" for r in rows) <= 1
    text = _cellar("member", "list", "--endpoints", endpoints)
    assert text.returncode == 0 and "NO" in text.stdout
