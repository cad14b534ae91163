"""Early send on real processes (docs/early-send.md): on by default in ``cellar serve``
(so every kill -9 and linearizability test of tests/runtime runs with it), off with
``--no-early-send`` or ``early_send = false``, and compared side by side by
``cellar bench --early-send``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from consensus.runtime.node import NodeError
from store.server import build_config


def cellar(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flag,default,bad", [("early_send", True, '"yes"'), ("defer_execution", True, "0")])
def test_a_switch_has_its_default_and_is_set_by_flag_or_setting(tmp_path, flag, default, bad):
    """early_send and defer_execution (on by default; the protocol's settings too)."""
    base = {"id": 0, "peers": "0=127.0.0.1:7000,1=127.0.0.1:7001,2=127.0.0.1:7002", "data_dir": str(tmp_path)}
    assert getattr(build_config(None, dict(base)), flag) is default
    assert getattr(build_config(None, {**base, flag: not default}), flag) is (not default)
    if flag in ("early_send", "defer_execution"):  # the protocol's settings too
        assert getattr(build_config(None, dict(base)).protocol_config(), flag) is True
        assert getattr(build_config(None, {**base, flag: False}).protocol_config(), flag) is False
    toml = tmp_path / "node.toml"
    toml.write_text(f"{flag} = {bad}\n")
    with pytest.raises(NodeError, match=f"{flag} = {bad.replace(chr(34), chr(39))} is not true or false"):
        build_config(str(toml), dict(base))
    toml.write_text(f"{flag} = {str(not default).lower()}\n")
    assert getattr(build_config(str(toml), dict(base)), flag) is (not default)


def test_bench_compares_early_send_off_and_on():
    p = cellar("bench", "--early-send", "--rounds", "1", "--seconds", "0.5", "--warmup", "0", "--sessions", "8", "--json")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert set(result["median"]) == {"waiting", "early"}
    assert all(result["median"][v]["writes_per_s"] > 0 for v in ("waiting", "early"))
    assert result["throughput_ratio_early_over_waiting"] > 0
    assert all(m["client_cpu_us_per_write"] > 0 and m["replica_cpu_us_per_write"] > 0 for ms in result["runs"].values() for m in ms)
    assert all(m["errors"] == 0 for ms in result["runs"].values() for m in ms)


@pytest.mark.parametrize("args,message", [
    (["--early-send", "--tls"], "one comparison at a time"),
    (["--early-send", "--protocol", "multipaxos"], "early send is SDPaxos's"),
    (["--early-send", "--machine", "scheduler"], "measure the kv machine"),
    (["--fsync-thread", "--early-send"], "one comparison at a time"),
    (["--fsync-thread", "--fsync", "always"], "where fsync=batch's fsync runs"),
    (["--fsync-thread", "--machine", "scheduler"], "measure the kv machine"),
    (["--fsync-process", "--fsync-thread"], "one comparison at a time"),
    (["--fsync-process", "--fsync", "never"], "where fsync=batch's fsync runs"),
    (["--execute-after-send", "--tls"], "one comparison at a time"),
    (["--execute-after-send", "--fsync-thread"], "one comparison at a time"),
    (["--execute-after-send", "--machine", "scheduler"], "measure the kv machine"),
])
def test_bench_variant_usage_errors_are_one_line(args, message):
    p = cellar("bench", *args, timeout=60)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_fsync_worker_defaults_to_the_loop_and_takes_the_older_spelling(tmp_path):
    """fsync_worker: "loop" by default (each loop turn's fsync on the loop, GroupCommitter
    inline), "process" (in a child process) or "thread"; the older fsync_thread =
    true/false means "thread"/"loop", and a flag beats the file."""
    base = {"id": 0, "peers": "0=127.0.0.1:7000,1=127.0.0.1:7001,2=127.0.0.1:7002", "data_dir": str(tmp_path)}
    assert build_config(None, dict(base)).fsync_worker == "loop"
    assert build_config(None, {**base, "fsync_worker": "process"}).fsync_worker == "process"
    assert build_config(None, {**base, "fsync_thread": True}).fsync_worker == "thread"
    assert build_config(None, {**base, "fsync_thread": False}).fsync_worker == "loop"
    toml = tmp_path / "node.toml"
    for text, worker in (('fsync_worker = "thread"\n', "thread"), ("fsync_thread = true\n", "thread"),
                         ("fsync_thread = false\n", "loop")):
        toml.write_text(text)
        assert build_config(str(toml), dict(base)).fsync_worker == worker
    assert build_config(str(toml), {**base, "fsync_worker": "process"}).fsync_worker == "process"
    toml.write_text('fsync_worker = "loop"\n')
    assert build_config(str(toml), {**base, "fsync_thread": True}).fsync_worker == "thread"
    toml.write_text('fsync_worker = "disk"\n')
    with pytest.raises(NodeError, match="unknown fsync_worker 'disk'"):
        build_config(str(toml), dict(base)).validate()
    toml.write_text('fsync_worker = "loop"\nfsync_thread = true\n')
    with pytest.raises(NodeError, match="both given"):
        build_config(str(toml), dict(base))
    toml.write_text("fsync_thread = 1\n")
    with pytest.raises(NodeError, match="fsync_thread = 1 is not true or false"):
        build_config(str(toml), dict(base))


def test_bench_compares_the_fsync_on_the_loop_with_the_process():
    p = cellar("bench", "--fsync-process", "--rounds", "1", "--seconds", "0.5", "--warmup", "0", "--sessions", "8",
               "--json")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert set(result["median"]) == {"loop", "process"}
    assert all(result["median"][v]["writes_per_s"] > 0 for v in ("loop", "process"))
    assert all(m["replica_cpu_us_per_write"] > 0 for ms in result["runs"].values() for m in ms)
    assert result["throughput_ratio_process_over_loop"] > 0 and result["cpu_per_write_ratio_process_over_loop"] > 0
    assert all(m["errors"] == 0 for ms in result["runs"].values() for m in ms)
