"""Explorer side of the restructure diff (see core_restructure_diff.py): steered walks
with every action's resulting network (all envelopes in flight, encoded) and each
replica's outbox of persisted records folded into one hash. Run per tree:

    PYTHONPATH=<tree> python3 tests/consensus/core_restructure_explorer_diff.py SEED WALKS DEPTH [N]
"""
from __future__ import annotations

import hashlib
import json
import sys

import consensus.sim.explorer as ex

H = hashlib.blake2b(digest_size=16)
orig_apply = ex.World.apply


def apply(self, action):
    out = orig_apply(self, action)
    H.update(repr(action).encode())
    for item in sorted(self.net):
        H.update(b"%d>%d:" % (item[0], item[1]))
        H.update(item[2])
    for r in range(self.n):
        d = self.disks[r]
        H.update(b"%d:%d;" % (r, len(d)))
        if d:
            H.update(d[-1])
    return out


ex.World.apply = apply


def main() -> None:
    seed, walks, depth = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    cfg = ex.ExplorerConfig(protocol="sdpaxos", replicas=n)
    res = ex.steered_walks(cfg, walks, depth, seed=seed, branches=4)
    v = res.violation
    print(json.dumps({"seed": seed, "walks": res.walks, "transitions": res.transitions, "leaves": res.leaves,
                      "signals": res.by_depth["signals"], "forks": res.by_depth["forks"],
                      "violation": None if v is None else {k: v[k] for k in ("kind", "walk", "branch") if k in v},
                      "hash": H.hexdigest()}, sort_keys=True))


if __name__ == "__main__":
    try:  # the simulators take their machines from the application layer (consensus.sim.registry)
        from store.machines import install_in_simulator
    except ImportError:  # a tree from before that change
        install_in_simulator = None
    if install_in_simulator is not None:
        install_in_simulator()
    main()
