"""List columns served from Parquet and Arrow versions (issue 26 item 7).

A list column is not a tensor: each row is served as its list (a Python list in an object
array of one entry per row). Rows of equal length used to make numpy build a 2-D array, and
``take`` / the ``Loader`` failed with "shape mismatch"; fixed, variable and nested lists, with
null rows and null elements, must all serve the rows as ingested.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.serve import write_arrow_dataset

pytestmark = pytest.mark.timeout(120)

N = 60


def _records() -> list[dict]:
    return [{
        "i": i,
        "fixed": [float(i)] * 8,  # every row the same length: the case that failed
        "var": [i] * (i % 5),  # variable length, some empty
        "nested": [[i, i + 1], [i]] if i % 3 else [[i]],
        "nulls": None if i % 7 == 0 else [None if (i + k) % 4 == 0 else float(k) for k in range(3)],
    } for i in range(N)]


def _check_rows(ds: Dataset) -> None:
    recs = _records()
    cols = ["fixed", "var", "nested", "nulls"]
    order = [5, 0, 59, 7, 14, 33]
    taken = ds.take(order)
    for name in cols:
        assert taken[name].shape == (len(order),) and taken[name].dtype == object
        assert [list(v) if v is not None else None for v in taken[name]] == [recs[i][name] for i in order]
    for i in (0, 1, 7, 42):
        row = ds[i]
        assert {c: row[c] for c in cols} == {c: recs[i][c] for c in cols}
    got = {}
    for batch in Loader(ds, batch_size=16, seed=1, rank=0, world_size=1):
        for j, i in enumerate(batch["i"].tolist()):
            got[i] = {c: batch[c][j] for c in cols}
    assert got == {r["i"]: {c: r[c] for c in cols} for r in recs}


def test_ingested_parquet_version_with_list_columns(tmp_path):
    store = open_store(str(tmp_path / "s"))
    with Ingestor(store, "lists", config=IngestConfig(wal_dir=str(tmp_path / "w"), shard_bytes=2048)) as ing:
        recs = _records()
        for k in range(0, N, 10):
            ing.write(recs[k:k + 10])
        version = ing.commit()
    assert version.layout == "parquet" and len(version.shards) > 1
    _check_rows(Dataset(store, version.id, cache_dir=tmp_path / "hot"))


def test_parquet_directory_with_list_columns(tmp_path):
    root = tmp_path / "pq"
    os.makedirs(root)
    table = pa.Table.from_pylist(_records())
    pq.write_table(table.slice(0, 25), root / "a.parquet", row_group_size=10)
    pq.write_table(table.slice(25), root / "b.parquet", row_group_size=10)
    _check_rows(Dataset.open(str(root), cache_dir=tmp_path / "hot"))


def test_arrow_version_with_list_columns(tmp_path):
    store = open_store(str(tmp_path / "s"))
    write_arrow_dataset(store, "lists", pa.Table.from_pylist(_records()), 20)
    _check_rows(Dataset(store, "lists@1", cache_dir=tmp_path / "hot"))


def test_fixed_size_list_rows_stay_tensors(tmp_path):
    """What is a tensor still is one: a fixed_size_list column serves (rows, width) arrays."""
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    table = pa.table({"i": np.arange(N), "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4)})
    root = tmp_path / "pq"
    os.makedirs(root)
    pq.write_table(table, root / "a.parquet")
    ds = Dataset.open(str(root), cache_dir=tmp_path / "hot")
    assert np.array_equal(ds.take([3, 1])["x"], x[[3, 1]])
