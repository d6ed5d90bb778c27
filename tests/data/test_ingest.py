"""Ingestor: inputs, schema errors, appends, replay idempotency, files, S3."""

from __future__ import annotations

import json
import os
import shutil

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.versions import load_version, read_shard
from trainstore.errors import ConfigError, NotFoundError, SchemaError
from trainstore.store import open_store


def rows_of(store, ref_name, version=None) -> list[dict]:
    v = load_version(store, ref_name, version)
    out = []
    for s in v.shards:
        out += pq.read_table(pa.BufferReader(pa.py_buffer(read_shard(store, s)))).to_pylist()
    return out


def test_write_every_input_kind_and_append_creates_child_version(tmp_path):
    store = open_store(str(tmp_path / "s"))
    cfg = IngestConfig(wal_dir=str(tmp_path / "wal"), shard_bytes=64)
    with Ingestor(store, "ds", config=cfg) as ing:
        ing.write([{"id": 1, "t": "a"}, {"id": 2, "t": "b"}])
        ing.write(pa.record_batch({"id": [3], "t": ["c"]}))
        ing.write(pa.table({"t": ["d"], "id": [4]}))  # column order does not matter
        ing.write(pd.DataFrame({"id": [5], "t": ["e"]}))
        ing.write(pl.DataFrame({"id": [6], "t": ["f"]}))
        v1 = ing.commit()
        assert v1.version == 1 and v1.rows == 6 and len(v1.shards) >= 2 and v1.parents == ()
        ing.write([{"id": 7, "t": "g"}])
        v2 = ing.commit()
    assert v2.parents == ("ds@1",) and v2.rows == 7
    assert v2.shards[: len(v1.shards)] == v1.shards
    assert [r["id"] for r in rows_of(store, "ds")] == list(range(1, 8))
    for info in v2.shards:
        read_shard(store, info)  # checksums recorded and verify


def test_schema_errors_name_record_and_field(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("t", pa.string())])
    with Ingestor(str(tmp_path / "s"), "ds", schema, config=IngestConfig(wal_dir=str(tmp_path / "w"))) as ing:
        with pytest.raises(SchemaError, match=r"record 2: field 'id' value 'x'"):
            ing.write([{"id": 1}, {"id": 2}, {"id": "x"}])
        with pytest.raises(SchemaError, match=r"record 1: field 'bogus' is not in the schema"):
            ing.write([{"id": 1}, {"id": 2, "bogus": 1}])
        with pytest.raises(SchemaError, match=r"record 0: field 'id' is missing or null"):
            ing.write([{"t": "a"}])
        with pytest.raises(SchemaError, match=r"record 1 is a int"):
            ing.write([{"id": 1}, 5])
        with pytest.raises(SchemaError, match="field 'id'"):
            ing.write(pa.table({"id": ["1", "zz"], "t": ["a", "b"]}))
        assert ing.commit().rows == 0  # nothing from the failed writes


def test_replay_after_crash_between_upload_and_segment_delete_is_idempotent(tmp_path):
    """The window a random SIGKILL rarely hits: shard uploaded (and even committed), but
    the WAL segment and journal still say it is pending. Replay must not duplicate it."""
    store, wal = str(tmp_path / "s"), str(tmp_path / "w")
    cfg = IngestConfig(wal_dir=wal)
    with Ingestor(store, "ds", config=cfg) as ing:
        ing.write([{"id": i} for i in range(10)])
        seg = [f for f in os.listdir(wal) if f.startswith("seg-")]
        assert len(seg) == 1
        shutil.copy(os.path.join(wal, seg[0]), tmp_path / "seg.copy")
        ing.flush()
        shutil.copy(os.path.join(wal, "uploaded.jsonl"), tmp_path / "journal.copy")
        ing.commit()
    shutil.copy(tmp_path / "seg.copy", os.path.join(wal, seg[0]))
    shutil.copy(tmp_path / "journal.copy", os.path.join(wal, "uploaded.jsonl"))
    with Ingestor(store, "ds", config=cfg) as ing:
        assert ing.recovered_rows == 10
        ing.write([{"id": 10}])
        v = ing.commit()
    ids = [r["id"] for r in rows_of(open_store(store), "ds")]
    assert ids == list(range(11)) and v.rows == 11


def test_unacknowledged_torn_wal_tail_is_dropped_on_replay(tmp_path):
    store, wal = str(tmp_path / "s"), str(tmp_path / "w")
    ing = Ingestor(store, "ds", config=IngestConfig(wal_dir=wal))
    ing.write([{"id": 1}])
    ing.write([{"id": 2}])
    seg = os.path.join(wal, [f for f in os.listdir(wal) if f.startswith("seg-")][0])
    ing.wal.close()  # simulate the crash: release the lock without flushing
    ing._pool.shutdown()
    with open(seg, "ab") as f:
        f.write(b"TSW1\x00\x01garbage")  # a torn frame
    with Ingestor(store, "ds", config=IngestConfig(wal_dir=wal)) as again:
        v = again.commit()
    assert [r["id"] for r in rows_of(open_store(store), "ds")] == [1, 2] and v.rows == 2


def test_ingest_files_jsonl_csv_parquet_binary(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text("\n".join(json.dumps({"id": i, "t": f"r{i}"}) for i in range(5)) + "\n")
    (src / "b.csv").write_text("id,t\n5,r5\n6,r6\n")
    pq.write_table(pa.table({"id": [7, 8], "t": ["r7", "r8"]}), src / "c.parquet")
    store = open_store(str(tmp_path / "s"))
    with Ingestor(store, "rec", config=IngestConfig(wal_dir=str(tmp_path / "w1"))) as ing:
        assert ing.ingest_files(sorted(str(p) for p in src.glob("*"))) == 9
        ing.commit()
    assert sorted(r["id"] for r in rows_of(store, "rec")) == list(range(9))
    (src / "img").mkdir()
    (src / "img" / "x.png").write_bytes(b"\x89PNG\x00\x01")
    (src / "img" / "y.bin").write_bytes(bytes(range(256)))
    with Ingestor(store, "blobs", config=IngestConfig(wal_dir=str(tmp_path / "w2"))) as ing:
        ing.ingest_files(str(src / "img" / "*"))
        ing.commit()
    got = {r["name"]: r["data"] for r in rows_of(store, "blobs")}
    assert got == {"x.png": b"\x89PNG\x00\x01", "y.bin": bytes(range(256))}


def test_bad_files_name_the_file(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"id": 1}\n{"id": 2\n')
    bad_type = tmp_path / "type.jsonl"
    bad_type.write_text('{"id": 1}\n{"id": 2}\n{"id": "three"}\n')
    bad_pq = tmp_path / "bad.parquet"
    bad_pq.write_bytes(b"PAR1 not really")
    with Ingestor(str(tmp_path / "s"), "ds", config=IngestConfig(wal_dir=str(tmp_path / "w"))) as ing:
        with pytest.raises(SchemaError, match=r"bad.jsonl:2: not valid JSON"):
            ing.ingest_files(str(bad_json))
        with pytest.raises(SchemaError, match=r"type.jsonl:3: .*'id'"):
            ing.ingest_files(str(bad_type))
        with pytest.raises(SchemaError, match=r"bad.parquet: not a readable Parquet file"):
            ing.ingest_files(str(bad_pq))
        with pytest.raises(NotFoundError, match="nope"):
            ing.ingest_files(str(tmp_path / "nope.csv"))
        with pytest.raises(NotFoundError, match="matches"):
            ing.ingest_files(str(tmp_path / "*.xyz"))


@pytest.mark.timeout(120)
def test_ingest_to_s3_with_shard_durability(tmp_path, s3_url):
    url, opts = s3_url
    cfg = IngestConfig(wal_dir=str(tmp_path / "w"), durability="shard", shard_bytes=4096, upload_workers=3)
    with Ingestor(url, "s3ds", config=cfg, **opts) as ing:
        ing.write([{"id": i, "p": "x" * 100} for i in range(300)])
        assert ing.pending_shards()  # durable before commit
        v = ing.commit()
    store = open_store(url, **opts)
    assert len(v.shards) > 3
    assert sorted(r["id"] for r in rows_of(store, "s3ds")) == list(range(300))


def test_large_write_in_wal_mode_skips_the_log_keeps_order_and_survives_a_restart(tmp_path):
    """A write of >= direct_bytes is stored as shards before it returns (no log copy); the
    logged records before it become a shard first; nothing is lost or doubled after a restart."""
    store, wal = str(tmp_path / "store"), str(tmp_path / "wal")
    cfg = IngestConfig(wal_dir=wal, direct_bytes=64 << 10, shard_bytes=1 << 20)

    def rows(lo: int, hi: int, width: int) -> pa.Table:
        return pa.table({"id": pa.array(range(lo, hi), pa.int64()), "payload": ["x" * width] * (hi - lo)})

    ing = Ingestor(store, "direct", config=cfg)
    ing.write(rows(0, 10, 8))  # small: logged
    segs = sorted(os.listdir(wal))
    ing.write(rows(10, 1010, 100))  # ~100 KB: direct
    assert ing.wal.segments() == []  # the logged records were sealed into a shard, nothing in the log
    assert [s.rows for s in ing.pending_shards()] == [10, 1000]
    ing.write(rows(1010, 1020, 8))  # small again: logged
    assert len(ing.wal.segments()) == 1
    ing.close()  # a "crash" without commit: the next Ingestor replays the log and the journal
    with Ingestor(store, "direct", config=cfg) as again:
        version = again.commit()
    ids = []
    for info in version.shards:
        ids += pq.read_table(pa.BufferReader(pa.py_buffer(read_shard(open_store(store), info)))).column("id").to_pylist()
    assert ids == list(range(1020)), "order kept, nothing lost or doubled"
    assert segs  # the first small write did go through the log


def test_direct_bytes_is_validated():
    with pytest.raises(ConfigError, match="direct_bytes"):
        IngestConfig(direct_bytes=0)
