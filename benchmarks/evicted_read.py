"""How fast this machine reads and hashes files that are not in the page cache: the floor of a
node-cache fill (and so of the loader's first epoch) after ``O_DIRECT`` writes.

Writes ``--files`` x 64 MiB of random bytes (fsynced) under ``BENCH_DIR`` (default: the
repository's disk), then per round and per method evicts them (``posix_fadvise(DONTNEED)``,
benchmarks/pagecache.py) and hashes every file with BLAKE3 the way ``nodecache.files.file_hash``
does (``mmap``), optionally after a read-ahead hint, or with ``readinto`` into one buffer; "cached"
hashes them resident. Medians of interleaved rounds.

    .venv/bin/python benchmarks/evicted_read.py --rounds 3
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import tempfile
import time

import blake3
from pagecache import evict

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ("mmap", "fadvise_willneed", "madv_sequential", "madv_willneed", "readinto", "cached")


def _hash_mmap(path: str, hint: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        if hint == "fadvise_willneed":
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
            if hint == "madv_sequential":
                m.madvise(mmap.MADV_SEQUENTIAL)
            elif hint == "madv_willneed":
                m.madvise(mmap.MADV_WILLNEED)
            h.update(m)
        return h.hexdigest()
    finally:
        os.close(fd)


def _hash_readinto(path: str, buf: bytearray) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--files", type=int, default=6)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ts-evicted-read-", dir=os.environ.get("BENCH_DIR", os.path.join(HERE, "..")))
    try:
        paths = []
        for i in range(a.files):
            p = os.path.join(root, f"f{i}")
            with open(p, "wb") as f:
                f.write(os.urandom(64 << 20))
                os.fsync(f.fileno())
            paths.append(p)
        buf = bytearray(8 << 20)
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        for rnd in range(a.rounds):
            for m in METHODS[rnd % len(METHODS):] + METHODS[:rnd % len(METHODS)]:
                if m != "cached":
                    evict(paths)
                else:
                    for p in paths:
                        _hash_mmap(p, "")
                t = time.perf_counter()
                for p in paths:
                    _hash_readinto(p, buf) if m == "readinto" else _hash_mmap(p, m)
                times[m].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mib = a.files * 64
    print(f"read + BLAKE3 of {a.files} x 64 MiB; medians of {a.rounds} interleaved rounds; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for m in METHODS:
        med = statistics.median(times[m])
        print(f"  {m:<17} {med:.3f} s  {mib / 1024 / med:.2f} GiB/s  ({', '.join(f'{x:.3f}' for x in times[m])})")


if __name__ == "__main__":
    main()
