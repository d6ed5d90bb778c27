"""Shard mode: what was acknowledged is recoverable from the store alone (a new node with an
empty local directory commits it), once and in order, also with concurrent writers."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.ingest.journal import PENDING_DIR, live_shard_keys
from trainstore.data.versions import list_versions, load_version, read_shard
from trainstore.errors import SchemaError
from trainstore.store import open_store


def ids_of(store, name: str = "ds") -> list[int]:
    out: list[int] = []
    for s in load_version(store, name).shards:
        out += pq.read_table(pa.BufferReader(pa.py_buffer(read_shard(store, s)))).column("id").to_pylist()
    return out


def rows(lo: int, hi: int) -> list[dict]:
    return [{"id": i, "t": f"r{i}"} for i in range(lo, hi)]


def cfg(path, durability: str = "shard") -> IngestConfig:
    return IngestConfig(wal_dir=str(path), durability=durability, shard_bytes=2 << 10)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_new_node_with_empty_local_dir_commits_every_acknowledged_shard(tmp_path, where, request):
    if where == "s3":
        url, opts = request.getfixturevalue("s3_url")
        store = open_store(url, **opts)
    else:
        store = open_store(str(tmp_path / "s"))
    old = Ingestor(store, "ds", config=cfg(tmp_path / "node1"))
    old.write(rows(0, 100))
    old.commit()
    for lo in range(100, 1000, 150):
        old.write(rows(lo, min(lo + 150, 1000)))  # acknowledged: durable in the store
    # The node dies (no close, no commit) and its local directory is lost.
    old.wal.close()
    shutil.rmtree(tmp_path / "node1")
    with Ingestor(store, "ds", config=cfg(tmp_path / "node2")) as new:
        v = new.commit()
    assert v.rows == 1000 and ids_of(store) == list(range(1000))
    assert list(store.list(f"datasets/ds/{PENDING_DIR}/")) == []  # journal entries retired
    with Ingestor(store, "ds", config=cfg(tmp_path / "node3")) as again:
        assert again.commit().id == v.id  # nothing left to adopt, nothing doubled


def test_concurrent_writers_each_commit_every_row_once(tmp_path):
    store = open_store(str(tmp_path / "s"))
    a = Ingestor(store, "ds", config=cfg(tmp_path / "a"))
    b = Ingestor(store, "ds", config=cfg(tmp_path / "b"))
    try:
        a.write(rows(0, 100))
        b.write(rows(10_000, 10_100))
        a.write(rows(100, 200))
        b.commit()  # adopts a's acknowledged shards too
        a.write(rows(200, 300))
        a.commit()
        b.write(rows(10_100, 10_200))
        b.commit()
    finally:
        a.close()
        b.close()
    ids = ids_of(store)
    assert sorted(ids) == [*range(300), *range(10_000, 10_200)]
    assert [i for i in ids if i < 10_000] == list(range(300))  # each writer's order kept
    assert [i for i in ids if i >= 10_000] == list(range(10_000, 10_200))


def test_journal_names_live_shards_until_committed(tmp_path):
    """What a data GC must keep: shards named by a version or by a pending journal entry."""
    store = open_store(str(tmp_path / "s"))
    with Ingestor(store, "ds", config=cfg(tmp_path / "w")) as ing:
        ing.write(rows(0, 50))
        pending = {s.key for s in ing.pending_shards()}
        assert pending and pending <= live_shard_keys(store, "ds")
        entry = next(iter(store.list(f"datasets/ds/{PENDING_DIR}/")))
        assert json.loads(bytes(store.get(entry.key)))["shards"][0]["key"] in pending
        v = ing.commit()
    assert live_shard_keys(store, "ds") == {s.key for s in v.shards}


def test_failed_file_ingest_in_shard_mode_is_not_adopted_by_a_new_node(tmp_path):
    store = open_store(str(tmp_path / "s"))
    good, bad = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows(0, 500)))
    bad.write_text('{"id": 1, "t": "x"}\n{"id": "no", "t": "y"}\n')
    with Ingestor(store, "ds", config=cfg(tmp_path / "w1")) as ing:
        with pytest.raises(SchemaError):
            ing.ingest_files([str(good), str(bad)], batch_bytes=1 << 10)
    with Ingestor(store, "ds", config=cfg(tmp_path / "w2")) as ing:
        ing.write(rows(500, 510))
        ing.commit()
    assert ids_of(store) == list(range(500, 510)) and list_versions(store, "ds") == [1]
