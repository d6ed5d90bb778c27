"""Serving Parquet directly: cleaned versions, row groups by byte ranges, Parquet directories
on S3 and Hugging Face ``datasets`` folders opened as they are, corrupt files."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import require  # tests/conftest.py: optional dependencies

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.transforms import CleanConfig, clean
from trainstore.data.versions import read_shard
from trainstore.errors import IntegrityError, TrainstoreError
from trainstore.store.local import LocalStore

pytestmark = pytest.mark.timeout(120)


class CountingStore(LocalStore):
    """A local store that counts the bytes read from it."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.read = 0

    def get(self, key):
        data = super().get(key)
        self.read += len(data)
        return data

    def get_ranges(self, key, ranges):
        parts = super().get_ranges(key, ranges)
        self.read += sum(len(p) for p in parts)
        return parts


def _epoch_rows(loader, columns) -> list[tuple]:
    out = []
    for batch in loader:
        out += list(zip(*(np.asarray(batch[c]).tolist() for c in columns)))
    return out


def _table(rows: int, start: int = 0, width: int = 256, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, width)).astype(np.float32)  # incompressible: row groups keep their size
    return pa.table({
        "i": np.arange(start, start + rows, dtype=np.int64),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), width),
        "s": [f"row-{j}" for j in range(start, start + rows)],
    })


def test_cleaned_version_served_by_loader_equals_pyarrow(tmp_path):
    store = open_store(str(tmp_path / "s"))
    recs = [{"k": i % 97, "v": f"v{i}"} for i in range(300)] + [{"k": 1, "v": "v1"}] * 20
    with Ingestor(store, "raw", config=IngestConfig(wal_dir=str(tmp_path / "w"), shard_bytes=2048)) as ing:
        for i in range(0, len(recs), 16):
            ing.write(recs[i:i + 16])
        ing.commit()
    cleaned = clean(store, "raw@1", dedup="row",
                    config=CleanConfig(cache_dir=str(tmp_path / "c"), memory_limit="256MB", shard_rows=40))
    assert cleaned.layout == "parquet" and len(cleaned.shards) > 1
    expect = []
    for s in cleaned.shards:
        expect += [(r["k"], r["v"]) for r in pq.read_table(pa.BufferReader(read_shard(store, s))).to_pylist()]
    assert len(expect) == 300  # the 20 duplicates are gone
    ds = Dataset(store, cleaned.id, cache_dir=tmp_path / "hot")
    got = _epoch_rows(Loader(ds, batch_size=16, shuffle=True, seed=3), ["k", "v"])
    assert sorted(got) == sorted(expect)
    assert [(ds[i]["k"], ds[i]["v"]) for i in (0, 41, 299)] == [expect[0], expect[41], expect[299]]


def test_random_access_reads_only_the_needed_row_groups(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(_table(800), root / "a.parquet", row_group_size=100, compression="zstd")
    meta = pq.read_metadata(root / "a.parquet")
    size = os.path.getsize(root / "a.parquet")
    group_bytes = [sum(meta.row_group(g).column(c).total_compressed_size for c in range(meta.row_group(g).num_columns))
                   for g in range(meta.num_row_groups)]
    assert meta.num_row_groups == 8 and min(group_bytes) > 90_000
    store = CountingStore(str(root))
    ds = Dataset.open(store, cache_dir=tmp_path / "hot")
    after_open = store.read  # the footer (one tail read), kept for serving
    assert after_open <= 64 << 10
    row = ds[250]  # row group 2
    assert int(row["i"]) == 250 and row["s"] == "row-250"
    assert np.array_equal(row["x"], _table(800)["x"][250].values.to_numpy())
    first = store.read - after_open
    assert group_bytes[2] <= first <= group_bytes[2] + 4096
    assert int(ds[299]["i"]) == 299 and store.read - after_open == first  # same group: no new read
    batch = ds.take([710, 5, 260], ranges=True)  # groups 7 and 0 (2 is held)
    assert batch["i"].tolist() == [710, 5, 260]
    assert store.read - after_open <= group_bytes[2] + group_bytes[7] + group_bytes[0] + 3 * 4096
    assert store.read < size / 2
    assert not ds.cache.contains("a.parquet")  # row-group reads do not fill the node cache


def test_parquet_directory_on_s3_opened_without_conversion(tmp_path, s3_url):
    url, opts = s3_url
    store = open_store(url, **opts)
    parts = [_table(60, start=60 * k, width=8, seed=k) for k in range(3)]
    for k, t in enumerate(parts):
        sink = pa.BufferOutputStream()
        pq.write_table(t, sink, row_group_size=25)
        store.put(f"data/part-{k:02d}.parquet", sink.getvalue())
    store.put("data/_SUCCESS", b"")
    ds = Dataset.open(f"{url}/data", cache_dir=tmp_path / "hot", **opts)
    assert ds.version.layout == "parquet" and len(ds) == 180 and len(ds.shards) == 3
    got = _epoch_rows(Loader(ds, batch_size=32, shuffle=True, seed=1), ["i", "s"])
    assert sorted(got) == [(i, f"row-{i}") for i in range(180)]
    whole = pa.concat_tables(parts)
    rows = ds.take([179, 0, 61])
    assert np.array_equal(rows["x"], whole["x"].combine_chunks().values.to_numpy().reshape(-1, 8)[[179, 0, 61]])
    assert sorted(m.key for m in store.list("data/")) == ["data/_SUCCESS"] + [f"data/part-{k:02d}.parquet" for k in range(3)]


def test_hugging_face_datasets_folder_opened_and_served(tmp_path):
    datasets = require("datasets", install="pip install 'trainstore[hfdata]'")
    n = 120
    hf = datasets.Dataset.from_dict({
        "idx": list(range(n)),
        "emb": [[float(i), float(i) / 2, -float(i)] for i in range(n)],
        "text": [f"sample {i}" for i in range(n)],
    }).cast_column("emb", datasets.List(datasets.Value("float32"), length=3))
    hf.save_to_disk(str(tmp_path / "hf"), num_shards=3)
    ds = Dataset.open(str(tmp_path / "hf"), cache_dir=tmp_path / "hot")
    assert ds.version.layout == "arrow-stream" and len(ds) == n and len(ds.shards) == 3
    got = []
    for batch in Loader(ds, batch_size=16, shuffle=True, seed=2):
        assert batch["emb"].dtype == np.float32 and batch["emb"].shape[1:] == (3,)
        got += [(int(i), e.tolist(), t) for i, e, t in zip(batch["idx"], batch["emb"], batch["text"])]
    expect = [(r["idx"], r["emb"], r["text"]) for r in hf]
    assert sorted(got) == expect
    assert ds[77]["text"] == "sample 77" and ds[77]["emb"].tolist() == [77.0, 38.5, -77.0]


def test_corrupt_files_raise_naming_the_file(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(_table(10, width=4), root / "a.parquet")
    (root / "b.parquet").write_bytes(b"this is not parquet" * 10)
    with pytest.raises(IntegrityError, match=r"b\.parquet.*not a readable Parquet file"):
        Dataset.open(str(root), cache_dir=tmp_path / "hot")
    (root / "b.parquet").unlink()
    pq.write_table(pa.table({"other": [1, 2]}), root / "c.parquet")
    with pytest.raises(IntegrityError, match=r"c\.parquet: schema"):
        Dataset.open(str(root), cache_dir=tmp_path / "hot")
    # a file that passes the footer but whose pages are damaged: named when read
    (root / "c.parquet").unlink()
    data = bytearray((root / "a.parquet").read_bytes())
    meta = pq.read_metadata(root / "a.parquet")
    col = meta.row_group(0).column(0)
    data[col.data_page_offset:col.data_page_offset + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    (root / "a.parquet").write_bytes(bytes(data))
    ds = Dataset.open(str(root), cache_dir=tmp_path / "hot2")
    with pytest.raises(TrainstoreError, match=r"a\.parquet"):
        ds[3]
    with pytest.raises(TrainstoreError, match=r"a\.parquet"):
        list(Loader(ds, batch_size=4))


def test_corrupt_hugging_face_file_raises_naming_it(tmp_path):
    datasets = require("datasets", install="pip install 'trainstore[hfdata]'")
    datasets.Dataset.from_dict({"a": list(range(40))}).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    bad = tmp_path / "hf" / "data-00001-of-00002.arrow"
    bad.write_bytes(bad.read_bytes()[:50])
    with pytest.raises(IntegrityError, match=r"data-00001-of-00002\.arrow"):
        Dataset.open(str(tmp_path / "hf"), cache_dir=tmp_path / "hot")
    (tmp_path / "hf" / "data-00000-of-00002.arrow").unlink()
    with pytest.raises(TrainstoreError, match=r"data-00000-of-00002\.arrow"):
        Dataset.open(str(tmp_path / "hf"), cache_dir=tmp_path / "hot")
