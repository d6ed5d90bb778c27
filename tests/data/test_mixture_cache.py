"""A mixture in ``block`` mode through a node cache that holds a third of its sources (a batch
of 16 reads the block windows of all three, up to six shards of 22): each shard is fetched
about once an epoch. The loader's eviction hints (the next use of every shard
it still reads) reach each source's node cache through the mixture, and the caches on one
directory share them; without them prefetch for later windows evicts shards the current batches
still need (no hints: 1.14-1.18x an epoch; hints kept per source cache: 1.45-1.5x)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainstore import open_store
from trainstore.data import Dataset, Loader, Mixture
from trainstore.data.serve import write_arrow_dataset

pytestmark = pytest.mark.timeout(240)

SIZES = {"web": 96, "code": 64, "math": 16}  # rows, 8 per shard: 22 shards of ~64 KiB
ROW = 2048  # float32 values per row (8 KiB)


@pytest.fixture(scope="module")
def durable(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixcache")
    store = open_store(str(root / "durable"))
    start = 0
    for name, n in SIZES.items():
        idx = np.arange(start, start + n, dtype=np.int64)
        write_arrow_dataset(store, name, {"idx": idx, "x": np.full((n, ROW), 1.0, np.float32) * idx[:, None]}, 8)
        start += n
    return store


def _epoch_bytes(durable, cache_dir, *, epochs: int = 3) -> tuple[list[float], list[np.ndarray]]:
    total = sum(Dataset(durable, f"{n}@1", cache_dir=cache_dir).source_bytes for n in SIZES)
    sources = {n: Dataset(durable, f"{n}@1", cache_dir=cache_dir, cache_limit=total // 3) for n in SIZES}
    mixture = Mixture(sources, {"web": 0.5, "code": 0.3, "math": 0.2}, seed=0)
    loader = Loader(mixture, 16, seed=0, shuffle_mode="block", block_shards=2, workers=2, prefetch=4,
                    world_size=1, rank=0)
    loader.config = dataclasses.replace(loader.config, cross_epoch=False)  # each epoch's bytes its own
    ratios, ids = [], []
    try:
        for _ in range(epochs):
            before = mixture.cache.stats.bytes_fetched  # node-cache fills, every source
            got = []
            for b in loader:
                assert np.array_equal(b["x"][:, 7], b["idx"].astype(np.float32))  # rows gathered whole
                got.append(b["idx"].copy())
            ratios.append((mixture.cache.stats.bytes_fetched - before) / total)
            ids.append(np.concatenate(got))
    finally:
        loader.close()
    return ratios, ids


def test_block_epochs_fetch_each_shard_about_once(durable, tmp_path):
    ratios, ids = _epoch_bytes(durable, tmp_path / "hot")
    assert all(len(e) == sum(SIZES.values()) for e in ids)
    # before, each source's cache saw the others' wanted shards as idle: 1.45-1.5x every epoch;
    # with no hints 1.14-1.18x. Shared hints: 0.86-1.05x alone, and one epoch of three at 1.14x
    # (3 shards of 22 fetched twice) in a full `make test` run, where the fills' timing differs:
    # the median holds the line, the worst epoch must stay clear of the per-source failure
    assert sorted(ratios)[1] <= 1.10 and max(ratios) <= 1.3, ratios  # a shard of 22 is 0.045
    print("bytes per epoch / sources' bytes:", ratios)
