"""Where a checkpoint's time to durable goes on a disk: trainstore's write pattern without its
CPU work, next to one plain sequential write + fsync of the same bytes (the floor).

On the H200 machine (docs/benchmarks.md, "GPU (H200)") a 4 GiB save took 10.9 s to durable
against 5.7 s for DCP, and more CPU threads did not help. This probe separates the disk's
part from the CPU's: the same bytes, already in memory, written

- ``floor``: one file, sequential buffered writes of 64 MiB, one fsync;
- ``store_direct``: ``LocalStore.put`` of ``--chunk-mib`` pieces on ``--threads`` threads
  (the default store: temp file, ``O_DIRECT`` write, fsync, rename, fsync of the directory);
- ``store_buffered``: the same with ``LocalStore(direct_io=False)`` (page-cache writes);
- ``files_direct`` / ``files_buffered``: each piece its own file, write + fsync only (no
  rename, no directory fsync): what the per-file commit costs on top;
- ``fsync_latency``: median of 50 small file creates + fsync + directory fsync, one thread.

Rounds interleave the patterns; medians. No hashing or compression anywhere: a pattern slower
than the floor here is the disk's (or the filesystem's) cost of the pattern.

    .venv/bin/python benchmarks/disk_pattern.py --gib 1 --rounds 3 [--dir /path/on/that/disk]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from trainstore.fileio import fsync_dir, write_all, write_direct
from trainstore.store.local import LocalStore

MiB = 1 << 20


def aligned(nbytes: int) -> memoryview:
    """A page-aligned, touched, random buffer (``O_DIRECT`` needs the alignment)."""
    m = mmap.mmap(-1, nbytes)
    arr = np.frombuffer(m, dtype=np.uint8)
    arr[:] = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    return memoryview(m)


def floor(d: str, piece: memoryview, n: int) -> None:
    fd = os.open(os.path.join(d, "floor.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(n):
            write_all(fd, piece)
        os.fsync(fd)
    finally:
        os.close(fd)


def store_puts(d: str, piece: memoryview, n: int, threads: int, direct: bool) -> None:
    store = LocalStore(d, direct_io=direct)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: store.put(f"chunks/{i:02x}/{i:06d}", piece), range(n)))


def plain_files(d: str, piece: memoryview, n: int, threads: int, direct: bool) -> None:
    def one(i: int) -> None:
        fd = os.open(os.path.join(d, f"{i:06d}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                     | (os.O_DIRECT if direct else 0), 0o644)
        try:
            (write_direct if direct else write_all)(fd, piece)
            os.fsync(fd)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(n)))


def fsync_latency(d: str, n: int = 50) -> float:
    times = []
    for i in range(n):
        t = time.perf_counter()
        fd = os.open(os.path.join(d, f"small{i}"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"x" * 4096)
        os.fsync(fd)
        os.close(fd)
        fsync_dir(d)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--chunk-mib", type=int, default=8, help="trainstore's WriteOptions.chunk_bytes")
    ap.add_argument("--threads", type=int, default=8, help="trainstore's WriteOptions.workers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="a folder on the disk to probe (default: a temp dir)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    piece = aligned(args.chunk_mib * MiB)
    n = max(1, int(args.gib * 1024) // args.chunk_mib)
    nbytes = n * piece.nbytes
    patterns: dict[str, Any] = {
        "floor": lambda d: floor(d, piece, n),
        "store_direct": lambda d: store_puts(d, piece, n, args.threads, True),
        "store_buffered": lambda d: store_puts(d, piece, n, args.threads, False),
        "files_direct": lambda d: plain_files(d, piece, n, args.threads, True),
        "files_buffered": lambda d: plain_files(d, piece, n, args.threads, False),
    }
    times: dict[str, list[float]] = {k: [] for k in patterns}
    lat: list[float] = []
    for r in range(args.rounds):
        order = list(patterns) if r % 2 == 0 else list(reversed(patterns))
        for name in order:
            d = tempfile.mkdtemp(prefix=f"ts-disk-{name}-", dir=args.dir)
            try:
                os.sync()
                t = time.perf_counter()
                patterns[name](d)
                times[name].append(time.perf_counter() - t)
            finally:
                shutil.rmtree(d, ignore_errors=True)
        d = tempfile.mkdtemp(prefix="ts-disk-lat-", dir=args.dir)
        try:
            lat.append(fsync_latency(d))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    fl = statistics.median(times["floor"])
    out = {"bytes": nbytes, "chunk_bytes": piece.nbytes, "threads": args.threads, "rounds": args.rounds,
           "fsync_dir_latency_ms": statistics.median(lat) * 1e3, "patterns": {}}
    print(f"{nbytes / 2**30:.2f} GiB in {n} pieces of {args.chunk_mib} MiB, {args.threads} threads, "
          f"medians of {args.rounds} interleaved rounds; small file fsync + dir fsync "
          f"{out['fsync_dir_latency_ms']:.2f} ms")
    for name, ts in times.items():
        med = statistics.median(ts)
        out["patterns"][name] = {"seconds": med, "GBps": nbytes / med / 1e9, "vs_floor": med / fl, "all": ts}
        print(f"  {name:<15} {med:7.3f} s  {nbytes / med / 1e9:6.2f} GB/s  {med / fl:5.2f}x the floor")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
