"""Exchange mode: N ranks with separate node caches read the dataset once from S3 per epoch
(not N times) and still get exactly the batches of the plain loader (same plan, same seed)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from harness.dist import run_ranks

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset
from trainstore.data.serve.exchange import RowExchange
from trainstore.errors import ConfigError

from .exchange_workers import open_loader

HERE = os.path.dirname(__file__)
pytestmark = pytest.mark.timeout(240)

N, ROWS_PER_SHARD, BATCH, SEED, EPOCHS, STOP = 300, 20, 16, 7, 2, 3


def make_dataset(store):
    idx = np.arange(N, dtype=np.int64)
    x = (idx[:, None, None] * 10 + np.arange(16).reshape(1, 2, 8)).astype(np.float32)
    return write_arrow_dataset(store, "feat", {"idx": idx, "x": x, "label": (idx % 7).astype(np.int32)},
                               ROWS_PER_SHARD)


def plain_batches(ds, rank, world, epoch):
    loader = Loader(ds, batch_size=BATCH, seed=SEED, rank=rank, world_size=world)
    loader.set_epoch(epoch)
    out = [b["idx"].tolist() for b in loader]
    loader.close()
    return out


@pytest.mark.parametrize("world", [3, pytest.param(2, marks=pytest.mark.stress), pytest.param(4, marks=pytest.mark.stress)])
def test_exchange_reads_each_byte_once_and_keeps_batches(s3_url, tmp_path, world):
    url, opts = s3_url
    version = make_dataset(open_store(url, **opts))
    args = {"url": url, "options": opts, "ref": "feat@1", "root": str(tmp_path), "batch": BATCH,
            "seed": SEED, "epochs": EPOCHS, "stop": STOP}
    res = run_ranks("exchange_workers:epochs", world, dict(args, exchange=True), pythonpath=[HERE],
                    timeout_s=180, pg_timeout_s=30)
    for r in res:
        assert r.ok, f"rank {r.rank} rc={r.returncode} error={r.error}\n{r.stderr[-2000:]}"
    got = [r.value for r in res]

    # object-store bytes: the dataset once in epoch 0 (each shard by its owner only), nothing after
    assert sum(g["bytes"][0] for g in got) == version.bytes
    assert all(g["bytes"][e] == 0 for g in got for e in range(1, EPOCHS))

    # every rank's batches are the plain loader's, and the rows' contents came along intact
    ds = Dataset(open_store(url, **opts), "feat@1", cache_dir=tmp_path / "reference")
    for rank, g in enumerate(got):
        for epoch, batches in enumerate(g["epochs"]):
            assert [b["idx"] for b in batches] == plain_batches(ds, rank, world, epoch)
            for b in batches:
                idx = np.array(b["idx"])
                assert b["x0"] == (idx * 10.0).tolist()
                assert b["xsum"] == (idx * 160.0 + 120.0).tolist()
                assert b["label"] == (idx % 7).tolist()
        # resume mid-epoch: the first STOP batches plus the resumed rest are the plain epoch
        plain = plain_batches(ds, rank, world, g["resume_epoch"])
        assert g["resume_epoch"] == EPOCHS
        assert g["resume_first"] == plain[:STOP] and g["resume_rest"] == plain[STOP:]
    ds.close()


def test_without_exchange_each_node_reads_the_whole_dataset(s3_url, tmp_path):
    """The baseline the exchange removes: W plain loaders with W node caches read W x the dataset."""
    url, opts = s3_url
    version = make_dataset(open_store(url, **opts))
    args = {"url": url, "options": opts, "ref": "feat@1", "root": str(tmp_path), "batch": BATCH, "seed": SEED}
    total = 0
    for rank in range(2):
        loader, store = open_loader(args, rank, 2, exchange=False)
        before = store.bytes_read  # the version manifest, read when the Dataset opens
        for _ in loader:
            pass
        total += store.bytes_read - before
        loader.close()
    assert total == 2 * version.bytes


def test_exchange_single_process_and_refusals(tmp_path):
    store = open_store(str(tmp_path / "durable"))
    make_dataset(store)
    ds = Dataset(store, "feat@1", cache_dir=tmp_path / "hot")
    plain = plain_batches(ds, 0, 1, 0)
    loader = Loader(ds, batch_size=BATCH, seed=SEED, rank=0, world_size=1, exchange=True)
    assert [b["idx"].tolist() for b in loader] == plain
    loader.close()
    # a world of 2 without an initialised process group is refused, naming what is missing
    with pytest.raises(ConfigError, match="process group"):
        Loader(ds, batch_size=BATCH, rank=0, world_size=2, exchange=True)
    # non-tensor columns cannot be exchanged as fixed-size rows
    write_arrow_dataset(store, "text", {"idx": np.arange(10), "s": np.array([f"r{i}" for i in range(10)],
                                                                              dtype=object)}, 5)
    text = Dataset(store, "text@1", cache_dir=tmp_path / "hot2")
    with pytest.raises(ConfigError, match="column 's'"):
        RowExchange(text, 0, 1)
