"""``cellar kv`` and ``cellar lease`` (store/kv_cli.py) as subprocesses against 3 real
replicas: every command, --json, and bad input as one error line with exit status 1
(2 for usage), never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from store.server import LocalCluster


# One worker for the whole module under xdist: the module-scoped cluster below then starts
# once (split across workers, each started its own).
pytestmark = pytest.mark.xdist_group("kv-cli-cluster")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("kvcli")), 3)
    c.start_all()
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop_all()


@pytest.fixture(scope="module")
def cellar(cluster):
    env = dict(os.environ, CELLAR_ENDPOINTS=",".join(f"127.0.0.1:{p}" for p in cluster.client_ports))

    def run(*args: str, stdin: str | None = None, code: int = 0, timeout: str = "15") -> str:
        p = subprocess.run([sys.executable, "-m", "store.cli", *args[:2], "--timeout", timeout, *args[2:]],
                           input=stdin, capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == code, (args, p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr, p.stderr
        if code == 1:
            assert len(p.stderr.strip().splitlines()) == 1, p.stderr
            return p.stderr
        return p.stdout

    return run


def test_kv_commands(cellar, tmp_path):
    assert cellar("kv", "put", "/c/a", "1").startswith("OK (revision ")
    out = cellar("kv", "put", "/c/a", "2", "--prev-kv")
    assert out.splitlines()[1:] == ["/c/a", "1"]
    cellar("kv", "put", "/c/b", stdin="from stdin")
    assert cellar("kv", "get", "/c/a").splitlines() == ["/c/a", "2"]
    got = json.loads(cellar("kv", "get", "/c/", "--prefix", "--json"))
    assert [kv["key"] for kv in got["kvs"]] == ["/c/a", "/c/b"] and got["kvs"][1]["value"] == "from stdin"
    rev = got["kvs"][0]["create_revision"]
    assert cellar("kv", "get", "/c/a", "--rev", str(rev)).splitlines() == ["/c/a", "1"]
    assert cellar("kv", "get", "/c/", "--prefix", "--keys-only", "--limit", "1").splitlines() == ["/c/a"]
    assert cellar("kv", "get", "/c/", "--prefix", "--count-only").strip() == "2"
    assert "not found" in cellar("kv", "get", "/c/zz", code=1)
    txn = tmp_path / "cas.json"
    txn.write_text(json.dumps({"compare": [{"key": "/c/a", "target": "value", "result": "=", "value": "2"}],
                               "success": [{"op": "put", "key": "/c/a", "value": "3"}],
                               "failure": [{"op": "range", "key": "/c/a"}]}))
    assert cellar("kv", "txn", str(txn)).splitlines()[0] == "SUCCESS"
    assert cellar("kv", "txn", str(txn)).splitlines() == ["FAILURE", "", "/c/a", "3"]
    etcd_shape = {"compare": [{"key": "/c/a", "target": "VALUE", "result": "EQUAL", "value": "3"}],
                  "success": [{"request_delete_range": {"key": "/c/b"}}]}
    assert json.loads(cellar("kv", "txn", "-", "--json", stdin=json.dumps(etcd_shape)))["succeeded"] is True
    assert cellar("kv", "del", "/c/", "--prefix").strip() == "1"


def test_lease_commands(cellar):
    out = cellar("lease", "grant", "30")
    lease = out.split()[1]
    assert out.strip() == f"lease {lease} granted with TTL(30s)"
    cellar("kv", "put", "/cl/a", "x", "--lease", lease)
    assert "attached keys([/cl/a])" in cellar("lease", "timetolive", lease, "--keys")
    assert lease in cellar("lease", "list").split()
    assert cellar("lease", "keepalive", lease).strip() == f"lease {lease} keepalived with TTL(30s)"
    assert json.loads(cellar("lease", "revoke", lease, "--json"))["deleted"] == 1
    assert "LeaseNotFound" in cellar("lease", "keepalive", lease, code=1)
    assert "LeaseNotFound" in cellar("kv", "put", "/cl/b", "x", "--lease", lease, code=1)


def test_errors_are_one_line(cellar, tmp_path):
    assert "TooLarge" in cellar("kv", "put", "/big", stdin="v" * (1100 * 1024), code=1)
    assert "key is empty" in cellar("kv", "put", "", "x", code=1)
    assert "not valid JSON" in cellar("kv", "txn", "-", stdin="{bad", code=1)
    assert "cannot read" in cellar("kv", "txn", str(tmp_path / "missing.json"), code=1)
    bad_op = tmp_path / "bad.json"
    bad_op.write_text(json.dumps({"success": [{"op": "put", "key": "/x", "value": "1", "colour": "red"}]}))
    assert "InvalidRequest" in cellar("kv", "txn", str(bad_op), code=1)
    assert "no node answered" in cellar("kv", "get", "/a", "--endpoints", "127.0.0.1:1", timeout="1", code=1)
    cellar("kv", "get", "/a", "--endpoints", "nonsense", code=2)
    cellar("kv", "get", code=2)
    cellar("lease", "grant", "0", code=2)
    assert cellar("kv", "get", "/big", code=1)  # nothing was stored
