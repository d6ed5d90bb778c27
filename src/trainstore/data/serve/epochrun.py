"""One epoch's batches for one rank, assembled in the background (the ``Loader``'s epoch run).

An ``EpochRun`` takes the rank's batches (row indices, or exchange steps) of one epoch from a
position, fills the shards they need ahead of use (``fill``), decodes Parquet row groups ahead
(``decodeahead``), assembles up to ``prefetch + 1`` batches on ``workers`` threads, and lets go
of each shard once no batch still to assemble reads it (evicting it when the node cache cannot
hold the dataset). A run ahead (the next epoch's) fetches nothing until ``after`` is set.
"""

from __future__ import annotations

import itertools
import threading
from bisect import bisect_left
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from ...bytebudget import ByteBudget
from ...devicecopy import CopyFence
from .decodeahead import DecodeAhead
from .exchange import ExchangeStep, RowExchange
from .fill import FillPlan, ShardFiller
from .meter import IOWaitMeter
from .source import EpochPlan, ServeSource


class RunOwner(Protocol):
    """What an epoch run reads of its ``Loader``."""

    dataset: ServeSource
    config: Any  # LoaderConfig
    meter: IOWaitMeter
    _exchange: RowExchange | None
    _fill_budget: ByteBudget
    _evict_done: bool

    def _finish(self, arrays: dict[str, np.ndarray]) -> tuple[Any, int, CopyFence | None]: ...


_RUN_SEQ = itertools.count()


class EpochRun:
    """Background assembly of one epoch's batches for one rank."""

    def __init__(self, loader: RunOwner, batches: list[np.ndarray] | list[ExchangeStep], start: int,
                 plan: EpochPlan, after: threading.Event | None = None) -> None:
        self.loader = loader
        self.cursor, self.next_cursor = plan.cursor, plan.next_cursor  # the source's, for this epoch and the next
        self.ds = loader.dataset
        self.exchange = loader._exchange
        self.batches = batches
        self.next_index = start
        self.start = start
        self._closed = threading.Event()
        cfg = loader.config
        self.pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="trainstore-batch")
        self.pending: deque[Future] = deque()
        self.submitted = start
        # each batch's rows of the source (an exchange step: the rows this rank reads for it)
        rows = [b.reads if isinstance(b, ExchangeStep) else b for b in batches]
        # shards each remaining batch needs, the first and last batch that needs each shard, and
        # the batches still to assemble that read each shard: at none its rows are copied out,
        # and its fill-ahead pin and node-cache copy are let go before the batch is consumed
        self.needs: list[np.ndarray] = []
        last_use: dict[int, int] = {}
        first_use: dict[int, int] = {}
        self._left: dict[int, list[int]] = {}  # ascending: the first is the shard's next use
        for b in range(start, len(batches)):
            shards = np.unique(np.searchsorted(self.ds.offsets, rows[b], side="right") - 1)
            self.needs.append(shards)
            for s in shards.tolist():
                first_use.setdefault(s, b)
                last_use[s] = b
                self._left.setdefault(s, []).append(b)
        order = list(first_use)  # shards in order of first use
        self.done_with: dict[int, list[int]] = {}
        for s, b in last_use.items():
            self.done_with.setdefault(b, []).append(s)
        self._left_mu = threading.Lock()
        self._shards_left = len(self._left)
        # block mode: the node cache evicts the shards this run reads next last (a full shuffle
        # reads nearly every shard until the epoch's end: there LRU decides)
        block = loader.config.shuffle_mode == "block"
        self._want = self.ds.want_shard if block else None
        self._unwant = self.ds.unwant_shard if block else None
        self._seq = next(_RUN_SEQ) * float(1 << 32)  # a run ahead's uses come after this one's
        if self._want is not None:
            for s, users in self._left.items():
                self._want(s, self._seq + users[0], id(self))
        #: set once every shard this run reads is copied out (a run ahead may fetch from then)
        self.gathered_all = threading.Event()
        if not self._shards_left:
            self.gathered_all.set()
        self._after = after
        self.needed_bytes = sum(self.ds.shards[x].bytes for x in order)
        # shard fill-ahead (serve.fill): pins held to the end of a block window, else first use
        release = last_use if cfg.shuffle_mode == "block" else first_use
        self.filler = ShardFiller(
            self.ds, FillPlan(tuple(order), dict(release)), loader._fill_budget,
            concurrency=cfg.fill_concurrency, retries=cfg.prefetch_retries, after=after,
            backoff_s=cfg.prefetch_backoff_s, on_all_filled=loader.meter.mark_warm,
        )
        # Parquet: row groups decoded ahead of the batch threads (serve.decodeahead)
        self.decoders = [DecodeAhead(ds, part, start, threads=cfg.decode_ahead)
                         for ds, part in (self.ds.decode_sources(rows) if cfg.decode_ahead else [])]
        self._top_up()

    def all_submitted(self) -> bool:
        return self.submitted >= len(self.batches)

    def _top_up(self) -> None:
        depth = self.loader.config.prefetch + 1
        while len(self.pending) < depth and self.submitted < len(self.batches):
            self.pending.append(self.pool.submit(self._assemble, self.submitted))
            self.submitted += 1

    def _assemble(self, b: int) -> tuple[Any, int, CopyFence | None]:
        if self._after is not None:  # a run ahead: wait for the current run's last shard
            while not self._after.wait(0.05):
                if self._closed.is_set():
                    break
        if self._closed.is_set():
            raise RuntimeError("loader closed")
        item = self.batches[b]
        if isinstance(item, ExchangeStep):
            gathered = self.exchange.gather(item)
            self._assembled(b)
            return gathered, 0, None  # sent in next(), in batch order
        return self.loader._finish(self.ds.take(item, gathered=lambda s: self._gathered(s, b),
                                                alloc=self.loader.batch_alloc))

    def _assembled(self, b: int) -> None:
        for s in self.needs[b - self.start].tolist():
            self._gathered(s, b)

    def _gathered(self, s: int, b: int) -> None:
        """A batch copied out its rows of shard ``s``: once no batch still to assemble reads it,
        it is done with. When the node cache cannot hold the dataset it is unpinned and dropped
        now, so fill-ahead gets the room at once, not when that batch is consumed (up to
        prefetch + 1 batches later, by when the next batches have fetched other shards in its
        place); when it can, the pin stays until then as before (the copy serves the next epoch)."""
        with self._left_mu:
            users = self._left[s]
            at = bisect_left(users, b)  # batches finish about in order: near the front
            if at < len(users) and users[at] == b:
                del users[at]
            if users:
                if self._want is not None and at == 0:  # its next use moved
                    self._want(s, self._seq + users[0], id(self))
                return
            self._shards_left -= 1
            if not self._shards_left:
                self.gathered_all.set()
        if self._unwant is not None:
            self._unwant(s, id(self))
        if self.loader._evict_done:  # the cache cannot hold the dataset: make room now
            self.filler.shard_done(s)
            self.ds.close_shard(s, evict=True)

    def next(self) -> tuple[Any, int, CopyFence | None] | None:
        if self.filler.error is not None:  # the shard thread stopped: say so now, not silently
            err, self.filler.error = self.filler.error, None
            raise err
        for decoder in self.decoders:  # from the first batch asked for (a run ahead waits)
            decoder.start()
        if not self.pending:
            self._top_up()
            if not self.pending:
                return None
        fut = self.pending.popleft()
        b = self.next_index
        self.next_index += 1
        result = fut.result()
        item = self.batches[b]
        if isinstance(item, ExchangeStep):  # the collective, in the iterating thread
            result = self.loader._finish(self.exchange.exchange(item, result[0]))
        self._retire(b)
        self._top_up()
        return result

    def _retire(self, b: int) -> None:
        self.filler.batch_consumed(b)
        for decoder in self.decoders:
            decoder.batch_consumed(b)
        for s in self.done_with.get(b, []):  # not needed again this epoch
            self.ds.close_shard(s, evict=self.loader._evict_done)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for f in self.pending:
            f.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
        for decoder in self.decoders:
            decoder.close()
        self.filler.close()
        self.gathered_all.set()  # fetches nothing more: a run ahead waiting on it may start
        if self._unwant is not None:
            with self._left_mu:
                left = [s for s, users in self._left.items() if users]
            for s in left:
                self._unwant(s, id(self))


__all__ = ["EpochRun", "RunOwner"]
