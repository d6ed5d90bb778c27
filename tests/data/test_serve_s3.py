"""Serving from S3 (moto behind the counting proxy): cold start, cache limits smaller than the
dataset, object-store bytes per epoch, and pins that hold across processes."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import uuid
import warnings
import weakref

import numpy as np
import pytest

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import RefetchWarning, write_arrow_dataset
from trainstore.errors import CapacityError
from trainstore.nodecache import CacheConfig, NodeCache
from trainstore.store import Buffer, ReadOnlyStore, Store

pytestmark = pytest.mark.timeout(180)

SHARDS = 32
ROWS = 32  # rows per shard
WIDTH = 1024  # float32 per row: 4 KiB rows, ~128 KiB shards, ~4 MiB in all


def _columns(n: int = SHARDS * ROWS) -> dict[str, np.ndarray]:
    idx = np.arange(n, dtype=np.int64)
    x = (idx[:, None] * 7 + np.arange(WIDTH)[None, :]).astype(np.float32)
    return {"idx": idx, "x": x}


@pytest.fixture
def proxy(s3_server):
    from harness.faultproxy import FaultConfig, FaultProxy

    p = FaultProxy(s3_server.endpoint, FaultConfig(rate=0.0), max_lifetime_s=600)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def s3_via_proxy(s3_server, proxy):
    """(url, options): a fresh bucket, read through the counting proxy."""
    bucket = f"serve-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/serve", proxy.options(s3_server.options())


@pytest.fixture
def s3_dataset(s3_via_proxy):
    url, opts = s3_via_proxy
    store = open_store(url, **opts)
    version = write_arrow_dataset(store, "feat", _columns(), ROWS)
    return store, version


def shard_bytes(proxy) -> int:
    return proxy.get_bytes("/shards/")


def run_epoch(loader) -> list[np.ndarray]:
    return [b["idx"].copy() for b in loader]


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_block_mode_reads_each_shard_once_per_epoch(s3_dataset, proxy, tmp_path, fraction):
    store, version = s3_dataset
    total = version.bytes
    limit = int(total * fraction)
    loader = Loader(Dataset(store, "feat@1", cache_dir=tmp_path / "hot", cache_limit=limit),
                    batch_size=16, seed=5, shuffle_mode="block", block_shards=2)
    local_store = open_store(str(tmp_path / "local"))
    write_arrow_dataset(local_store, "feat", _columns(), ROWS)
    reference = Loader(Dataset(local_store, "feat@1", cache_dir=tmp_path / "hot-local"),
                       batch_size=16, seed=5, shuffle_mode="block", block_shards=2)
    ends = []
    for _epoch in range(3):
        got = run_epoch(loader)
        want = run_epoch(reference)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
        ends.append(shard_bytes(proxy))
    loader.close()
    reference.close()
    # steady state (epochs 2 and 3): each shard read at most once per epoch from the object
    # store; only what the cache still held from the epoch before may be skipped
    per_epoch = (ends[2] - ends[0]) / 2
    assert total - limit <= per_epoch <= 1.05 * total, (per_epoch, total)
    assert ends[0] >= total
    # the goal of block mode: at most 5% of the dataset fetched again per epoch (a shard whose
    # window ends as the next epoch begins may be evicted and fetched once more)
    assert loader.stats()["refetched_bytes"] <= 0.05 * total * 3, (loader.stats()["refetched_bytes"], total)


def test_full_mode_reports_refetched_bytes(s3_dataset, proxy, tmp_path):
    store, version = s3_dataset
    total = version.bytes
    loader = Loader(Dataset(store, "feat@1", cache_dir=tmp_path / "hot", cache_limit=total // 4),
                    batch_size=16, seed=5, shuffle_mode="full")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_epoch(loader)
        first = shard_bytes(proxy)
        run_epoch(loader)
        second = shard_bytes(proxy)
        run_epoch(loader)
    loader.close()
    stats = loader.stats()
    measured = (second - first) - total  # what the store sent in epoch 2 beyond one copy
    assert measured > total // 2  # a quarter-size cache and a full shuffle: heavy re-reading
    by_epoch = stats["refetched_bytes_by_epoch"]
    assert len(by_epoch) == 3 and by_epoch[-1] == stats["refetched_bytes_last_epoch"]
    assert sum(by_epoch) == stats["refetched_bytes"]
    refetched = by_epoch[1]
    shard = max(s.bytes for s in version.shards)
    # the loader counts between its epoch ends, the proxy between ours: a few shards apart
    assert abs(refetched - measured) <= max(8 * shard, 0.05 * measured), (refetched, measured)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RefetchWarning)]
    # one warning per loader (every epoch re-fetches as much: the figures stay in stats())
    assert len(msgs) == 1, msgs
    assert "block" in msgs[0] and f"{by_epoch[0]:,}" in msgs[0]


def test_cold_then_warm_phases_and_early_start(s3_dataset, proxy, tmp_path):
    store, version = s3_dataset
    total = version.bytes
    loader = Loader(Dataset(store, "feat@1", cache_dir=tmp_path / "hot"), batch_size=16, seed=1,
                    shuffle_mode="block", block_shards=2)
    it = iter(loader)
    next(it)
    at_first_batch = shard_bytes(proxy)
    assert at_first_batch < total  # training started before every shard had arrived
    n = 1 + sum(1 for _ in it)
    for _ in loader:  # epoch 2: all from the node cache
        pass
    loader.close()
    st = loader.stats()
    assert st["cold_batches"] >= 1 and st["cold_batches"] + st["warm_batches"] == st["batches"] == 2 * n
    assert st["warm_batches"] >= n
    assert st["cold_s"] > 0 and 0 <= st["cold_wait_fraction"] <= 1 and 0 <= st["warm_wait_fraction"] <= 1
    assert shard_bytes(proxy) == total  # the warm epoch read nothing from the store


def test_large_object_fetched_with_parallel_ranges(s3_via_proxy, proxy, tmp_path):
    url, opts = s3_via_proxy
    store = open_store(url, **opts)
    data = np.random.default_rng(0).integers(0, 255, 6 << 20, dtype=np.uint8).tobytes()
    store.put("big/object", data)
    cache = NodeCache(store, tmp_path / "hot",
                      config=CacheConfig(64 << 20, part_bytes=1 << 20, fetch_concurrency=4))
    before = proxy.requests
    with cache.pin("big/object", size=len(data)) as h:
        assert h.read() == data
    assert proxy.requests - before >= 6  # one ranged GET per 1 MiB part
    assert 2 <= proxy.max_in_flight <= 4  # concurrent, and bounded by the byte budget
    assert proxy.get_bytes("/big/object") == len(data)


class _Part(bytearray):
    """A fetched part whose lifetime can be watched (bytes cannot carry a weakref)."""


class SlowFirstPartStore(ReadOnlyStore):
    """Reads pass through to the S3 store; the first range of every object answers
    ``head_delay_s`` late (a slow request at the head of a fill's window), and ``peak_live``
    is the most fetched part bytes alive at once: memory really held, whoever holds it."""

    def __init__(self, inner: Store, head_delay_s: float) -> None:
        super().__init__(inner)
        self.head_delay_s = head_delay_s
        self.live = 0
        self.peak_live = 0
        self._lock = threading.Lock()

    def _freed(self, n: int) -> None:
        with self._lock:
            self.live -= n

    def get_range(self, key: str, start: int, length: int) -> Buffer:
        if start == 0:
            time.sleep(self.head_delay_s)
        part = _Part(memoryview(self.inner.get_range(key, start, length)))
        with self._lock:
            self.live += len(part)
            self.peak_live = max(self.peak_live, self.live)
        weakref.finalize(part, self._freed, len(part))
        return part


def test_concurrent_ranged_fills_share_one_memory_bound(s3_via_proxy, proxy, tmp_path):
    """``part_bytes x fetch_concurrency`` bounds the fetched parts held per cache, however many
    shards fill at once (a loader fills ``fill_concurrency`` shards together)."""
    url, opts = s3_via_proxy
    part, conc, fills = 256 << 10, 4, 4
    rng = np.random.default_rng(1)
    objects = {f"big/{i}": rng.integers(0, 255, 8 * part, dtype=np.uint8).tobytes() for i in range(fills)}
    s3 = open_store(url, **opts)
    for key, data in objects.items():
        s3.put(key, data)
    store = SlowFirstPartStore(s3, head_delay_s=0.5)
    cache = NodeCache(store, tmp_path / "hot",
                      config=CacheConfig(64 << 20, part_bytes=part, fetch_concurrency=conc))
    got: dict[str, bytes] = {}

    def fill(key: str) -> None:
        with cache.pin(key, size=len(objects[key])) as h:
            got[key] = h.read()

    threads = [threading.Thread(target=fill, args=(k,)) for k in objects]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == objects
    assert proxy.get_bytes("/big/") == sum(map(len, objects.values()))  # each part fetched once
    assert store.peak_live <= conc * part, (store.peak_live, conc * part)
    assert store.live == 0


# -- pins across the processes of one node ------------------------------------------------------

def _hold_loader(store_path, cache_dir, ready, go, out):
    """Child: a Loader reads one batch (its shard thread fills ahead), waits, then finishes."""
    ds = Dataset(open_store(store_path), "feat@1", cache_dir=cache_dir)
    loader = Loader(ds, batch_size=16, seed=2, shuffle_mode="block", block_shards=2)
    it = iter(loader)
    next(it)
    import time

    time.sleep(1.0)  # let the shard thread fill its budget
    ready.set()
    go.wait(60)
    for _ in it:
        pass
    out.put(loader.stats()["bytes_fetched"])
    loader.close()


def test_other_process_cannot_evict_what_a_loader_prefetched(tmp_path):
    store_path = str(tmp_path / "durable")
    version = write_arrow_dataset(open_store(store_path), "feat", _columns(), ROWS)
    cache_dir = str(tmp_path / "hot")
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_hold_loader, args=(store_path, cache_dir, ready, go, out))
    child.start()
    try:
        assert ready.wait(60)
        # another process of the node clears the shared cache directory
        NodeCache(open_store(store_path), cache_dir, limit_bytes=1 << 30).clear()
        go.set()
        fetched = out.get(timeout=60)
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert fetched == version.bytes  # nothing the child had filled was lost: no shard fetched twice


def _pin_and_wait(store_path, cache_dir, key, ready, go):
    cache = NodeCache(open_store(store_path), cache_dir, limit_bytes=1 << 20)
    with cache.pin(key):
        ready.set()
        go.wait(60)


def test_eviction_skips_a_file_pinned_by_another_process(tmp_path):
    store_path = str(tmp_path / "durable")
    store = open_store(store_path)
    for k in "abc":
        store.put(f"obj/{k}", bytes([ord(k)]) * 400_000)
    cache_dir = str(tmp_path / "hot")
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_pin_and_wait, args=(store_path, cache_dir, "obj/a", ready, go))
    child.start()
    try:
        assert ready.wait(60)
        cache = NodeCache(store, cache_dir, config=CacheConfig(900_000, capacity_wait_s=0.5))
        cache.prefetch("obj/b")
        cache.prefetch("obj/c")  # needs room: evicts b (unpinned), never a (pinned over there)
        assert cache.contains("obj/a") and cache.contains("obj/c") and not cache.contains("obj/b")
        assert not cache.evict("obj/a")
        with cache.pin("obj/c"), pytest.raises(CapacityError):
            cache.prefetch("obj/b")  # a and c pinned: nothing evictable
    finally:
        go.set()
        child.join(30)
    assert child.exitcode == 0
    cache.prefetch("obj/b")  # a released: now it can go
    assert not cache.contains("obj/a")
