"""SIGKILL the ingesting process at random points: nothing acknowledged lost, nothing doubled."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.versions import load_version, read_shard
from trainstore.store import open_store

CHILD = os.path.join(os.path.dirname(__file__), "ingest_child.py")


def _ids(store_path: str) -> Counter:
    store = open_store(store_path)
    version = load_version(store, "crash")
    ids: Counter = Counter()
    for info in version.shards:
        table = pq.read_table(pa.BufferReader(pa.py_buffer(read_shard(store, info))))
        ids.update(table.column("id").to_pylist())
    assert sum(ids.values()) == version.rows
    return ids


def _run_child(store: str, wal: str, durability: str, start: int, seed: int, kill_after: float,
               wait_for: str = "READY") -> set[int]:
    """Run one child, SIGKILL it ``kill_after`` seconds after it printed ``wait_for``
    (READY: recovered; ACK: first write acknowledged); the ids it acknowledged."""
    proc = subprocess.Popen(
        [sys.executable, CHILD, store, wal, durability, str(start), str(seed)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    acked: set[int] = set()
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 20
    while not any(x.startswith(wait_for) for x in list(lines)) and time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    time.sleep(kill_after)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(5)
    err = proc.stderr.read()
    assert "Traceback" not in err, err
    assert any(x.startswith("READY") for x in lines), f"child never became ready: {err}"
    for line in lines:
        parts = line.split()
        if parts and parts[0] == "ACK" and len(parts) == 3:
            acked.update(range(int(parts[1]), int(parts[2]) + 1))
    return acked


@pytest.mark.timeout(240)
@pytest.mark.parametrize("durability,reps", [
    ("wal", 10), ("shard", 4), ("wal-direct", 8),
    pytest.param("wal", 60, marks=pytest.mark.stress), pytest.param("shard", 20, marks=pytest.mark.stress),
])
def test_sigkill_loses_no_acknowledged_record_and_duplicates_none(tmp_path, durability, reps):
    store, wal = str(tmp_path / "store"), str(tmp_path / "wal")
    rng = random.Random(1234)
    acked: set[int] = set()
    for rep in range(reps):
        wait_for = "ACK" if rep % 2 else "READY"  # crashes during recovery and during writes
        acked |= _run_child(store, wal, durability, rep * 1_000_000, rng.randrange(1 << 30),
                            rng.uniform(0.0, 0.6), wait_for)
    assert acked, "children never acknowledged anything"
    with Ingestor(store, "crash", config=IngestConfig(wal_dir=wal, durability=durability.removesuffix("-direct"))) as ing:
        ing.commit()
    ids = _ids(store)
    duplicated = [i for i, c in ids.items() if c > 1]
    assert not duplicated, f"{len(duplicated)} records duplicated, e.g. {duplicated[:5]}"
    lost = acked - set(ids)
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
