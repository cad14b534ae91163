"""SimDisk: written vs synced records, and the driver order persist → sync → send → reply.

The simulator's default disk makes every record durable the instant it is written,
so a core or driver that lets an answer out before its record is durable is never
caught. With ``disk_sync_ms`` the disk distinguishes the two (``consensus/sim/disk.py``)
and a crash loses what was not synced.
"""

import pytest

from consensus.core.messages import Ping
from consensus.sim import SimConfig, Simulation
from consensus.sim.search import churn_schedule, judge


def steady(**kw):
    """A quiet 3-replica cluster with a 20 ms disk, past its first pings."""
    sim = Simulation(SimConfig(replicas=3, clients_per_site=0, seconds=2.0, disk_sync_ms=20.0, **kw))
    sim.run(until_ms=1000)
    return sim


def propose(sim, node, seq, value="v"):
    sim.nodes[node].propose(7, seq, ["put", "k", value])
    sim._drain(node)


def test_messages_wait_for_the_sync_of_their_records():
    sim = steady()
    disk = sim.sim_disks[1]
    sim.message_counts = {}
    propose(sim, 1, 1)
    assert sim.disks[1][-1][0] == "C" and disk.unsynced == 1, "written, not yet durable"
    assert len(disk.waiting) == 1 and sim.message_counts == {}, "the C-accept waits for the sync"
    sim.run(until_ms=1015)
    # Only the other replicas' round-trip probes and echoes moved meanwhile.
    assert set(sim.message_counts) <= {"Probe", "Echo"} and disk.unsynced == 1
    sim.run(until_ms=1025)
    assert disk.unsynced == 0 and not disk.waiting
    assert sim.message_counts.get("CAccept") == 1


def test_a_later_ready_waits_behind_an_earlier_unsynced_record():
    """Effects leave in Ready order: one without records does not overtake the sync."""
    sim = steady()
    disk = sim.sim_disks[1]
    propose(sim, 1, 1)
    sim.nodes[1].broadcast(Ping(sim.nodes[1].view, -2))  # no record: only a message
    sim._drain(1)
    assert len(disk.waiting) == 2 and disk.unsynced == 1


def test_a_crash_loses_unsynced_records():
    sim = steady()
    propose(sim, 1, 1)
    before = len(sim.disks[1])
    sim.crash(1)
    assert len(sim.disks[1]) == before - 1, "the C record was never synced"
    assert sim.sim_disks[1].lost == 1 and not sim.sim_disks[1].waiting
    sim.restart(1)
    assert sim.nodes[1].clog[1] == {} and sim.nodes[1].next_inst == 0


def test_a_process_crash_keeps_written_records():
    sim = steady(lose_unsynced_on_crash=False)
    propose(sim, 1, 1)
    sim.crash(1)
    sim.restart(1)
    assert 0 in sim.nodes[1].clog[1], "the OS still had it"


def test_a_torn_tail_keeps_a_prefix_of_the_unsynced_records():
    kept = set()
    for seed in range(12):
        sim = Simulation(SimConfig(replicas=3, clients_per_site=0, seconds=2.0, seed=seed, disk_sync_ms=20.0, disk_torn=True))
        sim.run(until_ms=1000)
        synced = len(sim.disks[1])
        written = []
        for seq in range(1, 5):
            propose(sim, 1, seq, f"v{seq}")
            written = list(sim.disks[1])
        sim.crash(1)
        assert sim.disks[1] == written[: len(sim.disks[1])], "a prefix of what was written"
        kept.add(len(sim.disks[1]) - synced)
    assert min(kept) >= 0 and len(kept) > 1, "different seeds tear at different points"


@pytest.mark.parametrize("protocol", ["sdpaxos", "multipaxos"])
@pytest.mark.parametrize("replicas", [3, 5])
def test_crash_churn_with_a_slow_disk_is_safe_and_live(protocol, replicas):
    lost = 0
    for seed in range(3):
        cfg = SimConfig(
            protocol=protocol, replicas=replicas, seconds=3.0, seed=seed, clients_per_site=2, read_fraction=0.2,
            cas_fraction=0.3, keys=2, client_timeout_ms=1000.0, jitter=0.5, disk_sync_ms=20.0,
            disk_sync_jitter_ms=20.0, disk_torn=bool(seed % 2), faults=churn_schedule(replicas, 3.0, seed),
        )
        result = judge(cfg)
        assert result["failures"] == [], f"seed {seed}: {result['failures']}; Simulation({cfg!r}).run()"
        lost += result["disk_records_lost"]
    assert lost > 0, "crashes did land between a write and its sync"


def test_snapshots_with_a_slow_disk_install_after_the_sync():
    cfg = SimConfig(
        replicas=3, seconds=3.0, seed=4, clients_per_site=2, read_fraction=0.2, cas_fraction=0.2, keys=2,
        client_timeout_ms=1000.0, snapshot_every=5, disk_sync_ms=10.0, disk_sync_jitter_ms=10.0,
        faults=[(300, "isolate", 2), (1500, "heal"), (1600, "crash", 1), (1900, "restart", 1)],
    )
    result = judge(cfg)
    assert result["failures"] == []
    assert result["snapshots_taken"] > 0 and result["snapshots_installed"] > 0


class SendsBeforeSync(Simulation):
    """A broken driver, for this test only: it sends and replies as soon as a Ready's
    records are *written*, before the sync (the bug SimDisk exists to catch)."""

    def _drain_to_disk(self, node, replica, rd):
        if rd.executed:
            self._record_executed(node, rd.executed)
        self.disks[node].extend(rd.persist)
        self._release(node, (len(self.disks[node]), rd.messages, rd.replies, rd.snapshot_from))
        disk = self.sim_disks[node]
        if disk.unsynced and disk.syncing is None:
            self._start_sync(node)


def test_a_driver_that_sends_before_the_sync_is_caught():
    """Crash churn with a 20 ms disk: the correct driver passes, the eager one loses
    acknowledged writes or diverges (seeds 0, 2, 3, 4, 5 of 0-5 when this was written)."""
    caught = 0
    for seed in range(6):
        cfg = SimConfig(
            replicas=3, seconds=3.0, seed=seed, clients_per_site=2, read_fraction=0.2, cas_fraction=0.3, keys=2,
            client_timeout_ms=1000.0, jitter=0.5, disk_sync_ms=20.0, disk_sync_jitter_ms=20.0,
            faults=churn_schedule(3, 3.0, seed),
        )
        good = Simulation(cfg).run().summary()
        assert good["consistent"] and good["lost_acked"] == 0
        bad = SendsBeforeSync(cfg).run().summary()
        caught += (not bad["consistent"]) or (not bad["agreement"]) or bad["lost_acked"] > 0
    assert caught >= 3
