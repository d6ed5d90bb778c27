"""Decode-ahead: the Parquet row groups upcoming batches need, decoded before a batch asks.

Without it a cold epoch of a ``parquet`` version decodes each row group when the first batch
needing it is assembled, only ``prefetch`` batches ahead of the consumer. ``DecodeAhead`` (one
per epoch run of a ``Loader``) walks this rank's plan in one thread: once the fill thread has
a shard in the node cache, it reads the shard's footer and maps the plan's rows of that shard
to row groups (the first and last batch needing each); it hands the groups, in order of first
use, to a few decode threads (pyarrow releases the GIL). Fetch, decode and consume overlap.

Bound: the decoded bytes of the groups handed out and still needed (their last batch not yet
consumed) stay within the budget of the decoded-group LRU (``serve.rowgroups``), so decoding
ahead never pushes out a group a coming batch needs (one group alone is always let through).

Batch content cannot change: decode-ahead only fills the LRU that batch assembly reads from.
A group that does not decode is not kept; the batch needing it decodes it again and the
``IntegrityError`` naming file and row group reaches the consumer as before. Any other failure
(a shard evicted and not refetchable, ...) only ends decoding ahead for this run.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...errors import ConfigError
from .dataset import Dataset

log = logging.getLogger(__name__)

#: how often a wait for a shard to arrive in the node cache looks again (seconds)
POLL_S = 0.05
#: (first batch, shard, row group, last batch, estimated decoded bytes)
_Job = tuple[int, int, int, int, int]


class DecodeAhead:
    """Decode the row groups of ``batches[start:]`` (row indices per batch) ahead of use on
    ``threads`` threads, from ``start()``; ``batch_consumed`` moves the bound on, ``close`` stops it."""

    def __init__(self, ds: Dataset, batches: Sequence[np.ndarray], start: int, *, threads: int) -> None:
        groups = ds.decoded_groups
        if groups is None:
            raise ConfigError(f"{ds.version.id} is not a parquet version: nothing to decode ahead")
        self.ds, self.groups = ds, groups
        self._batches, self._start = batches, start
        self._reads: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # by the walk thread
        self._consumed = start  # batches before this one have been consumed
        self._live = 0  # estimated decoded bytes of handed-out groups still needed
        self._ends: dict[int, list[int]] = {}  # last batch -> sizes released once it is consumed
        self._closed = False
        self._cv = threading.Condition()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="trainstore-decode")
        self._thread = threading.Thread(target=self._walk, daemon=True, name="trainstore-decode-ahead")

    def start(self) -> None:
        """Begin decoding ahead (a run prepared for the next epoch starts when it is iterated:
        until then the current epoch's groups are still in use, and both would not fit)."""
        if self._thread.ident is None:
            self._thread.start()

    @staticmethod
    def _reads_by_shard(ds: Dataset, batches: Sequence[np.ndarray],
                        start: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """shard -> (its local rows read, the batch reading each), batches in plan order."""
        rows = [np.asarray(b, dtype=np.int64) for b in batches[start:]]
        if not rows:
            return {}
        flat = np.concatenate(rows)
        batch_of = np.repeat(np.arange(start, start + len(rows)), [len(r) for r in rows])
        shard_of = np.searchsorted(ds.offsets, flat, side="right") - 1
        order = np.argsort(shard_of, kind="stable")  # stable: batch order within a shard
        bounds = np.flatnonzero(np.diff(shard_of[order])) + 1
        out = {}
        for part in np.split(order, bounds) if len(order) else []:
            s = int(shard_of[part[0]])
            out[s] = (flat[part] - ds.offsets[s], batch_of[part])
        return out

    # -- the walk --------------------------------------------------------------------------------
    def _walk(self) -> None:
        try:
            self._schedule()
        except Exception as exc:  # noqa: BLE001 - an optimisation only: batch assembly reads (and reports) itself
            log.debug("decode-ahead of %s stopped: %s: %s", self.ds.version.id, type(exc).__name__, exc)

    def _schedule(self) -> None:
        self._reads = self._reads_by_shard(self.ds, self._batches, self._start)
        shards = sorted(self._reads, key=lambda s: (int(self._reads[s][1][0]), s))
        jobs: list[_Job] = []
        i = 0
        while not self._closed:
            # plan every shard first needed no later than the next job, so jobs go in first-use order
            while i < len(shards) and (not jobs or int(self._reads[shards[i]][1][0]) <= jobs[0][0]):
                for job in self._plan(shards[i]):
                    heapq.heappush(jobs, job)
                i += 1
            if not jobs:
                return
            _first, s, g, last, size = heapq.heappop(jobs)
            if self._admit(size, last):
                self._pool.submit(self._decode, s, g, last)

    def _plan(self, s: int) -> list[_Job]:
        """The row groups of shard ``s`` the plan reads, once the shard is in the node cache."""
        local, batch = self._reads[s]
        if not self._arrived(s, int(batch[-1])):
            return []
        op = self.ds.acquire(s)
        try:
            gid = op.group_of(local)
            jobs = []
            for g in np.unique(gid).tolist():
                used = batch[gid == g]
                jobs.append((int(used[0]), s, g, int(used[-1]), op.group_bytes(g)))
            return jobs
        finally:
            self.ds.release(op)

    def _arrived(self, s: int, last: int) -> bool:
        """Wait until shard ``s`` is in the node cache (the fill thread fetches it); False once
        closed or once its last batch has been consumed."""
        while True:
            with self._cv:
                if self._closed or self._consumed > last:
                    return False
            if self.ds.cached(s):
                return True
            with self._cv:
                self._cv.wait(POLL_S)

    def _admit(self, size: int, last: int) -> bool:
        """Wait until ``size`` more bytes fit the budget beside those still needed; False if the
        group's last batch has been consumed meanwhile (or closed)."""
        with self._cv:
            while (not self._closed and self._consumed <= last and self._live
                   and self._live + size > self.groups.budget_bytes):
                self._cv.wait()
            if self._closed or self._consumed > last:
                return False
            self._live += size
            self._ends.setdefault(last, []).append(size)
            return True

    def _decode(self, s: int, g: int, last: int) -> None:
        with self._cv:
            if self._closed or self._consumed > last:
                return
        if not self.ds.cached(s):  # evicted meanwhile: not fetched again
            return
        try:
            op = self.ds.acquire(s)
        except Exception as exc:  # noqa: BLE001 - see _walk
            log.debug("decode-ahead: shard %d not opened: %s", s, exc)
            return
        try:
            op.decode_ahead(g)
        except Exception as exc:  # noqa: BLE001 - not kept: the batch needing it decodes and raises it
            log.debug("decode-ahead: row group %d of shard %d: %s", g, s, exc)
        finally:
            self.ds.release(op)

    # -- the consumer's side -----------------------------------------------------------------------
    def batch_consumed(self, b: int) -> None:
        """Batch ``b`` was handed to the training loop: groups it used last no longer count."""
        with self._cv:
            self._consumed = max(self._consumed, b + 1)
            for size in self._ends.pop(b, ()):
                self._live -= size
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["POLL_S", "DecodeAhead"]
