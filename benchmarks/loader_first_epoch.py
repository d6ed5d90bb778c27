"""The loader's first epochs right after a dataset is written, with and without O_DIRECT writes.

``LocalStore`` writes large aligned objects with ``O_DIRECT`` (no page-cache copy); buffered
writes leave a just-written dataset in the page cache, so the node cache's first fills copy
from memory instead of the disk. Each measurement is a new process that writes the small
workload of benchmarks/loader.py (3,072 x 115 KB float32 samples, 64 MiB shards) with
``direct_io`` on or off, then times three epochs of a fresh ``Loader`` (batch 128, two
workers, node cache on the same disk, no compute): ms per batch, and the write's own time (ms,
until the version is committed). Variants interleave per round.

    .venv/bin/python benchmarks/loader_first_epoch.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset
from trainstore.store import LocalStore

SAMPLES, SHAPE, BATCH = 3072, (3, 98, 98), 128


def child(direct: bool, mode: str) -> dict:
    root = tempfile.mkdtemp(prefix="ts-first-epoch-")
    try:
        x = np.random.default_rng(0).standard_normal((SAMPLES, *SHAPE), dtype=np.float32)
        store = LocalStore(os.path.join(root, "durable"), direct_io=direct)
        t = time.perf_counter()
        write_arrow_dataset(store, "bench", {"x": x}, (64 << 20) // x[0].nbytes)
        write_ms = (time.perf_counter() - t) * 1000
        del x
        ds = Dataset(store, "bench@1", cache_dir=os.path.join(root, "hot"))
        loader = Loader(ds, BATCH, seed=0, shuffle_mode=mode, workers=2, prefetch=4, block_shards=2)
        out = {"write (ms)": write_ms}
        for epoch in range(3):
            t, n = time.perf_counter(), 0
            for _ in loader:
                n += 1
            out[f"epoch {epoch}"] = (time.perf_counter() - t) / n * 1000
        loader.close()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(child(args.one[0] == "direct", args.one[1])))
        return
    variants = [(io, mode) for mode in ("block", "full") for io in ("direct", "buffered")]
    runs: dict[tuple[str, str], list[dict]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for io, mode in variants:
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", io, mode],
                                 capture_output=True, text=True, check=True)
            runs[(io, mode)].append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"ms per batch, no compute; medians of {args.rounds} interleaved rounds (each a new process); "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for mode in ("block", "full"):
        med = {io: {k: statistics.median(r[k] for r in runs[(io, mode)]) for k in runs[(io, mode)][0]}
               for io in ("direct", "buffered")}
        for io in ("direct", "buffered"):
            print(f"  {mode:<6} {io:<9}" + "".join(f"{k} {v:6.1f}   " for k, v in med[io].items())
                  + "  (" + ", ".join(f"{r['epoch 0']:.1f}" for r in runs[(io, mode)]) + " in epoch 0)")
        print(f"  {mode:<6} first epoch, O_DIRECT / buffered: {med['direct']['epoch 0'] / med['buffered']['epoch 0']:.2f}x")


if __name__ == "__main__":
    main()
