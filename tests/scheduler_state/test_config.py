"""scheduler_state.config: HiveD configs load unchanged; bad ones are rejected with a
message naming the offending entry (issue 5, config bullet and acceptance 3).

The default suite reads our own configs (examples/); the tests marked ``shared`` read
HiveD's own files from ../shared/hived (``python3 -m pytest -m shared``)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from scheduler_state import ConfigError, SchedulerStateMachine, check, load_config
from tests.scheduler_state.helpers import EXAMPLES, FEATURE, HIVED, example

BASIC = """
physicalCluster:
  skuTypes:
    K80: {gpu: 1}
  cellTypes:
    K80-NODE: {childCellType: K80, childCellNumber: 4, isNodeLevel: true}
    K80-NODE-POOL: {childCellType: K80-NODE, childCellNumber: 3}
  physicalCells:
  - cellType: K80-NODE-POOL
    cellChildren:
    - cellAddress: node1
    - cellAddress: node2
      pinnedCellId: PIN
    - cellAddress: node3
virtualClusters:
  vc1:
    virtualCells:
    - {cellType: K80-NODE-POOL.K80-NODE, cellNumber: 1}
  vc2:
    virtualCells:
    - {cellType: K80-NODE-POOL.K80-NODE, cellNumber: 1}
    pinnedCells:
    - pinnedCellId: PIN
"""


def full_configs(root: Path) -> list[Path]:
    """Every YAML file under ``root`` that is a full config (one document with
    physicalCluster and virtualClusters); request files are not configs."""
    out = []
    for path in sorted(root.rglob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue  # multi-document request files
        if isinstance(doc, dict) and "physicalCluster" in doc and "virtualClusters" in doc:
            out.append(path)
    return out


def loads_and_round_trips(paths: list[Path]) -> None:
    for path in paths:
        cfg = load_config(path)
        again = load_config(cfg.to_dict())
        assert again.to_dict() == cfg.to_dict(), path
        m = SchedulerStateMachine(cfg)
        assert check(m) == [], path


def test_every_example_config_loads() -> None:
    paths = full_configs(EXAMPLES)
    names = {p.relative_to(EXAMPLES).as_posix() for p in paths}
    assert {"hived-small.yaml", "hived-demo.yaml"} <= names
    assert {f"hived-features/{n}.yaml" for n in (
        "fleet", "pinned", "mixed", "mixed-full-quota", "mixed-no-t4", "mixed-two-t4", "mixed-without-v0",
        "mixed-no-speech", "mixed-moved-quota")} <= names
    # The request files are HiveD pod documents, not configs.
    assert not any(n.endswith("-request.yaml") for n in names)
    loads_and_round_trips(paths)


@pytest.mark.shared
def test_every_shared_hived_config_loads(hived: Path) -> None:
    paths = full_configs(HIVED)
    names = {p.name for p in paths}
    assert {"design.yaml", "basic.yaml"} <= names
    assert {f"hived-config-{n}.yaml" for n in (1, 2, 3, 33, 4, 5, 6, 7, 8)} <= names
    loads_and_round_trips(paths)


def test_fleet_config_structure() -> None:
    """fleet.yaml uses every part of the format that HiveD's design.yaml shows."""
    cfg = load_config(example("fleet"))
    assert list(cfg.chains) == ["T4-NODE", "A100-POD", "H100-NODE", "H100-RACK2", "H100-RACK4", "IB-H100-PAIR"]
    # The leaf type of the IB chain is whatever its lowest childCellType names.
    assert cfg.chains["IB-H100-PAIR"].leaf_type == "IB-H100-GPU"
    assert [cfg.chains[c].leaf_type for c in ("H100-NODE", "H100-RACK2", "H100-RACK4")] == ["H100"] * 3
    m = SchedulerStateMachine(cfg)
    # Node dgx-a2 holds A100 devices 0..7 (inferred) and T4 devices 8 and 9.
    devices = sorted((p.chain.info.name, p.leaf_index) for p in m.cluster.node_leaves["dgx-a2"])
    assert devices == [("A100-POD", i) for i in range(8)] + [("T4-NODE", 8), ("T4-NODE", 9)]
    # Addresses spelled out (dgx-a1) are those HiveD would infer (dgx-a2).
    a1 = [p.addr for p in m.cluster.node_leaves["dgx-a1"]]
    a2 = [p.addr for p in m.cluster.node_leaves["dgx-a2"] if p.chain.info.name == "A100-POD"]
    assert a1 == [a.replace("dgx-a2", "dgx-a1") for a in a2]
    # Explicit, permuted device indices are kept (node dgx-a0).
    a0 = [p.leaf_index for p in m.cluster.node_leaves["dgx-a0"]]
    assert a0 == [6, 4, 7, 5, 2, 0, 3, 1]
    # Pinned cells at three levels: a device, a rack of 2 nodes inside a forged rack of
    # 4, and a whole top-level cell.
    assert (m.cluster.pinned_cells["VIS-T4"].ctype, m.cluster.pinned_cells["VIS-T4"].level) == ("T4", 1)
    assert m.cluster.pinned_cells["VIS-RACK"].ctype == "H100-RACK2"
    assert m.cluster.pinned_cells["VIS-IB"].ctype == "IB-H100-PAIR"
    summary = cfg.summary()
    assert summary["virtualClusters"]["vision"] == {"virtualCells": 6, "pinnedCells": 3, "nonPinnedLeafCells": 56}
    assert len(cfg.node_names()) == 19


@pytest.mark.shared
def test_design_config_structure(hived: Path) -> None:
    cfg = load_config(HIVED / "config" / "design.yaml")
    assert list(cfg.chains) == ["CT1-NODE", "3-DGX1-P100-NODE", "DGX2-V100-NODE", "3-DGX2-V100-NODE",
                                "4-DGX2-V100-NODE", "2-IB-DGX2-V100-NODE"]
    # The leaf type of the IB chain is whatever its lowest childCellType names.
    assert cfg.chains["2-IB-DGX2-V100-NODE"].leaf_type == "IB-DGX2-V100-V100"
    m = SchedulerStateMachine(cfg)
    # Node 1.0.0.2 holds CT1 devices 8 and 9 and DGX1-P100 devices 0..7 (inferred).
    devices = sorted((p.chain.info.name, p.leaf_index) for p in m.cluster.node_leaves["1.0.0.2"])
    assert devices == [("3-DGX1-P100-NODE", i) for i in range(8)] + [("CT1-NODE", 8), ("CT1-NODE", 9)]
    # Explicit, permuted device indices are kept (node 1.0.0.0).
    node0 = [p.leaf_index for p in m.cluster.node_leaves["1.0.0.0"]]
    assert node0 == [1, 3, 4, 7, 0, 2, 6, 5]
    assert m.cluster.pinned_cells["VC1-YQW-DGX2"].ctype == "2-DGX2-V100-NODE"
    assert m.cluster.pinned_cells["VC1-YQW-CT1"].level == 1


def test_addresses_are_inferred_like_hived() -> None:
    """A top cell defaults to its index, cells below the node to their index among the
    node's cells of that type (so devices are 0..n-1 on each node)."""
    m = SchedulerStateMachine(load_config(example("mixed")))
    leaves = [p.addr for p in m.cluster.node_leaves["gpu-v1"]]
    assert leaves == [f"0/gpu-v1/{q}/{p}/{d}" for q, p, d in (
        (0, 0, 0), (0, 0, 1), (0, 1, 2), (0, 1, 3), (1, 2, 4), (1, 2, 5), (1, 3, 6), (1, 3, 7))]
    t4 = [p.addr for p in m.cluster.node_leaves["gpu-t0"]]
    assert t4 == [f"1/gpu-t0/{a}/{b}" for a, b in ((0, 0), (0, 1), (1, 2), (1, 3))]


@pytest.mark.shared
def test_hived_addresses_are_inferred_like_hived(hived: Path) -> None:
    m = SchedulerStateMachine(load_config(FEATURE / "hived-config-2.yaml"))
    leaves = [p.addr for p in m.cluster.node_leaves["10.151.41.19"]]
    assert leaves == [f"0/10.151.41.19/{a}/{b}" for a, b in ((0, 0), (0, 1), (1, 2), (1, 3))]


def bad(text_or_doc: str | dict, *fragments: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(text_or_doc)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def doc() -> dict:
    return yaml.safe_load(BASIC)


def test_basic_inline_config_is_valid() -> None:
    cfg = load_config(BASIC)
    assert cfg.node_names() == ["node1", "node2", "node3"]


def test_malformed_yaml() -> None:
    bad("physicalCluster: [unclosed", "malformed YAML")
    bad("- just\n- a list\n", "must be a YAML mapping")
    bad("virtualClusters: {}\n", "physicalCluster")


def test_unknown_cell_type() -> None:
    d = doc()
    d["physicalCluster"]["cellTypes"]["K80-NODE"]["childCellType"] = "K8O"
    bad(d, "cellTypes.K80-NODE", "unknown cell type 'K8O'")
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["cellType"] = "NOPE"
    bad(d, "physicalCells[0]", "unknown cellType 'NOPE'")
    d = doc()
    d["virtualClusters"]["vc1"]["virtualCells"][0]["cellType"] = "NOPE.K80-NODE"
    bad(d, "virtualClusters.vc1.virtualCells[0]", "unknown cell type 'NOPE'")


def test_cycle_in_cell_types() -> None:
    d = doc()
    d["physicalCluster"]["skuTypes"] = {}
    d["physicalCluster"]["cellTypes"]["K80"] = {"childCellType": "K80-NODE-POOL", "childCellNumber": 1}
    msg = bad(d, "cycle", "forest")
    assert "K80-NODE-POOL" in msg


def test_node_level_exactly_once() -> None:
    d = doc()
    d["physicalCluster"]["cellTypes"]["K80-NODE"]["isNodeLevel"] = False
    bad(d, "physicalCells[0]", "no isNodeLevel", "exactly one node level")
    d = doc()
    d["physicalCluster"]["cellTypes"]["K80-NODE-POOL"]["isNodeLevel"] = True
    bad(d, "physicalCells[0]", "2 (", "exactly one node level")


def test_full_hierarchy_required() -> None:
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["cellChildren"].pop()
    bad(d, "physicalCells[0]", "needs all 3 children", "got 2")
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["cellChildren"][0]["cellChildren"] = [{"cellAddress": 0}]
    bad(d, "physicalCells[0].cellChildren[0]", "needs all 4 children")


def test_node_addresses_and_devices() -> None:
    d = doc()
    del d["physicalCluster"]["physicalCells"][0]["cellChildren"][2]["cellAddress"]
    bad(d, "physicalCells[0].cellChildren[2]", "needs a cellAddress")
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["cellChildren"][2]["cellAddress"] = "node1"
    bad(d, "physicalCells[0].cellChildren[2].cellChildren[0]", "device 0 of node 'node1' is already defined")
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["cellChildren"][0]["cellChildren"] = [
        {"cellAddress": "gpu-a"}, {"cellAddress": 1}, {"cellAddress": 2}, {"cellAddress": 3}]
    bad(d, "physicalCells[0].cellChildren[0].cellChildren[0]", "must be an integer device index")


@pytest.mark.parametrize("address", ["1_0", " 1", "+1", "-1", "1.0", "\u0661", "0x1"])
def test_a_leaf_address_is_decimal_digits(address: str) -> None:
    """A device index is decimal digits; Python's int() also takes "1_0" (device
    10), signs, spaces and non-ASCII digits (review 70)."""
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["cellChildren"][0]["cellChildren"] = [
        {"cellAddress": address}, {"cellAddress": 1}, {"cellAddress": 2}, {"cellAddress": 3}]
    bad(d, "physicalCells[0].cellChildren[0].cellChildren[0]", "must be an integer device index")


def test_leaf_addresses_with_leading_zeros_name_the_same_device() -> None:
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["cellChildren"][0]["cellChildren"] = [
        {"cellAddress": "0"}, {"cellAddress": "01"}, {"cellAddress": "1"}, {"cellAddress": 3}]
    bad(d, "physicalCells[0].cellChildren[0].cellChildren[2]", "device 1 of node 'node1' is already defined")


@pytest.mark.parametrize("sku, text", [
    ("K80", "must be a mapping"),
    ({"gpu": "one"}, "gpu must be a non-negative integer"),
    ({"gpu": -1}, "gpu must be a non-negative integer"),
    ({"gpu": True}, "gpu must be a non-negative integer"),
    ({"cpu": 4.5}, "cpu must be a non-negative integer"),
    ({"cpu": 1 << 31}, "cpu must be a non-negative integer"),
    ({"memory": [1]}, "memory must be a quantity"),
    ({"memory": -5}, "memory must be a quantity"),
    ({"memory": "lots"}, "memory must be a quantity"),
    ({"memory": "8192 Mi"}, "memory must be a quantity"),
    ({"memory": "-1Gi"}, "memory must be a quantity"),
])
def test_sku_types_are_checked(sku: object, text: str) -> None:
    d = doc()
    d["physicalCluster"]["skuTypes"]["K80"] = sku
    bad(d, "physicalCluster.skuTypes.K80", text)


def test_a_sku_type_needs_a_name() -> None:
    d = doc()
    d["physicalCluster"]["skuTypes"][None] = {"gpu": 1}
    bad(d, "physicalCluster.skuTypes: None is not a sku type name")


@pytest.mark.parametrize("memory", ["8192Mi", "54Gi", "1.5G", "512M", "1e9", 8589934592])
def test_sku_types_as_hived_writes_them_load(memory: object) -> None:
    d = doc()
    d["physicalCluster"]["skuTypes"]["K80"] = {"gpu": 1, "cpu": 4, "memory": memory}
    cfg = load_config(d)
    assert cfg.sku_types["K80"] == {"gpu": 1, "cpu": 4, "memory": memory}
    assert load_config(cfg.to_dict()).to_dict() == cfg.to_dict()


def test_negative_and_non_integer_numbers() -> None:
    d = doc()
    d["physicalCluster"]["cellTypes"]["K80-NODE"]["childCellNumber"] = -4
    bad(d, "cellTypes.K80-NODE", "childCellNumber must be a positive integer")
    d = doc()
    d["physicalCluster"]["cellTypes"]["K80-NODE"]["childCellNumber"] = "4"
    bad(d, "cellTypes.K80-NODE", "childCellNumber")
    d = doc()
    d["virtualClusters"]["vc1"]["virtualCells"][0]["cellNumber"] = -1
    bad(d, "virtualClusters.vc1.virtualCells[0]", "cellNumber must be a non-negative integer")


def test_virtual_cell_paths() -> None:
    d = doc()
    d["virtualClusters"]["vc1"]["virtualCells"][0]["cellType"] = "K80-NODE"
    bad(d, "virtualClusters.vc1.virtualCells[0]", "must start with a cell type used at the top of physicalCells")
    d = doc()
    d["virtualClusters"]["vc1"]["virtualCells"][0]["cellType"] = "K80-NODE-POOL.K80"
    bad(d, "virtualClusters.vc1.virtualCells[0]", "'K80' is not the childCellType of 'K80-NODE-POOL'")


def test_quota_must_fit() -> None:
    d = doc()
    d["virtualClusters"]["vc1"]["virtualCells"][0]["cellNumber"] = 2
    bad(d, "quota does not fit", "chain K80-NODE-POOL", "K80-NODE", "vc1, vc2")
    d = doc()
    d["virtualClusters"]["vc3"] = {"virtualCells": [{"cellType": "K80-NODE-POOL", "cellNumber": 1}]}
    bad(d, "quota does not fit", "K80-NODE-POOL cells", "vc3")


def test_pinned_cells() -> None:
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["cellChildren"][0]["pinnedCellId"] = "PIN"
    bad(d, "physicalCells[0].cellChildren[1]", "pinnedCellId 'PIN' is already used at physicalCells[0].cellChildren[0]")
    d = doc()
    d["virtualClusters"]["vc1"]["pinnedCells"] = [{"pinnedCellId": "PIN"}]
    bad(d, "virtualClusters.vc2.pinnedCells[0]", "already referred to by VC 'vc1'")
    d = doc()
    d["virtualClusters"]["vc2"]["pinnedCells"] = [{"pinnedCellId": "NOPE"}]
    bad(d, "virtualClusters.vc2.pinnedCells[0]", "'NOPE' is not defined in physicalCells")
    d = doc()
    d["physicalCluster"]["physicalCells"][0]["pinnedCellId"] = "OUTER"
    bad(d, "physicalCells[0].cellChildren[1]", "nested inside pinned cell 'OUTER'")


def test_fleet_yaml_variants_name_the_entry() -> None:
    d = yaml.safe_load(example("fleet").read_text())
    broken = copy.deepcopy(d)
    broken["virtualClusters"]["speech"]["virtualCells"][0]["cellNumber"] = 3
    bad(broken, "quota does not fit", "chain A100-POD")
    broken = copy.deepcopy(d)
    # dgx-a1 (physicalCells[3].cellChildren[1]) loses a GPU under socket 0's first link.
    broken["physicalCluster"]["physicalCells"][3]["cellChildren"][1]["cellChildren"][0]["cellChildren"][0][
        "cellChildren"].pop()
    bad(broken, "physicalCells[3].cellChildren[1].cellChildren[0].cellChildren[0]", "needs all 2 children")
    broken = copy.deepcopy(d)
    broken["virtualClusters"]["ops"]["pinnedCells"] = [{"pinnedCellId": "VIS-IB"}]
    bad(broken, "virtualClusters.vision.pinnedCells[2]", "already referred to by VC 'ops'")


@pytest.mark.shared
def test_design_yaml_variants_name_the_entry(hived: Path) -> None:
    d = yaml.safe_load((HIVED / "config" / "design.yaml").read_text())
    broken = copy.deepcopy(d)
    broken["virtualClusters"]["VC2"]["virtualCells"][0]["cellNumber"] = 3
    bad(broken, "chain 3-DGX1-P100-NODE")
    broken = copy.deepcopy(d)
    broken["physicalCluster"]["physicalCells"][3]["cellChildren"][1]["cellChildren"][0]["cellChildren"].pop()
    bad(broken, "physicalCells[3].cellChildren[1].cellChildren[0]", "needs all 2 children")


def test_reconfigure_with_a_bad_config_changes_nothing() -> None:
    m = SchedulerStateMachine(load_config(example("mixed")))
    assert m.apply({"op": "allocate", "group": {"virtualCluster": "vision", "leafCellNumber": 1, "name": "a"}})["ok"]
    before = m.snapshot()
    for config in ("physicalCluster: [", {"physicalCluster": {}}, 42, BASIC.replace("cellNumber: 1", "cellNumber: 5")):
        r = m.apply({"op": "reconfigure", "config": config})
        assert r["ok"] is False and r["error"], r
        assert m.snapshot() == before
