"""Golden transcripts (etcd raft's datadriven interaction tests): every file in
``testdata/golden`` is a list of commands, each followed by the output it must
print. ``CELLAR_REWRITE_GOLDEN=1 python3 -m pytest tests/consensus/test_golden.py``
rewrites the expected outputs (read the diff before committing it); otherwise a
mismatch fails with a unified diff. The command language is in
``consensus/sim/transcript.py``; how to write one: ``docs/golden-transcripts.md``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from consensus.sim.transcript import diff, parse, render, run_file, run_text

GOLDEN = Path(__file__).parent / "testdata" / "golden"
FILES = sorted(GOLDEN.glob("*.txt"))
REWRITE = os.environ.get("CELLAR_REWRITE_GOLDEN") == "1"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden(path: Path) -> None:
    old, new = run_file(str(path))
    if REWRITE:
        if new != old:
            path.write_text(new)
        return
    assert new == old, "golden transcript differs (CELLAR_REWRITE_GOLDEN=1 rewrites it):\n" + diff(str(path), old, new)


def test_there_are_transcripts() -> None:
    assert len(FILES) >= 5


def test_output_is_byte_identical_across_runs() -> None:
    text = (GOLDEN / "normal-n3.txt").read_text()
    assert run_text(text) == run_text(text)


def test_format_round_trips_comments_and_cases() -> None:
    text = "# a comment\ncluster n=3\n----\nwhatever\n\n# another\n\nstatus\n----\n"
    assert render(parse(text)) == text
    out = run_text(text)
    assert out.startswith("# a comment\ncluster n=3\n----\nsdpaxos N=3 quorum=2")
    assert "\n# another\n\nstatus\n----\nR0 view 0.0 seq R0 normal" in out


def test_unknown_command_and_bad_arguments_print_errors() -> None:
    out = run_text("cluster n=3\n----\n\nfrobnicate\n----\n\ncrash 7\n----\n")
    assert "error: unknown command 'frobnicate'" in out
    assert "error: no replica R7" in out
