"""Random-access batches from a Lance dataset vs the same rows as Parquet and arrow-ipc (issue 28 item 4).

The same samples (``idx`` int64, ``x`` float32 vectors of ``--sample-kb`` KB, random) are
written three ways into one local directory: an ``arrow-ipc`` version, a folder of Parquet
files and a Lance dataset (``lance.write_dataset``), ``--rows-per-file`` rows per shard / file /
fragment; each is served by trainstore (``Dataset``, the Lance and Parquet folders through
``Dataset.open``). Measured per format, node cache warm: the time of ``ds.take`` of a random
batch of ``--batch`` rows (median of ``--reps``; the first take of each shard after a cold
open is in ``first_take_ms``), and ``Loader`` samples/s (full shuffle, no compute). Also:
Lance's own ``LanceDataset.take`` on the same folder (no trainstore), for reference.

Run: ``.venv/bin/python benchmarks/loader_lance.py`` (``--samples``, ``--sample-kb``,
``--rows-per-file``, ``--batch``, ``--reps``, ``--json``); needs the ``lance`` extra.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import warnings

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset

warnings.filterwarnings("ignore")
logging.getLogger("trainstore").setLevel(logging.ERROR)


def write_all(root: str, n: int, width: int, per_file: int) -> None:
    rng = np.random.default_rng(0)
    idx = np.arange(n, dtype=np.int64)
    x = rng.standard_normal((n, width)).astype(np.float32)
    write_arrow_dataset(open_store(f"{root}/arrow"), "feat", {"idx": idx, "x": x}, per_file)
    table = pa.table({"idx": idx, "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), width)})
    open_store(f"{root}/parquet")  # creates the folder
    for k, start in enumerate(range(0, n, per_file)):
        pq.write_table(table.slice(start, per_file), f"{root}/parquet/part-{k:05d}.parquet", row_group_size=1024)
    lance.write_dataset(table, f"{root}/lance", max_rows_per_file=per_file)


def take_ms(ds: Dataset, n: int, batch: int, reps: int) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    ds.take(rng.choice(n, batch, replace=False))  # opens (and fills) the shards it touches
    first = (time.perf_counter() - t0) * 1e3
    for s in range(len(ds.shards)):
        ds.prefetch_shard(s)
    times = []
    for _ in range(reps):
        rows = rng.choice(n, batch, replace=False)
        t0 = time.perf_counter()
        ds.take(rows)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), first


def loader_samples_per_s(ds: Dataset, batch: int) -> float:
    loader = Loader(ds, batch, world_size=1, rank=0)
    list(loader)
    t0, n = time.perf_counter(), 0
    for b in loader:
        n += len(b["idx"])
    rate = n / (time.perf_counter() - t0)
    loader.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--sample-kb", type=float, default=4.0)
    ap.add_argument("--rows-per-file", type=int, default=2_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    width = max(1, int(a.sample_kb * 1024 // 4))
    out: dict = {"samples": a.samples, "sample_kb": a.sample_kb, "rows_per_file": a.rows_per_file, "batch": a.batch}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as root:
        write_all(root, a.samples, width, a.rows_per_file)
        served = {"arrow-ipc": Dataset(f"{root}/arrow", "feat@1", cache_dir=f"{root}/hot-a"),
                  "parquet": Dataset.open(f"{root}/parquet", cache_dir=f"{root}/hot-p"),
                  "lance": Dataset.open(f"{root}/lance", cache_dir=f"{root}/hot-l")}
        for name, ds in served.items():
            med, first = take_ms(ds, a.samples, a.batch, a.reps)
            out[f"{name}_take_ms"], out[f"{name}_first_take_ms"] = med, first
            out[f"{name}_loader_samples_per_s"] = loader_samples_per_s(ds, a.batch)
            ds.close()
        own = lance.dataset(f"{root}/lance")
        rng = np.random.default_rng(2)
        times = []
        for _ in range(a.reps):
            rows = rng.choice(a.samples, a.batch, replace=False)
            t0 = time.perf_counter()
            own.take(rows)
            times.append((time.perf_counter() - t0) * 1e3)
        out["lance_own_take_ms"] = statistics.median(times)
    if a.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:36s} {v:.4g}" if isinstance(v, float) else f"{k:36s} {v}")


if __name__ == "__main__":
    main()
