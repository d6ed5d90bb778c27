"""The data pipeline under crashes, a flaky store and corruption.

* Ingestion: SIGKILL the ingesting process at random points (WAL durability): no
  acknowledged record lost, none duplicated, every committed version readable (a commit cut
  short leaves the previous version, never a half one); ingestion through the fault proxy.
* Loader: a corrupt hot-tier copy of a shard is named and re-fetched from the durable tier;
  a corrupt durable shard is a clear IntegrityError naming it; a full epoch through the fault
  proxy returns exactly the rows of the dataset.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness import child_env, module_command

from trainstore import open_store
from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.serve import Dataset, Loader, write_arrow_dataset
from trainstore.data.versions import list_versions, load_version, read_shard
from trainstore.errors import IntegrityError, TrainstoreError

from .conftest import record

DATASET = "events"


# -- ingestion crashes ----------------------------------------------------------------------
def _ids(store) -> Counter:
    version = load_version(store, DATASET)
    ids: Counter = Counter()
    for info in version.shards:
        table = pq.read_table(pa.BufferReader(pa.py_buffer(bytes(read_shard(store, info)))))
        ids.update(table.column("id").to_pylist())
    assert sum(ids.values()) == version.rows
    return ids


def _ingest_kill(url: str, wal: str, start: int, delay: float, env: dict,
                 after_ack: bool = False) -> tuple[set[int], int]:
    """SIGKILL an ingesting child ``delay`` s after it is READY (or, with ``after_ack``, after
    its first acknowledgement: on a loaded machine the first ACK can come later than any delay)."""
    proc = subprocess.Popen(module_command("crashkit", "ingest", url, DATASET, wal, str(start)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    def waiting() -> bool:
        if after_ack:
            return not any(line.startswith("ACK") for line in list(lines))
        return not lines

    while waiting() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    reader.join(10)
    err = proc.stderr.read()
    assert lines and lines[0].strip() == "READY", err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    acked: set[int] = set()
    commits = 0
    for line in lines:
        parts = line.split()
        if parts[0] == "ACK":
            acked.update(range(int(parts[1]), int(parts[2]) + 1))
        elif parts[0] == "COMMIT":
            commits += 1
    return acked, commits


def _ingest_trials(url: str, wal: str, trials: int, seed: int, store_options: dict | None = None) -> dict:
    rng = random.Random(seed)
    env = {**child_env(), "TRAINSTORE_CRASHKIT_STORE_OPTIONS": json.dumps(store_options or {})}
    store = open_store(url, **(store_options or {}))
    acked: set[int] = set()
    commits = 0
    for trial in range(trials):
        # every other trial kills after the first ACK, so a trial set always acknowledged something
        got, c = _ingest_kill(url, wal, trial * 10_000_000, rng.uniform(0.0, 0.8), env, after_ack=trial % 2 == 1 or trials == 1)
        acked |= got
        commits += c
        # Whatever the kill interrupted, every committed version is whole and readable.
        for v in list_versions(store, DATASET)[-2:]:
            version = load_version(store, DATASET, v)
            for info in version.shards:
                read_shard(store, info)
    with Ingestor(url, DATASET, config=IngestConfig(wal_dir=wal), **(store_options or {})) as ing:
        ing.commit()
    ids = _ids(store)
    duplicated = [i for i, c in ids.items() if c > 1]
    lost = acked - set(ids)
    assert acked, "the children acknowledged nothing"
    assert not duplicated, f"{len(duplicated)} records duplicated, e.g. {duplicated[:5]}"
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
    return {"trials": trials, "acknowledged_records": len(acked), "commits_before_kills": commits,
            "versions": len(list_versions(store, DATASET)), "lost": 0, "duplicated": 0}


@pytest.mark.timeout(300)
def test_ingest_sigkill_s3(s3_url, tmp_path):
    url, opts = s3_url
    figures = _ingest_trials(url, str(tmp_path / "wal"), trials=4, seed=1, store_options=opts)
    record("ingest_sigkill_s3", **figures)


@pytest.mark.stress
@pytest.mark.timeout(1500)
def test_ingest_sigkill_local_stress(tmp_path):
    figures = _ingest_trials(str(tmp_path / "store"), str(tmp_path / "wal"), trials=50, seed=2)
    record("ingest_sigkill_local_stress", **figures)


@pytest.mark.timeout(300)
def test_ingest_through_faults(fault_proxy, flaky_s3, tmp_path):
    url, opts = flaky_s3
    fault_proxy.configure(rate=0.1, seed=31)
    config = IngestConfig(wal_dir=str(tmp_path / "wal"), shard_bytes=16 << 10, upload_workers=2)
    written = 0
    with Ingestor(url, DATASET, config=config, **opts) as ing:
        for batch in range(30):
            ing.write([{"id": i, "payload": "x" * (i % 50)} for i in range(written, written + 100)])
            written += 100
            if batch % 10 == 9:
                ing.commit()
    fault_proxy.configure(rate=0.0)
    ids = _ids(open_store(url, **opts))
    assert sorted(ids) == list(range(written)) and max(ids.values()) == 1
    assert fault_proxy.injected > 0
    record("ingest_through_faults", records=written, requests=fault_proxy.requests, faults=fault_proxy.counts)


# -- loader ---------------------------------------------------------------------------------
def _features(store, rows: int = 2000, rows_per_shard: int = 250) -> tuple[str, dict]:
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((rows, 8), dtype=np.float32), "y": np.arange(rows, dtype=np.int64)}
    v = write_arrow_dataset(store, "feats", data, rows_per_shard=rows_per_shard)
    return v.id, data


def _epoch(loader) -> np.ndarray:
    ys = [np.asarray(b["y"]).copy() for b in loader]
    return np.concatenate(ys)


def test_corrupt_hot_copy_is_named_and_refetched(tmp_path, caplog):
    store = open_store(str(tmp_path / "durable"))
    ref, data = _features(store)
    cache = str(tmp_path / "hot")
    loader = Loader(Dataset(store, ref, cache_dir=cache), batch_size=100, seed=1)
    first = _epoch(loader)
    loader.close()
    assert sorted(first.tolist()) == list(range(len(data["y"])))
    # Flip one bit in every cached shard file.
    cached = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(cache, "objects")) for f in fs
              if f.endswith(".arrow")]
    assert len(cached) == 8, cached
    for path in cached:
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x10]))
    caplog.set_level(logging.WARNING)
    ds = Dataset(store, ref, cache_dir=cache)
    loader = Loader(ds, batch_size=100, seed=1)
    second = _epoch(loader)
    assert np.array_equal(first, second)  # same order, same rows: the copies were re-fetched
    rows = ds.take(np.arange(len(data["y"])))
    assert np.array_equal(rows["x"], data["x"]) and np.array_equal(rows["y"], data["y"])
    named = {r.getMessage().split()[3] for r in caplog.records if "corrupt" in r.getMessage()}
    assert named == {s.key for s in ds.shards}, named
    assert ds.cache.stats.refetched_corrupt >= 8  # two threads may both notice one bad copy
    loader.close()


def test_corrupt_durable_shard_is_a_clear_error(tmp_path):
    store = open_store(str(tmp_path / "durable"))
    ref, _ = _features(store)
    version = load_version(store, "feats")
    bad = version.shards[3].key
    raw = bytearray(bytes(store.get(bad)))
    raw[len(raw) // 3] ^= 0x01
    store.put(bad, bytes(raw))
    loader = Loader(Dataset(store, ref, cache_dir=str(tmp_path / "hot")), batch_size=100, seed=1)
    with pytest.raises(IntegrityError) as info:
        _epoch(loader)
    assert bad in str(info.value)
    loader.close()


@pytest.mark.timeout(300)
def test_loader_through_faults(fault_proxy, flaky_s3, tmp_path):
    url, opts = flaky_s3
    store = open_store(url, **opts)
    ref, data = _features(store, rows_per_shard=50)
    fault_proxy.configure(rate=0.1, seed=41)
    loader = Loader(Dataset(store, ref, cache_dir=str(tmp_path / "hot")), batch_size=100, seed=3)
    ys = _epoch(loader)
    loader.close()
    fault_proxy.configure(rate=0.0)
    assert sorted(ys.tolist()) == list(range(len(data["y"])))
    assert fault_proxy.injected > 0, fault_proxy.counts
    record("loader_through_faults", rows=len(ys), requests=fault_proxy.requests, faults=fault_proxy.counts)


def test_loader_outage_is_a_clear_error(fault_proxy, flaky_s3, tmp_path):
    url, opts = flaky_s3
    from trainstore.store import RetryOptions

    store = open_store(url, **opts)
    ref, _ = _features(store)
    retry = RetryOptions(max_retries=2, retry_timeout_s=3, init_backoff_s=0.05, max_backoff_s=0.2,
                         timeout_s=0.5, connect_timeout_s=0.5)
    ds = Dataset(open_store(url, **{**opts, "retry": retry}), ref, cache_dir=str(tmp_path / "hot"))
    fault_proxy.outage = "reset"
    t0 = time.monotonic()
    with pytest.raises(TrainstoreError) as info:
        _epoch(Loader(ds, batch_size=100, seed=3))
    elapsed = time.monotonic() - t0
    fault_proxy.outage = False
    assert elapsed < 20 and "datasets/feats/shards/" in str(info.value), (elapsed, info.value)
    record("loader_outage", seconds_to_error=round(elapsed, 2), error=type(info.value).__name__)
