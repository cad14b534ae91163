"""SimDisk: one replica's write-ahead log as the simulator sees it, written vs synced.

A record the driver appends is *written* at once (it sits in the OS page cache) and
*durable* only once a sync that started after it completes. The simulator's driver
follows the ``Ready`` contract (``consensus.core.ready``) against it:

    persist (append) → sync → send → reply → install snapshot

so a Ready's messages and replies wait in ``waiting`` until every record written up
to and including that Ready is synced (its *mark*). Syncs are group commits, one in
flight per disk: a sync covers everything written when it started; records written
meanwhile wait for the next one. A crash keeps the synced prefix and loses the rest
(or keeps a random prefix of it: a torn tail), and drops every held message.

A snapshot store (the driver's own snapshot, or a peer's it installs) rewrites the
log with the replica's live records in one durable step (``rewrite``): everything the
replica holds in memory is then on disk, so whatever was waiting may leave.

``records`` is the simulator's ``disks[node]`` list itself, so code that reads that
list (tests, restarts) sees the same thing.
"""

from __future__ import annotations

import random
from collections import deque


class SimDisk:
    __slots__ = ("records", "synced", "syncing", "epoch", "waiting", "install", "syncs", "lost", "tokens")

    def __init__(self, records: list) -> None:
        self.records = records
        self.synced = len(records)  # records[:synced] are durable
        self.syncing: int | None = None  # the mark the sync in flight will make durable
        self.epoch = 0  # bumped by a crash or a rewrite: syncs in flight no longer count
        # (mark, messages, replies, snapshot_from): a Ready's effects held for its records.
        self.waiting: deque = deque()
        self.install: tuple | None = None  # a peer's snapshot that arrived while busy
        self.tokens: deque = deque()  # (mark, Ready token): tell the replica once synced
        self.syncs = 0
        self.lost = 0  # records lost in crashes (written, never synced)

    @property
    def unsynced(self) -> int:
        return len(self.records) - self.synced

    def holds(self) -> bool:
        """Something is not yet durable or not yet sent."""
        return bool(self.waiting) or self.syncing is not None or len(self.records) > self.synced

    def crash(self, lose_unsynced: bool, torn: bool, rng: random.Random) -> None:
        """The machine (``lose_unsynced``) or only the process died."""
        records = self.records
        if lose_unsynced:
            keep = self.synced
            extra = len(records) - keep
            if extra and torn:
                keep += rng.randrange(extra + 1)
            self.lost += len(records) - keep
            del records[keep:]
        self.synced = len(records)
        self._forget()

    def rewrite(self, live: list) -> list:
        """Replace the log by ``live``, durably; returns the new records list."""
        self.records = list(live)
        self.synced = len(self.records)
        self.syncing = None
        self.epoch += 1
        self.tokens.clear()
        return self.records

    def _forget(self) -> None:
        self.syncing = None
        self.epoch += 1
        self.waiting.clear()
        self.install = None
        self.tokens.clear()
