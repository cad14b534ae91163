"""A client's retry of a command still queued at a replica is not queued again.

Found by the steered search (``python3 -m consensus.sim.steer --replay 2067
--replicas 5``: geo, client timeout 150 ms, one command per instance, two instances in
flight): every retry was queued again, the executor applied each command once but
the queue grew faster than two instances per round trip drained it, and commands were
still pending long after the heal.
"""

import json
import subprocess
import sys

from consensus.core.config import ProtocolConfig
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine


def test_a_retry_of_a_queued_command_is_not_queued_twice():
    r = SDPaxosReplica(1, ProtocolConfig(n=3, initial_sequencer=0, inflight_max=1), KVStateMachine())
    r.propose(7, 1, ["put", "k", "a"])
    r.ready(sync=True)  # instance 0 takes it; inflight_max 1: the next ones wait
    r.propose(7, 2, ["put", "k", "b"])
    r.propose(7, 2, ["put", "k", "b"])  # the client's retry
    r.propose(7, 2, ["put", "k", "b"], needs_result=True)  # ... asking for the result: a new entry
    assert r.backlog == 2


def test_steered_seed_2067_drains_after_the_heal():
    out = subprocess.run(
        [sys.executable, "-m", "consensus.sim.steer", "--replay", "2067", "--replicas", "5"],
        capture_output=True, text=True, timeout=120,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failures"] == [], result
