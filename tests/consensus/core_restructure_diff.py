"""Differential harness for the core restructure (fe9c7b0 -> 1271bbb/f271088/6d79230).

Not a pytest module: run it once per tree with PYTHONPATH pointing at that tree, and
compare the printed lines (``seed hash``) of the two runs:

    PYTHONPATH=/work/wt/review-base python3 tests/consensus/core_restructure_diff.py swarm 1000 1100
    PYTHONPATH=/work/wt/review11    python3 tests/consensus/core_restructure_diff.py swarm 1000 1100

Modes: ``swarm`` (search.swarm_config(seed)), ``steer5`` (steer.plan_run with N = 5 and
the crash / loss / drop-accepts / isolate-seq / halves families), ``steer`` (default
steer options). The checks of steer.check_run (linearizability etc.) are skipped: the
trace hash covers every message, record and reply.

It also instruments the core it runs (by wrapping handlers, never editing the tree)
to count the states where the old code relied on aliasing (``CInst`` used as record,
proposal and recovery pick at once) and the new code does not, and reports them on
stderr as ``COUNTERS {...}``:

- ``cack_own_record_not_unready``: a CAck for our own instance that holds an
  uncommitted record which is not the proposal in ``unready`` (old: counted on the
  record; new: dropped). Any nonzero count is a potential behaviour difference.
- ``own_record_dirty_outside_unready`` (old tree): an own uncommitted record outside
  ``unready`` with nonzero born/sent_to when a re-prepare proposes (old kept them,
  new starts a fresh Proposal at 0).
- ``alias_broken``: ``unready[i]`` is not ``clog[me][i]`` (old) / ``p.rec`` is not
  the record or ``p.ballot``/``p.cmds`` differ from it (new), for unready and the
  current recoveries' ``accepting``.
- coverage counters: how often the paths of the brief ran.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import consensus.core.sdpaxos as sd
from consensus.core.messages import CAck, CAccept, CCommit

NEW = hasattr(sd, "Proposal")
C: Counter = Counter()
R = sd.SDPaxosReplica
H = R._handlers


def _rec_of(p):
    return p.rec if NEW else p


def check_alias(self) -> None:
    me = self.id
    own = self.clog[me]
    for inst, p in self.unready.items():
        c = own.get(inst)
        if c is None or _rec_of(p) is not c:
            C["alias_broken_unready"] += 1
        elif NEW and (p.ballot != c.ballot or p.cmds is not c.cmds):
            C["alias_broken_unready_value"] += 1
    for leader, rec in self.crec.items():
        for inst, p in rec.accepting.items():
            c = self.clog[leader].get(inst)
            if c is None or _rec_of(p) is not c:
                C["alias_broken_accepting"] += 1
            elif NEW and (p.ballot != c.ballot or p.cmds is not c.cmds) and not c.committed:
                C["alias_broken_accepting_value"] += 1


old_cack = H[CAck]


def on_cack(self, src, m):
    if 0 <= m.leader < self.n:
        C["cack"] += 1
        rec = self.crec.get(m.leader)
        if m.leader == self.id and not (rec is not None and rec.accepting):
            c = self.clog[self.id].get(m.inst)
            p = self.unready.get(m.inst)
            if c is not None and not c.committed and (p is None or _rec_of(p) is not c):
                C["cack_own_record_not_unready"] += 1
                C["cack_own_record_not_unready_" + ("ok" if m.ok else "nack")] += 1
                if m.ok and m.ballot == c.ballot:
                    C["cack_own_record_not_unready_SAMEBALLOT"] += 1
                print(f"DIFF? R{self.id} now={self.now} CAck src={src} {m} rec=({c.ballot},{c.committed}) unready={sorted(self.unready)[:8]}",
                      file=sys.stderr)
            if c is None and not m.ok:
                C["cack_own_norecord_nack"] += 1
            if c is not None and c.committed:
                C["cack_own_committed"] += 1
            if c is None and m.inst < self.floor_inst[self.id]:
                C["cack_own_compacted"] += 1
    old_cack(self, src, m)
    check_alias(self)


H[CAck] = on_cack

old_caccept = H[CAccept]


def on_caccept(self, src, m):
    if 0 <= m.leader < self.n:
        c = self.clog[m.leader].get(m.inst)
        if m.leader == self.id and src != self.id:
            C["caccept_for_own_inst"] += 1
            if c is not None and not c.committed and m.ballot != c.ballot and m.ballot >= self.promised[m.leader]:
                C["caccept_own_ballot_change" + ("_unready" if m.inst in self.unready else "_not_unready")] += 1
            if c is None and m.inst not in self.unready:
                C["caccept_own_new_record"] += 1
        elif c is not None and not c.committed and m.ballot != c.ballot:
            rec = self.crec.get(m.leader)
            if rec is not None and m.inst in rec.accepting:
                C["caccept_peer_accepting_ballot_change"] += 1
    old_caccept(self, src, m)
    check_alias(self)


H[CAccept] = on_caccept

old_ccommit = H[CCommit]


def on_ccommit(self, src, m):
    if 0 <= m.leader < self.n and m.full:
        c = self.clog[m.leader].get(m.inst)
        if c is not None and not c.committed and m.ballot != c.ballot:
            C["ccommit_full_ballot_change" + ("_own_unready" if m.leader == self.id and m.inst in self.unready else "")] += 1
    old_ccommit(self, src, m)
    check_alias(self)


H[CCommit] = on_ccommit

old_rp = R._recovery_propose


def recovery_propose(self, rec):
    own = rec.leader == self.id
    C["recovery_propose_own" if own else "recovery_propose_peer"] += 1
    if own:
        for inst, c in self.clog[self.id].items():
            if not c.committed and inst not in self.unready:
                C["own_record_outside_unready_at_reprepare"] += 1
                if not NEW and (c.born or c.sent_to or c.sent_tick):
                    C["own_record_dirty_outside_unready"] += 1
    old_rp(self, rec)
    check_alias(self)


R._recovery_propose = recovery_propose

old_rf = R._raise_floor


def raise_floor(self, slot, insts):
    popped = [i for i in self.unready if i < max(insts[self.id], self.floor_inst[self.id])]
    if popped:
        C["raise_floor_pops_unready"] += len(popped)
    for leader, rec in self.crec.items():
        if any(i < max(insts[leader], self.floor_inst[leader]) for i in rec.accepting):
            C["raise_floor_pops_accepting"] += 1
    old_rf(self, slot, insts)
    check_alias(self)


R._raise_floor = raise_floor

old_sc = R._start_crecovery


def start_crecovery(self, leader, *a, **k):
    old = self.crec.get(leader)
    if old is not None and old.accepting:
        C["crec_replaced_while_accepting"] += 1
    old_sc(self, leader, *a, **k)


R._start_crecovery = start_crecovery

old_init_after = R._after_replay


def after_replay(self):
    old_init_after(self)
    C["restarts"] += 1
    check_alias(self)


R._after_replay = after_replay


def run_swarm(seed: int) -> str:
    from consensus.sim.search import swarm_config
    from consensus.sim.simulator import Simulation

    return Simulation(swarm_config(seed)).run().trace_hash


def run_steer(seed: int, five: bool) -> str:
    import consensus.sim.steer as st

    st.check_run = lambda sim, opts, failures: {"trace_hash": sim.trace_hash, "failures": failures}
    if five:
        opts = st.Options(replicas=(5,), families=("crash", "loss", "drop-accepts", "isolate-seq", "halves", "drop-requests"))
    else:
        opts = st.Options()
    plan, res = st.run_seed(seed, opts)
    if "trace_hash" not in res:
        return "EXC " + repr(res.get("failures"))
    return res["trace_hash"]


def main() -> None:
    mode, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for seed in range(lo, hi):
        if mode == "swarm":
            h = run_swarm(seed)
        elif mode == "steer5":
            h = run_steer(seed, True)
        else:
            h = run_steer(seed, False)
        print(seed, h, flush=True)
    print("COUNTERS", json.dumps(dict(sorted(C.items()))), file=sys.stderr)


if __name__ == "__main__":
    try:  # the simulators take their machines from the application layer (consensus.sim.registry)
        from store.machines import install_in_simulator
    except ImportError:  # a tree from before that change
        install_in_simulator = None
    if install_in_simulator is not None:
        install_in_simulator()
    main()
