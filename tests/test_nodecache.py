"""NodeCache: read-through, LRU eviction, pins, corruption, several processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from trainstore import open_store
from trainstore.chunks import content_hash
from trainstore.errors import CapacityError, ConfigError, IntegrityError, NotFoundError
from trainstore.nodecache import CacheConfig, NodeCache, cache as nodecache_module
from trainstore.nodecache.files import TMP_PREFIX

pytestmark = pytest.mark.timeout(120)


def _fill_store(store, n: int, size: int) -> dict[str, bytes]:
    objs = {}
    for i in range(n):
        data = bytes([i % 251]) * (size // 2) + os.urandom(size - size // 2)
        store.put(f"obj/{i:03d}", data)
        objs[f"obj/{i:03d}"] = data
    return objs


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "durable"))


def test_read_through_hits_and_misses(store, tmp_path):
    objs = _fill_store(store, 3, 1000)
    cache = NodeCache(store, tmp_path / "hot", 10_000)
    for key, data in objs.items():
        with cache.open(key) as path:
            assert open(path, "rb").read() == data
    assert cache.stats.misses == 3 and cache.stats.hits == 0
    assert cache.stats.bytes_fetched == 3000
    with cache.pin("obj/001") as h:
        assert bytes(h.mmap()) == objs["obj/001"]
    assert cache.stats.hits == 1
    assert cache.usage() == 3000
    with pytest.raises(NotFoundError):
        cache.pin("obj/missing")
    assert not any(n.startswith(".tmp.") for _, _, ns in os.walk(tmp_path / "hot") for n in ns)


def test_lru_eviction_order(store, tmp_path):
    objs = _fill_store(store, 4, 1000)
    cache = NodeCache(store, tmp_path / "hot", 3000)
    for key in ["obj/000", "obj/001", "obj/002"]:
        cache.prefetch(key)
        time.sleep(0.01)
    cache.get("obj/000")  # now obj/001 is least recently used
    time.sleep(0.01)
    cache.prefetch("obj/003")
    assert cache.contains("obj/000") and not cache.contains("obj/001")
    assert cache.contains("obj/002") and cache.contains("obj/003")
    assert cache.stats.evictions == 1 and cache.usage() <= 3000
    assert cache.get("obj/001") == objs["obj/001"]  # re-fetched transparently


def test_pinned_file_never_evicted(store, tmp_path):
    objs = _fill_store(store, 4, 1000)
    cache = NodeCache(store, tmp_path / "hot", config=CacheConfig(2000, capacity_wait_s=0.2))
    a = cache.pin("obj/000")
    b = cache.pin("obj/001")
    with pytest.raises(CapacityError, match="obj/002"):
        cache.pin("obj/002")  # everything in use: bounded wait, then a clear error
    assert cache.contains("obj/000") and cache.contains("obj/001")
    b.close()
    with cache.pin("obj/002") as c:
        assert c.read() == objs["obj/002"]
    assert cache.contains("obj/000") and not cache.contains("obj/001")
    assert a.read() == objs["obj/000"]
    a.close()


def test_release_from_other_thread_unblocks_fill(store, tmp_path):
    import threading

    _fill_store(store, 2, 1000)
    cache = NodeCache(store, tmp_path / "hot", config=CacheConfig(1000, capacity_wait_s=10))
    a = cache.pin("obj/000")
    threading.Timer(0.2, a.close).start()
    t0 = time.monotonic()
    cache.prefetch("obj/001")
    assert 0.1 < time.monotonic() - t0 < 5


def test_limit_smaller_than_one_object(store, tmp_path):
    _fill_store(store, 1, 5000)
    cache = NodeCache(store, tmp_path / "hot", 1000)
    t0 = time.monotonic()
    with pytest.raises(CapacityError, match="obj/000.*5000 bytes"):
        cache.pin("obj/000")
    with pytest.raises(CapacityError):
        cache.pin("obj/000", size=5000)
    assert time.monotonic() - t0 < 2
    with pytest.raises(ConfigError):
        NodeCache(store, tmp_path / "hot2", 0)


def test_corrupt_hot_copy_is_refetched(store, tmp_path):
    objs = _fill_store(store, 1, 4096)
    key, data = "obj/000", objs["obj/000"]
    cache = NodeCache(store, tmp_path / "hot", 100_000)
    cs = content_hash(data)
    path = cache.path_of(key)
    cache.prefetch(key, checksum=cs, size=len(data))
    with open(path, "r+b") as f:  # bit rot in the hot tier
        f.seek(100)
        f.write(b"\xff\x00\xff")
    assert cache.get(key, checksum=cs, size=len(data)) == data
    assert cache.stats.refetched_corrupt == 1
    # a truncated copy is caught by the size check, in a fresh process-like cache object
    with open(path, "r+b") as f:
        f.truncate(10)
    fresh = NodeCache(store, tmp_path / "hot", 100_000)
    assert fresh.get(key, checksum=cs, size=len(data)) == data
    assert fresh.stats.refetched_corrupt == 1


def test_threads_that_find_the_same_corrupt_copy_refetch_it_once(store, tmp_path, monkeypatch):
    """Readers that all found the hot copy corrupt wait for the one re-fetch, then hit it."""
    import threading

    objs = _fill_store(store, 1, 4096)
    key, data = "obj/000", objs["obj/000"]
    cache = NodeCache(store, tmp_path / "hot", 100_000)
    cs = content_hash(data)
    cache.prefetch(key, checksum=cs, size=len(data))
    with open(cache.path_of(key), "r+b") as f:
        f.seek(7)
        f.write(b"\x00\xff")
    slow = nodecache_module.download  # slowed down so every reader finds the corrupt copy first
    monkeypatch.setattr(nodecache_module, "download", lambda s, k, fd: (time.sleep(0.3), slow(s, k, fd))[1])
    start = threading.Barrier(4)
    got = []

    def read() -> None:
        start.wait()
        got.append(cache.get(key, checksum=cs, size=len(data)))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [data] * 4
    assert cache.stats.refetched_corrupt == 1 and cache.stats.misses == 2  # prefetch + one re-fetch


def test_corrupt_durable_copy_names_the_key(store, tmp_path):
    store.put("obj/bad", b"x" * 100)
    cache = NodeCache(store, tmp_path / "hot", 10_000)
    with pytest.raises(IntegrityError, match="obj/bad"):
        cache.pin("obj/bad", checksum=content_hash(b"y" * 100))
    assert not cache.contains("obj/bad")


def _worker(args):
    durable, hot, keys, limit, rounds, sums = args
    cache = NodeCache(open_store(durable), hot, limit)
    for r in range(rounds):
        for i, key in enumerate(keys):
            k = keys[(i * 7 + r) % len(keys)]
            with cache.pin(k, checksum=sums[k]) as h:
                data = bytes(h.mmap())
                assert content_hash(data) == sums[k], k
    return cache.stats.as_dict()


def test_processes_share_one_cache_dir_fetching_each_object_once(store, tmp_path):
    objs = _fill_store(store, 12, 20_000)
    sums = {k: content_hash(v) for k, v in objs.items()}
    args = (str(tmp_path / "durable"), str(tmp_path / "hot"), sorted(objs), 10**7, 2, sums)
    with mp.get_context("spawn").Pool(4) as pool:
        stats = pool.map(_worker, [args] * 4)
    # the per-key download lock: every object crossed from the durable tier exactly once
    assert sum(s["misses"] for s in stats) == 12
    assert sum(s["bytes_fetched"] for s in stats) == 12 * 20_000


def test_processes_share_one_small_cache_dir(store, tmp_path):
    objs = _fill_store(store, 12, 20_000)
    sums = {k: content_hash(v) for k, v in objs.items()}
    limit = 100_000  # 5 objects for 4 processes pinning one each
    args = (str(tmp_path / "durable"), str(tmp_path / "hot"), sorted(objs), limit, 3, sums)
    with mp.get_context("spawn").Pool(4) as pool:
        stats = pool.map(_worker, [args] * 4)
    assert sum(s["evictions"] for s in stats) > 0
    assert NodeCache(store, tmp_path / "hot", limit).usage() <= limit


def test_namespaces_keep_stores_apart(tmp_path):
    s1, s2 = open_store(str(tmp_path / "a")), open_store(str(tmp_path / "b"))
    s1.put("k", b"one")
    s2.put("k", b"two")
    c1 = NodeCache(s1, tmp_path / "hot", 1000)
    c2 = NodeCache(s2, tmp_path / "hot", 1000)
    assert c1.get("k") == b"one" and c2.get("k") == b"two"


def test_s3_durable_store(s3_url, tmp_path):
    url, opts = s3_url
    store = open_store(url, **opts)
    data = os.urandom(300_000)
    store.put("shards/a.bin", data)
    cache = NodeCache(url, tmp_path / "hot", 1_000_000, **opts)
    with cache.pin("shards/a.bin", checksum=content_hash(data), size=len(data)) as h:
        assert bytes(h.mmap()) == data
    assert cache.get("shards/a.bin") == data
    assert cache.stats.misses == 1 and cache.stats.hits == 1


def test_wanted_files_are_evicted_last_and_never_for_a_fill_ahead(store, tmp_path):
    """``want``: eviction takes files nobody wants first, then the wanted one needed last; a
    fill ahead of use never evicts a wanted file, a fill on demand does after ``want_grace_s``."""
    _fill_store(store, 6, 1000)
    cache = NodeCache(store, tmp_path / "hot", config=CacheConfig(3000, capacity_wait_s=0.5, want_grace_s=0.1))
    for i in range(3):
        cache.prefetch(f"obj/{i:03d}")
        time.sleep(0.01)  # distinct LRU times: obj/000 is the oldest
    cache.want("obj/000", 1.0, owner=1)
    cache.want("obj/001", 5.0, owner=1)
    cache.prefetch("obj/003")  # evicts the idle obj/002, not the older but wanted obj/000
    assert [cache.contains(f"obj/{i:03d}") for i in range(4)] == [True, True, False, True]
    cache.pin("obj/004", ahead=True).close()  # the idle obj/003 goes
    assert not cache.contains("obj/003")
    cache.want("obj/004", 3.0, owner=2)
    with pytest.raises(CapacityError):
        cache.pin("obj/005", ahead=True)  # every file is wanted: a fill ahead waits instead
    cache.pin("obj/005", ahead=True, rank=4.0).close()  # needed before obj/001 (rank 5): takes it
    assert not cache.contains("obj/001") and cache.contains("obj/000") and cache.contains("obj/004")
    cache.unwant("obj/004", owner=2)
    cache.want("obj/005", 2.0, owner=1)
    cache.prefetch("obj/001")  # on demand: the unwanted obj/004 first
    assert not cache.contains("obj/004") and cache.contains("obj/000") and cache.contains("obj/005")
    cache.want("obj/001", 9.0, owner=1)
    cache.prefetch("obj/002")  # all wanted: after the grace, the one needed last (obj/001, rank 9)
    assert not cache.contains("obj/001") and cache.contains("obj/000") and cache.contains("obj/005")


def test_a_fill_ahead_that_is_no_longer_needed_downloads_nothing(store, tmp_path):
    _fill_store(store, 1, 1000)
    cache = NodeCache(store, tmp_path / "hot", 10_000)
    with pytest.raises(nodecache_module.NotNeeded):
        cache.pin("obj/000", ahead=True, needed=lambda: False)
    assert cache.stats.bytes_fetched == 0 and not cache.contains("obj/000")


def test_path_of_is_remembered_and_still_refuses_bad_keys(tmp_path):
    """``path_of`` is remembered per (key, tag); a bad key is refused every time, not learned."""
    cache = NodeCache(str(tmp_path / "store"), tmp_path / "cache", limit_bytes=1 << 20)
    first = cache.path_of("a/b.bin")
    assert cache.path_of("a/b.bin") == first and first.endswith(os.path.join("a", "b.bin"))
    assert cache.path_of("a/b.bin", tag="t1") != cache.path_of("a/b.bin", tag="t2") != first
    for _ in range(2):
        with pytest.raises(ConfigError):
            cache.path_of(f"a/{TMP_PREFIX}x/b.bin")
    other = NodeCache(str(tmp_path / "store"), tmp_path / "cache", limit_bytes=1 << 20)
    assert other.path_of("a/b.bin") == first  # the same store in the same directory: one layout
