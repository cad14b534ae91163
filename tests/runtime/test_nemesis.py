"""jepsen_like's db and nemesis roles on real processes (issue 14): nodes on their own
loopback addresses, partitions as iptables DROP rules in a chain of our own that is
always removed, kills and pauses by pid."""

from __future__ import annotations

import asyncio
import random
import subprocess

import pytest

from jepsen_like.db import CellarDB
from jepsen_like.nemesis import PARTITIONS, IptablesNet, ProcessNemesis, flap_pairs, iptables_available, partition_pairs, schedule
from store.client import CellarClient

# Under xdist, on one worker: these clusters listen on 127.0.0.20-22 (jepsen_like.db)
# and the nemesis' iptables rules cut those addresses, so no two may run at once.
pytestmark = pytest.mark.xdist_group("loopback-hosts")

WAIT_S = 30.0


def test_partition_shapes():
    rng = random.Random(3)
    for n in (3, 5):
        pairs, _ = partition_pairs("halves", n, rng)
        assert pairs and all((b, a) in pairs for a, b in pairs)  # both directions
        pairs, _ = partition_pairs("isolate-sequencer", n, rng, sequencer=1)
        assert {p for p in pairs if 1 in p} == pairs and len(pairs) == 2 * (n - 1)
        pairs, text = partition_pairs("one-way", n, rng, sequencer=2)
        x = int(text.split()[2])
        assert pairs == {(y, x) for y in range(n) if y != x}  # x hears nobody, everybody hears x
        pairs, _ = partition_pairs("bridge", n, rng)
        talks = lambda a, b: (a, b) not in pairs  # noqa: E731
        assert any(all(talks(m, o) for o in range(n)) for m in range(n)), "the bridge node talks to all"
    pairs, _ = partition_pairs("ring", 5, rng)
    hears = {a: {b for b in range(5) if (b, a) not in pairs} for a in range(5)}  # itself included
    assert all(len(h) == 3 for h in hears.values()) and len({frozenset(h) for h in hears.values()}) == 5
    windows = schedule(["partition", "kill", "pause"], 60, random.Random(1))
    assert windows and all(3.0 <= s < e <= 57.0 for s, e, _k in windows)
    assert all(e1 <= s2 for (_s1, e1, _k1), (s2, _e2, _k2) in zip(windows, windows[1:]))



def test_schedules_combine_network_faults_with_others_flap_and_hit_everyone():
    """Over many seeds: about one window in four holds a network fault and a kill, pause
    or clock fault at once (never a disk fault, never two of one kind); partitions
    flap; kill and pause reach all nodes too; the ring, a no-op on 3 nodes, is drawn
    only from 5."""
    kinds3 = [k for seed in range(200) for _s, _e, k in
              schedule(["partition", "kill", "pause", "clock", "disk", "delay"], 60, random.Random(seed), nodes=3)]
    combined = [k for k in kinds3 if "+" in k]
    assert 0.1 < len(combined) / len(kinds3) < 0.3, len(combined) / len(kinds3)
    for k in combined:
        net, other = k.split("+")
        assert net.split("-")[0] in (*PARTITIONS, "halves", "isolate", "one", "delay"), k
        assert other.split("-")[0] in ("kill", "pause", "clock"), k
    assert not any("disk" in k for k in combined)
    parts = {p for k in kinds3 for p in k.split("+")}
    assert {"flapping", "kill-all", "pause-all", "halves+kill-all"} & parts >= {"flapping", "kill-all", "pause-all"}
    assert "ring" not in parts
    kinds5 = {p for seed in range(50) for _s, _e, k in schedule(["partition"], 60, random.Random(seed), nodes=5)
              for p in k.split("+")}
    assert "ring" in kinds5 and "flapping" in kinds5
    # one nemesis alone is never combined
    assert not any("+" in k for seed in range(50) for _s, _e, k in schedule(["kill"], 60, random.Random(seed)))
    for _ in range(20):
        pairs, text = flap_pairs(3, random.Random(_))
        assert pairs and text.split()[0] in ("halves", "isolate", "one")


needs_iptables = pytest.mark.skipif(iptables_available() is not None, reason=str(iptables_available()))


@needs_iptables
async def test_a_partitioned_sequencer_loses_office_and_the_chain_is_removed(tmp_path):
    db = CellarDB(str(tmp_path / "db"), 3)
    db.start_all()
    net = None
    try:
        await db.await_ready()
        async with CellarClient(db.client_addresses, timeout_s=1.0, deadline_s=WAIT_S) as cellar:
            await cellar.session().put("before", "1")
            seq = db.sequencer()
            assert seq is not None
            net = IptablesNet(db.ips)
            pairs, _ = partition_pairs("isolate-sequencer", 3, random.Random(1), sequencer=seq)
            net.drop(pairs)
            assert len(net.rules()) == 4
            majority = cellar.session(node=(seq + 1) % 3)
            async with asyncio.timeout(WAIT_S):
                await majority.put("during", "2")  # the other two elect a sequencer and commit
            others = {db.sequencer()} - {None}
            assert others and seq not in others
            net.heal()
            assert net.rules() == []
            async with asyncio.timeout(WAIT_S):
                await cellar.session(node=seq).put("after", "3")  # the healed node serves again
                assert await cellar.session(node=seq).get("during") == "2"
        chain = net.chain
        net.close()
        out = subprocess.run(["iptables", "-S"], capture_output=True, text=True, timeout=10).stdout
        assert chain not in out, "the nemesis chain was left behind"
    finally:
        if net is not None:
            net.close()
        db.teardown()


async def test_kill_and_pause_by_pid(tmp_path):
    db = CellarDB(str(tmp_path / "db"), 3)
    db.start_all()
    try:
        await db.await_ready()
        nem = ProcessNemesis(db)
        async with CellarClient(db.client_addresses, timeout_s=1.0, deadline_s=WAIT_S) as cellar:
            victim = nem.targets("one", random.Random(2))
            nem.pause(victim)
            s = cellar.session(node=(victim[0] + 1) % 3)
            async with asyncio.timeout(WAIT_S):
                await s.put("k", "paused")
            nem.resume(victim)
            nem.kill(victim)
            assert not db.alive(victim[0])
            async with asyncio.timeout(WAIT_S):
                await s.put("k", "killed")
            nem.restart(victim)
            await db.await_ready()
            async with asyncio.timeout(WAIT_S):
                assert await cellar.session(node=victim[0]).get("k") == "killed"
    finally:
        db.teardown()
