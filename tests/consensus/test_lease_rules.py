"""The sequencer's lease (paper §3.5), rule by rule on one replica: it needs
promises from a majority, and it runs from the tick the ping was sent in (mutants
``lease-one-pong`` and ``lease-from-pong-arrival``)."""

from consensus.core.config import ProtocolConfig
from consensus.core.messages import Pong
from consensus.core.sdpaxos import SDPaxosReplica
from store.kv_machine import KVStateMachine


def sequencer(n: int) -> SDPaxosReplica:
    r = SDPaxosReplica(0, ProtocolConfig(n=n, initial_sequencer=0), KVStateMachine())
    assert r.sequencer == 0 and r.phase == "normal"
    for _ in range(3):
        r.tick()
    return r


def test_one_pong_is_not_a_majority_of_five():
    r = sequencer(5)
    sent = r.now
    r._ping()
    r.tick()
    r.step(1, [Pong(r.view, sent)])
    assert not r.lease_valid(), "S and R1 are 2 of 5: no lease"
    r.step(2, [Pong(r.view, sent)])
    assert r.lease_valid(), "S, R1 and R2 are a majority"


def test_the_lease_runs_from_the_pings_send_tick_not_the_pongs_arrival():
    r = sequencer(3)
    cfg = r.cfg
    sent = r.now
    r._ping()
    for _ in range(7):  # the pong takes a while
        r.tick()
    r.step(1, [Pong(r.view, sent)])
    assert r.lease_expiry == sent + int(cfg.lease_ticks * (1 - cfg.drift))


def test_the_lease_takes_the_oldest_promise_of_the_majority():
    r = sequencer(5)
    cfg = r.cfg
    first = r.now
    r._ping()
    r.tick()
    r.step(1, [Pong(r.view, first)])
    for _ in range(4):
        r.tick()
    second = r.now
    r._ping()
    r.tick()
    r.step(2, [Pong(r.view, second)])
    # Majority {S, R1 (promise from `first`), R2 (from `second`)}: the lease ends
    # with the oldest of those promises.
    assert r.lease_expiry == first + int(cfg.lease_ticks * (1 - cfg.drift))


def test_a_restarted_replica_votes_only_after_one_lease():
    """A pong's promise is volatile: a replica that (re)starts may have promised the
    old sequencer a lease it no longer remembers, so it votes for nobody until
    lease_ticks + 2 ticks have passed (mutant ``restart-forgets-lease``)."""
    from consensus.core.config import make_ballot
    from consensus.core.messages import Vote, VRequest

    cfg = ProtocolConfig(n=3, initial_sequencer=0)
    r = SDPaxosReplica(1, cfg, KVStateMachine())  # a fresh incarnation (as after a restart)
    view = make_ballot(1, 2)

    def votes() -> list:
        return [m for _, msgs in r.ready().messages for m in msgs if isinstance(m, Vote)]

    r.step(2, [VRequest(view, 0)])
    assert not votes(), "voted at once after a restart"
    while r.now < cfg.lease_ticks + 1:
        r.tick()
        r.step(2, [VRequest(view, 0)])
        assert not votes(), f"voted at tick {r.now}, inside the forgotten lease"
    for _ in range(3):
        r.tick()
    r.step(2, [VRequest(view, 0)])
    assert votes(), "votes once a whole lease has passed"
