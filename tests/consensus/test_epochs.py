"""Membership change, part 2 (docs/membership.md): ``consensus.core.epochs.Member``
carries a named process across epochs. A small lockstep driver (FIFO network, every
record durable at once, ticks between rounds) grows a cluster 3 -> 5, shrinks it to 3
without its sequencer, and replaces a crashed member by a new process, under a stream
of writes; every answered write is in the final state, and every member of the last
epoch holds the same state."""

from __future__ import annotations

import random

import pytest

from consensus.core.config import ProtocolConfig
from consensus.core.epochs import EpochBase, Member
from consensus.core.executor import RECONFIG
from consensus.core.messages import decode_envelope, encode_envelope
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine

CFG = ProtocolConfig(n=3, heartbeat_ticks=2, election_ticks=10, lease_ticks=4, resend_ticks=6, recovery_ticks=4)


def new_replica(index, cfg, snapshot, records):
    return SDPaxosReplica(index, cfg, KVStateMachine(), records=records, rng=random.Random(index), snapshot=snapshot)


class Driver:
    def __init__(self, members: list[str], seed: int = 1) -> None:
        base = EpochBase(0, tuple(members), members[0])
        self.procs: dict[str, Member] = {name: Member(name, base, CFG, new_replica) for name in members}
        self.net: list[tuple[str, str, int, bytes]] = []
        self.bases: dict[str, list[EpochBase]] = {name: [base] for name in members}
        self.answered: dict[tuple, object] = {}
        self.rng = random.Random(seed)
        self.down: set[str] = set()
        self.seq = 0
        self.proposed: list[tuple] = []

    def add(self, name: str) -> None:
        """A new, empty process: it learns its epoch from a peer."""
        self.procs[name] = Member(name, None, CFG, new_replica)
        self.bases[name] = []

    def drain(self, name: str) -> None:
        m = self.procs[name]
        while True:
            if m.want_base is not None:
                peer, m.want_base = self.procs[m.want_base], None
                if m.adopt(peer.base):
                    self.bases[name].append(m.base)
            for dst, epoch, msgs in m.notices():
                self.net.append((name, dst, epoch, encode_envelope(0, msgs)))
            if m.inner is None:
                return
            rd = m.inner.ready(sync=True)
            for dst, epoch, msgs in m.address(rd.urgent + rd.messages):
                self.net.append((name, dst, epoch, encode_envelope(0, msgs)))
            for rp in rd.replies:
                if rp.ok:
                    self.answered[(rp.client, rp.seq)] = rp.result
            if rd.epoch_end is None:
                return
            base = m.close(rd.epoch_end)
            self.bases[name].append(base)  # stored before anything of the next epoch
            m.enter(base)

    def round(self) -> None:
        net, self.net = self.net, []
        for src, dst, epoch, data in net:
            if dst in self.down or src in self.down or dst not in self.procs:
                continue
            _i, msgs = decode_envelope(data)
            self.procs[dst].step(src, epoch, msgs)
            self.drain(dst)
        for name, m in self.procs.items():
            if name not in self.down:
                m.tick()
                self.drain(name)

    def put(self) -> tuple:
        """A write by a client of its own (a client has one command out at a time)."""
        live = [n for n, m in self.procs.items() if n not in self.down and not m.removed]
        at = self.procs[self.rng.choice(live)]
        self.seq += 1
        key = (f"w{self.seq}", 1)
        self.proposed.append(key)
        at.inner.propose(key[0], 1, ["put", f"k{self.seq}", f"v{self.seq}"], False)
        self.drain(at.name)
        return key

    def reconfig(self, at: str, members: list[str], sequencer: str) -> tuple:
        m = self.procs[at]
        self.seq += 1
        m.inner.propose("admin", self.seq, [RECONFIG, m.epoch, members, sequencer], True)
        self.drain(at)
        return ("admin", self.seq)

    def run(self, rounds: int, puts_per_round: int = 1) -> None:
        for _ in range(rounds):
            for _ in range(puts_per_round):
                self.put()
            self.round()

    def settle(self, rounds: int = 300) -> None:
        for _ in range(rounds):
            self.round()

    def state(self, name: str) -> dict:
        return dict(self.procs[name].inner.executor.sm.data)

    def check(self, epoch: int, members: list[str]) -> None:
        for name in members:
            m = self.procs[name]
            assert m.epoch == epoch and not m.removed, (name, m.epoch)
        states = {name: self.state(name) for name in members}
        first = states[members[0]]
        assert all(s == first for s in states.values()), {n: len(s) for n, s in states.items()}
        for (client, _seq), _result in self.answered.items():
            if client.startswith("w"):
                n = client[1:]
                assert first.get(f"k{n}") == f"v{n}", f"answered put {n} is lost"


def test_grow_3_to_5_then_shrink_to_3_without_the_sequencer():
    d = Driver(["r0", "r1", "r2"])
    d.run(20)
    d.add("r3")
    d.add("r4")
    ask = d.reconfig("r1", ["r0", "r1", "r2", "r3", "r4"], "r0")
    d.run(40)
    d.settle(60)
    assert d.answered[ask]["ok"], d.answered.get(ask)
    d.check(1, ["r0", "r1", "r2", "r3", "r4"])
    # Every write is answered: those the old epoch did not order went on in the new one.
    assert not [k for k in d.proposed if k not in d.answered]
    assert d.procs["r3"].inner.n == 5 and d.bases["r3"][-1].epoch == 1  # adopted from a peer
    before = len([k for k in d.answered if k[0].startswith("w")])
    # Shrink to three, the sequencer r0 and r1 leaving.
    ask = d.reconfig("r3", ["r2", "r3", "r4"], "r2")
    d.run(40)
    d.settle(60)
    assert d.answered[ask]["ok"]
    d.check(2, ["r2", "r3", "r4"])
    assert d.procs["r0"].removed and d.procs["r1"].removed
    assert len([k for k in d.answered if k[0].startswith("w")]) > before + 20  # writes went on
    inner = d.procs["r2"].inner
    assert inner.cfg.epoch == 2 and inner.cfg.n == 3 and inner.cfg.initial_sequencer == 0  # r2 starts as sequencer


def test_a_crashed_member_is_replaced_by_a_new_process():
    d = Driver(["r0", "r1", "r2"], seed=2)
    d.run(20)
    d.down.add("r2")  # crashed for good
    d.run(20)
    d.add("r9")
    ask = d.reconfig("r0", ["r0", "r1", "r9"], "r0")
    d.run(40)
    d.settle(60)
    assert d.answered[ask]["ok"]
    d.check(1, ["r0", "r1", "r9"])


def test_a_cluster_moves_to_disjoint_members():
    """Every member replaced at once: the old members leave as they enter the new epoch,
    and tell the newcomers, who know nobody, where to fetch the base. Mutant
    ``epoch-no-newcomer-notice``."""
    d = Driver(["r0", "r1", "r2"], seed=4)
    d.run(15)
    for name in ("r3", "r4", "r5"):
        d.add(name)
    ask = d.reconfig("r2", ["r3", "r4", "r5"], "r4")
    d.run(30)
    d.settle(60)
    assert d.answered[ask]["ok"]
    d.check(1, ["r3", "r4", "r5"])
    assert all(d.procs[n].removed for n in ("r0", "r1", "r2"))


def test_a_removed_member_restarted_in_the_old_epoch_learns_it_is_out():
    """r2 misses the END (cut off while the epoch closes) and comes back in epoch 0: its
    peers answer with notices, it adopts their base, finds itself removed, and takes no
    writes."""
    d = Driver(["r0", "r1", "r2", "r3", "r4"], seed=3)
    d.run(10)
    d.down.add("r2")
    ask = d.reconfig("r0", ["r0", "r1", "r3"], "r0")
    d.run(30)
    d.settle(40)
    assert d.answered[ask]["ok"]
    assert d.procs["r2"].epoch == 0 and not d.procs["r2"].removed
    d.down.discard("r2")
    d.settle(60)
    assert d.procs["r2"].epoch == 1 and d.procs["r2"].removed
    d.check(1, ["r0", "r1", "r3"])


@pytest.mark.parametrize("members", [("a", "b", "c"), ("a", "b", "c", "d", "e")])
def test_an_epoch_base_round_trips(members):
    base = EpochBase(3, members, members[-1], b"state")
    assert EpochBase.unpack(base.pack()) == base
    with pytest.raises(ValueError):
        EpochBase.unpack(EpochBase(3, members, "zz", None).pack())
