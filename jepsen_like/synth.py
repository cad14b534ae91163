"""Generate histories of a simulated, correct (linearizable) key-value store, optionally broken.

``generate(clients=50, ops=10_000, keys=8, info_rate=0.03, workload="kv", seed=0,
corrupt=False) -> list[Op]``

The simulation is what a Jepsen test against a perfect store would record. Each of ``clients``
threads runs one operation at a time: think, invoke, wait a random latency, complete. Every
operation takes effect at a *linearization point* drawn uniformly between its invocation and its
completion; effects are applied to a real dict in linearization-point order, which yields each
operation's result. So the history is linearizable by construction.

With probability ``info_rate`` an operation times out: it completes as ``info``, takes effect
with probability 1/2 at a point drawn from [invoke, invoke + 3 x latency] (possibly *after* the
info event, as a real delayed write can), and its thread continues under a new process id, as
Jepsen does after a crash.

Workloads: ``kv`` is get / put / append with unique values (model ``kv``); ``cas`` is read /
write / cas on independent registers with values in 0..4, as in Jepsen's etcd test (model
``kv``, whose values are ``(key, v)``; a cas that does not match completes as ``fail``).

``corrupt=True`` makes exactly one key non-linearizable with a stale read: a read that returns a
value overwritten by a write that completed before the read began (and never written again).
When values repeat (``cas``), the read returns a value nobody wrote instead. The history does
not record which key; ``generate_with_key`` returns it.

Run ``python -m jepsen_like.synth --help`` to write a history file.
"""

from __future__ import annotations

import heapq
import random
import sys
from dataclasses import dataclass
from typing import Any

import click

from .history import FAIL, INFO, INVOKE, OK, Op, write_jsonl

__all__ = ["generate", "generate_with_key"]


@dataclass(slots=True)
class _Sim:
    """One simulated operation before it becomes two events."""

    seq: int
    process: int
    f: str
    key: str
    arg: Any
    t_invoke: int
    t_complete: int
    t_effect: float | None  # None: never takes effect
    timed_out: bool
    result: Any = None
    failed: bool = False


def generate(**kwargs: Any) -> list[Op]:
    """A generated history; the parameters are ``generate_with_key``'s."""
    return generate_with_key(**kwargs)[0]


def generate_with_key(
    *,
    clients: int = 50,
    ops: int = 10_000,
    keys: int = 8,
    info_rate: float = 0.03,
    workload: str = "kv",
    seed: int = 0,
    corrupt: bool = False,
) -> tuple[list[Op], str | None]:
    """Like ``generate``; also returns the corrupted key (None if ``corrupt`` is False)."""
    if workload not in ("kv", "cas"):
        raise ValueError(f"unknown workload {workload!r}")
    rng = random.Random(seed)
    key_names = [str(k) for k in range(keys)]
    sims: list[_Sim] = []
    # Threads ordered by the time they are next free; ties broken by thread number.
    free = [(rng.randrange(0, 50), t) for t in range(clients)]
    heapq.heapify(free)
    process_of = list(range(clients))
    for seq in range(ops):
        t_free, thread = heapq.heappop(free)
        t_invoke = t_free + rng.randrange(1, 20)  # think time (µs)
        latency = rng.randrange(20, 200) if rng.random() < 0.95 else rng.randrange(200, 2000)
        t_complete = t_invoke + latency
        timed_out = rng.random() < info_rate
        if timed_out:
            t_effect = rng.uniform(t_invoke, t_invoke + 3 * latency) if rng.random() < 0.5 else None
        else:
            t_effect = rng.uniform(t_invoke, t_complete)
        key = rng.choice(key_names)
        f, arg = _choose(rng, workload, process_of[thread], seq)
        sims.append(_Sim(seq, process_of[thread], f, key, arg, t_invoke, t_complete, t_effect, timed_out))
        if timed_out:
            process_of[thread] += clients  # Jepsen: a crashed process never comes back
        heapq.heappush(free, (t_complete, thread))

    # Apply effects in linearization-point order to a real map.
    store: dict[str, Any] = {}
    for s in sorted((s for s in sims if s.t_effect is not None), key=lambda s: (s.t_effect, s.seq)):
        cur = store.get(s.key)
        if s.f in ("get", "read"):
            s.result = cur
        elif s.f in ("put", "write"):
            store[s.key] = s.arg
        elif s.f == "append":
            store[s.key] = s.arg if cur is None else cur + s.arg
        elif s.f == "cas":
            if cur == s.arg[0]:
                store[s.key] = s.arg[1]
            else:
                s.failed = True

    corrupted = _corrupt(rng, sims) if corrupt else None
    return _events(sims), corrupted


def _choose(rng: random.Random, workload: str, process: int, seq: int) -> tuple[str, Any]:
    r = rng.random()
    if workload == "kv":
        if r < 0.5:
            return "get", None
        if r < 0.75:
            return "put", f"v{process}.{seq}"
        return "append", f"+{process}.{seq};"
    if r < 0.5:
        return "read", None
    if r < 0.75:
        return "write", rng.randrange(5)
    return "cas", (rng.randrange(5), rng.randrange(5))


def _corrupt(rng: random.Random, sims: list[_Sim]) -> str:
    """Turn one ok read into a stale read that no linearization can explain."""
    done = [s for s in sims if not s.timed_out and not s.failed]
    by_key: dict[str, list[_Sim]] = {}
    for s in done:
        by_key.setdefault(s.key, []).append(s)
    # How many operations (of any outcome: an info write may land late) write each value.
    writers: dict[tuple[str, Any], int] = {}
    for s in sims:
        for v in _written(s):
            writers[(s.key, v)] = writers.get((s.key, v), 0) + 1
    keys = sorted(by_key)
    rng.shuffle(keys)
    for key in keys:
        ops = by_key[key]
        writes = [s for s in ops if s.f in ("put", "write") and writers[(key, s.arg)] == 1]
        reads = [s for s in ops if s.f in ("get", "read")]
        # Prefer reads in the middle of the history: the search must get there first.
        reads.sort(key=lambda s: abs(s.seq - len(sims) * 0.6))
        for read in reads[:50]:
            for w1 in writes:
                if w1.t_complete >= read.t_invoke or w1.arg == read.result:
                    continue
                # Some write of another value completed after w1 did and before the read began.
                if any(
                    w2.t_invoke > w1.t_complete and w2.t_complete < read.t_invoke and w2.arg != w1.arg
                    for w2 in writes
                ):
                    read.result = w1.arg
                    return key
    # Values repeat (the cas workload): make a read return a value nobody ever wrote instead.
    for key in keys:
        reads = [s for s in by_key[key] if s.f in ("get", "read")]
        if reads:
            read = min(reads, key=lambda s: abs(s.seq - len(sims) * 0.6))
            read.result = "never-written"
            return key
    raise ValueError("could not find a read to corrupt; use more operations")


def _written(s: _Sim) -> tuple[Any, ...]:
    if s.f in ("put", "write"):
        return (s.arg,)
    if s.f == "cas":
        return (s.arg[1],)
    return ()


def _events(sims: list[_Sim]) -> list[Op]:
    # (time, kind, seq): at equal times invocations sort before completions, so operations that
    # touch in time count as concurrent (the conservative reading).
    raw: list[tuple[int, int, int, _Sim]] = []
    for s in sims:
        raw.append((s.t_invoke, 0, s.seq, s))
        raw.append((s.t_complete, 1, s.seq, s))
    raw.sort(key=lambda r: r[:3])
    out: list[Op] = []
    for t, kind, _, s in raw:
        if kind == 0:
            out.append(Op(len(out), t, s.process, INVOKE, s.f, (s.key, None if s.f in ("get", "read") else s.arg)))
            continue
        if s.timed_out:
            type_, value = INFO, (s.key, None if s.f in ("get", "read") else s.arg)
        elif s.failed:
            type_, value = FAIL, (s.key, s.arg)
        else:
            type_, value = OK, (s.key, s.result if s.f in ("get", "read") else s.arg)
        out.append(Op(len(out), t, s.process, type_, s.f, value, "timeout" if s.timed_out else None))
    return out


def history_options(seed: int = 0):
    """The click options naming a generated history (shared with ``jepsen_like.bench``)."""

    def apply(fn):
        for opt in reversed((
            click.option("--clients", type=click.IntRange(min=1), default=50, show_default=True),
            click.option("--ops", "n_ops", type=click.IntRange(min=1), default=10_000, show_default=True),
            click.option("--keys", type=click.IntRange(min=1), default=8, show_default=True),
            click.option("--info-rate", type=click.FloatRange(0.0, 1.0), default=0.03, show_default=True),
            click.option("--workload", type=click.Choice(["kv", "cas"]), default="kv", show_default=True),
            click.option("--seed", default=seed, show_default=True),
        )):
            fn = opt(fn)
        return fn

    return apply


@click.command()
@history_options(seed=0)
@click.option("--corrupt", is_flag=True, help="Make one key non-linearizable (a stale read).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="JSONL file (default stdout).")
def main(
    clients: int, n_ops: int, keys: int, info_rate: float, workload: str, seed: int, corrupt: bool, output: str | None
) -> None:
    """Write a generated history as JSON Lines (check it with `cellar check --model kv`)."""
    try:
        history, key = generate_with_key(
            clients=clients, ops=n_ops, keys=keys, info_rate=info_rate, workload=workload, seed=seed, corrupt=corrupt
        )
    except ValueError as e:  # e.g. nothing to corrupt
        raise click.ClickException(str(e)) from None
    if output:
        try:
            with open(output, "w", encoding="utf-8") as fp:
                write_jsonl(history, fp)
        except OSError as e:
            raise click.ClickException(f"cannot write {output}: {e.strerror or e}") from None
    else:
        write_jsonl(history, sys.stdout)
    if key is not None:
        click.echo(f"corrupted key: {key}", err=True)


if __name__ == "__main__":
    main()
