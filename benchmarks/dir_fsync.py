"""What a directory fsync adds to each durable chunk write on this disk.

A chunk put on a local store writes a temp file, fsyncs it, renames it into place and fsyncs
the directory (``store/local.py``); chunks fan out over 256 directories by hash prefix, so a
save of N chunks pays about N directory fsyncs. This times ``--chunks`` writes of ``--mib`` MiB
each way (file fsync only; file + directory fsync), ``--repeats`` interleaved rounds, medians.

Run: ``.venv/bin/python benchmarks/dir_fsync.py [--dir PATH] [--chunks 30] [--mib 4] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from trainstore.fileio import fsync_dir


def write_chunks(root: str, n: int, data: bytes, sync_dir: bool) -> float:
    """Seconds per chunk: temp, write, fsync, rename[, directory fsync] into one of 16 dirs."""
    t0 = time.perf_counter()
    for i in range(n):
        sub = os.path.join(root, f"{i % 16:02x}")
        os.makedirs(sub, exist_ok=True)
        path = os.path.join(sub, f"chunk{i}")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(path + ".tmp", path)
        if sync_dir:
            fsync_dir(sub)
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=".")
    ap.add_argument("--chunks", type=int, default=30)
    ap.add_argument("--mib", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    data = os.urandom(int(a.mib * (1 << 20)))
    runs: dict[str, list[float]] = {"file": [], "file+dir": []}
    base = tempfile.mkdtemp(prefix="dir-fsync-", dir=a.dir)
    try:
        for rep in range(a.repeats):
            for mode in (("file", "file+dir") if rep % 2 == 0 else ("file+dir", "file")):
                root = os.path.join(base, f"{mode}-{rep}")
                runs[mode].append(write_chunks(root, a.chunks, data, mode == "file+dir"))
                shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = {m: statistics.median(v) * 1e3 for m, v in runs.items()}
    print(f"{a.mib:g} MiB chunk, written + fsynced: {med['file']:.2f} ms; with its directory fsynced: "
          f"{med['file+dir']:.2f} ms ({med['file+dir'] / med['file']:.2f}x; runs "
          f"{[round(x * 1e3, 1) for x in runs['file']]} / {[round(x * 1e3, 1) for x in runs['file+dir']]})")


if __name__ == "__main__":
    main()
