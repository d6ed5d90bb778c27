"""Shard fill-ahead: the shards upcoming batches need, fetched into the node cache in plan
order, several at once, bounded by bytes pinned ahead of use.

A filled shard stays *pinned* (a shared ``flock`` in the node cache, so no process of the node
can evict it) until the batch that releases it has been consumed: in ``block`` mode that is
the shard's last use in the epoch (its window is over), otherwise its first use (a full
shuffle needs nearly every shard until the epoch's end; pinning them all would stall the
fill, so the cache's LRU decides and the loader reports what it re-fetches). Pinned-ahead
bytes of every epoch run of one loader share one ``ByteBudget``; a single shard larger than
the budget is still let through alone. Filling ahead never waits for space: when the node
cache is full of pinned files (other loaders, other processes of the node) the filler waits
for its consumer to move on and tries again, and when a fill of this process needs room the
filler gives up its pins one at a time, the shard needed last first (they only save a later
fetch; the batch that needs a shard fetches it on demand). The loader releases a pin as soon
as no batch still to assemble reads the shard (``shard_done``), and marks the shards it still
reads as wanted in the node cache, which evicts them last and never for a fill ahead; a fill
ahead of a shard the batches meanwhile fetched and finished with downloads nothing. A large shard is itself fetched as concurrent range
requests by the node cache (``CacheConfig.part_bytes`` / ``fetch_concurrency``); the parts of
all concurrent fills share one budget of their product, so ``concurrency`` does not multiply
that memory.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from ...bytebudget import ByteBudget
from ...errors import BackgroundError, CapacityError, IntegrityError, StoreError
from ...nodecache import NotNeeded
from .source import ServeSource


@dataclass(frozen=True)
class FillPlan:
    """Shards in fill order, and after which batch each one's pin is released."""

    order: tuple[int, ...]
    release_after: dict[int, int]


class ShardFiller:
    """Background fill of ``plan.order`` (see module docstring); ``error`` holds a failure."""

    def __init__(self, ds: ServeSource, plan: FillPlan, budget: ByteBudget, *, concurrency: int,
                 retries: int, backoff_s: float, on_all_filled: Callable[[], None],
                 after: threading.Event | None = None) -> None:
        self.ds = ds
        self.plan = plan
        self.budget = budget
        self.retries = retries
        self.backoff_s = backoff_s
        self.on_all_filled = on_all_filled
        self._after = after  # fill nothing before it is set (a run ahead: see Loader)
        self.error: BackgroundError | IntegrityError | None = None
        #: bytes this filler downloaded (node-cache misses), for the loader's re-fetch count
        self.fetched_bytes = 0
        self._closed = threading.Event()
        self._mu = threading.Lock()
        self._pins: dict[int, object] = {}  # shard -> PinnedFile, held until released
        self._released: set[int] = set()
        self._rank = {s: i for i, s in enumerate(plan.order)}
        self._by_batch: dict[int, list[int]] = {}
        for s, b in plan.release_after.items():
            self._by_batch.setdefault(b, []).append(s)
        self._progress = threading.Condition(self._mu)  # notified when a batch is consumed
        ds.add_pressure_hook(self.release_pins)
        self._pool = DaemonPool(concurrency, "trainstore-shard-fill")
        self._thread = threading.Thread(target=self._run, daemon=True, name="trainstore-shard-prefetch")
        self._thread.start()

    def _run(self) -> None:
        futures: list[Future] = []
        while self._after is not None and not self._after.wait(0.05):
            if self._closed.is_set():
                return
        for s in self.plan.order:
            with self._mu:
                if s in self._released:  # already consumed (filled on demand): nothing to hold
                    continue
            nbytes = self.ds.shards[s].bytes
            if not self.budget.acquire(nbytes, self._closed):
                return
            futures.append(self._pool.submit(self._fill, s, nbytes))
        for f in futures:
            if not f.result() or self._closed.is_set():
                return
        self.on_all_filled()

    def _fill(self, s: int, nbytes: int) -> bool:
        try:
            handle = self._pin(s)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer at its next batch
            self.budget.release(nbytes)
            info = self.ds.shards[s]
            if isinstance(exc, IntegrityError):  # corrupt data: the error itself names the object
                self.error = exc
            else:
                err = BackgroundError(f"prefetch of shard {info.key} of {self.ds.source_id} failed: "
                                      f"{type(exc).__name__}: {exc}")
                err.__cause__ = exc
                self.error = err
            self._closed.set()
            return False
        if handle is None:
            self.budget.release(nbytes)
            return not self._closed.is_set()
        with self._mu:
            if handle.fetched:
                self.fetched_bytes += handle.size
            keep = not self._closed.is_set() and s not in self._released
            if keep:
                self._pins[s] = handle
        if not keep:
            self._drop(s, handle)
        return True

    def _pin(self, s: int):
        """Fill and pin shard ``s``. No room (everything pinned): wait for the consumer to
        move on and retry, for as long as it takes (None once closed or consumed); another
        transient store error (unreachable, throttled) is retried with backoff before it counts."""
        attempt = 0
        while not self._closed.is_set():
            if self._is_released(s):
                return None
            try:
                # skip a download once the batches are done with s
                return self.ds.pin_shard(s, ahead=True, needed=lambda: not self._is_released(s))
            except NotNeeded:
                return None
            except CapacityError:
                with self._progress:
                    self._progress.wait(0.2)
            except StoreError:
                if attempt == self.retries or self._closed.wait(self.backoff_s * 2 ** attempt):
                    raise
                attempt += 1
        return None

    def _is_released(self, s: int) -> bool:
        with self._mu:
            return s in self._released

    def batch_consumed(self, b: int) -> None:
        """Batch ``b`` was handed to the training loop: release the pins it ends."""
        self._unpin(*self._by_batch.get(b, ()))

    def shard_done(self, s: int) -> None:
        """No batch still to assemble reads shard ``s``: release its pin now (before the
        batch that last read it is consumed)."""
        self._unpin(s)

    def _unpin(self, *shards: int) -> None:
        """``shards`` are consumed: drop their pins, and wake fills waiting for room."""
        for s in shards:
            with self._mu:
                self._released.add(s)
                handle = self._pins.pop(s, None)
            if handle is not None:
                self._drop(s, handle)
        with self._progress:
            self._progress.notify_all()

    def _drop(self, s: int, handle) -> None:
        """Close the pin ``handle`` of shard ``s`` and give its bytes back to the budget."""
        handle.close()
        self.budget.release(self.ds.shards[s].bytes)

    def release_pins(self) -> None:
        """The node cache needs room: give up the pin held ahead of use furthest from use
        (last in fill order). One per call: the cache asks again while it still lacks room, and
        the shards the next batches read stay pinned (LRU would evict them first: they were
        filled first)."""
        with self._mu:
            if not self._pins:
                return
            last = max(self._pins, key=self._rank.__getitem__)
            handle = self._pins.pop(last)
        self._drop(last, handle)

    def close(self) -> None:
        self.ds.remove_pressure_hook(self.release_pins)
        self._closed.set()
        self._thread.join(timeout=30)
        self._pool.shutdown()
        with self._mu:
            pins, self._pins = self._pins, {}
        for s, handle in pins.items():
            self._drop(s, handle)


class DaemonPool:
    """A fixed set of daemon worker threads running submitted calls, each with a ``Future``.

    Fill-ahead workers wait for room in the node cache "for as long as it takes"; with
    ``ThreadPoolExecutor`` (non-daemon workers, joined at interpreter exit) a loader left
    unclosed mid-epoch kept the process from exiting. A fill interrupted by exit leaves only a
    temp file (the node cache publishes a file by rename), so daemon workers are safe here.
    ``shutdown`` cancels what has not started and waits for what has."""

    def __init__(self, workers: int, name: str) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"{name}_{i}")
                         for i in range(max(1, workers))]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., object], *args: object) -> Future:
        fut: Future = Future()
        self._q.put((fut, fn, args))
        return fut

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                fut.set_exception(exc)

    def shutdown(self) -> None:
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()


__all__ = ["DaemonPool", "FillPlan", "ShardFiller"]
