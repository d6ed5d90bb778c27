"""Exchange-mode benchmark: object-store bytes per epoch and the exchange's cost per batch.

W gloo ranks on 127.0.0.1 pose as W nodes (one node-cache directory each, one counting view of
the S3 store each) over one arrow-ipc dataset in a moto S3 server. Per world size and mode
(``plain`` full shuffle / ``exchange`` full shuffle): object-store bytes read in the cold epoch
and the warm epoch (summed over ranks, as a multiple of the dataset), and for exchange the time
per batch spent in the exchange (all_to_all_single per column + placing rows; mean over ranks)
and the bytes each rank sent per batch. Run: ``.venv/bin/python benchmarks/loader_exchange.py``
(``--rows``, ``--row-kb``, ``--batch``, ``--worlds``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the test harness: harness.dist, harness.counting

from harness.counting import CountingStore  # noqa: E402


def rank_run(rank: int, world: int, args: dict) -> dict:
    """One rank: a cold and a warm epoch; bytes read, epoch seconds, exchange cost."""
    store = CountingStore(open_store(args["url"], **args["options"]))
    ds = Dataset(store, args["ref"], cache_dir=os.path.join(args["root"], f"node{rank}"))
    loader = Loader(ds, batch_size=args["batch"], seed=0, exchange=args["exchange"], workers=2, prefetch=4)
    out: dict = {"bytes": [], "seconds": [], "batches": []}
    for _ in range(2):
        before, t0, n = store.bytes_read, time.perf_counter(), 0
        for _batch in loader:
            n += 1
        out["seconds"].append(time.perf_counter() - t0)
        out["bytes"].append(store.bytes_read - before)
        out["batches"].append(n)
    ex = loader._exchange  # noqa: SLF001 - the benchmark reads the exchange's own counters
    if ex is not None:
        out["exchange_ms_per_batch"] = 1000 * ex.seconds / max(ex.steps, 1)
        out["sent_bytes_per_batch"] = ex.bytes_sent / max(ex.steps, 1)
    loader.close()
    return out


def main() -> None:
    from harness.dist import run_ranks  # noqa: PLC0415 - benchmark-only harness

    from trainstore.testing.s3server import start_s3_server  # noqa: PLC0415

    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--row-kb", type=int, default=100)
    p.add_argument("--rows-per-shard", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--worlds", default="2,4")
    a = p.parse_args()
    server = start_s3_server()
    try:
        bucket = "exchange-bench"
        server.create_bucket(bucket)
        url, opts = f"s3://{bucket}/ds", server.options()
        width = a.row_kb * 1024 // 4
        rng = np.random.default_rng(0)
        x = rng.standard_normal((a.rows, width), dtype=np.float32)
        version = write_arrow_dataset(open_store(url, **opts), "feat",
                                      {"idx": np.arange(a.rows), "x": x}, a.rows_per_shard)
        print(f"dataset: {a.rows} rows x {a.row_kb} KB = {version.bytes / 1e6:.1f} MB, "
              f"{len(version.shards)} shards, batch {a.batch}")
        rows = []
        for world in [int(w) for w in a.worlds.split(",")]:
            for exchange in (False, True):
                with tempfile.TemporaryDirectory() as root:
                    args = {"url": url, "options": opts, "ref": "feat@1", "root": root, "batch": a.batch,
                            "exchange": exchange}
                    res = run_ranks("loader_exchange:rank_run", world, args, pythonpath=[HERE], timeout_s=600)
                bad = [r for r in res if not r.ok]
                if bad:
                    raise SystemExit(f"rank failed: {bad[0].error}\n{bad[0].stderr}")
                vals = [r.value for r in res]
                row = {
                    "world": world, "mode": "exchange" if exchange else "plain",
                    "cold_x_dataset": round(sum(v["bytes"][0] for v in vals) / version.bytes, 3),
                    "warm_x_dataset": round(sum(v["bytes"][1] for v in vals) / version.bytes, 3),
                    "cold_epoch_s": round(max(v["seconds"][0] for v in vals), 2),
                    "warm_epoch_s": round(max(v["seconds"][1] for v in vals), 2),
                    "batches_per_epoch": vals[0]["batches"][1],
                }
                if exchange:
                    row["exchange_ms_per_batch"] = round(float(np.mean([v["exchange_ms_per_batch"] for v in vals])), 2)
                    row["sent_MB_per_batch"] = round(float(np.mean([v["sent_bytes_per_batch"] for v in vals])) / 1e6, 2)
                rows.append(row)
                print(json.dumps(row))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
