"""Bytes a `block`-mode epoch reads from S3 when the node cache holds only a few block windows
(issue 30 item 3): 32 shards of ~1 MiB, a hot tier of 25% of the dataset, batches that span
several windows. Prefetch for later windows must not evict what the current batches still
need: each shard is fetched about once per epoch (goal <= 1.05x the dataset)."""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import pytest
from harness.counting import CountingStore

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset

pytestmark = pytest.mark.timeout(300)

SHARDS = 32
SAMPLE = (3, 98, 98)  # ~115 KB float32 samples, as benchmarks/loader_s3.py's "small" workload
SHARD_ROWS = 9  # ~1 MiB shards: a 32 MiB dataset
BATCH = 64  # a batch spans ~7 shards: several block windows of 2


@pytest.fixture(scope="module")
def s3_version(s3_server):
    bucket = f"blockbytes-{uuid.uuid4().hex[:10]}"
    s3_server.create_bucket(bucket)
    url, opts = f"s3://{bucket}/ds", s3_server.options()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SHARDS * SHARD_ROWS, *SAMPLE), dtype=np.float32)
    version = write_arrow_dataset(open_store(url, **opts), "bench", {"x": x}, SHARD_ROWS)
    return url, opts, version


def _epochs(url, opts, total, cache_dir, *, prefetch: int, cross_epoch: bool, epochs: int = 4) -> list[float]:
    """S3 bytes / dataset bytes of each epoch. With ``cross_epoch`` the next epoch's first batches
    are fetched during the current one, so one epoch's figure holds part of the next; the last
    epoch is run without that, so the sum is exactly what ``epochs`` epochs read."""
    store = CountingStore(open_store(url, **opts))
    ds = Dataset(store, "bench@1", cache_dir=cache_dir, cache_limit=total // 4)
    loader = Loader(ds, BATCH, seed=0, shuffle_mode="block", block_shards=2, workers=2, prefetch=prefetch)
    loader.config = dataclasses.replace(loader.config, cross_epoch=cross_epoch)
    ratios = []
    try:
        for epoch in range(epochs):
            if epoch == epochs - 1:  # nothing fetched ahead for an epoch after the last
                loader.config = dataclasses.replace(loader.config, cross_epoch=False)
            before = store.bytes_read
            rows = sum(len(b["x"]) for b in loader)
            assert rows == SHARDS * SHARD_ROWS
            ratios.append((store.bytes_read - before) / total)
    finally:
        loader.close()
    return ratios


@pytest.mark.parametrize("prefetch", [4, 1])
def test_block_epoch_reads_the_dataset_once_with_a_quarter_size_cache(s3_version, tmp_path, prefetch):
    """No run ahead across epochs: each epoch's bytes are its own."""
    url, opts, version = s3_version
    ratios = _epochs(url, opts, version.bytes, tmp_path / "hot", prefetch=prefetch, cross_epoch=False)
    assert max(ratios) <= 1.05, ratios


def test_block_epochs_with_the_next_epoch_fetched_ahead(s3_version, tmp_path):
    """The next epoch's run starts while the current one is assembled: its fetches must wait
    for the current run's last shard, not evict what it still needs."""
    url, opts, version = s3_version
    ratios = _epochs(url, opts, version.bytes, tmp_path / "hot", prefetch=4, cross_epoch=True)
    assert sum(ratios) / len(ratios) <= 1.05, ratios
