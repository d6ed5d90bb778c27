"""A Lance dataset served as it is (data.lance_layout, serve.lancedir): map-style rows, the
Loader with resume on another world size, from a local folder and from S3, in a Mixture."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from trainstore import open_store
from trainstore.data import Dataset, Loader, Mixture, lance_layout
from trainstore.data.lance_layout import LANCE
from trainstore.data.serve import write_arrow_dataset
from trainstore.errors import ConfigError

lance = pytest.importorskip("lance")
pytestmark = pytest.mark.timeout(180)


def write_lance(path, n=100, base=0, rows_per_file=40):
    idx = np.arange(n, dtype=np.int64) + base
    x = pa.FixedSizeListArray.from_arrays(pa.array((idx[:, None] * 10 + np.arange(3)).astype(np.float32).ravel()), 3)
    lance.write_dataset(pa.table({"idx": idx, "x": x, "text": [f"doc {i}" for i in idx]}), str(path),
                        max_rows_per_file=rows_per_file)


def ids(loader, stop=None):
    out = []
    for b in loader:
        assert np.array_equal(b["x"][:, 0], b["idx"] * 10)
        out.append(b["idx"].copy())
        if stop is not None and len(out) == stop:
            break
    return out


def test_a_random_take_reads_rows_not_whole_files(tmp_path, monkeypatch):
    """Lance has no zero-copy mapping: serving it by opening whole files decoded every fragment a
    batch touched, again whenever the open budget had closed it. Takes read only their rows."""
    write_lance(tmp_path / "ds", n=200, rows_per_file=20)
    whole = []
    real = lance_layout._LanceFile._all
    monkeypatch.setattr(lance_layout._LanceFile, "_all", lambda self: (whole.append(1), real(self))[1])
    ds = Dataset.open(str(tmp_path / "ds"), cache_dir=tmp_path / "hot")
    rng = np.random.default_rng(0)
    for _ in range(5):
        rows = rng.integers(0, 200, 32)
        got = ds.take(rows)
        assert got["idx"].tolist() == rows.tolist() and np.array_equal(got["x"][:, 0], rows * 10)
    assert ds[123]["text"] == "doc 123"
    assert whole == []


def test_lance_dataset_served_and_resumed_on_another_world_size(tmp_path):
    write_lance(tmp_path / "ds")
    ds = Dataset.open(str(tmp_path / "ds"), cache_dir=tmp_path / "hot")
    assert ds.version.layout == "lance" and len(ds) == 100 and len(ds.shards) == 3
    assert ds[57]["idx"] == 57 and ds[57]["text"] == "doc 57" and ds[57]["x"].tolist() == [570, 571, 572]
    assert ds.take([99, 3, 41])["idx"].tolist() == [99, 3, 41]
    seen, states = [], []
    for r in range(2):
        lo = Loader(ds, 6, seed=3, rank=r, world_size=2)
        seen += ids(lo, 4)
        states.append(json.loads(json.dumps(lo.state_dict())))
    for r in range(3):
        lo = Loader(ds, 6, seed=3, rank=r, world_size=3)
        lo.load_state_dict(states[0])
        seen += ids(lo)
    got = np.concatenate(seen)
    assert set(got.tolist()) == set(range(100)) and len(got) == 100 + (-(-52 // 3) * 3 - 52)


def test_lance_from_s3_and_in_a_mixture(s3_url, tmp_path):
    url, opts = s3_url
    write_lance(tmp_path / "local", n=60, base=5000, rows_per_file=25)
    store = open_store(url + "/lance", **opts)
    for root, _dirs, files in os.walk(tmp_path / "local"):
        for f in files:
            full = os.path.join(root, f)
            with open(full, "rb") as fh:
                store.put(os.path.relpath(full, tmp_path / "local").replace(os.sep, "/"), fh.read())
    remote = Dataset.open(url + "/lance", cache_dir=tmp_path / "hot", **opts)
    assert remote.version.layout == "lance" and len(remote) == 60
    arrow_store = open_store(str(tmp_path / "durable"))
    idx = np.arange(40, dtype=np.int64)
    write_arrow_dataset(arrow_store, "web", {"idx": idx, "x": (idx[:, None] * 10 + np.arange(3)).astype(np.float32)},
                        10)
    web = Dataset(arrow_store, "web@1", cache_dir=tmp_path / "hot")

    def make():
        return Mixture({"web": web, "lance": remote}, {"web": 0.5, "lance": 0.5}, seed=1)

    straight = np.concatenate(ids(Loader(make(), 5, world_size=1, rank=0)))
    first = ids(Loader(make(), 5, world_size=1, rank=0), 6)
    lo = Loader(make(), 5, world_size=1, rank=0)
    ids(lo, 6)
    state = lo.state_dict()
    rest = []
    for r in range(2):
        again = Loader(make(), 5, world_size=2, rank=r)
        again.load_state_dict(state)
        rest.append(ids(again))
    got = np.concatenate(first + [x for step in zip(*rest) for x in step])
    assert np.array_equal(got, straight)
    lance_ids = got[got >= 5000]  # 50 of its 60 rows this epoch, each once
    assert len(lance_ids) == 50 and len(set(lance_ids.tolist())) == 50


def test_lance_with_deleted_rows_or_split_columns_is_refused(tmp_path):
    write_lance(tmp_path / "del")
    lance.dataset(str(tmp_path / "del")).delete("idx < 5")
    with pytest.raises(ConfigError, match="fragment 0 has deleted rows"):
        Dataset.open(str(tmp_path / "del"), cache_dir=tmp_path / "hot")
    write_lance(tmp_path / "split")
    lance.dataset(str(tmp_path / "split")).add_columns({"y": "idx * 2"})
    with pytest.raises(ConfigError, match="spreads its columns over 2 data files"):
        Dataset.open(str(tmp_path / "split"), cache_dir=tmp_path / "hot")


def test_lance_file_take_keeps_the_order_asked(tmp_path):
    write_lance(tmp_path / "ds", n=40, rows_per_file=40)
    data = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "ds" / "data") for f in fs if f.endswith(".lance")]
    f = LANCE.open(data[0])
    assert f.take([31, 2, 17, 2]).column("idx").to_pylist() == [31, 2, 17, 2]
