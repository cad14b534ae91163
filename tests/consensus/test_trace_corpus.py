"""Trace-hash corpus: a few hundred seeded runs whose trace hashes must stay bit-identical.

A refactor of the core that is not a deliberate fix must not change a single event of
any run. The corpus (``tests/testdata/trace_corpus.json``) was recorded before the
core was restructured; a deliberate behaviour change rewrites it with

    CELLAR_REWRITE_CORPUS=1 python3 -m pytest tests/consensus/test_trace_corpus.py

and the commit says which seeds changed and why.
"""

import json
import os
from pathlib import Path

import pytest

from consensus.sim import SimConfig, Simulation
from consensus.sim.scenarios import random_schedule

CORPUS = Path(__file__).parent.parent / "testdata" / "trace_corpus.json"
SEEDS = 240


def corpus_config(seed: int) -> SimConfig:
    """The run of corpus entry ``seed``: protocol, size, network and faults from the seed."""
    protocol = "multipaxos" if seed % 4 == 3 else "sdpaxos"
    replicas = 5 if seed % 3 == 2 else 3
    rtt = "lan" if seed % 5 in (1, 3) else "geo"
    seconds = 0.6 if rtt == "lan" else 1.5
    return SimConfig(
        protocol=protocol,
        replicas=replicas,
        rtt=rtt,
        sequencer=seed % replicas,
        clients_per_site=1 + seed % 2,
        seconds=seconds,
        seed=seed,
        batch=(1, 8, 256)[seed % 3],
        jitter=(0.0, 0.5, 1.5)[(seed // 3) % 3],
        loss=(0.0, 0.02, 0.1)[(seed // 9) % 3],
        dup=(0.0, 0.05)[(seed // 27) % 2],
        read_fraction=(0.0, 0.3, 0.6)[(seed // 2) % 3],
        keys=1 + seed % 3,
        client_timeout_ms=1000.0,
        snapshot_every=(0, 0, 20)[(seed // 5) % 3] if protocol == "sdpaxos" else 0,
        faults=random_schedule(replicas, seconds, seed) if seed % 6 else [],
    )


# The default suite replays the first 30 entries (every protocol, size, network, batch,
# jitter, loss, duplication, read mix and snapshot setting occurs among them: duplication
# turns on at 27); the whole corpus runs with -m slow, and on a rewrite.
DEFAULT_SEEDS = 30


def run_corpus(seeds: int = SEEDS) -> dict[str, str]:
    return {str(seed): Simulation(corpus_config(seed)).run().trace_hash for seed in range(seeds)}


def _check(seeds: int) -> None:
    rewrite = bool(os.environ.get("CELLAR_REWRITE_CORPUS"))
    got = run_corpus(SEEDS if rewrite else seeds)
    if rewrite:
        CORPUS.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
    want = json.loads(CORPUS.read_text())
    changed = sorted((int(s) for s in want if int(s) < seeds and got.get(s) != want[s]))
    assert not changed, f"{len(changed)} corpus runs changed their trace: seeds {changed[:40]}"


def test_trace_hashes_are_unchanged():
    _check(DEFAULT_SEEDS)


@pytest.mark.slow
def test_whole_corpus_is_unchanged():
    _check(SEEDS)
