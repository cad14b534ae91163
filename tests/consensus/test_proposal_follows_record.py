"""Review of the core restructure (1271bbb): what the split of ``CInst`` into an
acceptor record and a ``Proposal`` relies on, checked at every tick of steered N = 5
runs (crashes, loss, dropped accepts, recoveries of live leaders' instances).

Before the split one ``CInst`` object was the record in ``clog``, the proposal in
``unready`` and a recovery's pick in ``CRecovery.accepting``, so they could not
disagree. Now a proposal follows its record only where ``_proposal`` finds it, and
``_on_cack`` looks in ``unready`` instead of ``clog``. The restructure changes no
behaviour as long as (docs/reviews/core-restructure-review.md):

1. every proposal in ``unready`` is the proposal of our record of that instance,
   with the record's ballot and value;
2. so is every proposal of a current recovery's ``accepting`` (until it is chosen);
3. an own uncommitted record outside ``unready`` never had a proposal here (we never
   sent a CAccept for it in this incarnation), so no CAck can come for it.
"""

from __future__ import annotations

import consensus.sim.steer as st

OPTS = st.Options(replicas=(5,), families=("crash", "loss", "drop-accepts", "isolate-seq", "halves", "drop-requests"))


def check(run, seen: dict) -> None:
    for r in run.sim.nodes:
        if r is None:
            continue
        own = r.clog[r.id]
        for inst, p in r.unready.items():
            assert p.rec is own.get(inst), f"R{r.id}: unready[{inst}] is not the record's proposal"
            assert (p.ballot, p.cmds) == (p.rec.ballot, p.rec.cmds), f"R{r.id}: unready[{inst}] lags its record"
        for leader, rec in r.crec.items():
            for inst, p in rec.accepting.items():
                assert p.rec is r.clog[leader].get(inst), f"R{r.id}: accepting[{leader}][{inst}] is not the record's"
                if not p.rec.committed:
                    assert p.ballot == p.rec.ballot, f"R{r.id}: accepting[{leader}][{inst}] lags its record"
            if leader == r.id:
                assert not rec.accepting, "an own re-prepare is dropped from crec once it proposes"
        if any(i not in r.unready and not c.committed for i, c in own.items()):
            seen["own-record-outside-unready"] = seen.get("own-record-outside-unready", 0) + 1
        if r.crec:
            seen["recovery"] = seen.get("recovery", 0) + 1


def test_proposals_follow_their_records_in_steered_runs():
    seen: dict = {}
    for seed in range(8):
        _plan, res = st.run_seed(seed, OPTS, on_step=lambda run: check(run, seen))
        assert not [f for f in res["failures"] if f.startswith("exception")], res["failures"]
    assert seen.get("recovery"), "the runs recovered C-instances"
