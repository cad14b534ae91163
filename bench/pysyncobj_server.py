"""One PySyncObj replica holding a replicated dict, with a line-protocol TCP put endpoint:
the peer that ``cellar bench peers`` (and ``cellar bench kv-http --targets pysyncobj``)
drives beside Cellar and etcd.

    python3 -m bench.pysyncobj_server --self 127.0.0.1:P0 --partners 127.0.0.1:P1,127.0.0.1:P2 \\
        --client 127.0.0.1:C0 --data-dir DIR [--durability fsync|journal] [--no-batch]

The replica is PySyncObj's own ``SyncObj`` with one consumer, ``pysyncobj.batteries.ReplDict``
(its ticking thread: ``autoTick``). The endpoint (asyncio, on the main thread) reads lines:

- ``P <key> <value>``: ``ReplDict.set(key, value, callback=...)``; answered ``OK`` only when
  PySyncObj's callback reports ``FAIL_REASON.SUCCESS``, i.e. the command is committed (a
  majority has it in its log) and applied on this replica; ``ERR <reason>`` otherwise;
- ``S``: ``S <leader or -> <ready 0/1>``.

Durability, as read in PySyncObj 0.3.17's source (``pysyncobj/journal.py``, ``syncobj.py``):
``SyncObjConf(journalFile=...)`` keeps the Raft log in a file written through ``mmap``
(``FileJournal``/``ResizableFile``); nothing in ``SyncObj`` ever calls the journal's
``flush()`` (``mmap.flush``, an msync) or fsync: an acknowledged write is in the page cache
of a majority, so it survives a process crash but not a power loss or kernel crash. The
term/vote/commit index go to ``journal.meta`` with write, flush and rename, no fsync. There
is no ``flushJournal`` option in 0.3.x (``SyncObjConf`` ignores unknown keywords; an unmerged
upstream pull request proposed one). So:

- ``--durability journal``: PySyncObj as shipped (journal in the page cache, no fsync);
- ``--durability fsync`` (default): the same journal, and before any Raft message leaves this
  replica (an AppendEntries from the leader, a follower's acknowledgement of entries) the
  journal file is fdatasync'ed (the pages written through the mapping reach the disk, as
  with msync ``MS_SYNC``) if it changed since the last sync; the meta file and the full
  dump are fsync'ed before their renames. A leader only counts a follower that acknowledged
  after its own sync, and only sends entries after syncing them, so an acknowledged put is
  on the disk of a majority: Raft's rule, group-committed (one sync per message, not per
  entry). This is a shim of ours around PySyncObj, not a PySyncObj option.

``fullDumpFile`` is set beside the journal (log compaction, PySyncObj's default of every
5,000 entries or 300 s, writes a dump in a forked child; without a dump file a compacted
journal would lose entries on restart). The process exits when its parent does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time


def _install_durable_journal() -> None:
    """Make ``SyncObj`` create journals that know whether they changed since their last
    sync, and fsync the meta file and the full dump before renaming them."""
    import pysyncobj.journal as journal
    import pysyncobj.serializer as serializer
    import pysyncobj.syncobj as syncobj

    class SyncedJournal(journal.FileJournal):
        dirty = False

        def add(self, command, idx, term):  # noqa: ANN001 - PySyncObj's signature
            super().add(command, idx, term)
            self.dirty = True

        def clear(self):
            super().clear()
            self.dirty = True

        def deleteEntriesFrom(self, entryFrom):  # noqa: N802, N803
            super().deleteEntriesFrom(entryFrom)
            self.dirty = True

        def sync(self) -> None:
            if self.dirty:
                # fdatasync of the mapped file writes back the pages written through the
                # mapping, as msync(MS_SYNC) (``self.flush()``) would; unlike mmap.flush it
                # releases the GIL, so the endpoint's thread goes on meanwhile.
                os.fdatasync(self._FileJournal__journalFile._ResizableFile__f.fileno())
                self.dirty = False

    def store_meta(self, meta):  # noqa: ANN001
        path = self.getPath()
        with open(path + ".tmp", "wb") as f:
            f.write(journal.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        fsync_dir(path)

    def create(journalFile=None):  # noqa: N803
        return journal.MemoryJournal() if journalFile is None else SyncedJournal(journalFile)

    def durable_replace(tmp: str, path: str) -> None:
        """The full dump (log compaction, in a forked child) on disk before it replaces the
        old one: the journal drops the entries it covers right after."""
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path)

    def fsync_dir(path: str) -> None:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    journal.MetaStorer.storeMeta = store_meta
    syncobj.createJournal = create
    serializer.atomicReplace = durable_replace


def _durable_transport():  # -> type
    from pysyncobj.transport import TCPTransport

    class SyncBeforeSend(TCPTransport):
        """Syncs the journal before a message leaves (see the module's docstring)."""

        def send(self, node, message):  # noqa: ANN001
            self._syncObj._SyncObj__raftLog.sync()
            return super().send(node, message)

    return SyncBeforeSend


class Replica:
    def __init__(self, args: argparse.Namespace) -> None:
        from pysyncobj import SyncObj, SyncObjConf
        from pysyncobj.batteries import ReplDict

        os.makedirs(args.data_dir, exist_ok=True)
        extra = {}
        if args.durability == "fsync":
            _install_durable_journal()
            extra["transportClass"] = _durable_transport()
        conf = SyncObjConf(journalFile=os.path.join(args.data_dir, "journal"),
                           fullDumpFile=os.path.join(args.data_dir, "dump"),
                           appendEntriesUseBatch=args.batch, appendEntriesPeriod=args.append_period,
                           autoTickPeriod=args.tick_period)
        self.kv = ReplDict()
        self.obj = SyncObj(args.self_addr, [p for p in args.partners.split(",") if p], conf, consumers=[self.kv],
                           **extra)

    def status(self) -> str:
        leader = self.obj._getLeader()
        return f"S {leader.address if leader is not None else '-'} {int(self.obj.isReady())}"


async def serve(args: argparse.Namespace) -> None:
    from pysyncobj import FAIL_REASON

    replica = Replica(args)
    loop = asyncio.get_running_loop()
    ok = FAIL_REASON.SUCCESS
    reasons = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}

    def done(fut: asyncio.Future, err: int) -> None:
        if not fut.done():
            fut.set_result(err)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                parts = line.split()
                if parts[:1] == [b"P"] and len(parts) == 3:
                    fut = loop.create_future()
                    replica.kv.set(parts[1].decode(), parts[2].decode(),
                                   callback=lambda _res, err, fut=fut: loop.call_soon_threadsafe(done, fut, err))
                    err = await fut
                    writer.write(b"OK\n" if err == ok else f"ERR {reasons.get(err, err)}\n".encode())
                elif parts[:1] == [b"S"]:
                    writer.write((replica.status() + "\n").encode())
                else:
                    writer.write(b"ERR bad request\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    host, port = args.client.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port), backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = args.exit_with_parent

    async def watch_parent() -> None:
        while parent and not stop.is_set():
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                stop.set()
            await asyncio.sleep(0.5)

    watcher = asyncio.ensure_future(watch_parent())
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        server.close()
        stopped = threading.Thread(target=replica.obj.destroy_synchronous, daemon=True)
        stopped.start()
        stopped.join(5.0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self", dest="self_addr", required=True, help="HOST:PORT of this replica's Raft transport")
    ap.add_argument("--partners", required=True, help="the other replicas' HOST:PORT, comma-separated")
    ap.add_argument("--client", required=True, help="HOST:PORT of the put endpoint")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--durability", choices=["fsync", "journal"], default="fsync")
    ap.add_argument("--no-batch", dest="batch", action="store_false",
                    help="appendEntriesUseBatch=False: an AppendEntries per command")
    ap.add_argument("--append-period", type=float, default=0.1,
                    help="appendEntriesPeriod (PySyncObj's default 0.1 s)")
    ap.add_argument("--tick-period", type=float, default=0.05,
                    help="autoTickPeriod: the ticking thread's longest wait for a socket event (default 0.05 s)")
    ap.add_argument("--exit-with-parent", type=int, default=0, metavar="PID")
    args = ap.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    t0 = time.monotonic()
    asyncio.run(serve(args))
    print(f"pysyncobj replica {args.self_addr} stopped after {time.monotonic() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
