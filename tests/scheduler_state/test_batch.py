"""Batches: several commands in one log entry (``scheduler_state.replicated``). Each
command of a batch is applied alone, in order, with its own result: the same results
and the same state as the commands applied one by one."""

from __future__ import annotations

import random

from scheduler_state.bench import _group_spec, generate_config
from scheduler_state.config import load_config
from scheduler_state.invariants import check
from scheduler_state.replicated import BATCH_MAX, ReplicatedScheduler


def _machine() -> ReplicatedScheduler:
    return ReplicatedScheduler(load_config(generate_config(64, 2)))


def _stream(seed: int, n: int) -> list[dict]:
    """Allocations and releases (some of groups that never existed, or already gone)."""
    rng = random.Random(seed)
    cmds: list[dict] = []
    for i in range(n):
        if rng.random() < 0.6:
            cmds.append({"op": "allocate", "group": _group_spec(rng, f"g{i}", 2), "wait": rng.random() < 0.3})
        else:
            cmds.append({"op": "release", "group": f"g{rng.randrange(i + 1)}"})
    return cmds


def test_a_batch_answers_and_changes_exactly_as_its_commands_one_by_one():
    cmds = _stream(7, 400)
    one, many = _machine(), _machine()
    singles = [one.apply(c) for c in cmds]
    batched = []
    rng = random.Random(3)
    i = 0
    while i < len(cmds):
        k = rng.randint(1, 40)
        out = many.apply({"op": "batch", "commands": cmds[i:i + k]})
        assert out["ok"] and len(out["results"]) == len(cmds[i:i + k])
        batched.extend(out["results"])
        i += k
    assert batched == singles
    assert many.digest() == one.digest()
    assert check(many.inner) == []
    assert any(r.get("ok") for r in singles) and any(not r.get("ok") for r in singles)


def test_each_command_of_a_batch_stands_alone():
    m = _machine()
    spec = _group_spec(random.Random(1), "a", 2)
    out = m.apply({"op": "batch", "commands": [
        {"op": "allocate", "group": spec, "wait": False},
        {"op": "allocate", "group": spec, "wait": False},  # the same name again: refused alone
        {"op": "nonsense"},
        {"op": "batch", "commands": [{"op": "release", "group": "a"}]},  # no nesting
        "not a mapping",
        {"op": "release", "group": "a"},
    ]})
    r = out["results"]
    assert out["ok"] and len(r) == 6
    assert r[0]["ok"] and not r[1]["ok"] and "already allocated" in r[1]["error"]
    assert not r[2]["ok"] and not r[3]["ok"] and "batch" in r[3]["error"] and not r[4]["ok"]
    assert r[5]["ok"] and r[5]["released"]
    assert m.inner.groups == {}


def test_malformed_batches_are_refused_whole_and_change_nothing():
    m = _machine()
    before = m.digest()
    for bad in ({"op": "batch"}, {"op": "batch", "commands": []}, {"op": "batch", "commands": "x"},
                {"op": "batch", "commands": [{"op": "list_groups"}] * (BATCH_MAX + 1)}):
        out = m.apply(bad)
        assert out["ok"] is False and "commands" in out["error"]
    assert m.digest() == before


def test_the_observer_sees_every_command_of_a_batch():
    m = _machine()
    seen = []
    m.observer = lambda cmd, result, ns: seen.append((cmd["op"], result.get("ok")))
    m.timer = lambda: 0
    cmds = _stream(5, 20)
    out = m.apply({"op": "batch", "commands": cmds})
    assert seen == [(c["op"], r.get("ok")) for c, r in zip(cmds, out["results"])]


def test_keys_and_reads_of_a_batch():
    m = _machine()
    b = {"op": "batch", "commands": [{"op": "list_groups"}]}
    assert m.read_key(b) is None  # never a lease read: it goes through the log
    assert m.keys_of(b) == ["scheduler"]
