"""Review 2: a liveness hole the N=5 swarm search found (seed 704296), pinned with its
full config so a change to the generator does not change what it replays.

A new sequencer serves once ``_recompute_majority`` sees the acked majority prefix reach
``recover_end``. But ``_raise_floor`` (``install_snapshot``, ``compact``) also raises
``majority_prefix`` to the floor. When a *recovering* sequencer installs a peer's
snapshot at or past ``recover_end`` (it was behind: a voter's Compacted notice on a
resend), ``majority_prefix`` jumps to ``recover_end`` with no ``_start_serving``; every
later ack then stops at ``if prefix <= self.majority_prefix: return`` before the phase
check. The sequencer stays ``recovering`` for good while it keeps pinging (so nobody
stands): every replica's commands wait forever although all five acked ``recover_end``.

(Serving on the floor alone would not do: a view serves only on a majority of OAcks,
which the o_view argument of Fig. 7 needs. The check wants the ack-derived prefix.)
"""

import json


from consensus.sim.search import config_from_json
from consensus.sim.simulator import Simulation
from .schedules import RuleBroken


CONFIG = json.loads('{"protocol": "sdpaxos", "replicas": 5, "rtt": "geo", "rtt_file": null, "sequencer": 0, "clients_per_site": 2, "seconds": 3.0, "seed": 2939031371, "batch": 256, "inflight": 32, "tick_ms": 10.0, "resend_ms": 500.0, "heartbeat_ms": 500.0, "ping_ms": 100.0, "lease_ms": 500.0, "recovery_ms": 500.0, "straggler_window_ms": 500.0, "straggler_cooldown_ms": 10000.0, "thrifty": true, "jitter": 1.5, "jitter_ms_min": 0.0, "loss": 0.0, "dup": 0.0, "read_fraction": 0.2, "keys": 2, "client_timeout_ms": 1000.0, "drain_seconds": 30.0, "cpu_us_event": 10.0, "cpu_us_msg": 1.0, "tick_skew": [0.0017, -0.0009, 0.014, -0.016, 0.013], "snapshot_every": 5, "faults": [[169.34, "crash", 2], [306.226, "restart", 2], [353.021, "crash", 2], [378.943, "restart", 2], [411.281, "crash", 1], [509.556, "restart", 1], [693.49, "crash", 4], [799.948, "restart", 4], [962.711, "crash", 4], [1056.027, "restart", 4], [1483.07, "crash", 0], [1557.634, "restart", 0], [1663.647, "crash", 0], [1791.984, "restart", 0], [2044.397, "crash", 2], [2062.973, "restart", 2], [2100.0, "heal"], [2100.0, "loss", 0.0], [2100.0, "slow", 0, 1.0], [2100.0, "resume", 0], [2100.0, "restart", 0], [2100.0, "slow", 1, 1.0], [2100.0, "resume", 1], [2100.0, "restart", 1], [2100.0, "slow", 2, 1.0], [2100.0, "resume", 2], [2100.0, "restart", 2], [2100.0, "slow", 3, 1.0], [2100.0, "resume", 3], [2100.0, "restart", 3], [2100.0, "slow", 4, 1.0], [2100.0, "resume", 4], [2100.0, "restart", 4]], "cas_fraction": 0.2, "disk_sync_ms": 10.0, "disk_sync_jitter_ms": 10.0, "lose_unsynced_on_crash": true, "disk_torn": false}')


def test_a_recovering_sequencer_that_installs_a_snapshot_past_recover_end_never_serves():
    """Swarm seed 704296: N=5, geo, snapshots every 5, SimDisk, churn (crashes only).

    R4 wins view 36 (recover_end 25) while behind; at t ~ 3.03 s it installs a peer's
    snapshot at slot 25 (majority_prefix := 25); all five then ack 25, yet R4 stays
    recovering and every command after the heal is pending at the end of the drain.
    """
    sim = Simulation(config_from_json(CONFIG))
    sim.run()
    seqs = [n for n in sim.nodes if n is not None and n.sequencer == n.id]
    for s in seqs:
        acked = sorted(s.acked, reverse=True)[s.quorum - 1]
        if s.phase == "recovering" and acked >= s.recover_end:
            raise RuleBroken(
                f"R{s.id} (view {s.view}) still recovering at the end: a majority acked {acked} >= "
                f"recover_end {s.recover_end} (majority_prefix {s.majority_prefix}, floor {s.floor_slot}); "
                f"quiet={sim.quiet()}"
            )
    assert sim.quiet(), "live after the heal"
