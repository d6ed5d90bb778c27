"""Ingest commits under store faults: a failed upload is retried, never forgotten; a commit
that cannot include every acknowledged row publishes nothing; SIGKILLed shard-mode writers
whose local directory is lost are recovered from the store alone.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore import open_store
from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.versions import list_versions, load_version, read_shard
from trainstore.errors import TrainstoreError

from .conftest import FAST_RETRY, record

DATASET = "events"
CHILD_DATASET = "crash"  # what tests/data/ingest_child.py writes
CHILD = os.path.join(os.path.dirname(__file__), os.pardir, "data", "ingest_child.py")


def _ids(store, name: str = DATASET) -> list[int]:
    out: list[int] = []
    for info in load_version(store, name).shards:
        out += pq.read_table(pa.BufferReader(pa.py_buffer(bytes(read_shard(store, info))))).column("id").to_pylist()
    return out


def _rows(lo: int, hi: int) -> list[dict]:
    return [{"id": i, "payload": "x" * (i % 40)} for i in range(lo, hi)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("durability", ["wal", "shard"])
def test_upload_errors_are_retried_and_block_the_commit_until_the_store_recovers(
        fault_proxy, flaky_s3, tmp_path, durability):
    url, opts = flaky_s3
    store = open_store(url, **opts)
    config = IngestConfig(wal_dir=str(tmp_path / "wal"), durability=durability, shard_bytes=4 << 10,
                          upload_workers=2, upload_retries=2, retry_backoff_s=0.05)
    acked: list[int] = []
    with Ingestor(url, DATASET, config=config, **opts) as ing:
        ing.write(_rows(0, 100))
        acked += range(100)
        ing.commit()
        fault_proxy.outage = "reset"
        failed: list[int] = []
        for lo in range(100, 600, 100):
            try:
                ing.write(_rows(lo, lo + 100))
            except TrainstoreError:
                failed.append(lo)  # not acknowledged: the caller retries it later
                continue
            acked += range(lo, lo + 100)
        if durability == "shard":  # stored before it returns: nothing is acknowledged now
            assert len(failed) == 5
        with pytest.raises(TrainstoreError):
            ing.commit()
        fault_proxy.outage = None
        assert list_versions(store, DATASET) == [1]  # the failed commit published nothing
        for lo in failed:
            ing.write(_rows(lo, lo + 100))
            acked += range(lo, lo + 100)
        v = ing.commit()
    assert v.version == 2
    assert _ids(store) == acked  # every acknowledged row, once, in order
    record("ingest_commit_outage", durability=durability, acknowledged=len(acked), failed_writes=len(failed),
           lost=0, duplicated=0, faults=fault_proxy.counts)


# -- SIGKILLed shard-mode writers, lost local directories, a flaky store ---------------------
def _kill_one(url: str, wal: str, start: int, seed: int, delay: float, env: dict) -> set[int]:
    proc = subprocess.Popen([sys.executable, CHILD, url, wal, "shard", str(start), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while not any(x.startswith("READY") for x in list(lines)) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    reader.join(10)
    err = proc.stderr.read()
    assert any(x.startswith("READY") for x in lines), err[-3000:]
    acked: set[int] = set()
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ACK":
            acked.update(range(int(parts[1]), int(parts[2]) + 1))
    return acked


def _trials(url: str, opts: dict, tmp_path, trials: int, seed: int, fault_proxy) -> dict:
    """Each trial: a shard-mode child on a *fresh* local directory, SIGKILLed at random, its
    directory then deleted. At the end a new node commits; compare with what was acked."""
    rng = random.Random(seed)
    env = {**os.environ, "TRAINSTORE_INGEST_CHILD_STORE_OPTIONS": _options_json(opts)}
    acked: set[int] = set()
    for trial in range(trials):
        wal = str(tmp_path / f"node{trial}")
        acked |= _kill_one(url, wal, trial * 10_000_000, rng.randrange(1 << 30), rng.uniform(0.2, 1.5), env)
        shutil.rmtree(wal, ignore_errors=True)
    store = open_store(url, **opts)
    with Ingestor(store, CHILD_DATASET, config=IngestConfig(wal_dir=str(tmp_path / "final"), durability="shard")) as ing:
        for attempt in range(5):  # the store is still flaky: a commit may fail, a retry must not double
            try:
                ing.commit()
                break
            except TrainstoreError:
                if attempt == 4:
                    raise
    fault_proxy.configure(rate=0.0)
    ids = Counter(_ids(store, CHILD_DATASET))
    by_writer: dict[int, list[int]] = {}
    for i in ids:  # a Counter keeps first-seen (committed) order
        by_writer.setdefault(i // 10_000_000, []).append(i)
    order_kept = all(seq == sorted(seq) for seq in by_writer.values())
    duplicated = sum(c - 1 for c in ids.values() if c > 1)
    lost = len(acked - set(ids))
    changed = 0  # ids are the content: a changed row would show as a lost + an unknown one
    unknown = len(set(ids) - acked)
    assert acked, "the children acknowledged nothing"
    assert duplicated == 0 and lost == 0 and order_kept, (duplicated, lost, order_kept)
    return {"trials": trials, "acknowledged": len(acked), "committed": sum(ids.values()),
            "unacknowledged_committed": unknown, "lost": lost, "duplicated": duplicated, "changed": changed,
            "per_writer_order_kept": order_kept, "requests": fault_proxy.requests,
            "faults": dict(fault_proxy.counts)}


def _options_json(opts: dict) -> str:
    out = {k: v for k, v in opts.items() if k != "retry"}
    out.update(asdict(FAST_RETRY))
    return json.dumps(out)


@pytest.mark.timeout(300)
def test_sigkilled_shard_writers_on_lost_nodes_through_a_flaky_store(fault_proxy, flaky_s3, tmp_path):
    url, opts = flaky_s3
    fault_proxy.configure(rate=0.05, seed=7, faults=("500", "503", "reset"))
    figures = _trials(url, opts, tmp_path, trials=3, seed=3, fault_proxy=fault_proxy)
    record("ingest_commit_store_faults_short", **figures)


@pytest.mark.stress
@pytest.mark.timeout(1800)
def test_sigkilled_shard_writers_on_lost_nodes_through_a_flaky_store_stress(fault_proxy, flaky_s3, tmp_path):
    url, opts = flaky_s3
    fault_proxy.configure(rate=0.1, seed=11)
    figures = _trials(url, opts, tmp_path, trials=30, seed=4, fault_proxy=fault_proxy)
    record("ingest_commit_store_faults_stress", **figures)
