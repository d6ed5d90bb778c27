"""Helpers of the transform resume / Ray tests: a small multi-shard dataset and its rows."""

from __future__ import annotations

import io

import blake3
import pyarrow as pa
import pyarrow.parquet as pq

from trainstore.data.versions import (
    DatasetVersion,
    ShardInfo,
    commit_version,
    read_shard,
    shards_prefix,
)
from trainstore.store import open_store

ROWS = 120
SHARDS = 4


def small_dataset(tmp_path, name="nums"):
    """Version 1 of ``name``: ``ROWS`` records ``{"id": i}`` in ``SHARDS`` Parquet shards
    (written directly, so these tests do not depend on ingest); returns the store."""
    store = open_store(str(tmp_path / "store"))
    schema = pa.schema([("id", pa.int64())])
    per = ROWS // SHARDS
    shards = []
    for i in range(SHARDS):
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": list(range(i * per, (i + 1) * per))}, schema=schema), buf)
        data = buf.getvalue()
        key = f"{shards_prefix(name)}part-{i:05d}.parquet"
        store.put(key, data)
        shards.append(ShardInfo(key, per, len(data), blake3.blake3(data).hexdigest()))
    commit_version(store, DatasetVersion(name=name, version=1, layout="parquet", schema=schema,
                                         shards=tuple(shards)))
    return store


def column(store, version, name) -> list:
    """One column of an arrow-ipc version, in shard order."""
    out = []
    for shard in version.shards:
        out += pa.ipc.open_file(pa.py_buffer(read_shard(store, shard))).read_all().column(name).to_pylist()
    return out
