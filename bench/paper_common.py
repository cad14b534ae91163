"""What ``cellar bench failover``, ``reads``, ``straggler`` and ``load`` share (the SDPaxos
paper's Figs. 14, 11 and 9, and latency against offered load, on real processes): the
pure timeline helpers, per-replica load, a status watcher, and the run frame (results
folder, progress on stderr, signals).

Pure helpers (unit-tested in tests/runtime/test_paper_benches.py):

- ``bucket_counts(times, t0, t1, width)``: completions per bucket of ``width`` s;
- ``rate(times, a, b)``: completions per second in [a, b);
- ``first_ack_after(invokes, completes, t)``: the first acknowledgement of an
  operation *invoked* at or after ``t`` (one acknowledged after a kill but ordered
  before it does not count);
- ``recovery_time(counts, width, start, level)``: from ``start`` (s from the first
  bucket) to the first whole bucket back at ``level`` ops per bucket or more.

Nothing here asserts a time. Every loop is bounded by a deadline; every process is
started through ``store.server.LocalCluster`` and stopped by its PID.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import signal
import time
from typing import Any, Callable, Sequence

import click

from bench.geo_bench import BenchError, _loadavg, git_commits

PROTOCOLS = ("sdpaxos", "multipaxos")
BUCKET_S = 0.1
START_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 3.0


# --- pure helpers -------------------------------------------------------------------------


def bucket_counts(times: Sequence[float], t0: float, t1: float, width: float = BUCKET_S) -> list[int]:
    """How many of ``times`` fall in each bucket [t0 + k*width, t0 + (k+1)*width) up to t1."""
    if width <= 0:
        raise ValueError("width must be > 0")
    n = max(0, int(round((t1 - t0) / width + 1e-9)))
    counts = [0] * n
    for t in times:
        if t0 <= t < t0 + n * width:
            k = min(n - 1, int((t - t0) / width + 1e-9))  # 10.1 - 10.0 is 0.0999...
            counts[k] += 1
    return counts


def rate(times: Sequence[float], a: float, b: float) -> float:
    """Completions per second in [a, b)."""
    if b <= a:
        return 0.0
    return sum(1 for t in times if a <= t < b) / (b - a)


def first_ack_after(invokes: Sequence[float], completes: Sequence[float], t: float) -> float | None:
    """The earliest completion of an operation invoked at or after ``t`` (None: none)."""
    best = None
    for i, c in zip(invokes, completes):
        if i >= t and (best is None or c < best):
            best = c
    return best


def recovery_time(counts: Sequence[int], width: float, start: float, level: float) -> float | None:
    """Seconds from ``start`` (measured from the first bucket's start) to the start of the
    first bucket at or after ``start`` whose count is at least ``level`` (None: never)."""
    k0 = int(start / width + 1e-9)
    if k0 * width < start - 1e-9:
        k0 += 1  # the first whole bucket after start
    for k in range(k0, len(counts)):
        if counts[k] >= level and level > 0:
            return round(k * width - start + width, 3)  # the bucket is done by its end
    return None


def invokes_of(completions: Sequence[float], latencies_ms: Sequence[float]) -> list[float]:
    """Invocation times of the acknowledged operations of a ``LoadResult`` (its
    completions are monotonic times, its latencies perf_counter intervals)."""
    return [c - ms / 1000.0 for c, ms in zip(completions, latencies_ms)]


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return round(a / b, digits) if a is not None and b else None


def alternate(protocols: Sequence[str], k: int) -> list[str]:
    """Round k's order: as given on even rounds, reversed on odd ones."""
    return list(protocols) if k % 2 == 0 else list(protocols)[::-1]


# --- a cluster, its load and its status -----------------------------------------------------


class Run:
    """One protocol's cluster of real ``cellar serve`` processes on loopback."""

    def __init__(self, protocol: str, replicas: int, fsync: str, root: str, sequencer: int = 0) -> None:
        from store.server import LocalCluster

        self.protocol = protocol
        self.n = replicas
        self.root = root
        self.cluster = LocalCluster(root, replicas, protocol=protocol, fsync=fsync, cluster_id=f"paper-{protocol}",
                                    extra_args=["--sequencer", str(sequencer)])
        self.admin: Any = None
        self.clients: dict[int, Any] = {}

    async def start(self) -> None:
        from store.client import CellarClient

        self.cluster.start_all()
        try:
            await self.cluster.await_ready(timeout_s=START_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as e:
            raise BenchError(f"{self.protocol}: {e}") from None
        self.admin = CellarClient(self.cluster.client_addresses, timeout_s=0.5, deadline_s=5.0)
        for i in range(self.n):
            self.clients[i] = CellarClient([self.cluster.client_addresses[i]], timeout_s=REQUEST_TIMEOUT_S,
                                           deadline_s=20.0)
        await self.commit_once()

    async def commit_once(self) -> None:
        """One write through every replica (peers connected, the view settled)."""
        from store.client import CellarError

        deadline = time.monotonic() + START_TIMEOUT_S
        for i, cl in self.clients.items():
            while True:  # bounded by the deadline
                try:
                    await asyncio.wait_for(cl.session().put(f"warm{i}", "up"), max(0.1, deadline - time.monotonic()))
                    break
                except (CellarError, ConnectionError, OSError, asyncio.TimeoutError) as e:
                    if time.monotonic() > deadline:
                        raise BenchError(f"{self.protocol}: replica {i} did not commit within {START_TIMEOUT_S:g} s "
                                         f"({type(e).__name__}: {e}); {self.cluster.log_tail(i, 2)}") from None
                    await asyncio.sleep(0.2)

    async def status(self, i: int) -> dict | None:
        try:
            return await asyncio.wait_for(self.admin.status(i, digest=False), 1.0)
        except Exception:  # a killed or stopped replica: no answer
            return None

    async def orderer(self, among: Sequence[int] | None = None) -> int | None:
        """The sequencer (Multi-Paxos: the leader) as most live replicas report it."""
        votes: dict[int, int] = {}
        sts = await asyncio.gather(*[self.status(i) for i in (among if among is not None else range(self.n))])
        for st in sts:
            if st and st.get("phase") == "normal":
                who = st.get("sequencer", st.get("leader"))
                if who is not None:
                    votes[who] = votes.get(who, 0) + 1
        return max(votes, key=lambda k: votes[k]) if votes else None

    async def stop(self) -> None:
        for cl in [*self.clients.values(), *([self.admin] if self.admin else [])]:
            try:
                await cl.close()
            except Exception:
                pass
        self.cluster.stop_all()

    def pid(self, i: int) -> int | None:
        p = self.cluster.procs.get(i)
        return p.pid if p is not None else None


async def per_replica_load(run: Run, at: Sequence[int], sessions: int, seconds: float, *, read_fraction: float = 0.0,
                           seed: int = 1, on_progress: Callable[[int], None] | None = None, value_bytes: int = 16,
                           key_chooser: Callable | None = None) -> dict[int, Any]:
    """``sessions`` closed-loop sessions spread over the replicas ``at``, each group
    through a client that talks to its replica only; completions recorded. Keys: each
    session's own under ``r<i>/``, or with ``key_chooser`` (``store.loadgen.ZipfKeys``,
    ``UniformKeys``) one key space shared by every replica's sessions."""
    from store.loadgen import run_load

    share = {i: sessions // len(at) + (1 if k < sessions % len(at) else 0) for k, i in enumerate(at)}
    tick = progress_by_replica(on_progress)
    groups = [i for i in at if share[i] > 0]
    results = await asyncio.gather(*[
        run_load(run.clients[i], sessions=share[i], seconds=seconds, read_fraction=read_fraction, seed=seed * 100 + i,
                 key_prefix="" if key_chooser is not None else f"r{i}/", record_completions=True,
                 on_progress=tick(i), value_bytes=value_bytes, key_chooser=key_chooser) for i in groups])
    return dict(zip(groups, results))


def progress_by_replica(on_progress: Callable[[int], None] | None) -> Callable[[int], Callable]:
    """``tick(i)``: the ``on_progress`` callback for replica i's load, which reports the
    operations done so far over every replica's load to ``on_progress``."""
    live: dict[int, Any] = {}

    def tick(i: int) -> Callable:
        def on(res: Any) -> None:
            live[i] = res
            if on_progress is not None:
                on_progress(sum(r.ops for r in live.values()))
        return on

    return tick


async def end_state(runs: dict[str, Run], replicas: int) -> dict[str, dict]:
    """Each protocol's replicas at the end: their views (a view change under load is an
    election timeout, a stalled loop or machine, or SDPaxos's straggler detection) and
    their loops' longest pauses, which tell those apart."""
    statuses = {p: [await run.status(i) for i in range(replicas)] for p, run in runs.items()}
    return {"views_at_end": {p: [st.get("view") if st else None for st in sts] for p, sts in statuses.items()},
            "loop_lag_max_ms": {p: [st.get("loop", {}).get("lag_max_ms") if st else None for st in sts]
                                for p, sts in statuses.items()}}


async def stop_runs(runs: dict[str, Run], roots: dict[str, str]) -> None:
    """Stop every protocol's cluster (by PID) and remove its data."""
    for run in runs.values():
        await run.stop()
    for root in roots.values():
        shutil.rmtree(root, ignore_errors=True)


class StatusWatcher:
    """Polls the replicas' status every ``every`` s; records each change of (view,
    sequencer/leader, phase) with its monotonic time. Bounded by ``stop()`` and a deadline."""

    def __init__(self, run: Run, replicas: Sequence[int], every: float = 0.05, limit_s: float = 600.0) -> None:
        self.run = run
        self.replicas = list(replicas)
        self.every = every
        self.limit_s = limit_s
        self.events: list[dict] = []
        self._last: dict[int, tuple] = {}
        self._judged: dict[int, tuple] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        deadline = time.monotonic() + self.limit_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            sts = await asyncio.gather(*[self.run.status(i) for i in self.replicas])
            now = time.monotonic()
            for i, st in zip(self.replicas, sts):
                if st is None:
                    continue
                key = (st.get("view"), st.get("sequencer", st.get("leader")), st.get("phase"))
                strag = st.get("straggler") or {}
                judged = (strag.get("strikes"), strag.get("doubts"), tuple(strag.get("votes") or ()))
                if self._last.get(i) != key or self._judged.get(i, judged) != judged:
                    self._last[i] = key
                    event = {"t": now, "replica": i, "view": key[0], "orderer": key[1], "phase": key[2]}
                    if strag:  # SDPaxos: how this replica judges its sequencer (paper §4)
                        event["straggler"] = strag
                    self.events.append(event)
                self._judged[i] = judged
            try:
                await asyncio.wait_for(self._stop.wait(), self.every)
            except asyncio.TimeoutError:
                pass

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()

    def current_orderer(self) -> int | None:
        """The sequencer/leader most watched replicas reported last, in phase normal."""
        votes: dict[int, int] = {}
        for _view, who, phase in self._last.values():
            if phase == "normal" and who is not None:
                votes[who] = votes.get(who, 0) + 1
        return max(votes, key=lambda k: votes[k]) if votes else None

    def first(self, after: float, pred: Callable[[dict], bool]) -> dict | None:
        for e in self.events:
            if e["t"] >= after and pred(e):
                return e
        return None

    def relative(self, t0: float) -> list[dict]:
        return [{**e, "t": round(e["t"] - t0, 3)} for e in self.events]


# --- the frame of a run ---------------------------------------------------------------------


def new_out_dir(out: str, exp: str) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for k in range(100):  # two runs within a second get their own folders
        path = os.path.join(out, f"{exp}-{stamp}" + (f"-{k}" if k else ""))
        try:
            os.makedirs(path, exist_ok=False)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise BenchError(f"cannot create {path}: {e.strerror or e}") from None
    raise BenchError(f"cannot create a new folder {exp}-{stamp}-N under {out}")


def header(exp: str, **fields: Any) -> dict:
    return {"experiment": exp,
            "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **{f"{k}_commit": v for k, v in git_commits().items()}, "cpus": os.cpu_count(),
            "load_average_before": _loadavg(), **fields}


def load_text(avg: list[float] | None) -> str:
    return f"{avg[0]:.2f}/{avg[1]:.2f}/{avg[2]:.2f}" if avg else "?"


def machine_text(result: dict) -> str:
    """``N CPUs, load average A before, B after`` of a result with ``header``'s fields."""
    return (f"{result['cpus']} CPUs, load average {load_text(result['load_average_before'])} before, "
            f"{load_text(result.get('load_average_after'))} after")


def summary_doc(title: str, intro: str, table: str, command: str) -> str:
    """summary.md: a title, what was measured, the table as printed, the command line."""
    return "\n".join([f"# {title}", "", intro, "", "```", *table.splitlines(), "```", "", f"Command: `{command}`", ""])


class Frame:
    """Console, progress bar and ``say`` on stderr (``--quiet`` silences them)."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True, quiet=quiet, soft_wrap=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                 console=self.console, transient=True, disable=quiet)

    def say(self, msg: str) -> None:
        self.console.print(msg, markup=False, highlight=False)


def run_experiment(exp: str, out: str, body: Callable[[Frame], Any], *, quiet: bool,
                   summary: Callable[[dict], str], plot: Callable[[dict, str], None]) -> dict:
    """Run ``body(frame)`` (a coroutine function returning the result dict) on the
    runtime's loop, with SIGINT/SIGTERM cancelling it (its ``finally`` blocks stop the
    servers); then write results.json, summary.md and ``<exp>.png`` to a new folder."""
    from store.server import install_loop, tune_gc

    out_dir = new_out_dir(out, exp)
    frame = Frame(quiet)

    async def main() -> dict:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)

        def quiet_cancel(loop: asyncio.AbstractEventLoop, context: dict) -> None:
            if not isinstance(context.get("exception"), asyncio.CancelledError):
                loop.default_exception_handler(context)

        loop.set_exception_handler(quiet_cancel)
        with frame.progress:
            return await body(frame)

    install_loop()
    tune_gc()
    try:
        result = asyncio.run(main())
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)  # a run that did not finish leaves no folder
        raise
    result["load_average_after"] = _loadavg()
    result["out_dir"] = out_dir
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(summary(result))
    try:
        plot(result, os.path.join(out_dir, f"{exp}.png"))
    except ImportError:
        frame.say(f"no {exp}.png: the plot needs matplotlib (python3 -m pip install -e '.[bench]')")
    frame.say(f"results in {out_dir}")
    return result


def cli_main(exp: str, call: Callable[[], dict], as_json: bool, text: Callable[[dict], str]) -> None:
    """One line on stderr for every failure; the JSON or the table on stdout."""
    try:
        result = call()
    except BenchError as e:
        click.echo(f"cellar bench {exp}: {e}", err=True)
        raise SystemExit(1) from None
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo(f"cellar bench {exp}: interrupted; every server stopped", err=True)
        raise SystemExit(130) from None
    except (OSError, RuntimeError, asyncio.TimeoutError) as e:
        click.echo(f"cellar bench {exp}: {type(e).__name__}: {e}", err=True)
        raise SystemExit(1) from None
    click.echo(json.dumps(result) if as_json else text(result))


def common_options(seconds: float, sessions: int | None) -> Callable:
    """``--replicas --seconds --sessions --fsync --out --quiet --json`` (no ``--sessions``
    with ``sessions=None``: the command defines its own)."""
    def deco(f: Callable) -> Callable:
        for opt in reversed([
            click.option("--replicas", type=click.Choice(["3", "5"]), default="3", show_default=True,
                         callback=lambda c, p, v: int(v)),
            click.option("--seconds", type=click.FloatRange(1.0, 600), default=seconds, show_default=True,
                         help="Measured seconds per protocol (per case, per point)."),
            *([] if sessions is None else [
                click.option("--sessions", type=click.IntRange(1, 4096), default=sessions, show_default=True,
                             help="Closed-loop sessions (16-byte blind writes, keys of their own).")]),
            click.option("--fsync", type=click.Choice(["always", "batch", "never"]), default="batch",
                         show_default=True, help="The replicas' WAL fsync policy."),
            click.option("--out", type=click.Path(file_okay=False), default=os.path.join("bench", "results"),
                         show_default=True, help="Results go to OUT/<experiment>-<UTC timestamp>/."),
            click.option("--quiet", is_flag=True, help="No progress on stderr."),
            click.option("--json", "as_json", is_flag=True, help="Print the result as JSON only."),
        ]):
            f = opt(f)
        return f
    return deco


def plt_module() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str, dpi: int = 110) -> None:
    plt = plt_module()
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


COLORS = {"sdpaxos": "#2b8a3e", "multipaxos": "#868e96"}
