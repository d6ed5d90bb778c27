"""First-touch copy microbenchmark: what a fresh process's first save pays to copy a state
into never-touched staging memory, per kind of destination and copy strategy.

Every measurement is a new process (``--one VARIANT``) that fills a touched source of
``--mib`` MiB (the training state, untimed), measures the first-touch speed of 256 MiB of fresh
anonymous memory (one write per page), then times one copy of the source into fresh memory of
the variant's kind and reports GB/s and how much of it the kernel backed with huge pages.
Rounds are interleaved (every variant once per round); the parent prints medians.

Variants: ``huge`` / ``small`` (``HostBuffer`` with / without ``MADV_HUGEPAGE``), ``torch``
(``torch.empty``), ``*_2t`` / ``*_4t`` (the copy split over 2 / 4 threads, as staging does for
large tensors), ``populate_*`` (``MADV_POPULATE_WRITE`` first, on N threads, then the copy;
both timed), ``again_*`` (a second copy into the same, now touched, buffer: the steady state),
``read_*`` (``os.preadv`` of a page-cached file into the fresh buffer, as a restore reads).

    .venv/bin/python benchmarks/first_touch.py --mib 512 --rounds 5
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from trainstore.hostmem import HostBuffer

TOUCH_MIB = 256
MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
VARIANTS = ("huge", "small", "torch", "huge_2t", "small_2t", "small_4t", "populate_huge_2t", "populate_small_1t",
            "populate_small_2t", "populate_small_4t", "again_huge_2t", "again_small_2t", "read_huge", "read_small")


def first_touch_gbps(mib: int = TOUCH_MIB) -> float:
    """GB/s of one write per 4 KiB page into ``mib`` MiB of fresh plain anonymous memory."""
    buf = HostBuffer(mib << 20, huge_pages=False, pin=False)
    a = buf.array()
    t = time.perf_counter()
    a[::4096] = 1
    return (mib << 20) / (time.perf_counter() - t) / 1e9


def split_copy(dst: np.ndarray, src: np.ndarray, threads: int) -> None:
    if threads < 2:
        np.copyto(dst, src)
        return
    step = -(-dst.nbytes // threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: np.copyto(dst[i:i + step], src[i:i + step]), range(0, dst.nbytes, step)))


def populate(buf: HostBuffer, threads: int) -> None:
    """MADV_POPULATE_WRITE of ``buf`` in ``threads`` parts at once (2 MiB-aligned parts)."""
    if threads < 2:
        buf.touch()
        return
    step = -(-buf.nbytes // threads // (2 << 20)) * (2 << 20)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: _libc.madvise(buf.address + i, min(step, buf.nbytes - i), MADV_POPULATE_WRITE), range(0, buf.nbytes, step)))


def anon_huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def vmstat(*names: str) -> dict[str, int]:
    """Kernel counters (``/proc/vmstat``): compaction stalls and huge-page fault results."""
    with open("/proc/vmstat") as f:
        pairs = (line.split() for line in f)
        return {k: int(v) for k, v in pairs if k in names}


VMSTAT = ("compact_stall", "thp_fault_alloc", "thp_fault_fallback", "pgmajfault")


def child(variant: str, mib: int) -> dict:
    n = mib << 20
    src = np.full(n, 7, dtype=np.uint8)  # the state: touched memory
    touch = first_touch_gbps()
    threads = int(variant.rsplit("_", 1)[1][0]) if variant.endswith("t") else 1
    kind = "torch" if variant.startswith("torch") else ("huge" if "huge" in variant else "small")
    huge_before = anon_huge_kib()
    vm_before = vmstat(*VMSTAT)
    if variant.startswith("read"):
        return read_child(variant, kind, src, touch)
    t = time.perf_counter()
    if kind == "torch":
        dst = torch.empty(n, dtype=torch.uint8).numpy()
    else:
        buf = HostBuffer(n, huge_pages=kind == "huge", pin=False)
        if variant.startswith("populate"):
            populate(buf, threads)
        dst = buf.array()
    split_copy(dst, src, threads)
    if variant.startswith("again"):  # time only a second copy into the now-touched memory
        t = time.perf_counter()
        split_copy(dst, src, threads)
    d = time.perf_counter() - t
    assert dst[n - 1] == 7 and dst[0] == 7
    vm = {k: v - vm_before.get(k, 0) for k, v in vmstat(*VMSTAT).items()}  # system-wide
    return {**vm, "variant": variant, "gbps": n / d / 1e9, "s": d, "touch_gbps": touch,
            "huge_mib": (anon_huge_kib() - huge_before) / 1024}


def read_child(variant: str, kind: str, src: np.ndarray, touch: float) -> dict:
    """preadv of a page-cached file of ``src`` into fresh memory (the file written untimed)."""
    fd, path = tempfile.mkstemp(prefix="first-touch-")
    try:
        os.write(fd, memoryview(src))
        huge_before = anon_huge_kib()
        t = time.perf_counter()
        buf = HostBuffer(src.nbytes, huge_pages=kind == "huge", pin=False)
        dst = buf.array()
        pos = 0
        while pos < src.nbytes:
            pos += os.preadv(fd, [memoryview(dst[pos:])], pos)
        d = time.perf_counter() - t
    finally:
        os.close(fd)
        os.unlink(path)
    assert dst[0] == 7 and dst[-1] == 7
    return {"variant": variant, "gbps": src.nbytes / d / 1e9, "s": d, "touch_gbps": touch,
            "huge_mib": (anon_huge_kib() - huge_before) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", help="variant to measure in this process")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    if args.one:
        print(json.dumps(child(args.one, args.mib)))
        return
    variants = args.variants.split(",")
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    print(f"start: load {os.getloadavg()}")
    for r in range(args.rounds):
        for v in variants:
            out = subprocess.run([sys.executable, __file__, "--one", v, "--mib", str(args.mib)],
                                 capture_output=True, text=True, check=True).stdout
            rows[v].append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {r + 1}: load {os.getloadavg()[0]:.1f}: "
              + " ".join(f"{v}={rows[v][-1]['gbps']:.2f}" for v in variants), flush=True)
    print(f"end: load {os.getloadavg()}; {args.mib} MiB, medians of {args.rounds} interleaved rounds")
    print(f"{'variant':<20}{'GB/s':>8}{'min':>8}{'max':>8}{'huge MiB':>10}{'touch GB/s (plain)':>20}"
          f"{'compact stalls':>16}{'thp fallback':>14}")
    for v, rs in rows.items():
        g = [x["gbps"] for x in rs]
        print(f"{v:<20}{statistics.median(g):>8.2f}{min(g):>8.2f}{max(g):>8.2f}"
              f"{statistics.median(x['huge_mib'] for x in rs):>10.0f}"
              f"{statistics.median(x['touch_gbps'] for x in rs):>20.2f}"
              f"{statistics.median(x.get('compact_stall', 0) for x in rs):>16.0f}"
              f"{statistics.median(x.get('thp_fault_fallback', 0) for x in rs):>14.0f}")


if __name__ == "__main__":
    main()
