"""Bounded local resources: clean of a remote dataset larger than its cache; loader cache
default bound; prefetch errors reach the consumer."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.transforms import CleanConfig, clean
from trainstore.data.versions import read_shard
from trainstore.store import open_store


def _rows(store, version) -> list[dict]:
    out = []
    for s in version.shards:
        out += pq.read_table(pa.BufferReader(pa.py_buffer(read_shard(store, s)))).to_pylist()
    return out


def _dir_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def test_clean_of_remote_dataset_larger_than_cache(tmp_path, s3_url):
    url, opts = s3_url
    store = open_store(url, **opts)
    rng = np.random.default_rng(7)
    recs = [{"k": int(k), "blob": rng.bytes(2000).hex()} for k in rng.integers(0, 150, 400)]
    with Ingestor(store, "raw", config=IngestConfig(wal_dir=str(tmp_path / "w"), shard_bytes=64 << 10)) as ing:
        for i in range(0, len(recs), 50):
            ing.write(recs[i:i + 50])
        src = ing.commit()
    largest = max(s.bytes for s in src.shards)
    limit = largest + 1024  # room for one shard at a time, far less than the dataset
    assert len(src.shards) >= 5 and src.bytes > 4 * limit
    small_cache = str(tmp_path / "small")
    bounded = clean(store, "raw@1", dedup=["k"], output="bounded",
                    config=CleanConfig(cache_dir=small_cache, cache_bytes=limit, shard_rows=60))
    unbounded = clean(store, "raw@1", dedup=["k"], output="unbounded",
                      config=CleanConfig(cache_dir=str(tmp_path / "big"), shard_rows=60))
    expected = list({r["k"]: r for r in reversed(recs)}.values())[::-1]  # first row per key, in order
    expected = sorted(expected, key=lambda r: next(i for i, x in enumerate(recs) if x is r))
    assert _rows(store, bounded) == _rows(store, unbounded) == expected
    assert [s.checksum for s in bounded.shards] == [s.checksum for s in unbounded.shards]
    assert bounded.extra["duplicates"] == len(recs) - len(expected)
    cached = _dir_bytes(os.path.join(small_cache, "objects"))
    assert cached <= limit, f"hot tier holds {cached} bytes, limit {limit}"


# -- loader -------------------------------------------------------------------------------------
def _features(store, n=120, rows_per_shard=15):
    from trainstore.data.serve import write_arrow_dataset

    idx = np.arange(n, dtype=np.int64)
    return write_arrow_dataset(store, "feat", {"idx": idx, "x": np.repeat(idx[:, None], 64, 1).astype(np.float32)},
                               rows_per_shard)


def test_loader_default_cache_limit_is_bounded_and_explained(tmp_path, monkeypatch):
    from trainstore.data.serve import Dataset, Loader, options as options_mod

    store = open_store(str(tmp_path / "s"))
    v = _features(store)
    biggest = max(s.bytes for s in v.shards)
    loader = Loader(Dataset(store, "feat@1", cache_dir=tmp_path / "hot"), 10, seed=0)
    stats = loader.stats()
    assert stats["cache_limit"] == max(v.bytes + biggest, 1 << 20)  # was 2x the dataset
    assert "dataset" in stats["cache_limit_reason"]
    # a disk with little free space: the default takes only a fraction of it, and reading works
    free = __import__("shutil").disk_usage(tmp_path).free
    monkeypatch.setattr(options_mod, "CACHE_FREE_FRACTION", 3 * biggest / free)
    small = Loader(Dataset(store, "feat@1", cache_dir=tmp_path / "hot2"), 10, shuffle=False)
    st = small.stats()
    assert biggest <= st["cache_limit"] < v.bytes and "free space" in st["cache_limit_reason"]
    got = np.concatenate([b["idx"] for b in small])
    assert got.tolist() == list(range(120))
    assert small.stats()["evictions"] > 0


def test_prefetch_error_reaches_the_consumer_at_the_next_batch(tmp_path, s3_url):
    import time

    from trainstore.data.serve import Dataset, Loader
    from trainstore.errors import BackgroundError, TrainstoreError

    url, opts = s3_url
    store = open_store(url, **opts)
    v = _features(store, n=160, rows_per_shard=20)  # 8 shards
    lost = v.shards[-1]
    store.delete(lost.key)  # a real fault: the object is gone from the durable store
    loader = Loader(Dataset(url, "feat@1", cache_dir=tmp_path / "hot", **opts), 5, shuffle=False, workers=1)
    first_needing_lost = (v.rows - lost.rows) // 5  # batch 28 of 32
    got = 0
    with pytest.raises(TrainstoreError) as info:
        for _ in loader:
            got += 1
            time.sleep(0.05)  # the training step: the shard thread runs ahead meanwhile
    assert isinstance(info.value, BackgroundError) and lost.key in str(info.value)
    assert got < first_needing_lost, f"error surfaced only at batch {got}"
