"""clean (dedup, missing, quarantine) and transform (local / Ray, resumable, failures)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import require  # tests/conftest.py: optional dependencies

from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.transforms import DROP, CleanConfig, clean, transform
from trainstore.data.versions import list_versions, load_version, parse_ref, read_shard
from trainstore.errors import ConfigError, TransformError
from trainstore.store import open_store

from . import fns


def _ingest(store, name, records, wal_dir, shard_bytes=256):
    with Ingestor(store, name, config=IngestConfig(wal_dir=str(wal_dir), shard_bytes=shard_bytes)) as ing:
        for i in range(0, len(records), 7):
            ing.write(records[i:i + 7])
        return ing.commit()


def _rows(store, version) -> list[dict]:
    out = []
    for s in version.shards:
        buf = pa.py_buffer(read_shard(store, s))
        if version.layout == "parquet":
            out += pq.read_table(pa.BufferReader(buf)).to_pylist()
        else:
            out += pa.ipc.open_file(buf).read_all().to_pylist()
    return out


@pytest.fixture
def cfg(tmp_path):
    return CleanConfig(cache_dir=str(tmp_path / "cache"), memory_limit="256MB", shard_rows=4)


def test_dedup_whole_row_and_by_key_across_shards(tmp_path, cfg):
    store = open_store(str(tmp_path / "s"))
    recs = [{"k": i % 5, "v": f"v{i % 3}"} for i in range(30)]
    src = _ingest(store, "raw", recs, tmp_path / "w")
    assert len(src.shards) > 1
    by_row = clean(store, "raw@1", dedup="row", config=cfg)
    expect_row = list(dict.fromkeys((r["k"], r["v"]) for r in recs))
    assert [(r["k"], r["v"]) for r in _rows(store, by_row)] == expect_row
    by_key = clean(store, "raw@1", dedup=["k"], output="raw.bykey", config=cfg)
    assert _rows(store, by_key) == [recs[i] for i in range(5)]  # first occurrence, input order
    assert by_key.extra["duplicates"] == 25 and by_key.parents == ("raw@1",)
    assert by_key.operation == "clean" and by_key.config_hash and by_key.trainstore_version


def test_missing_values_drop_and_fill(tmp_path, cfg):
    store = open_store(str(tmp_path / "s"))
    recs = [{"a": 1, "b": "x"}, {"a": None, "b": "y"}, {"a": 3, "b": None}, {"a": None, "b": None}]
    _ingest(store, "raw", recs, tmp_path / "w")
    dropped = clean(store, "raw", missing="drop", output="d", config=cfg)
    assert _rows(store, dropped) == [{"a": 1, "b": "x"}] and dropped.extra["dropped_missing"] == 3
    filled = clean(store, "raw", missing={"a": -1, "b": "?"}, output="f", config=cfg)
    assert _rows(store, filled) == [{"a": 1, "b": "x"}, {"a": -1, "b": "y"}, {"a": 3, "b": "?"},
                                    {"a": -1, "b": "?"}]
    mixed = clean(store, "raw", missing={"a": 0, "b": DROP}, output="m", config=cfg)
    assert _rows(store, mixed) == [{"a": 1, "b": "x"}, {"a": 0, "b": "y"}]


def test_schema_enforcement_quarantines_failing_rows_with_reason(tmp_path, cfg):
    store = open_store(str(tmp_path / "s"))
    recs = [{"id": "1", "score": "0.5"}, {"id": "two", "score": "1.5"}, {"id": "3", "score": "oops"},
            {"id": None, "score": "2"}, {"id": "5", "score": None}]
    _ingest(store, "raw", recs, tmp_path / "w")
    schema = pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("score", pa.float32())])
    out = clean(store, "raw", schema=schema, config=cfg)
    assert out.schema.equals(schema)
    assert _rows(store, out) == [{"id": 1, "score": 0.5}, {"id": 5, "score": None}]
    assert out.extra["quarantined_rows"] == 3
    q = load_version(store, *parse_ref(out.extra["quarantine"]))
    qrows = _rows(store, q)
    assert [r["id"] for r in qrows] == ["two", "3", None]
    assert "id: cannot cast two to INTEGER" in qrows[0]["_reason"]
    assert "score: cannot cast oops to FLOAT" in qrows[1]["_reason"]
    assert "id: null in a non-nullable column" in qrows[2]["_reason"]
    assert all(r["_source_shard"].startswith("datasets/raw/shards/") for r in qrows)


def test_clean_rejects_unknown_columns(tmp_path, cfg):
    store = open_store(str(tmp_path / "s"))
    _ingest(store, "raw", [{"a": 1}], tmp_path / "w")
    with pytest.raises(ConfigError, match="dedup key 'zz'"):
        clean(store, "raw", dedup=["zz"], config=cfg)
    with pytest.raises(ConfigError, match="unknown column 'zz'"):
        clean(store, "raw", missing={"zz": 1}, config=cfg)


def _text_dataset(tmp_path):
    store = open_store(str(tmp_path / "s"))
    recs = [{"id": i, "text": "héllo " * (i % 7) + str(i)} for i in range(200)]
    _ingest(store, "txt", recs, tmp_path / "w", shard_bytes=2048)
    return store


def test_transform_outputs_arrow_ipc_and_is_identical_for_1_and_2_workers(tmp_path):
    store = _text_dataset(tmp_path)
    kw = {"column": "text", "length": 24, "keep": ["id"]}
    one = transform(store, "txt@1", "trainstore.data.features:byte_tokens", fn_kwargs=kw, output="a",
                    config=None, workers=1)
    two = transform(store, "txt@1", "trainstore.data.features:byte_tokens", fn_kwargs=kw, output="b", workers=2)
    assert [s.checksum for s in one.shards] == [s.checksum for s in two.shards]
    assert one.layout == "arrow-ipc" and one.rows == 200 and one.parents == ("txt@1",)
    assert one.extra["columns"]["tokens"] == {"arrow": "fixed_size_list<item: int32>[24]", "dtype": "int32",
                                              "shape": [24]}
    path = store.local_path(one.shards[0].key)
    with pa.memory_map(path) as mm:  # memory-mappable, random access, zero-copy to numpy
        reader = pa.ipc.open_file(mm)
        batch = reader.get_batch(0)
        tokens = batch.column("tokens").flatten().to_numpy(zero_copy_only=True).reshape(-1, 24)
    assert tokens[0, 0] == ord("0") + 1


def test_transform_resumes_skipping_done_shards(tmp_path):
    store = _text_dataset(tmp_path)
    first = transform(store, "txt", fns.double_id, output="x")
    assert first.extra["resumed_shards"] == 0
    # "crash": one output shard lost, one corrupted; the rest are done
    os.unlink(store.local_path(first.shards[0].key))
    with open(store.local_path(first.shards[1].key), "r+b") as f:
        f.write(b"XXXX")
    again = transform(store, "txt", fns.double_id, output="x")
    assert again.extra["resumed_shards"] == len(first.shards) - 2
    assert [s.checksum for s in again.shards] == [s.checksum for s in first.shards]
    assert [r["id2"] for r in _rows(store, again)] == [2 * i for i in range(200)]


def test_transform_fn_that_raises_names_shard_and_rows_and_publishes_nothing(tmp_path):
    store = _text_dataset(tmp_path)
    with pytest.raises(TransformError, match=r"boom_after_100 failed on shard datasets/txt/shards/\S+ rows \d+-\d+: "
                                             r"ValueError: bad id"):
        transform(store, "txt", fns.boom_after_100, output="y", config=None)
    assert list_versions(store, "y") == []


def test_transform_rejects_a_fn_that_is_not_callable_or_does_not_import(tmp_path):
    store = _text_dataset(tmp_path)
    with pytest.raises(ConfigError, match="must be callable"):
        transform(store, "txt", 42)
    with pytest.raises(ConfigError, match="does not import"):
        transform(store, "txt", "no_such_module_x:fn")


@pytest.mark.timeout(180)
def test_ray_engine_matches_local_engine(tmp_path):
    ray = require("ray", install="pip install 'trainstore[ray]'")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    store = _text_dataset(tmp_path)
    kw = {"column": "text", "length": 16}
    local = transform(store, "txt", "trainstore.data.features:byte_tokens", fn_kwargs=kw, output="loc")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = transform(store, "txt", "trainstore.data.features:byte_tokens", fn_kwargs=kw, output="ray",
                           engine="ray", workers=2)
    finally:
        ray.shutdown()
    assert remote.extra["engine"] == "ray" and remote.extra["resumed_shards"] == 0
    assert [s.checksum for s in remote.shards] == [s.checksum for s in local.shards]


@pytest.mark.timeout(120)
def test_clean_and_transform_on_s3(tmp_path, s3_url):
    url, opts = s3_url
    store = open_store(url, **opts)
    _ingest(store, "raw", [{"k": i % 3, "text": f"t{i % 3}"} for i in range(20)], tmp_path / "w")
    cleaned = clean(store, "raw", dedup="row", config=CleanConfig(cache_dir=str(tmp_path / "cache")))
    assert cleaned.rows == 3
    feats = transform(store, cleaned.id, "trainstore.data.features:byte_tokens", fn_kwargs={"length": 4},
                      config=None, workers=1)
    assert [r["n_tokens"] for r in _rows(store, feats)] == [2, 2, 2]


def test_package_exports_the_functions_even_after_their_modules_are_imported():
    """``trainstore.data.clean`` / ``.transform`` are the functions, not same-named modules."""
    import importlib

    import trainstore.data as data

    importlib.import_module("trainstore.data.transforms.cleaning")
    importlib.import_module("trainstore.data.transforms")
    importlib.import_module("trainstore.data.transforms.runner")
    assert callable(data.clean) and data.clean is clean
    assert callable(data.transform) and data.transform is transform
    from trainstore.data import Loader, clean as clean2, transform as transform2

    assert clean2 is clean and transform2 is transform and isinstance(Loader, type)
