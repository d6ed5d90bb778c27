"""The shard layout registry (``data.layouts``) and ``versions.derive``, the one way a stage
commits a version."""

from __future__ import annotations

import threading

import blake3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore import open_store
from trainstore.data import get_layout, layouts, register_layout
from trainstore.data.layouts import ArrowIpcLayout, ParquetLayout
from trainstore.data.lineage import config_hash
from trainstore.data.versions import (
    DatasetVersion,
    ShardInfo,
    derive,
    list_versions,
    load_version,
    read_shard,
)
from trainstore.errors import AlreadyExistsError, ConfigError, ManifestError

TABLE = pa.table({"id": list(range(1000)), "text": [f"row {i}" for i in range(1000)]})


@pytest.mark.parametrize("name", ["parquet", "arrow-ipc"])
def test_each_layout_writes_and_reads_rows_ranges_and_bytes(tmp_path, name):
    layout = get_layout(name)
    data = layout.encode(TABLE)
    path = tmp_path / f"shard{layout.suffix}"
    path.write_bytes(data.to_pybytes())
    for source in (str(path), data):
        shard = layout.open(source)
        assert shard.num_rows == 1000 and shard.schema.equals(TABLE.schema)
        assert pa.Table.from_batches(shard.batches()).equals(TABLE)
        assert [b.num_rows for b in shard.iter_batches(300)] and \
            pa.Table.from_batches(list(shard.iter_batches(300))).equals(TABLE)
        assert max(b.num_rows for b in shard.iter_batches(300)) <= 300
        assert shard.read_rows(250, 260).column("id").to_pylist() == list(range(250, 260))
        ranges = shard.byte_ranges(0, 1000)
        assert ranges and all(0 <= off and off + n <= data.size for off, n in ranges)
        shard.close()


def test_parquet_byte_ranges_cover_only_the_row_groups_asked_for(tmp_path):
    path = tmp_path / "groups.parquet"
    pq.write_table(TABLE, path, row_group_size=100)
    shard = get_layout("parquet").open(str(path))
    meta = pq.ParquetFile(path).metadata
    third = meta.row_group(3)
    expected = sorted((third.column(c).data_page_offset if not third.column(c).has_dictionary_page
                       else third.column(c).dictionary_page_offset, third.column(c).total_compressed_size)
                      for c in range(third.num_columns))
    assert sorted(shard.byte_ranges(300, 400)) == expected
    assert len(shard.byte_ranges(250, 450)) == 3 * third.num_columns
    assert shard.read_rows(395, 405).column("id").to_pylist() == list(range(395, 405))


def test_registry_refuses_unknown_and_duplicate_names_and_takes_new_ones():
    with pytest.raises(ConfigError, match="unknown shard layout .orc.*arrow-ipc.*parquet"):
        get_layout("orc")
    with pytest.raises(ConfigError, match="already registered"):
        register_layout(ParquetLayout())

    class Renamed(ArrowIpcLayout):
        name = "test-ipc-copy"

    try:
        assert register_layout(Renamed()) is get_layout("test-ipc-copy")
    finally:
        layouts._LAYOUTS.pop("test-ipc-copy", None)


def _shard(store, name, i):
    data = get_layout("parquet").encode(TABLE.slice(i * 10, 10))
    key = f"datasets/{name}/shards/s{i}.parquet"
    store.put(key, data)
    return ShardInfo(key, 10, data.size, blake3.blake3(data).hexdigest())


def test_derive_records_lineage_and_takes_the_next_number(tmp_path):
    store = open_store(str(tmp_path / "s"))
    cfg = {"k": [1, 2], "z": "x"}
    one = derive(store, (), "ingest", cfg, [_shard(store, "a", 0)], name="a", layout="parquet",
                 schema=TABLE.schema)
    two = derive(store, (one, "other@3"), "clean", cfg, [_shard(store, "a", 1)], name="a", layout="parquet",
                 schema=TABLE.schema, extra={"n": 1})
    loaded = load_version(store, "a", 2)
    assert (one.version, two.version) == (1, 2) and loaded == two
    assert loaded.parents == ("a@1", "other@3") and loaded.operation == "clean"
    assert loaded.config == cfg and loaded.config_hash == config_hash(cfg) and loaded.extra == {"n": 1}
    assert loaded.code_version == one.code_version and loaded.created > 0
    assert read_shard(store, loaded.shards[0])
    with pytest.raises(AlreadyExistsError, match="a@2 already exists"):
        derive(store, (), "x", {}, [], name="a", layout="parquet", schema=TABLE.schema, version=2)


def test_derive_from_racing_writers_gives_each_its_own_version(tmp_path):
    store = open_store(str(tmp_path / "s"))
    made, errors = [], []

    def commit(i):
        try:
            made.append(derive(store, (), "w", {"i": i}, [], name="race", layout="parquet",
                               schema=TABLE.schema).version)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(made) == [1, 2, 3, 4, 5, 6] == list_versions(store, "race")
    assert sorted(load_version(store, "race", v).config["i"] for v in made) == list(range(6))


def test_a_manifest_naming_an_unregistered_layout_does_not_load(tmp_path):
    store = open_store(str(tmp_path / "s"))
    with pytest.raises(ConfigError, match="unknown shard layout"):
        derive(store, (), "x", {}, [], name="bad", layout="orc", schema=TABLE.schema)
    assert list_versions(store, "bad") == []
    good = derive(store, (), "x", {}, [], name="bad", layout="parquet", schema=TABLE.schema)
    manifest = {**good.to_json(), "layout": "orc"}
    with pytest.raises(ManifestError, match="unknown layout 'orc'"):
        DatasetVersion.from_json(manifest, where="bad@1")
