"""Serving Parquet directly vs the same rows as arrow-ipc (issue 16 item 1).

The same samples (``idx`` int64, ``x`` float32 vectors of ``--sample-kb`` KB, random so they do
not compress) are written twice: as a ``parquet`` version (zstd, one row group per
``--row-group`` rows) and as an ``arrow-ipc`` version, into a local store and into a moto S3
bucket on 127.0.0.1. For each, the Loader (block shuffle) runs a cold epoch (empty node
cache; samples/s after the first batch, and the whole epoch's seconds), a warm epoch with no
compute (samples/s), and a warm epoch with ``--compute-ms`` of emulated compute per batch (AU =
compute / wall, first batch excluded), then a second cold epoch, with that compute (cold AU);
bytes read from the store over the first three epochs and Parquet row groups decoded
(``Dataset.row_group_stats``; ``decoded_ahead`` by the loader's decode-ahead). Also: random
access ``ds[i]`` to Parquet rows not cached (row groups fetched by byte ranges), bytes per row.

Run: ``.venv/bin/python benchmarks/loader_parquet.py`` (``--samples``, ``--sample-kb``,
``--compute-ms``, ``--decode-ahead`` threads, 0 = off; ``--json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
import warnings

import numpy as np

from trainstore import open_store
from trainstore.chunks import content_hash
from trainstore.data import Dataset, Loader
from trainstore.data.layouts import PARQUET
from trainstore.data.serve import write_arrow_dataset
from trainstore.data.serve.write import table_from_numpy
from trainstore.data.versions import ShardInfo, derive, shards_prefix
from trainstore.testing.s3server import start_s3_server

warnings.filterwarnings("ignore")
logging.getLogger("trainstore").setLevel(logging.ERROR)


def write_both(store, n: int, width: int, rows_per_shard: int, row_group: int) -> None:
    rng = np.random.default_rng(0)
    data = {"idx": np.arange(n, dtype=np.int64), "x": rng.standard_normal((n, width)).astype(np.float32)}
    write_arrow_dataset(store, "feat", data, rows_per_shard)
    table, desc = table_from_numpy(data)
    shards = []
    for i, start in enumerate(range(0, n, rows_per_shard)):
        part = table.slice(start, rows_per_shard)
        buf = PARQUET.encode(part, compression="zstd", row_group_size=row_group)
        key = f"{shards_prefix('featpq')}v000001-{i:05d}.parquet"
        store.put(key, buf)
        shards.append(ShardInfo(key, part.num_rows, buf.size, content_hash(buf)))
    derive(store, [], "features", {}, shards, name="featpq", layout=PARQUET.name, schema=table.schema,
           extra={"columns": desc}, version=1)


def epoch(loader: Loader, compute_s: float) -> tuple[float, int, float, float]:
    """(wall seconds after the first batch, samples, compute seconds, wall seconds in all)."""
    start = t0 = time.perf_counter()
    n, computed, first = 0, 0.0, True
    for batch in loader:
        if first:
            t0, first = time.perf_counter(), False
        else:
            n += len(batch["idx"])
            if compute_s:
                time.sleep(compute_s)
                computed += compute_s
    end = time.perf_counter()
    return end - t0, n, computed, end - start


def fresh_loader(store, ref: str, cache: str, batch: int, decode_ahead: int) -> tuple[Dataset, Loader]:
    """A Loader over an empty node cache (and a new process-level decoded-group cache)."""
    shutil.rmtree(cache, ignore_errors=True)
    ds = Dataset(store, ref, cache_dir=cache)
    return ds, Loader(ds, batch_size=batch, seed=0, shuffle_mode="block", workers=2, prefetch=4,
                      decode_ahead=decode_ahead)


def measure(store, ref: str, cache: str, batch: int, compute_s: float, decode_ahead: int) -> dict:
    ds, loader = fresh_loader(store, ref, cache, batch, decode_ahead)
    cold, n, _, cold_all = epoch(loader, 0.0)
    warm, n, _, _ = epoch(loader, 0.0)
    wall, _, computed, _ = epoch(loader, compute_s)
    fetched = loader.stats()["bytes_fetched"]
    groups = ds.row_group_stats()
    loader.close()
    _, cold_loader = fresh_loader(store, ref, cache, batch, decode_ahead)  # a cold epoch with compute
    cold_wall, _, cold_computed, _ = epoch(cold_loader, compute_s)
    cold_loader.close()
    return {"cold_samples_per_s": round(n / cold), "cold_epoch_s": round(cold_all, 3),
            "cold_au_at_compute": round(cold_computed / cold_wall, 3), "warm_samples_per_s": round(n / warm),
            "au_at_compute": round(computed / wall, 3), "store_mb_read_3_epochs": round(fetched / 1e6, 1),
            "row_groups_decoded": groups["decoded"], "decoded_ahead": groups["decoded_ahead"],
            "decoded_mb": round(groups["decoded_bytes"] / 1e6, 1)}


def random_access(store, cache: str, n: int, probes: int) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    ds = Dataset(store, "featpq@1", cache_dir=cache)
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    for i in rng.integers(0, n, probes):
        ds[int(i)]
    dt = time.perf_counter() - t0
    return {"rows_per_s": round(probes / dt), "fetched_mb": round(ds.row_group_stats()["fetched_bytes"] / 1e6, 2),
            "dataset_mb": round(ds.version.bytes / 1e6, 2)}


def compare_decode_ahead(a: argparse.Namespace, width: int, tmp: str) -> dict:
    """Cold epochs of the parquet version in a local store, with the emulated compute,
    decode-ahead off and on, and the arrow-ipc version for reference, interleaved
    ``--compare-decode-ahead`` times each: medians (and all values) of the cold AU and of the
    whole cold epoch's seconds with no compute."""
    store = open_store(os.path.join(tmp, "durable"))
    write_both(store, a.samples, width, a.rows_per_shard, a.row_group)
    runs: dict[str, dict[str, list[float]]] = {}
    for _ in range(a.compare_decode_ahead):
        for name, ref, threads in (("arrow-ipc", "feat@1", 0), ("parquet, decode-ahead off", "featpq@1", 0),
                                   ("parquet, decode-ahead 2", "featpq@1", 2)):
            r = runs.setdefault(name, {"cold_au_at_compute": [], "cold_epoch_s_no_compute": []})
            _, loader = fresh_loader(store, ref, os.path.join(tmp, "cache"), a.batch, threads)
            wall, _, computed, _ = epoch(loader, a.compute_ms / 1000)
            loader.close()
            r["cold_au_at_compute"].append(round(computed / wall, 3))
            _, loader = fresh_loader(store, ref, os.path.join(tmp, "cache"), a.batch, threads)
            r["cold_epoch_s_no_compute"].append(round(epoch(loader, 0.0)[3], 3))
            loader.close()
    return {name: {k: {"median": statistics.median(v), "all": v} for k, v in r.items()} for name, r in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--sample-kb", type=int, default=100)
    ap.add_argument("--rows-per-shard", type=int, default=200)
    ap.add_argument("--row-group", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--decode-ahead", type=int, default=2, help="Loader decode_ahead threads (0: off)")
    ap.add_argument("--compare-decode-ahead", type=int, default=0, metavar="N",
                    help="only: N interleaved cold epochs each with decode-ahead off / on (local store)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    width = a.sample_kb * 1024 // 4
    tmp = tempfile.mkdtemp(prefix="ts-pqbench-")
    if a.compare_decode_ahead:
        try:
            print(json.dumps(compare_decode_ahead(a, width, tmp), indent=1), flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    server = start_s3_server()
    out: dict = {"args": vars(a), "results": []}
    try:
        server.create_bucket("pqbench")
        stores = {"local": open_store(os.path.join(tmp, "durable")),
                  "s3": open_store("s3://pqbench/data", **server.options())}
        for where, store in stores.items():
            write_both(store, a.samples, width, a.rows_per_shard, a.row_group)
            for ref, layout in (("feat@1", "arrow-ipc"), ("featpq@1", "parquet")):
                r = measure(store, ref, os.path.join(tmp, "cache"), a.batch, a.compute_ms / 1000, a.decode_ahead)
                r.update(store=where, layout=layout)
                print(json.dumps(r), flush=True)
                out["results"].append(r)
            ra = random_access(store, os.path.join(tmp, "cache"), a.samples, 200)
            ra.update(store=where, layout="parquet ds[i] by row groups")
            print(json.dumps(ra), flush=True)
            out["results"].append(ra)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
