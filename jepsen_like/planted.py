"""Planted bugs in the replicated state machine: the product's own ``cellar serve`` with
a deliberately broken machine in every replica, to show that the harness's checkers
find what a wrong ``apply`` does (issue 14). Nothing in the product changes and no
build flag exists: the harness starts its nodes as

    python3 -m jepsen_like.planted BUG serve ARGS...

which puts the broken machine in ``store.machines``' registry under the name the node
asks for (``kv`` or ``scheduler``) and then runs ``cellar serve ARGS...`` unchanged
(``cellar jepsen run --planted machine-BUG``; ``jepsen_like.db.CellarDB(planted=BUG)``).

The bugs (``MACHINE_BUGS``), each one a mistake an implementer could make:

- ``kv-lost-write``: every 5th ``put`` is stored under the wrong key (its key with a
  suffix) and acknowledged as usual. Every replica does the same, so they agree; a
  later read does not see the acknowledged write (linearizability).
- ``kv-cas-ignores-compare``: every 4th ``txn`` runs its success branch without
  evaluating its compares: a compare-and-set that should fail succeeds
  (linearizability).
- ``kv-diverge``: replica 0 alone drops every 10th ``put`` (applies nothing, answers as
  usual): a non-deterministic machine. The replicas' states part (digests after the
  heal) and reads through replica 0 go stale.
- ``scheduler-ack-unplaced``: every 6th allocation that succeeds is released again in
  the same apply, while its answer says it was placed: an acknowledged allocation
  that the final state does not hold.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

MACHINE_BUGS = ("kv-lost-write", "kv-cas-ignores-compare", "kv-diverge", "scheduler-ack-unplaced")


def _suffixed(key: Any) -> Any:
    return key + (b"~lost" if isinstance(key, bytes) else "~lost")


def _broken_kv(bug: str, node_id: int, apply: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The KV machine's ``apply`` with ``bug`` in it."""
    count = {"put": 0, "txn": 0}

    def broken(op: Any) -> Any:
        name = op.get("op") if type(op) is dict else None
        if name in count:
            count[name] += 1
        if name == "put" and "key" in op:
            if bug == "kv-lost-write" and count["put"] % 5 == 0:
                op = dict(op, key=_suffixed(op["key"]))
            elif bug == "kv-diverge" and node_id == 0 and count["put"] % 10 == 0:
                return apply({"op": "range", "key": op["key"], "count_only": True})  # applies nothing
        elif name == "txn" and bug == "kv-cas-ignores-compare" and count["txn"] % 4 == 0:
            op = dict(op, compare=[])
        return apply(op)

    return broken


def _broken_scheduler(apply_one: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The scheduler's ``_apply`` (one command) with ``scheduler-ack-unplaced`` in it."""
    placed = [0]

    def broken(command: Any) -> Any:
        result = apply_one(command)
        if type(command) is dict and command.get("op") == "allocate" and type(result) is dict \
                and result.get("ok") and result.get("state") == "allocated":
            placed[0] += 1
            group = command.get("group")
            name = (group.get("affinityGroup") or {}).get("name") if isinstance(group, dict) else None
            if placed[0] % 6 == 0 and name:
                apply_one({"op": "release", "group": name})
        return result

    return broken


class _Delegate:
    """The machine ``inner`` with ``apply`` replaced; everything else is ``inner``'s."""

    def __init__(self, inner: Any, apply: Callable[[Any], Any]) -> None:
        self._inner = inner
        self.apply = apply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install(bug: str, node_id: int) -> None:
    """Wrap the machines ``store.machines``' registry builds so they carry ``bug``: the
    product's own machine, its ``apply`` (the scheduler: ``_apply``, one command of a
    batch) broken as the module docstring says."""
    from store import machines

    if bug not in MACHINE_BUGS:
        raise ValueError(f"unknown planted machine bug {bug!r} ({', '.join(MACHINE_BUGS)})")
    name = "kv" if bug.startswith("kv-") else "scheduler"
    real = machines._FACTORIES[name]

    def factory(config: Any) -> Any:
        m = real(config)
        if name == "kv":  # slotted: a stand-in that answers for it, apply broken
            return _Delegate(m, _broken_kv(bug, node_id, m.apply))
        m._apply = _broken_scheduler(m._apply)
        return m

    machines._FACTORIES[name] = factory


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] != "serve":
        sys.stderr.write("usage: python3 -m jepsen_like.planted BUG serve ARGS... "
                         f"(BUG: {', '.join(MACHINE_BUGS)})\n")
        sys.exit(2)
    node_id = int(argv[argv.index("--id") + 1]) if "--id" in argv[:-1] else -1
    try:
        install(argv[0], node_id)
    except ValueError as e:
        sys.stderr.write(f"jepsen_like.planted: {e}\n")
        sys.exit(2)
    from store.cli import main as cellar

    cellar(args=argv[1:], prog_name="cellar")


if __name__ == "__main__":
    main(sys.argv[1:])
