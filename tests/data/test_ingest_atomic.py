"""Multi-file ingest is all-or-nothing and idempotent; empty input never fixes the schema."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trainstore.cli.main import app
from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.versions import list_versions, load_version, read_shard, shards_prefix
from trainstore.errors import SchemaError
from trainstore.store import open_store

runner = CliRunner()


def ids_of(store, name: str = "ds") -> list[int]:
    out: list[int] = []
    for s in load_version(store, name).shards:
        out += pq.read_table(pa.BufferReader(pa.py_buffer(read_shard(store, s)))).column("id").to_pylist()
    return out


def write_jsonl(path, ids, bad_at: int | None = None) -> str:
    with open(path, "w") as f:
        for i in ids:
            f.write(json.dumps({"id": "oops" if i == bad_at else i, "t": f"row {i}"}) + "\n")
    return str(path)


def small(tmp_path, **kw) -> IngestConfig:
    """Small shards and batches, so the first file becomes several uploaded shards before the
    second one fails."""
    return IngestConfig(wal_dir=str(tmp_path / "wal"), shard_bytes=4 << 10, **kw)


# -- item 3: atomic multi-file ingest, idempotent retry ---------------------------------------
@pytest.mark.parametrize("durability", ["wal", "shard"])
def test_failed_multi_file_ingest_leaves_nothing_and_retry_does_not_duplicate(tmp_path, durability):
    store = open_store(str(tmp_path / "s"))
    a = write_jsonl(tmp_path / "a.jsonl", range(1000))
    b = write_jsonl(tmp_path / "b.jsonl", range(1000, 2000), bad_at=1500)
    cfg = small(tmp_path, durability=durability)
    with Ingestor(store, "ds", config=cfg) as ing:
        with pytest.raises(SchemaError, match=r"b\.jsonl:501"):
            ing.ingest_files([a, b], batch_bytes=2 << 10)
        assert ing.pending_shards() == []
    # Nothing of a survives: not pending, not in the log, not left in the store.
    assert list(store.list(shards_prefix("ds"))) == []
    write_jsonl(tmp_path / "b.jsonl", range(1000, 2000))  # fix b, retry the same command
    with Ingestor(store, "ds", config=cfg) as ing:
        assert ing.recovered_rows == 0
        assert ing.ingest_files([a, b], batch_bytes=2 << 10) == 2000
        v1 = ing.commit()
    assert v1.rows == 2000 and ids_of(store) == list(range(2000))
    assert {s.path for s in v1.sources} == {"a.jsonl", "b.jsonl"}
    assert all(len(s.blake3) == 64 for s in v1.sources)
    # A retry after success skips both files: no new rows, no new version.
    with Ingestor(store, "ds", config=cfg) as ing:
        assert ing.ingest_files([a, b]) == 0
        assert sorted(os.path.basename(p) for p, _ in ing.skipped_files) == ["a.jsonl", "b.jsonl"]
        assert ing.skipped_files[0][1] == "ds@1"
        assert ing.commit().id == "ds@1"
    assert list_versions(store, "ds") == [1]
    # The override ingests them again.
    with Ingestor(store, "ds", config=cfg) as ing:
        assert ing.ingest_files([a], allow_duplicate_files=True) == 1000
        assert ing.commit().rows == 3000
    assert ids_of(store) == [*range(2000), *range(1000)]


def test_same_content_is_skipped_while_pending_and_within_one_call(tmp_path):
    store = open_store(str(tmp_path / "s"))
    a = write_jsonl(tmp_path / "a.jsonl", range(10))
    copy = write_jsonl(tmp_path / "copy.jsonl", range(10))  # same bytes, other name
    with Ingestor(store, "ds", config=small(tmp_path)) as ing:
        assert ing.ingest_files([a, copy]) == 10
        assert ing.ingest_files(a) == 0  # acknowledged, not yet committed
        assert ing.commit().rows == 10


def test_writes_before_an_ingest_keep_their_place(tmp_path):
    store = open_store(str(tmp_path / "s"))
    a = write_jsonl(tmp_path / "a.jsonl", range(5, 10))
    with Ingestor(store, "ds", config=small(tmp_path)) as ing:
        ing.write([{"id": i, "t": f"row {i}"} for i in range(5)])
        ing.ingest_files(a)
        ing.write([{"id": i, "t": f"row {i}"} for i in range(10, 15)])
        ing.commit()
    assert ids_of(store) == list(range(15))


def test_cli_ingest_is_atomic_and_idempotent(tmp_path):
    url, wal = str(tmp_path / "s"), str(tmp_path / "wal")
    a = write_jsonl(tmp_path / "a.jsonl", range(1000))
    b = write_jsonl(tmp_path / "b_bad.jsonl", range(1000, 2000), bad_at=1999)
    cmd = ["data", "ingest", url, "ds", a, b, "--wal-dir", wal]
    res = runner.invoke(app, cmd)
    assert res.exit_code != 0 and "b_bad.jsonl:1000" in res.output, res.output
    assert list_versions(open_store(url), "ds") == []
    write_jsonl(tmp_path / "b_bad.jsonl", range(1000, 2000))
    res = runner.invoke(app, [*cmd, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["rows"] == 2000
    res = runner.invoke(app, cmd)
    assert res.exit_code == 0, res.output
    assert "skipped" in res.output and "a.jsonl" in res.output and "ds@1" in res.output
    assert ids_of(open_store(url)) == list(range(2000))
    res = runner.invoke(app, [*cmd, "--allow-duplicate-files"])
    assert res.exit_code == 0, res.output
    assert load_version(open_store(url), "ds").rows == 4000


# -- item 6: empty commits and empty files ---------------------------------------------------
def test_commit_before_any_write_does_not_fix_the_schema(tmp_path):
    store = open_store(str(tmp_path / "s"))
    with Ingestor(store, "ds", config=small(tmp_path)) as ing:
        ing.write([])
        assert ing.commit().rows == 0
    with Ingestor(store, "ds", config=small(tmp_path)) as ing:
        ing.write([{"id": 1, "t": "x"}])
        v = ing.commit()
    assert v.rows == 1 and v.schema.names == ["id", "t"]
    assert v.schema.field("id").type == pa.int64()


def test_header_only_csv_ingests_zero_rows_and_later_data_fixes_the_schema(tmp_path):
    store = open_store(str(tmp_path / "s"))
    header = tmp_path / "header.csv"
    header.write_text("id,t\n")
    full = tmp_path / "full.csv"
    full.write_text("id,t\n1,x\n2,y\n")
    with Ingestor(store, "ds", config=small(tmp_path)) as ing:
        assert ing.ingest_files(str(header)) == 0
        ing.commit()
    with Ingestor(store, "ds", config=small(tmp_path)) as ing:
        assert ing.ingest_files(str(full)) == 2
        v = ing.commit()
    assert v.schema.field("id").type == pa.int64() and ids_of(store) == [1, 2]


@pytest.mark.parametrize("name,text", [("e.jsonl", ""), ("blank.jsonl", "\n  \n"), ("e.csv", "")])
def test_empty_file_ingests_zero_rows(tmp_path, name, text):
    store = open_store(str(tmp_path / "s"))
    empty = tmp_path / name
    empty.write_text(text)
    a = write_jsonl(tmp_path / "a.jsonl", range(3))
    with Ingestor(store, "ds", config=small(tmp_path)) as ing:
        assert ing.ingest_files(str(empty)) == 0
        assert ing.ingest_files([str(empty), a]) == 3
        v = ing.commit()
    assert ids_of(store) == [0, 1, 2] and v.schema.names == ["id", "t"]
