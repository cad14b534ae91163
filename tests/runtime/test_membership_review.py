"""Adversarial review of membership on real processes (docs/membership.md, part 3):
schedules the runtime and ``cellar member`` got wrong. Each test names its finding."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from store.client import CellarClient
from store.server import LocalCluster, free_ports
from tests.runtime.test_membership_real import Joiner


STEP_S = 60.0


def cli(*args: str, timeout: float = STEP_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, timeout=timeout)


def endpoints(addrs) -> str:
    return ",".join(f"{h}:{p}" for h, p in addrs)


async def epoch_of(addr, **tls) -> dict:
    """``["epoch"]`` of one endpoint, or {"error": ...}."""
    from consensus.runtime import clientwire

    try:
        async with CellarClient([addr], timeout_s=2.0, connect_timeout_s=1.0, **tls) as cellar:
            return await cellar.call_once(0, clientwire.ADMIN, "review", 1, ["epoch"])
    except Exception as e:  # noqa: BLE001 - reported
        return {"error": f"{type(e).__name__}: {e}"}


async def wait_epoch(addr, epoch: int, timeout_s: float, **tls) -> dict:
    """Poll (bounded) until ``addr`` serves ``epoch`` or later; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        a = await epoch_of(addr, **tls)
        if a.get("epoch", -1) >= epoch or time.monotonic() > deadline:
            return a
        await asyncio.sleep(0.2)

def started(c, joiners: list, tmp_path, names=("A", "B")) -> list[Joiner]:
    """Newcomers ``names`` started with ``cellar serve --join`` against ``c``."""
    new = [Joiner(tmp_path, n, c.client_addresses) for n in names]
    joiners.extend(new)
    for j in new:
        j.start()
    return new


async def added(c, joiners: list, tmp_path) -> tuple[list[Joiner], subprocess.CompletedProcess]:
    """Newcomers A and B started and added by ``cellar member add`` (which succeeded)."""
    new = started(c, joiners, tmp_path)
    p = await asyncio.to_thread(cli, "member", "add", *(j.entry for j in new), "--endpoints",
                                endpoints(c.client_addresses), "--json")
    assert p.returncode == 0, p.stderr[-800:]
    return new, p



@pytest.fixture
def cluster(tmp_path):
    made: list = []

    def make(**kwargs) -> LocalCluster:
        c = LocalCluster(str(tmp_path / f"c{len(made)}"), 3, **kwargs)
        made.append(c)
        c.start_all()
        return c

    yield make
    for c in made:
        c.stop_all()


@pytest.fixture
def joiners():
    made: list[Joiner] = []
    yield made
    for j in made:
        j.stop()


async def test_a_change_read_at_an_older_epoch_is_refused(cluster, joiners, tmp_path):
    """Finding R1: ``["reconfig", members, sequencer]`` carries no epoch; the node
    stamps its *own* epoch on it. A ``cellar member`` that read the members at epoch e
    and whose request lands at a node already in e+1 (a concurrent change, or its own
    first attempt timed out and was executed, and ``_propose`` moved on to the next
    endpoint) closes e+1 with a list computed from e: it silently undoes the other
    change (here: removes the two members just added)."""
    from store import member_cli
    from store.admin_cli import CLIError

    c = cluster()
    await c.await_ready(timeout_s=30)
    stale_epoch, stale_members, stale_seq, _ = await member_cli._current(c.client_addresses, 2.0)
    assert stale_epoch == 0
    new, p = await added(c, joiners, tmp_path)
    assert json.loads(p.stdout)["epoch"] == 1
    # A second admin, who read the members at epoch 0 (say for "replace 2 by 2"), now sends its change.
    with pytest.raises(CLIError, match="epoch"):
        await member_cli._propose(c.client_addresses, stale_members, stale_seq, stale_epoch, 2.0, 10.0)
    a = await epoch_of(c.client_addresses[0])
    assert a.get("epoch") == 1 and len(a["members"]) == 5, a


async def test_add_of_a_member_that_never_joins_is_not_reported_as_done(cluster):
    """Finding R2: ``cellar member add`` waits for a majority of the new list, which the
    old members make alone (3 of 5): adding two members that do not exist (a typo'd
    address, a joiner that failed to start, a joiner with the wrong --cluster-id) is
    reported as done in a few ms, and the cluster is left with 5 members, 2 of them
    absent: it can no longer lose any."""
    c = cluster()
    await c.await_ready(timeout_s=30)
    a, b, ca, cb = free_ports(4)
    p = await asyncio.to_thread(cli, "member", "add", f"X=127.0.0.1:{a},127.0.0.1:{ca}",
                                f"Y=127.0.0.1:{b},127.0.0.1:{cb}", "--endpoints", endpoints(c.client_addresses),
                                "--wait", "3")
    assert p.returncode != 0, p.stdout
    assert "X" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


async def test_a_joiner_with_the_wrong_cluster_id_changes_nothing(cluster, tmp_path):
    """Finding R2 (bad input): a joiner started with the wrong --cluster-id waits
    (epoch 0 answers no base), ``cellar member add`` succeeds, and only then the joiner
    fails: the cluster was grown by a member that can never join."""
    c = cluster()
    await c.await_ready(timeout_s=30)
    new = [Joiner(tmp_path, n, c.client_addresses) for n in ("A", "B")]
    new[0].args[new[0].args.index("--cluster-id") + 1] = "another"
    try:
        for j in new:
            j.start()
        p = await asyncio.to_thread(cli, "member", "add", *(j.entry for j in new), "--endpoints",
                                    endpoints(c.client_addresses), "--wait", "5")
        assert p.returncode != 0, p.stdout
        a = await epoch_of(c.client_addresses[0])
        assert a.get("epoch") == 0 or "A" not in [m.partition("=")[0] for m in a.get("members", [])], a
    finally:
        for j in new:
            j.stop()


async def test_a_member_down_during_the_change_catches_up_when_restarted(cluster, joiners, tmp_path):
    """Finding R3: epoch 0's members are ``ID=HOST:PORT`` (no client address) and
    ``cellar member`` fills in the client address only of members that answer. A member
    that was down during the change kept an entry without one, so no new-epoch node
    could send it an ``epoch_notice`` (``_notify`` skips it), and its epoch-0 peers now
    refuse its handshake (``local@e1``): restarted, it stayed in epoch 0 for ever, and
    the new epoch ran one member short. Now ``cellar member`` refuses such a change
    (one line, nothing proposed) unless ``--client-of`` gives the address."""
    c = cluster()
    await c.await_ready(timeout_s=30)
    c.stop(2)
    new = [Joiner(tmp_path, n, c.client_addresses[:2]) for n in ("A", "B")]
    joiners.extend(new)
    for j in new:
        j.start()
    args = ["member", "add", *(j.entry for j in new), "--endpoints", endpoints(c.client_addresses[:2]), "--json"]
    p = await asyncio.to_thread(cli, *args)
    assert p.returncode != 0 and "--client-of 2=" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert (await epoch_of(c.client_addresses[0])).get("epoch") == 0
    p = await asyncio.to_thread(cli, *args, "--client-of", "2=%s:%d" % c.client_addresses[2])
    assert p.returncode == 0, p.stderr[-800:]
    c.start(2)
    await c.await_ready(2, timeout_s=30)
    a = await wait_epoch(c.client_addresses[2], 1, 20.0)
    assert a.get("epoch") == 1, a


async def test_under_tls_a_wrong_identity_is_refused_and_changes_nothing(cluster, tmp_path):
    """Finding R4, with TLS on: a joiner whose certificate names another replica than
    its member name fails at startup with one line, and a change naming a member that
    no certificate can name (not a number) is refused; every member stays in epoch 0.
    (Membership under TLS itself: the test below, and test_membership_real.py.)"""
    from store.certs import init_certs

    certs = str(tmp_path / "certs")
    init_certs(certs, 5, force=True)
    c = cluster(tls_dir=certs)
    await c.await_ready(timeout_s=30)
    j = Joiner(tmp_path, "3", c.client_addresses)
    j.args += ["--tls-ca", os.path.join(certs, "ca.pem"), "--tls-cert", os.path.join(certs, "node0.pem"),
               "--tls-key", os.path.join(certs, "node0-key.pem")]
    out = await asyncio.to_thread(subprocess.run, j.args, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "replica 3" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    from consensus.runtime import clientwire

    ca = {"tls": os.path.join(certs, "ca.pem"), "tls_cert": os.path.join(certs, "admin.pem"),
          "tls_key": os.path.join(certs, "admin-key.pem")}
    async with CellarClient(c.client_addresses, timeout_s=3.0, **ca) as cellar:
        members = (await cellar.call_once(0, clientwire.ADMIN, "review", 1, ["epoch"]))["members"]
        named = members[:2] + ["x=127.0.0.1:1,127.0.0.1:2"]
        with pytest.raises(Exception, match="TLS"):
            await cellar.call_once(0, clientwire.ADMIN, "review", 2, ["reconfig", named, members[1], 0])
    for addr in c.client_addresses:
        a = await epoch_of(addr, **ca)
        assert a.get("epoch") == 0 and not a.get("ended"), a


async def test_a_joiner_joins_under_tls(cluster, joiners, tmp_path):
    """Finding R4: with TLS, (a) ``serve --join`` runs its placeholder config as node 0,
    so ``check_files`` refuses any certificate but ``node-0``'s; (b) a node of epoch
    e >= 1 has the index of its place in the new list, which a removal shifts, while its
    certificate names its old id (the startup check and the peers' handshake refuse
    it); (c) ``epoch_base`` and ``epoch_notice`` are ADMIN requests, which need
    ``OU=cellar-admin``, and a node talks to its peers' client ports with its node
    certificate: a joiner never gets the base and a laggard is never told."""
    from store.certs import init_certs

    certs = str(tmp_path / "certs")
    init_certs(certs, 5, force=True)
    c = cluster(tls_dir=certs)
    await c.await_ready(timeout_s=30)
    new = [Joiner(tmp_path, n, c.client_addresses) for n in ("3", "4")]
    joiners.extend(new)
    for j in new:
        j.args += ["--tls-ca", os.path.join(certs, "ca.pem"), "--tls-cert", os.path.join(certs, f"node{j.name}.pem"),
                   "--tls-key", os.path.join(certs, f"node{j.name}-key.pem")]
        j.start()
    tls = ["--cacert", os.path.join(certs, "ca.pem"), "--cert", os.path.join(certs, "admin.pem"), "--key",
           os.path.join(certs, "admin-key.pem")]
    p = await asyncio.to_thread(cli, "member", "add", *(j.entry for j in new), "--endpoints",
                                endpoints(c.client_addresses), "--json", *tls)
    assert p.returncode == 0, p.stderr[-800:]
    ca = {"tls": os.path.join(certs, "ca.pem"), "tls_cert": os.path.join(certs, "admin.pem"),
          "tls_key": os.path.join(certs, "admin-key.pem")}
    for j in new:
        a = await wait_epoch(j.client, 1, 20.0, **ca)
        assert a.get("epoch") == 1, (j.name, a, open(j.log).read()[-600:])


async def test_a_restart_under_another_name_does_not_retire_the_member(cluster, joiners, tmp_path):
    """Finding R5: ``run_node`` treats "my name is not in the current base" as the crash
    between storing a base that left us out and writing ``REMOVED``, and writes
    ``REMOVED``. A member restarted with a typo in ``--name`` (or ``--id``) therefore
    retires for good: restarted again with the right name it still refuses every write,
    and the cluster has lost a member for ever."""
    c = cluster()
    await c.await_ready(timeout_s=30)
    new, p = await added(c, joiners, tmp_path)
    a = new[0]
    a.stop()
    typo = list(a.args)
    typo[typo.index("--name") + 1] = "AA"
    out = await asyncio.to_thread(subprocess.run, typo, capture_output=True, text=True, timeout=30)
    # A clear refusal, not a retirement...
    assert out.returncode != 0 and "AA" in out.stderr, (out.returncode, out.stderr[-600:])
    # ... and with the right name it is a member again.
    a.start()
    st = await wait_epoch(a.client, 1, 20.0)
    assert st.get("epoch") == 1 and not st.get("retired"), st


async def test_a_member_paused_through_the_switch_catches_up_and_every_base_is_the_same(cluster, joiners,
                                                                                        tmp_path):
    """Checked sound: a member SIGSTOPped before the change and resumed after it is told
    by the new epoch (``epoch_notice``), fetches the base and moves on; every member's
    ``BASE`` of epoch 1 is byte-identical (the ones that executed END, the joiners that
    fetched it, the laggard that adopted it), and no acknowledged write is lost."""
    import signal

    from tests.runtime.test_membership_real import Load

    c = cluster()
    await c.await_ready(timeout_s=30)
    new = started(c, joiners, tmp_path)
    load = Load(list(c.client_addresses[:2]) + [j.client for j in new], sessions=6)
    task = asyncio.create_task(load.run())
    try:
        await asyncio.sleep(0.5)
        c.procs[2].send_signal(signal.SIGSTOP)
        p = await asyncio.to_thread(cli, "member", "add", *(j.entry for j in new), "--endpoints",
                                    endpoints(c.client_addresses[:2]), "--client-of",
                                    "2=%s:%d" % c.client_addresses[2], "--json")
        assert p.returncode == 0, p.stderr[-800:]
        await asyncio.sleep(0.5)
    finally:
        c.procs[2].send_signal(signal.SIGCONT)
    a = await wait_epoch(c.client_addresses[2], 1, 20.0)
    assert a.get("epoch") == 1, a
    load.stop()
    await asyncio.wait_for(task, STEP_S)
    assert not load.errors, load.errors[:3]
    bases = {}
    for d in [c.data_dir(i) for i in range(3)] + [j.data for j in new]:
        with open(os.path.join(d, "epochs", "1", "BASE"), "rb") as f:
            bases[d] = f.read()
    assert len(set(bases.values())) == 1
    every = list(c.client_addresses) + [j.client for j in new]
    async with CellarClient(every, timeout_s=3.0, deadline_s=STEP_S) as cellar:
        s = cellar.session()
        missing = [k for k, v in list(load.acked.items()) if await s.get(k) != v]
    assert not missing and len(load.acked) > 20, (missing[:5], len(load.acked))


async def test_a_joiner_whose_join_endpoints_are_gone_joins_by_the_epoch_notice(cluster, joiners, tmp_path):
    """Liveness: a newcomer asks only its ``--join`` endpoints for the base. If those
    are gone by the time it is added (here: its one endpoint stops), it waited for ever
    although the new epoch's members send it ``epoch_notice`` (it is in their list); now
    its joining port takes the notice's sender as one more place to ask."""
    c = cluster()
    await c.await_ready(timeout_s=30)
    new = [Joiner(tmp_path, "A", c.client_addresses[:1]), Joiner(tmp_path, "B", c.client_addresses)]
    joiners.extend(new)
    for j in new:
        j.start()
    deadline = time.monotonic() + 20.0
    while not (await epoch_of(new[0].client)).get("joining"):
        assert time.monotonic() < deadline, "A never answered"
        await asyncio.sleep(0.1)
    c.stop(0)
    p = await asyncio.to_thread(cli, "member", "add", *(j.entry for j in new), "--endpoints",
                                endpoints(c.client_addresses[1:]), "--client-of", "0=%s:%d" % c.client_addresses[0],
                                "--json", "--wait", "20")
    assert p.returncode == 0, p.stderr[-800:]
    a = await epoch_of(new[0].client)
    assert a.get("epoch") == 1 and a.get("name") == "A", a


async def test_a_joiner_under_the_name_of_a_current_member_is_refused(cluster, joiners, tmp_path):
    """Finding R7 (safety): ``serve --join`` accepts any base that names it. Started on
    an empty data dir under the name of a current member that is down (the natural
    "bring back A" after A lost its disk), it fetches the current base, which names A,
    and runs as A with an empty log: A's promises and acceptances are forgotten, and a
    quorum counting the new A may choose a second value for a slot already decided
    (docs/operations.md: never bring a replica back empty under its old name). A joiner
    must be new in the epoch it joins: it refuses, with one line, a name the members
    already have."""
    c = cluster()
    await c.await_ready(timeout_s=30)
    new, p = await added(c, joiners, tmp_path)
    a = new[0]
    a.stop()
    again = list(a.args)
    again[again.index("--data-dir") + 1] = str(tmp_path / "join-A-empty")
    out = await asyncio.to_thread(subprocess.run, again, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "already a member" in out.stderr, (out.returncode, out.stderr[-600:])
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


async def test_bad_membership_input_gives_one_line_and_changes_nothing(cluster, tmp_path):
    """Checked: each malformed or impossible change is refused with one line, before
    anything is proposed (the multi-paxos one now before the joiners are looked for),
    and every member is still in epoch 0."""
    from consensus.runtime import clientwire

    c = cluster()
    mp = cluster(protocol="multipaxos")
    await c.await_ready(timeout_s=30)
    await mp.await_ready(timeout_s=30)
    e = endpoints(c.client_addresses)
    x, y = "X=127.0.0.1:1,127.0.0.1:2", "Y=127.0.0.1:3,127.0.0.1:4"
    cases = {
        "no client address": (["member", "add", "X=127.0.0.1:1", "--endpoints", e], "client address"),
        "even count": (["member", "add", x, "--endpoints", e], "odd number"),
        "malformed": (["member", "add", "X=bad", y, "--endpoints", e], "HOST:PORT"),
        "duplicate name": (["member", "add", x, "X=127.0.0.1:3,127.0.0.1:4", "--endpoints", e], "distinct"),
        "existing name": (["member", "add", "1=127.0.0.1:1,127.0.0.1:2", y, "--endpoints", e], "already a member"),
        "unknown member": (["member", "remove", "7", "--endpoints", e], "not a member"),
        "too few": (["member", "remove", "1", "2", "--endpoints", e], "odd number"),
        "not running": (["member", "add", x, y, "--endpoints", e], "does not answer"),
        "multipaxos": (["member", "add", x, y, "--endpoints", endpoints(mp.client_addresses)], "multipaxos"),
    }
    # All at once: each is refused before anything is proposed, whatever the others do.
    runs = await asyncio.gather(*(asyncio.to_thread(cli, *args, "--wait", "2") for args, _ in cases.values()))
    for (what, (args, needle)), p in zip(cases.items(), runs):
        assert p.returncode != 0 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, (what, p.stderr)
    async with CellarClient(c.client_addresses, timeout_s=3.0) as cellar:
        members = (await cellar.call_once(0, clientwire.ADMIN, "review", 1, ["epoch"]))["members"]
        for op, needle in ((["reconfig", members[:2], members[0], 0], "odd number"),
                           (["reconfig", members, "nobody", 0], "not a member"),
                           (["reconfig", members, members[0], "0"], "EPOCH"),
                           (["reconfig", members, members[0], 5], "busy"),
                           (["reconfig", "x", members[0], 0], "members")):
            with pytest.raises(Exception, match=needle):
                await cellar.call_once(0, clientwire.ADMIN, f"review-{needle}", 1, op)
        with pytest.raises(Exception, match="admin request"):
            await cellar.call_once(0, clientwire.CALL, "review-raw", 1, ["cellar.reconfig", 0, members, members[0]])
    for addr in c.client_addresses + mp.client_addresses:
        a = await epoch_of(addr)
        assert a.get("epoch") == 0 and not a.get("ended"), a


async def test_a_joiner_restarted_after_it_was_added_but_before_its_base_still_joins(cluster, joiners, tmp_path):
    """The other side of R7: a joiner that claimed its data dir while waiting (MEMBER)
    and was stopped after the change named it but before it stored its base never ran a
    node, so it forgot nothing: restarted, it takes the base that names it."""
    from store import member_cli

    c = cluster()
    await c.await_ready(timeout_s=30)
    new = started(c, joiners, tmp_path)
    deadline = time.monotonic() + 20.0
    while not (await epoch_of(new[0].client)).get("joining"):
        assert time.monotonic() < deadline, "A never answered"
        await asyncio.sleep(0.1)
    new[0].stop()
    epoch, members, sequencer, _ = await member_cli._current(c.client_addresses, 2.0)
    await member_cli._propose(c.client_addresses, members + [j.entry for j in new], sequencer, epoch, 2.0, 20.0,
                              ("B",))
    new[0].start()
    a = await wait_epoch(new[0].client, 1, 20.0)
    assert a.get("epoch") == 1 and a.get("name") == "A", (a, open(new[0].log).read()[-600:])


async def test_a_malformed_epoch_notice_is_refused_and_the_node_keeps_serving(cluster):
    """Finding R8: ``_admin_epoch`` took ``int(op[2][1])`` of an ``epoch_notice`` on
    faith, and ``membership._address`` ``int(port)`` of any ``port.isdigit()`` ("²");
    either raised out of the client frame handler, which is crash-only: one bad admin
    request (any client, without TLS) stopped the replica."""
    from consensus.runtime import clientwire

    c = cluster()
    await c.await_ready(timeout_s=30)
    async with CellarClient(c.client_addresses[:1], timeout_s=3.0) as cellar:
        for i, port in enumerate(["x", None, [1], 1e400, 70000]):
            with pytest.raises(Exception, match="malformed"):
                await cellar.call_once(0, clientwire.ADMIN, "review", i + 1, ["epoch_notice", 5, ["127.0.0.1", port]])
    # The same for a member whose port has a digit int() refuses ("²".isdigit() is true).
    async with CellarClient(c.client_addresses[:1], timeout_s=3.0) as cellar:
        members = (await cellar.call_once(0, clientwire.ADMIN, "review", 10, ["epoch"]))["members"]
        with pytest.raises(Exception, match="HOST:PORT"):
            await cellar.call_once(0, clientwire.ADMIN, "review", 11,
                                   ["reconfig", members + ["X=127.0.0.1:\u00b2", "Y=127.0.0.1:9"], members[0], 0])
    async with CellarClient(c.client_addresses[:1], timeout_s=3.0) as cellar:
        st = await cellar.status(0)
    assert st.get("epoch") == 0 and c.alive(0)


async def test_a_member_removed_while_down_is_told_also_after_the_others_restart(cluster, joiners, tmp_path):
    """Finding R9: a new epoch's nodes notify the previous epoch's members only if the
    process moved from that epoch itself (``prev_members`` lives in ``run_node``'s
    memory). Once the new members restart, a member removed while it was down is told
    by no one: restarted with its data it stays in the old epoch for ever (neither a
    member nor retired; clients time out instead of hearing ``moved``)."""
    c = cluster()
    await c.await_ready(timeout_s=30)
    new, p = await added(c, joiners, tmp_path)
    c.stop(2)  # down while it is removed
    p = await asyncio.to_thread(cli, "member", "remove", "2", "B", "--endpoints",
                                endpoints(c.client_addresses[:2] + [new[0].client]), "--json")
    assert p.returncode == 0, p.stderr[-800:]
    for i in (0, 1):  # the remaining members restart (an upgrade, a reboot)
        c.stop(i)
        c.start(i)
        await c.await_ready(i, timeout_s=30)
    new[0].stop()
    new[0].start()
    assert (await wait_epoch(new[0].client, 2, 20.0)).get("epoch") == 2
    c.start(2)
    await c.await_ready(2, timeout_s=30)
    a = await wait_epoch(c.client_addresses[2], 2, 20.0)
    assert a.get("retired") is True, a
