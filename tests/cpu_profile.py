"""Opt-in profile of the suite's time: ``python3 -m pytest -q -p tests.cpu_profile``.

For every test (setup, call and teardown): its wall time, the CPU time of the pytest
process that ran it (``RUSAGE_SELF``: simulators, explorers, Hypothesis) and that of the
processes it started and waited for (``RUSAGE_CHILDREN``: ``cellar serve`` nodes, CLI
runs). One JSON line per test goes to ``$CELLAR_TEST_CPU`` (default
``cellar-test-cpu.jsonl`` in the temp dir, emptied at the start of each run); the end of
the run prints the costliest tests and each xdist worker's totals (when did each stop:
a worker left alone at the end shows here).

A process reaped later (a module-scoped cluster stopped after its last test) counts
towards the test that reaped it; a process never waited for counts nowhere."""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time

import pytest

TOP = 25


def _path() -> str:
    return os.environ.get("CELLAR_TEST_CPU") or os.path.join(tempfile.gettempdir(), "cellar-test-cpu.jsonl")


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or the only process): a new file
        with open(_path(), "w"):
            pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    start = time.time()
    own0, children0 = _cpu()
    yield
    own1, children1 = _cpu()
    row = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"), "start": round(start, 3),
           "wall": round(time.time() - start, 3), "cpu": round(own1 - own0, 3),
           "children_cpu": round(children1 - children0, 3)}
    with open(_path(), "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    try:
        with open(_path()) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except OSError:
        return
    if not rows:
        return
    t0 = min(r["start"] for r in rows)
    tr = terminalreporter
    tr.section(f"CPU profile ({_path()})")
    rows.sort(key=lambda r: -(r["cpu"] + r["children_cpu"]))
    tr.write_line(f"{'cpu s':>7} {'children':>8} {'wall s':>7}  test (the {TOP} costliest)")
    for r in rows[:TOP]:
        tr.write_line(f"{r['cpu']:7.1f} {r['children_cpu']:8.1f} {r['wall']:7.1f}  {r['test']}")
    for w in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == w]
        tr.write_line(f"worker {w}: {len(mine)} tests, wall {sum(r['wall'] for r in mine):.0f} s, "
                      f"cpu {sum(r['cpu'] for r in mine):.0f} s + children {sum(r['children_cpu'] for r in mine):.0f} s, "
                      f"last test ended at {max(r['start'] + r['wall'] for r in mine) - t0:.0f} s")
