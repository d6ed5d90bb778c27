"""External data changed under the node cache (issue 26 item 4).

A file trainstore did not write can be rewritten in place by its owner. The node cache must
tell one content of an external key from another by what the store reports (ETag, or the
local store's mtime/size/inode tag), not by size alone: a new ``Dataset.open`` (here in a new
process, the way a new job sees it) refills, and a dataset opened before the change raises
``IntegrityError`` naming the file instead of mixing the old footer with new bytes.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.errors import IntegrityError
from trainstore.nodecache import NodeCache, source_tag

pytestmark = pytest.mark.timeout(120)

ROWS = 50


def _parquet(start: int) -> bytes:
    """A Parquet file whose size does not depend on ``start`` (plain, uncompressed, no stats)."""
    values = np.arange(start, start + ROWS, dtype=np.int64)
    table = pa.table({"i": values, "f": values.astype(np.float64) / 2})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="none", use_dictionary=False, write_statistics=False,
                   row_group_size=20)
    return sink.getvalue().to_pybytes()


def _stream(start: int) -> bytes:
    """An Arrow IPC stream (a Hugging Face ``datasets`` data file) of a size independent of ``start``."""
    table = pa.table({"i": np.arange(start, start + ROWS, dtype=np.int64)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


class _Source:
    """External data on a local directory or an S3 bucket, rewritten in place."""

    def __init__(self, kind: str, tmp_path, s3_url) -> None:
        if kind == "local":
            self.url, self.opts = str(tmp_path / "ext"), {}
            os.makedirs(self.url)
        else:
            url, self.opts = s3_url
            self.url = f"{url}/ext"
        self.kind = kind
        self.store = open_store(self.url, **self.opts)

    def write(self, key: str, data: bytes) -> None:
        if self.kind == "local":  # the owner's tool rewrites the file in place: same inode
            path = os.path.join(self.url, key)
            mode = "r+b" if os.path.exists(path) else "wb"
            with open(path, mode) as f:
                f.write(data)
        else:
            self.store.put(key, data)

    def open(self, cache_dir) -> Dataset:
        return Dataset.open(self.url, cache_dir=cache_dir, **self.opts)


@pytest.fixture(params=["local", "s3"])
def source(request, tmp_path):
    s3_url = request.getfixturevalue("s3_url") if request.param == "s3" else None
    return _Source(request.param, tmp_path, s3_url)


def _parquet_source(source: _Source) -> None:
    source.write("a.parquet", _parquet(0))
    source.write("b.parquet", _parquet(1000))


def _served(url: str, opts: dict, cache_dir: str, out) -> None:
    """Child process: every row of a fresh ``Dataset.open``, through the Loader and ``take``."""
    try:
        ds = Dataset.open(url, cache_dir=cache_dir, **opts)
        loaded = sorted(int(i) for b in Loader(ds, batch_size=16, seed=0, rank=0, world_size=1) for i in b["i"])
        out.put((loaded, ds.take(np.arange(len(ds)))["i"].tolist()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(repr(exc))


def _in_new_process(source: _Source, cache_dir: str):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_served, args=(source.url, source.opts, cache_dir, out))
    child.start()
    try:
        got = out.get(timeout=90)
    finally:
        child.join(30)
    assert not isinstance(got, str), got
    return got


def test_parquet_rewritten_in_place_is_refilled_in_a_new_process(source, tmp_path):
    _parquet_source(source)
    cache_dir = str(tmp_path / "hot")
    ds = source.open(cache_dir)
    assert ds.take(np.arange(len(ds)))["i"].tolist() == [*range(ROWS), *range(1000, 1000 + ROWS)]
    assert ds.cache.contains("a.parquet", tag=ds.source_tag(0))  # filled: the stale copy to avoid
    ds.close()
    new = _parquet(500)
    assert len(new) == len(_parquet(0))  # same size: a size check cannot see the change
    source.write("a.parquet", new)
    loaded, taken = _in_new_process(source, cache_dir)
    expect = [*range(500, 500 + ROWS), *range(1000, 1000 + ROWS)]
    assert taken == expect and loaded == expect


def test_parquet_changed_under_an_open_dataset_raises_naming_it(source, tmp_path):
    _parquet_source(source)
    ds = source.open(str(tmp_path / "hot"))
    source.write("a.parquet", _parquet(500))
    with pytest.raises(IntegrityError, match=r"a\.parquet.*changed"):
        ds.take([0, 1])  # whole-file fill of the node cache
    with pytest.raises(IntegrityError, match=r"a\.parquet.*changed"):
        ds[3]  # row groups by byte ranges
    with pytest.raises(IntegrityError, match=r"a\.parquet.*changed"):
        list(Loader(ds, batch_size=16, rank=0, world_size=1))
    assert ds.take([ROWS])["i"].tolist() == [1000]  # the file that did not change still serves
    assert not ds.cache.contains("a.parquet", tag=ds.source_tag(0))  # nothing half-checked was kept


def _hf_source(source: _Source) -> None:
    files = [f"data-0000{k}-of-00002.arrow" for k in range(2)]
    for k, name in enumerate(files):
        source.write(name, _stream(1000 * k))
    source.write("state.json", json.dumps({"_data_files": [{"filename": f} for f in files]}).encode())


def test_hugging_face_file_rewritten_in_place_is_refilled(source, tmp_path):
    _hf_source(source)
    cache_dir = str(tmp_path / "hot")
    ds = source.open(cache_dir)
    assert ds.take(np.arange(len(ds)))["i"].tolist() == [*range(ROWS), *range(1000, 1000 + ROWS)]
    ds.close()
    new = _stream(500)
    assert len(new) == len(_stream(0))
    source.write("data-00000-of-00002.arrow", new)
    loaded, taken = _in_new_process(source, cache_dir)
    assert taken == loaded == [*range(500, 500 + ROWS), *range(1000, 1000 + ROWS)]


def test_hugging_face_file_changed_under_an_open_dataset_raises(source, tmp_path):
    _hf_source(source)
    cache_dir = str(tmp_path / "hot")
    ds = source.open(cache_dir)
    ds.cache.clear()  # describing the folder read every file through the cache: start cold
    source.write("data-00001-of-00002.arrow", _stream(7))
    with pytest.raises(IntegrityError, match=r"data-00001-of-00002\.arrow.*changed"):
        ds.take([ROWS])


def test_node_cache_keeps_one_copy_per_content(tmp_path):
    """The mechanism under the tests above: a tagged pin is a copy of that content only."""
    store = open_store(str(tmp_path / "ext"))
    store.put("d/x.bin", b"a" * 1000)
    cache = NodeCache(store, tmp_path / "hot", limit_bytes=1 << 20)
    old = source_tag(store.head("d/x.bin"))
    assert cache.get("d/x.bin", size=1000, tag=old) == b"a" * 1000
    with open(store.local_path("d/x.bin"), "r+b") as f:
        f.write(b"b" * 1000)
    new = source_tag(store.head("d/x.bin"))
    assert new != old
    with pytest.raises(IntegrityError, match=r"d/x\.bin changed since it was listed"):
        cache.get("d/x.bin", size=1000, tag="etag:something-else")  # the store holds neither
    assert cache.get("d/x.bin", size=1000, tag=old) == b"a" * 1000  # a copy of that content: a hit
    assert cache.get("d/x.bin", size=1000, tag=new) == b"b" * 1000  # a miss, filled
    assert not cache.contains("d/x.bin", tag=old)  # the copy the store no longer holds is dropped
    assert cache.stats.misses == 2 and cache.stats.hits == 1
