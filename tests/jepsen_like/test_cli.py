"""``cellar check``: formats, exit codes, JSON output, reports and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from jepsen_like.cli import check
from jepsen_like.synth import generate
from jepsen_like.history import write_jsonl

ETCD_OK = (
    "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n"
    "INFO  jepsen.util - 1\t:invoke\t:write\t3\n"
    "INFO  jepsen.util - 0\t:ok\t:read\t3\n"
    "INFO  jepsen.util - 1\t:ok\t:write\t3\n"
    "INFO  jepsen.util - 2\t:invoke\t:cas\t[3 0]\n"
    "INFO  jepsen.util - 2\t:ok\t:cas\t[3 0]\n"
    "INFO  jepsen.util - 3\t:invoke\t:cas\t[3 1]\n"
    "INFO  jepsen.util - 3\t:fail\t:cas\t[3 1]\n"
    "INFO  jepsen.util - 4\t:invoke\t:write\t2\n"
    "INFO  jepsen.util - 4\t:info\t:write\t:timed-out\n"
    "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n"
    "INFO  jepsen.util - 0\t:ok\t:read\t2\n"
)
ETCD_BAD = ETCD_OK + "INFO  jepsen.util - 0\t:invoke\t:read\tnil\nINFO  jepsen.util - 0\t:ok\t:read\t0\n"
KV_OK = (
    '{:process 0, :type :invoke, :f :append, :key "1", :value "x 0 0 y"}\n'
    '{:process 1, :type :invoke, :f :get, :key "1", :value nil}\n'
    '{:process 1, :type :ok, :f :get, :key "1", :value ""}\n'
    '{:process 0, :type :ok, :f :append, :key "1", :value "x 0 0 y"}\n'
    '{:process 1, :type :invoke, :f :get, :key "1", :value nil}\n'
    '{:process 1, :type :ok, :f :get, :key "1", :value "x 0 0 y"}\n'
)


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(check, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "etcd_ok.log": ETCD_OK,
        "etcd_bad.log": ETCD_BAD,
        "kv_ok.txt": KV_OK,
        "garbage.txt": "hello world\n",
        "broken.log": ETCD_OK + "INFO  jepsen.util - 5\t:invoke\t:write\t[1\n",
    }
    out = {}
    for name, text in paths.items():
        out[name] = tmp_path / name
        out[name].write_text(text)
    return out


def test_exit_codes_and_json(files: dict[str, Path]) -> None:
    code, out, _ = _run("--model", "cas-register", str(files["etcd_ok.log"]), "--json")
    assert code == 0
    verdict = json.loads(out)
    assert verdict["linearizable"] is True and verdict["ops"] == 6 and verdict["partitions"] == 1
    assert set(verdict) == {"linearizable", "ops", "partitions", "seconds"}
    code, out, _ = _run("--model", "cas-register", str(files["etcd_bad.log"]), "--json", "--format", "jepsen")
    assert code == 1 and json.loads(out)["linearizable"] is False
    code, out, _ = _run("--model", "kv", str(files["kv_ok.txt"]))
    assert code == 0 and out.startswith("linearizable")


def test_human_output_explains_the_violation(files: dict[str, Path]) -> None:
    code, out, _ = _run("--model", "cas-register", str(files["etcd_bad.log"]))
    assert code == 1
    assert out.startswith("NOT linearizable")
    assert "read → 0" in out and "longest linearizable prefix" in out


def test_bad_input_exits_2_naming_file_and_line(files: dict[str, Path], tmp_path: Path) -> None:
    code, out, err = _run("--model", "register", str(files["garbage.txt"]))
    assert code == 2 and out == ""
    assert f"{files['garbage.txt']}:1:" in err and "cannot tell the format" in err
    code, _, err = _run("--model", "cas-register", str(files["broken.log"]))
    assert code == 2 and f"{files['broken.log']}:13: bad value" in err
    code, _, err = _run("--model", "register", str(files["etcd_ok.log"]))  # cas in a plain register
    assert code == 2 and "register has no function 'cas'" in err
    code, _, err = _run("--model", "register", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "No such file" in err
    code, _, err = _run("--model", "register", str(files["etcd_ok.log"]), "--format", "yaml")
    assert code == 2  # click rejects the choice
    code, _, err = _run("--model", "kv", str(files["kv_ok.txt"]), "--format", "jsonl")
    assert code == 2 and "kv_ok.txt:1: not JSON" in err


def test_timeout_gives_unknown(tmp_path: Path) -> None:
    history = generate(clients=200, ops=3000, keys=1, info_rate=0.03, seed=2)  # seconds of search
    path = tmp_path / "hard.jsonl"
    with open(path, "w") as fp:
        write_jsonl(history, fp)
    code, out, _ = _run("--model", "kv", str(path), "--timeout", "0", "--json")
    assert code == 2 and json.loads(out)["linearizable"] is None


def test_report_option_writes_html(files: dict[str, Path], tmp_path: Path) -> None:
    report = tmp_path / "out.html"
    code, out, _ = _run("--model", "cas-register", str(files["etcd_bad.log"]), "--report", str(report))
    assert code == 1 and report.exists() and f"report: {report}" in out
    page = report.read_text()
    assert "class='op ok violation involved'" in page
