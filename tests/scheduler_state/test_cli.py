"""scheduler_state.cli: ``cellar scheduler validate`` and ``cellar scheduler bench``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from scheduler_state.cli import scheduler
from store.cli import main
from tests.scheduler_state.helpers import example


def test_validate_accepts_example_config() -> None:
    r = CliRunner().invoke(scheduler, ["validate", str(example("fleet"))])
    assert r.exit_code == 0, r.output
    assert "valid: 6 chains, 19 nodes, 142 leaf cells, 3 virtual clusters" in r.output
    assert "chain A100-POD: 1 top cells, 3 nodes, 24 x A100" in r.output
    r = CliRunner().invoke(scheduler, ["validate", "--json", str(example("pinned"))])
    assert r.exit_code == 0
    assert json.loads(r.output)["virtualClusters"]["cv"]["pinnedCells"] == 1


@pytest.mark.shared
def test_validate_accepts_hived_config(hived: Path) -> None:
    r = CliRunner().invoke(scheduler, ["validate", str(hived / "config" / "design.yaml")])
    assert r.exit_code == 0, r.output
    assert "valid: 6 chains, 20 nodes, 270 leaf cells, 2 virtual clusters" in r.output
    r = CliRunner().invoke(scheduler, ["validate", "--json", str(hived / "feature" / "hived-config-1.yaml")])
    assert r.exit_code == 0
    assert json.loads(r.output)["virtualClusters"]["vc2"]["pinnedCells"] == 1


def test_validate_rejects_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("physicalCluster:\n  cellTypes:\n    A: {childCellType: B, childCellNumber: 2}\n"
                   "    B: {childCellType: A, childCellNumber: 2}\n  physicalCells: [{cellType: A}]\n")
    r = CliRunner().invoke(scheduler, ["validate", str(bad)])
    assert r.exit_code == 1
    lines = [line for line in r.output.splitlines() if line]
    assert len(lines) == 1 and "invalid" in lines[0] and "cycle" in lines[0]
    r = CliRunner().invoke(scheduler, ["validate", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 1 and "cannot read config file" in r.output


def test_bench_json_small() -> None:
    r = CliRunner().invoke(scheduler, ["bench", "--nodes", "32", "--vcs", "2", "--ops", "300", "--warmup", "50",
                                       "--seed", "3", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["ops"] == 300 and out["gpus"] == 256 and out["counts"]["errors"] == 0
    assert out["cpu"]["ops_per_s"] > 0 and out["wall"]["p99_us"] >= out["wall"]["p50_us"]
    r = CliRunner().invoke(scheduler, ["bench", "--nodes", "30"])
    assert r.exit_code != 0 and "multiple of 16" in r.output


def test_reachable_through_cellar_cli() -> None:
    r = CliRunner().invoke(main, ["scheduler", "validate", str(example("pinned"))])
    assert r.exit_code == 0 and "valid" in r.output
