"""ByteBudget: bytes in flight bounded under concurrent writers, an oversized item admitted
alone, budget given back on error and cancel; the checkpoint writer and parallel chunk puts
(memory and S3) under it."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from trainstore import open_store
from trainstore.bytebudget import ByteBudget
from trainstore.checkpoint.save.staging import StagedTensor
from trainstore.checkpoint.save.writer import WriteOptions, write_tensors
from trainstore.chunks import ChunkStore, PutResult
from trainstore.errors import ConfigError

RNG = np.random.default_rng(0)


class Meter:
    """Counts the bytes (and calls) inside a region at any moment."""

    def __init__(self) -> None:
        self.inflight = self.peak = self.concurrent = self.peak_concurrent = 0
        self.lock = threading.Lock()
        self.sizes_alone: list[int] = []  # sizes that entered when nothing else was inside

    def enter(self, n: int) -> None:
        with self.lock:
            if self.concurrent == 0:
                self.sizes_alone.append(n)
            self.inflight += n
            self.concurrent += 1
            self.peak = max(self.peak, self.inflight)
            self.peak_concurrent = max(self.peak_concurrent, self.concurrent)

    def leave(self, n: int) -> None:
        with self.lock:
            self.inflight -= n
            self.concurrent -= 1


class MeteredChunkStore(ChunkStore):
    """A chunk store whose puts are metered and slowed down so they overlap."""

    def __init__(self, *a, delay: float = 0.01, **kw) -> None:
        super().__init__(*a, **kw)
        self.delay, self.meter = delay, Meter()

    def put(self, data, codec=None, itemsize=1, digest=None, cpu=None) -> PutResult:
        n = memoryview(data).nbytes
        self.meter.enter(n)
        try:
            time.sleep(self.delay)
            return super().put(data, codec, itemsize, digest, cpu)
        finally:
            self.meter.leave(n)


def memory_chunks(**kw) -> MeteredChunkStore:
    return MeteredChunkStore(open_store(f"memory://{uuid.uuid4().hex}"), **kw)


def test_bytes_in_flight_stay_bounded_under_concurrent_producers():
    budget, meter = ByteBudget(1000), Meter()
    sizes = [100, 300, 64, 500, 250, 10, 999, 1] * 10

    def item(n: int) -> None:
        meter.enter(n)
        time.sleep(0.002)
        meter.leave(n)

    def producer(pool: ThreadPoolExecutor, offset: int) -> None:
        for n in sizes[offset::3]:
            budget.submit(pool, n, item, n)

    with ThreadPoolExecutor(max_workers=8) as pool:
        producers = [threading.Thread(target=producer, args=(pool, i)) for i in range(3)]
        for t in producers:
            t.start()
        for t in producers:
            t.join()
    assert meter.peak <= 1000, meter.peak
    assert meter.peak_concurrent >= 2  # it did run items side by side (peak > any one item is timing-dependent)
    assert budget.peak <= 1000 and budget.inflight == 0


def test_an_item_larger_than_the_budget_is_admitted_alone():
    budget, meter = ByteBudget(1000), Meter()

    def item(n: int) -> None:
        meter.enter(n)
        time.sleep(0.01)
        meter.leave(n)

    with ThreadPoolExecutor(max_workers=4) as pool:
        futs = [budget.submit(pool, n, item, n) for n in (300, 5000, 200, 5000, 400)]
        for f in futs:
            f.result(timeout=10)
    assert meter.sizes_alone.count(5000) == 2  # each oversized item ran with nothing beside it
    assert budget.peak == 1000 and budget.inflight == 0


def test_acquire_blocks_until_release():
    budget = ByteBudget(100)
    budget.acquire(80)
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (budget.acquire(30), got.set()))
    waiter.start()
    assert not got.wait(0.2)  # 80 + 30 > 100: blocked
    budget.release(80)
    assert got.wait(5)
    waiter.join()
    assert budget.inflight == 30


def test_budget_is_released_on_error_and_cancel():
    budget = ByteBudget(100)

    def boom() -> None:
        raise ValueError("bad item")

    with ThreadPoolExecutor(max_workers=1) as pool:
        bad = budget.submit(pool, 60, boom)
        with pytest.raises(ValueError, match="bad item"):
            bad.result(timeout=10)
        assert budget.submit(pool, 60, lambda: 1).result(timeout=10) == 1  # no deadlock
        gate = threading.Event()
        blocker = budget.submit(pool, 10, gate.wait, 10)
        queued = budget.submit(pool, 10, lambda: 2)  # waits behind the blocker in the pool
        assert queued.cancel()
        gate.set()
        blocker.result(timeout=10)
    assert budget.inflight == 0


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="positive"):
        ByteBudget(0)
    budget = ByteBudget(10)
    with pytest.raises(ConfigError, match="negative"):
        budget.acquire(-1)
    with pytest.raises(ConfigError, match="in flight"):
        budget.release(5)


def test_checkpoint_writer_keeps_pieces_within_max_inflight_bytes():
    chunks = memory_chunks()
    opts = WriteOptions(chunk_bytes=4096, max_inflight_bytes=3 * 4096, workers=8, cpu_threads=8)
    arrays = {f"t{i}": RNG.integers(0, 255, n, dtype=np.uint8) for i, n in enumerate([40_000, 9_000, 100, 20_000])}
    staged = [StagedTensor(name, "uint8", (a.size,), 1, memoryview(a)) for name, a in arrays.items()]
    entries, stats = write_tensors(chunks, staged, opts)
    assert chunks.meter.peak <= 3 * 4096, chunks.meter.peak
    assert chunks.meter.peak_concurrent >= 2  # ...while pieces still ran in parallel
    assert stats.logical_bytes == sum(a.size for a in arrays.values())
    for name, a in arrays.items():
        got = b"".join(bytes(memoryview(chunks.get(c.ref))) for c in entries[name].chunks)
        assert got == a.tobytes()


def test_parallel_puts_under_a_budget_to_s3(s3_url):
    url, opts = s3_url
    chunks = ChunkStore(open_store(url, **opts))
    arrays = [RNG.normal(0, 0.02, 40_000).astype(np.float32) for _ in range(16)]
    budget = ByteBudget(1 << 20)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futs = [budget.submit(pool, a.nbytes, chunks.put, a, itemsize=4) for a in arrays]
        refs = [f.result().ref for f in futs]
    assert len(list(chunks.list_keys())) == 16 and budget.inflight == 0
    for a, ref in zip(arrays, refs):
        assert bytes(memoryview(chunks.get(ref))) == a.tobytes()


def test_acquire_gives_up_when_cancelled_and_reserves_nothing():
    budget = ByteBudget(100)
    budget.acquire(80)
    cancel = threading.Event()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(budget.acquire(50, cancel)))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # blocked: 80 + 50 > 100
    cancel.set()
    waiter.join(2)
    assert got == [False] and budget.inflight == 80
    budget.release(80)
    assert budget.acquire(50, cancel) is False  # already cancelled: nothing reserved
    assert budget.inflight == 0


def test_try_acquire_reserves_only_what_fits_now():
    budget = ByteBudget(100)
    assert budget.try_acquire(60) and budget.inflight == 60
    assert not budget.try_acquire(50) and budget.inflight == 60  # would wait: nothing reserved
    assert budget.try_acquire(40) and budget.inflight == 100
    budget.release(60)
    budget.release(40)
    assert budget.try_acquire(500) and budget.inflight == 100  # oversized: alone, as the whole budget
    assert not budget.try_acquire(1)
    budget.release(500)
    assert budget.inflight == 0 and budget.peak == 100
