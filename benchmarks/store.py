"""Stores and chunks: local-store put/get against plain Python file I/O, and the chunk store
per codec on weight-like float32 and bf16 data.

    .venv/bin/python benchmarks/store.py [--reps 5] [--dir bench-out/store] [--mib 64]

Method: every variant runs once per repetition, in rotating order (interleaved), and the
median of the repetitions is reported, so a noisy neighbour hits all variants alike.
Buffers are allocated and touched once up front (first touch of fresh memory costs several
times a memcpy into touched memory). Reads are page-cache reads: dropping the cache needs
root, which this machine does not give, so read figures are memory-bound, not disk-bound.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import blake3
import numpy as np
import xxhash
import zstandard

from trainstore.bytebudget import ByteBudget
from trainstore.chunks import ChunkStore
from trainstore.codecs import CODECS, CodecConfig
from trainstore.store import LocalStore, open_store

MiB = 1 << 20


def weight_like(n: int, seed: int = 0) -> np.ndarray:
    """Trained-looking float32 weights: rows of Student-t(6) values (heavier tails than a
    fresh normal init) times 0.02 times a per-row log-normal scale (rows differ in norm)."""
    rng = np.random.default_rng(seed)
    cols = 4096
    rows = max(1, n // cols)
    scale = (0.02 * rng.lognormal(0.0, 0.3, (rows, 1))).astype(np.float32)
    w = rng.standard_t(6, (rows, cols)).astype(np.float32) * scale
    return w.reshape(-1)[:n]


def to_bf16(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def interleaved(variants: dict[str, Callable[[], None]], reps: int,
                setup: dict[str, Callable[[], None]] | None = None) -> dict[str, float]:
    """Median seconds per variant over ``reps`` rounds, the order rotating each round;
    ``setup[name]`` (untimed) runs before each timed call of ``name``."""
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            if setup and name in setup:
                setup[name]()
            t0 = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(v) for n, v in times.items()}


def bench_local(root: str, mib: int, reps: int) -> list[tuple[str, float]]:
    data = np.frombuffer(np.random.default_rng(1).bytes(mib * MiB), dtype=np.uint8)  # touched once
    store = LocalStore(os.path.join(root, "local"))
    plain_path = os.path.join(root, "plain.bin")
    store.put("warm/obj", data)  # creates the directory, warms the code path
    nbytes = data.nbytes
    reuse = bytearray(nbytes)

    def plain_write() -> None:
        with open(plain_path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def store_put() -> None:
        store.put("warm/obj", data)

    def plain_read() -> None:
        with open(plain_path, "rb") as f:
            assert len(f.read()) == nbytes

    def plain_readinto() -> None:
        with open(plain_path, "rb", buffering=0) as f:
            assert f.readinto(reuse) == nbytes

    def store_get() -> None:
        assert len(store.get("warm/obj")) == nbytes

    plain_write()
    w = interleaved({"plain write+fsync": plain_write, "LocalStore.put": store_put}, reps)
    r = interleaved({"plain read()": plain_read, "plain readinto(reused buffer)": plain_readinto,
                     "LocalStore.get": store_get}, reps)
    gbps = lambda s: nbytes / s / 1e9  # noqa: E731
    rows = [(f"write {mib} MiB: {k}", gbps(v)) for k, v in w.items()]
    rows += [(f"read {mib} MiB (page cache): {k}", gbps(v)) for k, v in r.items()]
    print(f"\n== local store, {mib} MiB objects, median of {reps} interleaved reps (GB/s)")
    for name, v in rows:
        print(f"  {name:<52} {v:6.2f}")
    print(f"  ratio put / plain write+fsync: {w['plain write+fsync'] / w['LocalStore.put']:.2f}x")
    print(f"  ratio get / plain read():      {r['plain read()'] / r['LocalStore.get']:.2f}x")
    os.unlink(plain_path)
    return rows


def bench_hashes(buf: np.ndarray, reps: int) -> None:
    view = memoryview(buf).cast("B")
    t = interleaved({
        "blake3 (1 thread)": lambda: blake3.blake3(view).digest(),
        "blake3 (all cores)": lambda: blake3.blake3(view, max_threads=blake3.blake3.AUTO).digest(),
        "xxh3-128": lambda: xxhash.xxh3_128(view).digest(),
    }, reps)
    print(f"\n== hashes, {view.nbytes // MiB} MiB, median of {reps} (GB/s)")
    for k, v in t.items():
        print(f"  {k:<24} {view.nbytes / v / 1e9:6.2f}")


def bench_chunks(root: str, arrays: dict[str, np.ndarray], reps: int, chunk_mib: int) -> None:
    store = LocalStore(os.path.join(root, "chunks"))
    mem = open_store(f"memory://bench-{uuid.uuid4().hex}")
    print(f"\n== chunk store ({chunk_mib} MiB chunks, 2 writer threads, blosc2 2 threads, level 1), "
          f"median of {reps} interleaved reps")
    print(f"  {'data':<8} {'codec':<13} {'ratio':>6} {'put GB/s':>9} {'put mem://':>10} {'get GB/s':>9} "
          f"{'get mem://':>10}")
    for label, arr in arrays.items():
        view = memoryview(arr).cast("B")
        step = chunk_mib * MiB
        pieces = [view[i : i + step] for i in range(0, view.nbytes, step)]
        out = np.empty(view.nbytes, dtype=np.uint8)  # reused for every get (touched below)
        out[:] = 0
        outv = memoryview(out)
        results: dict[str, dict[str, float]] = {}
        for codec in CODECS:
            state: dict[str, list] = {}

            def clear(target, tag=""):
                """Empty the namespace (untimed), so every put really writes: no dedup hits."""
                for key, _, _ in list(ChunkStore(target, prefix=f"c{tag}").list_keys()):
                    target.delete(key)

            def put(target, codec=codec, tag=""):
                chunks = ChunkStore(target, prefix=f"c{tag}", codec=CodecConfig(codec=codec))
                budget = ByteBudget(4 * step)
                with ThreadPoolExecutor(max_workers=2) as pool:
                    futs = [budget.submit(pool, p.nbytes, chunks.put, p, codec=codec, itemsize=arr.itemsize)
                            for p in pieces]
                    state[tag] = [f.result().ref for f in futs]

            def get(target, tag=""):
                chunks = ChunkStore(target, prefix=f"c{tag}")
                pos = 0
                for ref in state[tag]:
                    chunks.get(ref, out=outv[pos : pos + ref.size])
                    pos += ref.size

            put(store, tag="d")
            put(mem, tag="m")
            t = interleaved({
                "put": lambda: put(store, tag="d"), "put_mem": lambda: put(mem, tag="m"),
                "get": lambda: get(store, tag="d"), "get_mem": lambda: get(mem, tag="m"),
            }, reps, setup={"put": lambda: clear(store, tag="d"), "put_mem": lambda: clear(mem, tag="m")})
            assert bytes(outv[:64]) == bytes(view[:64])
            stored = sum(r.stored for r in state["d"])
            results[codec] = {k: view.nbytes / v / 1e9 for k, v in t.items()}
            results[codec]["ratio"] = stored / view.nbytes
            r = results[codec]
            print(f"  {label:<8} {codec:<13} {r['ratio']:6.3f} {r['put']:9.2f} {r['put_mem']:10.2f} "
                  f"{r['get']:9.2f} {r['get_mem']:10.2f}")
        # What a user might do instead: plain zstandard level 1 over the raw bytes, one thread.
        cctx, dctx = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
        comp = [cctx.compress(p) for p in pieces]
        t = interleaved({"c": lambda: [cctx.compress(p) for p in pieces],
                         "d": lambda: [dctx.decompress(c) for c in comp]}, reps)
        ratio = sum(len(c) for c in comp) / view.nbytes
        print(f"  {label:<8} {'zstandard-1*':<13} {ratio:6.3f} {view.nbytes / t['c'] / 1e9:9.2f} "
              f"{'':>10} {view.nbytes / t['d'] / 1e9:9.2f}")
    print("  * the zstandard library alone (compress/decompress only: no hashing, no I/O)")
    print("  put = hash (BLAKE3) + encode + LocalStore.put (fsync); get = read + decode into a reused "
          "buffer + re-hash; mem:// = the same over the in-memory store")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mib", type=int, default=64, help="local-store object size")
    ap.add_argument("--chunk-mib", type=int, default=4)
    ap.add_argument("--data-mib", type=int, default=64, help="float32 tensor size for the chunk bench")
    ap.add_argument("--dir", default="bench-out/store", help="scratch directory on the disk to measure")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, scratch {root}")
    try:
        bench_local(root, args.mib, args.reps)
        f32 = weight_like(args.data_mib * MiB // 4)
        bench_hashes(f32, args.reps)
        bench_chunks(root, {"float32": f32, "bf16": to_bf16(f32)}, args.reps, args.chunk_mib)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
