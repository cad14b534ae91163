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
from typing import Any

MACHINE_BUGS = ("kv-lost-write", "kv-cas-ignores-compare", "kv-diverge", "scheduler-ack-unplaced")


def _suffixed(key: Any) -> Any:
    return key + (b"~lost" if isinstance(key, bytes) else "~lost")


def _kv_machine(bug: str, node_id: int) -> Any:
    from store.kv_machine import KVStateMachine

    class PlantedKV(KVStateMachine):
        puts = 0
        txns = 0

        def apply(self, op: Any) -> Any:
            if type(op) is dict and op.get("op") == "put":
                self.puts += 1
                if bug == "kv-lost-write" and self.puts % 5 == 0 and "key" in op:
                    op = dict(op, key=_suffixed(op["key"]))
                elif bug == "kv-diverge" and node_id == 0 and self.puts % 10 == 0:
                    return super().apply({"op": "range", "key": op.get("key"), "count_only": True}) \
                        if "key" in op else None
            elif type(op) is dict and op.get("op") == "txn" and bug == "kv-cas-ignores-compare":
                self.txns += 1
                if self.txns % 4 == 0:
                    op = dict(op, compare=[])
            return super().apply(op)

    return PlantedKV()


def _scheduler_machine(bug: str, config: Any) -> Any:
    from scheduler_state.replicated import ReplicatedScheduler

    class PlantedScheduler(ReplicatedScheduler):
        placed = 0

        def _apply(self, command: Any) -> Any:
            result = super()._apply(command)
            if type(command) is dict and command.get("op") == "allocate" and type(result) is dict \
                    and result.get("ok") and result.get("state") == "allocated":
                self.placed += 1
                group = command.get("group")
                name = (group.get("affinityGroup") or {}).get("name") if isinstance(group, dict) else None
                if self.placed % 6 == 0 and name:
                    super()._apply({"op": "release", "group": name})
            return result

    return PlantedScheduler(config)


def install(bug: str, node_id: int) -> None:
    """Put the broken machine of ``bug`` into ``store.machines``' registry."""
    from store import machines

    if bug not in MACHINE_BUGS:
        raise ValueError(f"unknown planted machine bug {bug!r} ({', '.join(MACHINE_BUGS)})")
    if bug.startswith("kv-"):
        machines._FACTORIES["kv"] = lambda config: _kv_machine(bug, node_id)
    else:
        real = machines._FACTORIES["scheduler"]

        def factory(config: Any) -> Any:
            real(config)  # the same checks of the config
            from scheduler_state.config import Config, load_config

            if config is not None and not isinstance(config, Config):
                config = load_config(config)
            return _scheduler_machine(bug, config)

        machines._FACTORIES["scheduler"] = factory


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
