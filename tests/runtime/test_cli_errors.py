"""Every ``cellar`` command: a usage error (unknown command or option, bad value,
missing argument) is one line naming the command, and exit status 2 (store/cli.py,
``LazyGroup.main``)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def cellar(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args", [["jepsen", "run", "--net", "foo"], ["nosuch"], ["bench", "--sessions", "zero"]])
def test_click_usage_errors_are_one_line_too(args):
    p = cellar(*args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "--help" in lines[0] and lines[0].startswith("cellar"), p.stderr
