"""Data GC: orphaned shards go, referenced / leased / acknowledged ones stay, also under races."""

from __future__ import annotations

import json
import os
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trainstore.cli.main import app
from trainstore.data.gc import DataGcOptions, collect_garbage
from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.leases import run_lease
from trainstore.data.transforms import CleanConfig, TransformConfig, clean, transform
from trainstore.data.versions import list_datasets, list_versions, load_version, read_shard
from trainstore.errors import ManifestError
from trainstore.store import open_store

from . import fns

NOW = DataGcOptions(grace=0)


def _shard_files(root) -> dict[str, int]:
    """Every shard under ``root`` (a local store) with its size, from the file system."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(root, "datasets")):
        for f in files:
            path = os.path.join(dirpath, f)
            key = os.path.relpath(path, root).replace(os.sep, "/")
            if key.split("/")[2] == "shards":
                out[key] = os.path.getsize(path)
    return out


def _all_rows(store) -> dict[str, list[dict]]:
    """Rows of every committed version (each shard read once, checksum-verified)."""
    out, seen = {}, {}
    for name in list_datasets(store):
        for ver in list_versions(store, name):
            v = load_version(store, name, ver)
            rows = []
            for s in v.shards:
                if s.key not in seen:
                    buf = pa.py_buffer(read_shard(store, s))
                    seen[s.key] = (pq.read_table(pa.BufferReader(buf)) if v.layout == "parquet"
                                   else pa.ipc.open_file(buf).read_all()).to_pylist()
                rows += seen[s.key]
            out[v.id] = rows
    return out


def _ingest(store, name, ids, wal_dir, **cfg):
    with Ingestor(store, name, config=IngestConfig(wal_dir=str(wal_dir), **cfg)) as ing:
        for i in range(0, len(ids), 10):
            ing.write([{"id": j} for j in ids[i:i + 10]])
        return ing.commit()


def test_deletes_orphans_keeps_referenced_and_reports_bytes(tmp_path):
    root = str(tmp_path / "s")
    store = open_store(root)
    _ingest(store, "raw", list(range(50)), tmp_path / "w", shard_bytes=200)
    clean(store, "raw@1", dedup="row", config=CleanConfig(cache_dir=str(tmp_path / "c"), shard_rows=8))
    transform(store, "raw.clean@1", fns.double_id, config=TransformConfig(cache_dir=str(tmp_path / "c")))
    before = _all_rows(store)
    kept = _shard_files(root)
    # leftovers of crashed writers: a clean's shard, a transform's shard and its work marker
    store.put("datasets/raw.clean/shards/clean-0123456789ab-deadbeef-00000.parquet", b"x" * 1000)
    store.put("datasets/raw.features/shards/xf-00000000000000aa-00000.arrow", b"y" * 3000)
    store.put("datasets/raw.features/work/00000000000000aa/00000.json", b"{}")
    orphans = {k: v for k, v in _shard_files(root).items() if k not in kept}
    assert len(orphans) == 2

    dry = collect_garbage(store, NOW, dry_run=True)
    assert (dry.deleted, dry.bytes_reclaimed, dry.markers_deleted) == (2, 4000, 1)
    assert _shard_files(root).keys() == kept.keys() | orphans.keys()  # a dry run deletes nothing

    young = collect_garbage(store)  # default grace (1h): everything is too young
    assert young.deleted == 0 and young.too_young == 2

    report = collect_garbage(store, NOW)
    assert sorted(report.deleted_keys) == sorted(orphans)
    assert report.bytes_reclaimed == sum(orphans.values()) == 4000
    assert report.markers_deleted == 1 and not store.exists("datasets/raw.features/work/00000000000000aa/00000.json")
    assert report.referenced == len(kept) and report.referenced_bytes == sum(kept.values())
    assert report.missing == 0 and report.versions == 3
    assert _shard_files(root) == kept
    assert _all_rows(store) == before
    again = collect_garbage(store, NOW)
    assert again.deleted == 0 and again.unreferenced == 0


@pytest.mark.parametrize("durability", ["wal", "shard"])
def test_acknowledged_uncommitted_ingest_shards_survive_gc(tmp_path, durability):
    store = open_store(str(tmp_path / "s"))
    wal = tmp_path / "w"
    _ingest(store, "raw", list(range(20)), wal, durability=durability, shard_bytes=100)
    # a process that wrote (acknowledged), uploaded, then went away without committing
    ing = Ingestor(store, "raw", config=IngestConfig(wal_dir=str(wal), durability=durability, shard_bytes=100))
    for i in range(20, 60, 10):
        ing.write([{"id": j} for j in range(i, i + 10)])
    ing.flush()  # every shard is uploaded; in "wal" mode the log segments are gone
    pending = {s.key for s in ing.pending_shards()}
    ing.close()
    assert pending and all(store.exists(k) for k in pending)
    report = collect_garbage(store, NOW)
    # named by the store-side ingest journal, and covered by the writer's lease
    assert report.deleted == 0 and report.pending == len(pending)
    assert all(store.exists(k) for k in pending)
    with Ingestor(store, "raw", config=IngestConfig(wal_dir=str(wal), durability=durability)) as again:
        v = again.commit()
    assert sorted(r["id"] for r in _all_rows(store)[v.id]) == list(range(60))
    # after the commit the lease no longer covers committed shards: they are just referenced
    after = collect_garbage(store, NOW)
    assert (after.pending, after.leased, after.deleted) == (0, 0, 0) and after.referenced == len(v.shards)


def test_crashed_run_lease_protects_until_it_expires(tmp_path):
    store = open_store(str(tmp_path / "s"))
    _ingest(store, "raw", list(range(10)), tmp_path / "w")
    prefix = "datasets/raw.clean/shards/clean-aaaaaaaaaaaa-00000000-"
    lease = run_lease(store, "clean", "raw.clean", [prefix]).write()
    store.put(prefix + "00000.parquet", b"z" * 10)
    lease.stop()  # the writer died: no more renewals, no drop
    assert collect_garbage(store, NOW).leased == 1 and store.exists(prefix + "00000.parquet")
    later = collect_garbage(store, NOW, now=lambda: time.time() + 2 * 86400)
    assert later.deleted == 1 and not store.exists(prefix + "00000.parquet")
    leases = [m.key.rsplit("/", 1)[-1] for m in store.list("gc/data/leases/")]
    assert [k.split("-")[0] for k in leases] == ["ingest"]  # the expired run lease was removed


def test_unreadable_manifest_stops_the_sweep(tmp_path):
    store = open_store(str(tmp_path / "s"))
    _ingest(store, "raw", list(range(10)), tmp_path / "w")
    store.put("datasets/raw/shards/orphan.parquet", b"o")
    store.put("datasets/bad/versions/000001.json", b"{not json")
    with pytest.raises(ManifestError, match="000001.json"):
        collect_garbage(store, NOW)
    assert store.exists("datasets/raw/shards/orphan.parquet")
    report = collect_garbage(store, DataGcOptions(grace=0, ignore_unreadable=True))
    assert report.deleted == 1


def test_cli_gc_dry_run_then_delete(tmp_path):
    root = str(tmp_path / "s")
    store = open_store(root)
    _ingest(store, "raw", list(range(10)), tmp_path / "w")
    store.put("datasets/raw/shards/orphan.parquet", b"o" * 7)
    runner = CliRunner()
    out = runner.invoke(app, ["data", "gc", root, "--dry-run", "--grace", "0s", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["deleted"] == 1 and store.exists("datasets/raw/shards/orphan.parquet")
    out = runner.invoke(app, ["data", "gc", root, "--grace", "0s"])
    assert out.exit_code == 0 and "deleted 1" in out.output
    assert not store.exists("datasets/raw/shards/orphan.parquet")
    assert runner.invoke(app, ["data", "gc", root, "--grace", "soon"]).exit_code == 2


# -- races -----------------------------------------------------------------------------------
def _race(tmp_path, seconds: float) -> dict:
    """GC (grace 0: only the protocol protects) runs in a loop while ingests (both modes),
    cleans and transforms run. Returns figures; asserts nothing referenced or acknowledged
    was lost."""
    store = open_store(str(tmp_path / "s"))
    cache = str(tmp_path / "cache")
    stop = threading.Event()
    errors: list[BaseException] = []
    acked: dict[str, list[int]] = {"wal": [], "shard": []}
    figures = {"rounds": 0, "deleted": 0, "cleans": 0, "transforms": 0}

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                stop.set()
        return run

    def ingest(mode):
        n = 0
        while not stop.is_set():
            with Ingestor(store, f"in-{mode}", config=IngestConfig(wal_dir=str(tmp_path / f"w-{mode}"),
                                                                   durability=mode, shard_bytes=150)) as ing:
                for _ in range(3):
                    ing.write([{"id": j} for j in range(n, n + 10)])
                    acked[mode] += range(n, n + 10)
                    n += 10
                if n % 60:  # every other session ends without a commit (the next one commits)
                    ing.commit()

    def clean_and_transform():
        k = 0
        while not stop.is_set():
            k += 1  # a crashed writer's leftover: real garbage for the sweeps to find
            store.put(f"datasets/junk/shards/orphan-{k:05d}.parquet", b"j" * 100)
            if not list_versions(store, "in-wal"):
                time.sleep(0.05)
                continue
            v = clean(store, "in-wal", dedup="row", config=CleanConfig(cache_dir=cache, shard_rows=7))
            figures["cleans"] += 1
            transform(store, v.id, fns.double_id, config=TransformConfig(cache_dir=cache, batch_rows=5))
            figures["transforms"] += 1

    def gc():
        while not stop.is_set():
            r = collect_garbage(store, DataGcOptions(grace=0, heartbeat=1.0))
            figures["rounds"] += 1
            figures["deleted"] += r.deleted
            assert r.missing == 0, r

    threads = [threading.Thread(target=guard(f)) for f in
               (lambda: ingest("wal"), lambda: ingest("shard"), clean_and_transform, gc)]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for mode in ("wal", "shard"):  # every acknowledged record is committed (after a last commit)
        with Ingestor(store, f"in-{mode}", config=IngestConfig(wal_dir=str(tmp_path / f"w-{mode}"),
                                                               durability=mode)) as ing:
            v = ing.commit()
        assert sorted(r["id"] for r in _all_rows(store)[v.id]) == sorted(acked[mode])
    rows = _all_rows(store)  # every version of every dataset reads back and verifies
    figures["versions"] = len(rows)
    final = collect_garbage(store, NOW)
    assert final.missing == 0
    figures["lost"] = final.missing
    return figures


def test_gc_races_ingest_clean_transform(tmp_path):
    f = _race(tmp_path, seconds=6.0)
    assert f["rounds"] >= 3 and f["cleans"] >= 1 and f["transforms"] >= 1, f


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_gc_races_ingest_clean_transform_long(tmp_path):
    f = _race(tmp_path, seconds=60.0)
    print(f"data gc race: {f}")
    assert f["rounds"] >= 20 and f["deleted"] > 0, f
