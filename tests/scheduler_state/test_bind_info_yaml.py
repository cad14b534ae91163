"""``pods.bind_info_yaml`` writes the pod-bind-info annotation without PyYAML's emitter:
the text must be exactly ``yaml.safe_dump(info, sort_keys=False,
default_flow_style=False)`` for every bind info, whatever its strings (it falls back to
PyYAML for strings whose form depends on where they stand)."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_state.pods import _bind_info_lines, bind_info_yaml

TRICKY = ["", "1", "007", "-1", "+1", "1.5", "1e3", "0o7", "0x1F", "1_000", ".inf", "NaN", "true", "No", "yes",
          "null", "~", "2001-01-01", "10.0.0.1", "0.0.5.0", "-x", "-", "?", ":", "x:", "x:y", "a: b", "#a", "a#b",
          "@x", "*a", "&b", "!t", "%p", "|", ">", "[x]", "{x}", "x,y", '"q', "'q", "=", "<<", ".", "x y", " x",
          "x ", "x\ty", "x\n", "é", "ñode", "a" * 100, "b" * 90 + " c", "node-000-01", "V100-NODE", "K80"]
strings = st.one_of(st.sampled_from(TRICKY), st.text(max_size=12), st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}",
                                                                                   fullmatch=True))
ints = st.integers(0, 10**12)


@st.composite
def infos(draw):
    members = []
    for _ in range(draw(st.integers(1, 3))):
        pps = []
        for _ in range(draw(st.integers(1, 3))):
            n = draw(st.integers(1, 5))
            pps.append({"physicalNode": draw(strings),
                        "physicalLeafCellIndices": draw(st.lists(ints, min_size=n, max_size=n)),
                        "preassignedCellTypes": draw(st.lists(strings, min_size=n, max_size=n))})
        members.append({"podPlacements": pps})
    return {"node": draw(strings), "leafCellIsolation": draw(st.lists(ints, min_size=1, max_size=8)),
            "cellChain": draw(strings), "affinityGroupBindInfo": members}


# 100 examples draw each TRICKY string several times over (250 before: 2.5x the time, 2026-11-27).
@settings(max_examples=100, deadline=None)
@given(infos())
def test_bind_info_yaml_is_pyyaml_s_text(info):
    assert bind_info_yaml(info) == yaml.safe_dump(info, sort_keys=False, default_flow_style=False)


def test_ordinary_names_take_the_direct_path():
    info = {"node": "node-000-01", "leafCellIsolation": [0, 1], "cellChain": "RACK",
            "affinityGroupBindInfo": [{"podPlacements": [
                {"physicalNode": "node-000-01", "physicalLeafCellIndices": [0, 1],
                 "preassignedCellTypes": ["NODE", ""]}]}]}
    assert _bind_info_lines(info) == yaml.safe_dump(info, sort_keys=False, default_flow_style=False)
