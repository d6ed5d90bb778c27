"""Bounded local resources: clean of a remote dataset larger than its cache; loader cache
default bound; prefetch errors reach the consumer."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore.data.cleaning import CleanConfig, clean
from trainstore.data.ingest import IngestConfig, Ingestor
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
