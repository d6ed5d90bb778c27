"""Loader defaults that fit (issue 29 item 5): Parquet shards served with the default (full)
shuffle say once that ``shuffle_mode="block"`` fits them; ``loader.epoch`` counts epochs; the
methods users call have docstrings."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore.data import Dataset, Loader


@pytest.fixture
def parquet_dir(tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"x": list(range(i * 50, (i + 1) * 50))}), d / f"part-{i}.parquet")
    return str(d)


def test_parquet_with_default_shuffle_warns_once_about_block(parquet_dir, tmp_path):
    with pytest.warns(UserWarning, match="shuffle_mode='block'"):
        Loader(Dataset.open(parquet_dir, cache_dir=tmp_path / "c1"), batch_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Loader(Dataset.open(parquet_dir, cache_dir=tmp_path / "c2"), batch_size=10, shuffle_mode="full")
        Loader(Dataset.open(parquet_dir, cache_dir=tmp_path / "c3"), batch_size=10, shuffle_mode="block")
        Loader(Dataset.open(parquet_dir, cache_dir=tmp_path / "c4"), batch_size=10, shuffle=False)


def test_epoch_counts_and_methods_have_docstrings(parquet_dir, tmp_path):
    loader = Loader(Dataset.open(parquet_dir, cache_dir=tmp_path / "c"), batch_size=50, shuffle_mode="block")
    assert loader.epoch == 0
    assert sum(len(b["x"]) for b in loader) == 150
    assert loader.epoch == 1
    for name in ("__iter__", "state_dict", "load_state_dict", "set_epoch"):
        assert (getattr(Loader, name).__doc__ or "").strip(), name
