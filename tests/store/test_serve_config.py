"""``cellar serve`` settings for the scheduler machine (flags and the TOML file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus.runtime.node import NodeError
from store.kv_machine import KVStateMachine, stamp, validate
from store.server import build_config, load_hived_config, make_node

SMALL = Path(__file__).resolve().parents[2] / "examples" / "hived-small.yaml"
PEERS = "0=127.0.0.1:7000,1=127.0.0.1:7001,2=127.0.0.1:7002"


def test_toml_scheduler_settings_resolve_relative_to_the_file(tmp_path):
    (tmp_path / "hived.yaml").write_text(SMALL.read_text())
    toml = tmp_path / "node0.toml"
    toml.write_text(f'id = 0\ndata_dir = "d0"\nmachine = "scheduler"\nhived_config = "hived.yaml"\n'
                    f'http = "127.0.0.1:8200"\n[peers]\n0 = "127.0.0.1:7000"\n1 = "127.0.0.1:7001"\n'
                    f'2 = "127.0.0.1:7002"\n')
    cfg = build_config(str(toml), {})
    assert cfg.machine == "scheduler"
    assert cfg.extra["hived_config"] == str(tmp_path / "hived.yaml")
    assert cfg.extra["http"] == ("127.0.0.1", 8200)
    assert load_hived_config(cfg.extra["hived_config"]).virtual_clusters.keys() == {"vc-a", "vc-b"}


def test_flags_and_errors(tmp_path):
    cfg = build_config(None, {"id": 1, "peers": PEERS, "data_dir": "d", "machine": "scheduler",
                              "hived_config": str(SMALL)})
    assert cfg.machine == "scheduler" and "http" not in cfg.extra
    assert build_config(None, {"id": 1, "peers": PEERS, "data_dir": "d"}).machine == "kv"
    with pytest.raises(NodeError, match="needs --hived-config"):
        build_config(None, {"id": 0, "peers": PEERS, "data_dir": "d", "machine": "scheduler"})
    # --http serves the KV machine's API too (store/kv_http.py)
    assert build_config(None, {"id": 0, "peers": PEERS, "data_dir": "d", "http": "127.0.0.1:1"}).extra["http"] == (
        "127.0.0.1", 1)
    with pytest.raises(NodeError, match="cannot read"):
        load_hived_config(str(tmp_path / "missing.yaml"))


def test_the_machine_name_is_resolved_above_the_runtime(tmp_path):
    """The runtime resolves no machine name (tests/test_layering.py): build_config refuses
    an unknown one, and make_node hands the node the registry's machine, its check and its
    stamper (store.machines)."""
    (tmp_path / "node.toml").write_text(f'id = 0\ndata_dir = "d"\nmachine = "nope"\npeers = "{PEERS}"\n')
    with pytest.raises(NodeError, match=r"unknown machine 'nope' \(kv, scheduler\)"):
        build_config(str(tmp_path / "node.toml"), {})
    cfg = build_config(None, {"id": 0, "peers": PEERS, "data_dir": str(tmp_path / "d")})
    node = make_node(cfg)
    assert type(node.sm_factory()) is KVStateMachine and node._validate is validate and node._stamp is stamp
    cfg.machine = "nope"
    with pytest.raises(NodeError, match="machine nope: unknown machine"):
        make_node(cfg)
