"""Issue 12's rough edges, tried as a new user would: each bad input gets one clear
line and a nonzero exit, never a traceback; and a failure nobody foresaw in any
command is one line too (the ``cellar`` group's guard)."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from store import cli


def _cellar(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def files(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_bytes(b"\xff\xfe not utf-8")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{bad")
    history = tmp_path / "h.jsonl"
    history.write_text('{"process":0,"type":"invoke","f":"write","value":1}\n'
                       '{"process":0,"type":"ok","f":"write","value":1}\n')
    return {"yaml": str(bad_yaml), "json": str(bad_json), "history": str(history), "tmp": tmp_path}


CASES = [
    ("scheduler validate on a non-UTF-8 file", ["scheduler", "validate", "{yaml}"], "not UTF-8"),
    ("sim --rtt-file with bad JSON", ["sim", "--rtt-file", "{json}"], "not a JSON RTT table"),
    ("check --timeout -1", ["check", "{history}", "--model", "register", "--timeout", "-1"], "--timeout"),
    ("scheduler bench --ops -5", ["scheduler", "bench", "--ops", "-5"], "--ops"),
    ("serve --snapshot-every -3", ["serve", "--snapshot-every", "-3", "--id", "0", "--peers",
                                   "0=127.0.0.1:1,1=127.0.0.1:2,2=127.0.0.1:3", "--data-dir", "{tmp}/d"], "--snapshot-every"),
    ("two peers on one address", ["serve", "--id", "0", "--peers", "0=127.0.0.1:5,1=127.0.0.1:5,2=127.0.0.1:6",
                                  "--data-dir", "{tmp}/d"], "share the peer address"),
]


@pytest.mark.parametrize("what,args,expect", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(files, what, args, expect):
    out = _cellar(*[a.format(**files) for a in args])
    assert out.returncode != 0, f"{what}: accepted"
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    assert expect in out.stderr + out.stdout, out.stderr


def test_scheduler_validate_json_reports_errors_as_json(files):
    out = _cellar("scheduler", "validate", files["yaml"], "--json")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["valid"] is False and "UTF-8" in doc["error"]


def test_check_report_into_a_missing_directory_is_written(files):
    report = files["tmp"] / "new" / "dir" / "r.html"
    out = _cellar("check", files["history"], "--model", "register", "--report", str(report))
    assert out.returncode == 0, out.stderr
    assert report.exists() and report.stat().st_size > 0


def test_an_unforeseen_failure_in_any_command_is_one_line(monkeypatch):
    @click.command()
    def boom():
        raise RuntimeError("the disk\nfell over")

    monkeypatch.setitem(cli.SUBCOMMANDS, "boom", ("tests.store.test_cli_rough_edges:_BOOM", "test"))
    monkeypatch.setattr(sys.modules[__name__], "_BOOM", boom, raising=False)
    monkeypatch.delenv("CELLAR_DEBUG", raising=False)
    result = CliRunner().invoke(cli.main, ["boom"])
    assert result.exit_code == 1
    assert result.output.strip() == "cellar boom: internal error: RuntimeError: the disk fell over (CELLAR_DEBUG=1 shows where)"
    assert "Traceback" not in result.output


def test_serve_prints_one_startup_line(tmp_path):
    """``cellar serve`` says who it is, where it listens and where it recovered to."""
    import signal as sig

    from store.server import free_ports

    ports = free_ports(3)
    peers = ",".join(f"{i}=127.0.0.1:{p}" for i, p in enumerate(ports))
    proc = subprocess.Popen([sys.executable, "-m", "store.cli", "serve", "--id", "1", "--peers", peers,
                             "--data-dir", str(tmp_path / "d")], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
    finally:
        proc.send_signal(sig.SIGTERM)
        proc.wait(timeout=30)
    assert line.startswith("cellar serve: replica 1 of 3 (sdpaxos, kv, fsync batch)"), line
    assert f"peers 127.0.0.1:{ports[1]}" in line and "recovered to slot 0" in line and str(tmp_path / "d") in line
