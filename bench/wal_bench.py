"""WAL micro-benchmark: appends/s and fsyncs/s in batch mode.

    python -m bench.wal_bench [--dir DIR] [--seconds 1.0]

Cases, each for 16-byte and 200-byte records:

- ``sync every k``: append k records, ``sync()``, repeat (k = 1, 10, 100, 1000). k=1
  is one fsync per record (what ``fsync=always`` costs); larger k shows how group
  commit amortizes the fsync.
- ``committer, W writers``: W asyncio tasks each loop ``append`` + ``await
  committer.durable(seq)`` (every record waits for its own durability, as an
  acceptor's reply does); the ``GroupCommitter`` fsyncs in its thread and each fsync
  covers whatever was appended meanwhile.
- ``never``: appends with no fsync at all, the ceiling.

The directory should be on the disk the WAL will use in production (default: a
temporary directory under the system temp dir). Each case is bounded by time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time

from consensus.storage.wal import WAL, GroupCommitter

RECORD_SIZES = (16, 200)
BATCHES = (1, 10, 100, 1000)
WRITERS = (1, 16, 256)


def bench_sync_every(directory: str, size: int, batch: int, seconds: float, mode: str = "batch") -> dict[str, float]:
    wal, _ = WAL.open(directory, fsync=mode)
    payload = os.urandom(size)
    fsyncs0 = wal.stats["fsyncs"]
    appends = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        wal.append_many([payload] * batch)
        wal.sync()
        appends += batch
    elapsed = time.perf_counter() - start
    fsyncs = wal.stats["fsyncs"] - fsyncs0
    wal.close()
    return {"appends_s": appends / elapsed, "fsyncs_s": fsyncs / elapsed, "per_fsync": appends / max(fsyncs, 1)}


async def _committer_case(directory: str, size: int, writers: int, seconds: float) -> dict[str, float]:
    wal, _ = WAL.open(directory)
    committer = GroupCommitter(wal, waiters_max=writers * 2)
    payload = os.urandom(size)
    fsyncs0 = wal.stats["fsyncs"]
    appends = 0
    deadline = time.perf_counter() + seconds

    async def writer() -> None:
        nonlocal appends
        while time.perf_counter() < deadline:
            await committer.durable(wal.append(payload))
            appends += 1

    start = time.perf_counter()
    async with asyncio.timeout(seconds + 30):
        await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - start
    fsyncs = wal.stats["fsyncs"] - fsyncs0
    await committer.close()
    wal.close()
    return {"appends_s": appends / elapsed, "fsyncs_s": fsyncs / elapsed, "per_fsync": appends / max(fsyncs, 1)}


def bench_committer(directory: str, size: int, writers: int, seconds: float) -> dict[str, float]:
    try:
        import uvloop

        return uvloop.run(_committer_case(directory, size, writers, seconds))
    except ImportError:
        return asyncio.run(_committer_case(directory, size, writers, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="parent directory for the benchmark WALs")
    parser.add_argument("--seconds", type=float, default=1.0, help="duration of each case")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="wal-bench-", dir=args.dir)
    print(f"WAL benchmark in {root} ({args.seconds:g} s per case)")
    print(f"{'case':<32}{'record':>8}{'appends/s':>14}{'fsyncs/s':>12}{'records/fsync':>15}")
    n = 0

    def row(case: str, size: int, r: dict[str, float]) -> None:
        per_fsync = f"{r['per_fsync']:,.1f}" if case.startswith("batch") else "-"
        print(f"{case:<32}{size:>7}B{r['appends_s']:>14,.0f}{r['fsyncs_s']:>12,.0f}{per_fsync:>15}", flush=True)

    try:
        for size in RECORD_SIZES:
            for batch in BATCHES:
                n += 1
                row(f"batch: sync every {batch}", size, bench_sync_every(f"{root}/{n}", size, batch, args.seconds))
            for writers in WRITERS:
                n += 1
                row(f"batch: committer, {writers} writers", size,
                    bench_committer(f"{root}/{n}", size, writers, args.seconds))
            n += 1
            row("never: write every 1000", size, bench_sync_every(f"{root}/{n}", size, 1000, args.seconds, "never"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
