"""Parquet served by row group (issue 16 item 1): the same batches as arrow-ipc, each row
group decoded once from the cached file, corrupt row groups named, remote reads by ranges."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness.counting import CountingStore

from trainstore import open_store
from trainstore.chunks import content_hash
from trainstore.data import Dataset, Loader
from trainstore.data.layouts import PARQUET, ROW_GROUP_BYTES
from trainstore.data.serve import DatasetConfig, write_arrow_dataset
from trainstore.data.serve.decodeahead import DecodeAhead
from trainstore.data.versions import ShardInfo, derive, shards_prefix
from trainstore.errors import IntegrityError

pytestmark = pytest.mark.timeout(120)

ROWS, PER_SHARD, PER_GROUP, WIDTH = 240, 60, 15, 64


def _table(rows: int = ROWS, width: int = WIDTH) -> pa.Table:
    x = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    return pa.table({
        "i": np.arange(rows, dtype=np.int64),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), width),
        "s": [f"row-{j}" for j in range(rows)],
    })


def _parquet_bytes(part: pa.Table, **options) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    pq.write_table(part, sink, row_group_size=PER_GROUP, **options)
    return sink.getvalue()


def _write_both(store, table: pa.Table, **parquet_options) -> None:
    """The same rows as version ``arr@1`` (arrow-ipc) and ``pq@1`` (parquet, 4 row groups per shard)."""
    write_arrow_dataset(store, "arr", table, PER_SHARD)
    shards = []
    for k, start in enumerate(range(0, table.num_rows, PER_SHARD)):
        buf = _parquet_bytes(table.slice(start, PER_SHARD), **parquet_options)
        key = f"{shards_prefix('pq')}{k:05d}.parquet"
        store.put(key, buf)
        shards.append(ShardInfo(key, min(PER_SHARD, table.num_rows - start), buf.size, content_hash(buf)))
    derive(store, [], "features", {}, shards, name="pq", layout=PARQUET.name, schema=table.schema, version=1)


@pytest.mark.parametrize("mode", ["block", "full"])
def test_loader_batches_identical_to_arrow_ipc(tmp_path, mode):
    store = open_store(str(tmp_path / "s"))
    _write_both(store, _table(), compression="zstd")
    loaders = [Loader(Dataset(store, ref, cache_dir=tmp_path / f"hot-{ref}"), batch_size=16, seed=5,
                      shuffle_mode=mode, block_shards=2, workers=2, prefetch=3) for ref in ("arr@1", "pq@1")]
    for _epoch in range(2):
        pairs = list(zip(*loaders, strict=True))
        assert len(pairs) == ROWS // 16
        for a, p in pairs:
            assert a.keys() == p.keys()
            for name in a:
                assert a[name].dtype == p[name].dtype and np.array_equal(a[name], p[name]), name
    arr, pqds = (ld.dataset for ld in loaders)
    idx = np.random.default_rng(1).integers(0, ROWS, 50)
    fresh = Dataset(store, "pq@1", cache_dir=tmp_path / "hot-fresh")  # nothing cached: row groups by ranges
    for got in (pqds.take(idx), fresh.take(idx, ranges=True)):
        want = arr.take(idx)
        assert all(np.array_equal(want[n], got[n]) for n in want)
    for ld in loaders:
        ld.close()


def test_each_row_group_decoded_once_from_the_cached_file(tmp_path):
    store = open_store(str(tmp_path / "s"))
    _write_both(store, _table(), compression="zstd")
    ds = Dataset(store, "pq@1", cache_dir=tmp_path / "hot")
    groups = ROWS // PER_GROUP
    loader = Loader(ds, batch_size=16, seed=2, shuffle_mode="block", block_shards=2, workers=2)
    rows = sorted(int(i) for batch in loader for i in batch["i"])
    assert rows == list(range(ROWS))
    stats = ds.row_group_stats()
    assert stats["decoded"] == groups  # block shuffle: every row group decoded exactly once
    assert stats["decoded_bytes"] <= ds.version.bytes * 2
    assert all(ds.cache.contains(s.key) for s in ds.shards)  # the Loader read whole, verified files
    for _ in loader:  # the decoded row groups fit the budget: the next epoch decodes nothing
        pass
    assert ds.row_group_stats()["decoded"] == groups
    loader.close()


def _corrupt_value_in_group(data: bytearray, meta: pq.FileMetaData, group: int, column: str) -> None:
    """Flip one byte in the middle of ``column``'s (uncompressed) values in row group ``group``:
    the page still decodes, to a wrong value, unless its CRC is checked."""
    rg = meta.row_group(group)
    col = next(rg.column(c) for c in range(rg.num_columns) if rg.column(c).path_in_schema.startswith(column))
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    mid = start + col.total_compressed_size // 2
    data[mid] ^= 0x40


def _external_file_with_corrupt_group(tmp_path, table: pa.Table) -> Path:
    """An external Parquet folder holding ``a.parquet`` (page CRCs, no compression) whose row
    group 2 has one flipped value byte in column ``x``."""
    root = tmp_path / "ext"
    root.mkdir()
    data = bytearray(_parquet_bytes(table, compression="none", write_page_checksum=True).to_pybytes())
    _corrupt_value_in_group(data, pq.read_metadata(pa.BufferReader(bytes(data))), 2, "x")
    (root / "a.parquet").write_bytes(bytes(data))
    return root


def test_corrupt_row_group_raises_naming_shard_and_row_group(tmp_path):
    table = _table(60)
    root = _external_file_with_corrupt_group(tmp_path, table)
    # an external file has no whole-file checksum: the page CRC is what catches it
    ds = Dataset.open(str(root), cache_dir=tmp_path / "hot")
    assert np.array_equal(ds[3]["x"], np.asarray(table["x"][3].values))  # row group 0 is intact
    with pytest.raises(IntegrityError, match=r"a\.parquet.*row group 2"):
        ds[2 * PER_GROUP + 1]  # by byte ranges
    ds2 = Dataset.open(str(root), cache_dir=tmp_path / "hot2")
    with pytest.raises(IntegrityError, match=r"a\.parquet.*row group 2"):
        list(Loader(ds2, batch_size=8, shuffle=False))  # from the cached file


def test_trainstore_parquet_shards_carry_page_checksums(tmp_path):
    """``PARQUET.encode`` writes page CRCs, so a range read (no whole-file hash) is verified."""
    table = _table(60)
    data = bytearray(PARQUET.encode(table, compression="none", row_group_size=PER_GROUP).to_pybytes())
    meta = pq.read_metadata(pa.BufferReader(bytes(data)))
    assert meta.num_row_groups == 60 // PER_GROUP
    # floats are not dictionary-encoded (values do not repeat), other columns are
    assert [meta.row_group(0).column(c).has_dictionary_page for c in range(3)] == [True, False, True]
    big = _table(240, width=8192)  # 7.9 MB of Arrow data: two row groups of about ROW_GROUP_BYTES
    assert big.nbytes > ROW_GROUP_BYTES and pq.read_metadata(pa.BufferReader(PARQUET.encode(big))).num_row_groups == 2
    checksum = content_hash(bytes(data))  # the manifest's: the durable copy rots after the commit
    _corrupt_value_in_group(data, meta, 1, "x")
    store = open_store(str(tmp_path / "s"))
    key = f"{shards_prefix('pq')}00000.parquet"
    store.put(key, bytes(data))
    derive(store, [], "features", {}, [ShardInfo(key, 60, len(data), checksum)], name="pq", layout=PARQUET.name,
           schema=table.schema, version=1)
    ds = Dataset(store, "pq@1", cache_dir=tmp_path / "hot")
    assert int(ds[0]["i"]) == 0
    with pytest.raises(IntegrityError, match=r"00000\.parquet.*row group 1"):
        ds[PER_GROUP + 2]  # by byte ranges: the page CRC
    with pytest.raises(IntegrityError, match=r"00000\.parquet"):
        ds.take([0])  # the whole file: its BLAKE3 when filled into the node cache


def test_trainstore_parquet_float_columns_are_byte_stream_split(tmp_path):
    """float32/float64 leaves (scalars and lists) are written ``BYTE_STREAM_SPLIT`` (smaller,
    faster to decode); float16 (DuckDB cannot read it split) and the rest are not; the values
    come back unchanged through pyarrow and through DuckDB."""
    x = np.random.default_rng(3).standard_normal((40, 16))
    table = pa.table({
        "i": np.arange(40, dtype=np.int64),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.astype(np.float32).reshape(-1)), 16),
        "d": x[:, 0],
        "l": pa.array([[list(r[:3])] for r in x], type=pa.list_(pa.list_(pa.float64()))),
        "h": x[:, 1].astype(np.float16),
    })
    buf = PARQUET.encode(table, row_group_size=PER_GROUP)
    meta = pq.read_metadata(pa.BufferReader(buf))
    group = meta.row_group(0)
    split = {group.column(c).path_in_schema: "BYTE_STREAM_SPLIT" in group.column(c).encodings
             for c in range(group.num_columns)}
    assert split == {"i": False, "x.list.element": True, "d": True, "l.list.element.list.element": True, "h": False}
    assert pq.read_table(pa.BufferReader(buf)).equals(table)
    path = tmp_path / "t.parquet"
    path.write_bytes(buf.to_pybytes())
    rows = duckdb.sql(f"select i, x[1], d, l[1][2] from read_parquet('{path}') order by i").fetchall()
    assert rows[5] == (5, float(np.float32(x[5, 0])), x[5, 0], x[5, 1])


def test_remote_read_fetches_only_the_needed_ranges(tmp_path, s3_url):
    url, opts = s3_url
    table = _table(ROWS, width=2048)  # 8 KB rows: 120 KB per row group
    _write_both(open_store(url, **opts), table, compression="zstd")
    store = CountingStore(open_store(url, **opts))
    ds = Dataset(store, "pq@1", cache_dir=tmp_path / "hot")
    before = store.bytes_read  # the manifest
    idx = [PER_SHARD + 3, PER_SHARD + 2 * PER_GROUP + 7, PER_SHARD + 4]  # shard 1, row groups 0 and 2
    got = ds.take(idx, ranges=True)
    assert got["i"].tolist() == idx and got["s"].tolist() == [f"row-{j}" for j in idx]
    assert np.array_equal(got["x"], table["x"].combine_chunks().values.to_numpy().reshape(-1, 2048)[idx])
    shard = ds.shards[1]
    meta = pq.read_metadata(pa.BufferReader(open_store(url, **opts).get(shard.key)))
    footer = meta.serialized_size + 8
    chunks = sum(meta.row_group(g).column(c).total_compressed_size
                 for g in (0, 2) for c in range(meta.row_group(g).num_columns))
    read = store.bytes_read - before
    # the footer (one tail read, at most the whole file's last 64 KB) and the two row groups
    assert chunks + footer <= read <= chunks + min(shard.bytes, 64 << 10)
    assert read < shard.bytes * 0.75
    assert not ds.cache.contains(shard.key)
    again = store.bytes_read
    ds.take([PER_SHARD + 5], ranges=True)  # row group 0 again: decoded already, nothing fetched
    assert store.bytes_read == again


def _wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_row_groups_are_decoded_ahead_of_the_consumer(tmp_path):
    """With the consumer paused after its first batch, the row groups of later block windows
    (which the batch threads, 2 batches ahead, never reach) get decoded by the decode-ahead
    threads; the rest of the epoch then decodes nothing and serves the arrow-ipc batches."""
    store = open_store(str(tmp_path / "s"))
    _write_both(store, _table(), compression="zstd")
    groups = ROWS // PER_GROUP
    loaders = [Loader(Dataset(store, ref, cache_dir=tmp_path / f"hot-{ref}"), batch_size=16, seed=3,
                      shuffle_mode="block", block_shards=2, workers=1, prefetch=1) for ref in ("arr@1", "pq@1")]
    ds = loaders[1].dataset
    arr_it, pq_it = iter(loaders[0]), iter(loaders[1])
    pairs = [(next(arr_it), next(pq_it))]
    # batches 1-2 (in the batch threads) need the first window's row groups only: the second
    # window's 8 groups can only be decoded ahead
    assert _wait_for(lambda: ds.row_group_stats()["decoded"] == groups), ds.row_group_stats()
    stats = ds.row_group_stats()
    assert stats["decoded_ahead"] >= groups // 2 and stats["evicted"] == 0
    pairs += list(zip(arr_it, pq_it, strict=True))
    assert len(pairs) == ROWS // 16
    for a, p in pairs:
        assert all(np.array_equal(a[n], p[n]) for n in a)
    assert ds.row_group_stats()["decoded"] == groups  # each once: the consumer found them decoded
    for ld in loaders:
        ld.close()


def test_decode_ahead_error_reaches_the_consumer_naming_file_and_row_group(tmp_path):
    table = _table(60)
    root = _external_file_with_corrupt_group(tmp_path, table)
    ds = Dataset.open(str(root), cache_dir=tmp_path / "hot")
    loader = Loader(ds, batch_size=8, shuffle=False, workers=1, prefetch=0)
    it = iter(loader)
    first = next(it)  # rows 0-7 (group 0); batch 1 (groups 0-1) is being assembled
    assert first["i"].tolist() == list(range(8))
    # group 2 (rows 30-44, first needed by batch 3) is reached by decode-ahead alone: it fails there
    assert _wait_for(lambda: ds.row_group_stats()["failed"] == 1), ds.row_group_stats()
    assert _wait_for(lambda: ds.row_group_stats()["decoded_ahead"] >= 1)  # group 3 all the same
    got = [first]
    with pytest.raises(IntegrityError, match=r"a\.parquet.*row group 2"):
        for batch in it:
            got.append(batch)
    assert [int(b["i"][0]) for b in got] == [0, 8, 16]  # batches before the damaged group arrived
    assert ds.row_group_stats()["failed"] == 2  # the consumer's own decode failed too: not cached
    loader.close()


def test_decode_ahead_keeps_the_groups_still_needed_within_the_budget(tmp_path):
    """Budget of 1.5 block windows of decoded groups: decoding the next window ahead stops at
    the budget until the current window's last batch is consumed, so no group is pushed out
    while still needed and each is decoded once (decoding everything at once would evict)."""
    store = open_store(str(tmp_path / "s"))
    _write_both(store, _table(), compression="zstd")
    probe = Dataset(store, "pq@1", cache_dir=tmp_path / "hot-probe")
    probe.take(np.arange(ROWS))
    group_bytes = probe.row_group_stats()["decoded_bytes"] // (ROWS // PER_GROUP)
    ds = Dataset(store, "pq@1", config=DatasetConfig(cache_dir=str(tmp_path / "hot"), max_open_bytes=12 * group_bytes))
    for s in range(len(ds.shards)):
        ds.prefetch_shard(s)
    rng = np.random.default_rng(4)
    order = np.concatenate([rng.permutation(np.arange(w, w + 2 * PER_SHARD)) for w in (0, 2 * PER_SHARD)])
    batches = [order[i:i + 16] for i in range(0, ROWS, 16)]
    ahead = DecodeAhead(ds, batches, 0, threads=2)
    ahead.start()
    try:
        # the first window (8 groups) and at most 4 of the second fit (sizes are estimated from
        # the footer before a group is decoded: a little more at first); the rest waits for
        # batch 7, the last one reading the first window, to be consumed
        assert _wait_for(lambda: ds.row_group_stats()["decoded_ahead"] >= 8), ds.row_group_stats()
        time.sleep(0.5)
        stats = ds.row_group_stats()
        assert stats["decoded"] <= 12 and stats["evicted"] == 0, stats
        for b, rows in enumerate(batches):
            assert np.array_equal(ds.take(rows)["i"], rows)
            ahead.batch_consumed(b)
            time.sleep(0.02)
    finally:
        ahead.close()
    stats = ds.row_group_stats()
    assert stats["decoded"] == ROWS // PER_GROUP, stats  # each once: nothing needed was evicted
