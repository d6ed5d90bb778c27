"""Durable ingest and transform throughput, against plain pyarrow in the same run.

Ingest: the same Arrow table of 1 KB and of 1 MB records is (a) written by
``pq.write_table`` (zstd level 1) + fsync of the file and its directory, and (b) ingested by
``trainstore.data.Ingestor`` into a local store (durability "wal": every write fsynced in the
WAL, shards encoded and uploaded in parallel, then ``commit``; and durability "shard").
Transform: ``byte_tokens`` (length 128) over a text dataset with 1 and 2 local workers.
Repeats are interleaved; medians are printed with ratios.

Run: .venv/bin/python benchmarks/ingest.py [--repeats 3] [--mb 64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.transforms import transform


def make_table(record_bytes: int, total_bytes: int) -> pa.Table:
    n = max(1, total_bytes // record_bytes)
    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, size=n * record_bytes, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, (n + 1) * record_bytes, record_bytes, dtype=np.int32))
    payload = pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets.buffers()[1], pa.py_buffer(blob)])
    return pa.table({"id": pa.array(np.arange(n)), "payload": payload})


def plain_parquet(table: pa.Table, root: str) -> float:
    path = os.path.join(root, "plain.parquet")
    t = time.perf_counter()
    pq.write_table(table, path, compression="zstd", compression_level=1)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    dfd = os.open(root, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    return time.perf_counter() - t


def trainstore_ingest(table: pa.Table, root: str, per_write: int, durability: str) -> tuple[float, float]:
    """(seconds until the last ``write`` returned = every record acknowledged durable,
    seconds until ``commit`` published the version)."""
    direct = {} if durability != "wal-logonly" else {"direct_bytes": None}  # default: 16 MiB writes skip the log
    cfg = IngestConfig(wal_dir=os.path.join(root, "wal"), durability=durability.removesuffix("-logonly"),
                       shard_bytes=32 << 20, **direct)
    t = time.perf_counter()
    with Ingestor(os.path.join(root, "store"), "bench", config=cfg) as ing:
        for start in range(0, table.num_rows, per_write):
            ing.write(table.slice(start, per_write))
        acked = time.perf_counter() - t
        ing.commit()
    return acked, time.perf_counter() - t


#: (record size, records per ``write``): 1 KB records in 4 MiB writes; 1 MB records in 4, 16
#: and 64 MiB writes (in "shard" mode every write ends a shard, so its size matters most).
CASES = ((1024, 4096), (1 << 20, 4), (1 << 20, 16), (1 << 20, 64))


def bench_ingest(repeats: int, total: int) -> None:
    print(f"== durable ingest, {total >> 20} MiB per run, {repeats} interleaved repeats (MB/s, median)")
    print("   acked = until the last write() returned (records durable: WAL fsynced, or shard stored);")
    print("   committed = until commit() published the dataset version (every shard uploaded)")
    print("   wal = default config (writes >= 16 MiB skip the log); wal-logonly = direct_bytes=None")
    for record_bytes, per_write in CASES:
        table = make_table(record_bytes, total)
        mb = table.nbytes / 1e6
        plain: list[float] = []
        modes = ("wal", "wal-logonly", "shard")
        acked: dict[str, list[float]] = {m: [] for m in modes}
        committed: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(repeats):
            for name in ("pyarrow", *modes):
                root = tempfile.mkdtemp(prefix="ts-bench-ingest-")
                try:
                    if name == "pyarrow":
                        plain.append(plain_parquet(table, root))
                    else:
                        a, c = trainstore_ingest(table, root, per_write, name)
                        acked[name].append(a)
                        committed[name].append(c)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
        base = mb / statistics.median(plain)
        label = ("1 KB" if record_bytes == 1024 else "1 MB") + f" records, {per_write * record_bytes >> 20} MiB per write"
        print(f"  {label}: pyarrow write_table + fsync {base:7.1f} MB/s")
        for name in modes:
            ra, rc = mb / statistics.median(acked[name]), mb / statistics.median(committed[name])
            print(f"    Ingestor {name:11s}: acked {ra:7.1f} MB/s x{ra / base:.2f}   committed {rc:7.1f} MB/s x{rc / base:.2f}")


def bench_transform(repeats: int, rows: int) -> None:
    root = tempfile.mkdtemp(prefix="ts-bench-xf-")
    try:
        store = os.path.join(root, "store")
        rng = np.random.default_rng(1)
        words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])
        text = [" ".join(rng.choice(words, size=30)) for _ in range(rows)]
        cfg = IngestConfig(wal_dir=os.path.join(root, "wal"), shard_bytes=4 << 20)
        with Ingestor(store, "text", config=cfg) as ing:
            ing.write(pa.table({"id": np.arange(rows), "text": text}))
            src = ing.commit()
        mb = sum(len(t) for t in text) / 1e6
        print(f"== transform byte_tokens(length=128), {rows:,} rows ({mb:.0f} MB text), {len(src.shards)} shards, "
              f"{repeats} interleaved repeats (median; includes worker start-up)")
        times: dict[int, list[float]] = {1: [], 2: []}
        for r in range(repeats):
            for workers in times:
                t = time.perf_counter()
                transform(store, "text", "trainstore.data.features:byte_tokens", workers=workers,
                          output=f"f{workers}-{r}", fn_kwargs={"length": 128 + r})  # new config: no resume
                times[workers].append(time.perf_counter() - t)
        for workers, ts in times.items():
            med = statistics.median(ts)
            print(f"  workers={workers}: {rows / med:10,.0f} rows/s  {mb / med:6.1f} MB/s  "
                  f"x{statistics.median(times[1]) / med:.2f} of 1 worker")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rows", type=int, default=400_000)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    bench_ingest(args.repeats, args.mb << 20)
    bench_transform(args.repeats, args.rows)


if __name__ == "__main__":
    main()
