"""Distributed checkpoint benchmark: trainstore.dcp vs torch DCP's FileSystemWriter/Reader.

    .venv/bin/python benchmarks/distributed.py            # 2 ranks x 512 MiB, 3 interleaved repeats
    .venv/bin/python benchmarks/distributed.py --quick    # 2 ranks x 32 MiB, 1 repeat (smoke)

Two real ranks (gloo on 127.0.0.1, one process each). Each rank holds 512 MiB of float32
weights (8 tensors, N(0, 0.02)), the local shards of Shard(0) DTensors. In the same run,
interleaved (order alternates per repeat), medians reported:

1. full save with ``dcp.save``: ``trainstore.dcp.StorageWriter`` (local directory store;
   default options, and ``WriteOptions(codec="shuffle-zstd")`` for full pieces) vs
   ``FileSystemWriter`` (torch's default, fsync on). Before each repeat one element per 4 KiB
   changes, so no repeat dedups against the previous one.
2. load with ``dcp.load`` into preallocated tensors: ``StorageReader`` (decodes and BLAKE3-
   verifies every chunk) vs ``FileSystemReader`` (files in the page cache for both).
3. ``dcp.async_save``: time the caller is blocked (staging copy) and time to durable.
4. bytes stored over 5 consecutive saves of a training run: between saves every weight
   moves by N(0, (1e-3 * 0.02)^2) (relative change ~1e-3, an AdamW-sized step); trainstore
   saves step 1 full and steps 2-5 as incrementals (XOR deltas vs step 1), FileSystemWriter
   saves 5 full checkpoints.

Wall times are taken on rank 0 between barriers (a DCP save ends with a collective, so the
ranks finish together).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def rank_main(rank: int, world: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from trainstore.dcp import StorageReader, StorageWriter

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    n_tensors, per = 8, args["mib"] * (1 << 20) // 4 // 8
    g = torch.Generator().manual_seed(rank)
    local = [torch.randn(per // 1024, 1024, generator=g) * 0.02 for _ in range(n_tensors)]
    state = {"model": {f"layer{i}.weight": DTensor.from_local(t, mesh, [Shard(0)]) for i, t in enumerate(local)}}
    root = args["root"]

    def sync_time(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    def bump() -> None:
        for t in local:
            t.view(-1)[::1024] += 1e-3

    def clean(path: str) -> None:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()

    from trainstore.checkpoint.save.writer import WriteOptions
    from trainstore.dcp import BaseCache

    # bytes-first: full pieces shuffle-zstd (the default stores them shuffle-lz4, or raw when a
    # sample shows lz4 saves under 10%, as for fresh float32 weights); deltas shuffle-zstd in both
    zstd_full = WriteOptions(codec="shuffle-zstd")
    caches = {"ts": BaseCache(), "ts-zstd": BaseCache()}  # incrementals XOR against the base in memory
    writers = {
        "ts": lambda path, step, kind="full": StorageWriter(path, "bench", step, kind=kind, base_cache=caches["ts"]),
        "ts-zstd": lambda path, step, kind="full": StorageWriter(path, "bench", step, kind=kind, options=zstd_full,
                                                               base_cache=caches["ts-zstd"]),
        "fs": lambda path, step, kind="full": dcp.FileSystemWriter(path),
    }
    # async_save: fresh host copy per save (both writers' default), and trainstore with the
    # staged copy cached across saves (FileSystemWriter's cache option pins memory: CUDA only)
    cached_writer = StorageWriter(os.path.join(root, "ats-cached"), "bench", cache_staged_state_dict=True)
    async_writers = {"ts": lambda path: StorageWriter(path, "bench"), "fs": lambda path: dcp.FileSystemWriter(path),
                     "ts-cached": lambda path: cached_writer}
    readers = {"ts": lambda path: StorageReader(path, "bench"), "ts-zstd": lambda path: StorageReader(path, "bench"),
               "fs": lambda path: dcp.FileSystemReader(path)}
    names = list(writers)
    res: dict[str, list[float]] = {f"{w}_{m}": [] for w in names for m in ("save", "load")}
    res.update({f"{w}_{m}": [] for w in async_writers for m in ("async_block", "async_durable")})
    sizes: dict[str, int] = {}
    target = {"model": {f"layer{i}.weight": DTensor.from_local(torch.empty_like(t), mesh, [Shard(0)])
                        for i, t in enumerate(local)}}
    for rep in range(args["repeats"]):
        order = names[rep % len(names):] + names[:rep % len(names)]  # rotate who goes first
        bump()
        for who in order:
            path = os.path.join(root, f"{who}{rep}")
            res[f"{who}_save"].append(sync_time(lambda: dcp.save(state, storage_writer=writers[who](path, 1))))
            if rank == 0:
                sizes[f"{who}_full_{rep}"] = dir_bytes(path)
        for who in order:
            path = os.path.join(root, f"{who}{rep}")
            res[f"{who}_load"].append(sync_time(lambda: dcp.load(target, storage_reader=readers[who](path))))
            for a, b in zip(local, target["model"].values()):
                assert torch.equal(a, b.to_local()), f"{who}: loaded state differs"
            clean(path)
        bump()
        names_a = list(async_writers)
        for who in names_a[rep % 3:] + names_a[:rep % 3]:
            path = os.path.join(root, f"a{who}" if who == "ts-cached" else f"a{who}{rep}")
            dist.barrier()
            t0 = time.perf_counter()
            ckpt_id = None if who == "fs" else 2 + rep  # FileSystemWriter: the id would be a path
            fut = dcp.async_save(state, storage_writer=async_writers[who](path), checkpoint_id=ckpt_id)
            blocked = time.perf_counter() - t0
            fut.result()
            dist.barrier()
            res[f"{who}_async_block"].append(blocked)
            res[f"{who}_async_durable"].append(time.perf_counter() - t0)
            if who != "ts-cached":  # its writer (and chunk-store knowledge) lives across repeats
                clean(path)
    clean(os.path.join(root, "ats-cached"))

    # bytes over a training run of 5 saves, for two step sizes
    run_times: dict[str, list[float]] = {}
    for scale in args["scales"]:
        gen = torch.Generator().manual_seed(100 + rank)
        for step in range(1, 6):
            if step > 1:
                for t in local:
                    t.add_(torch.randn(t.shape, generator=gen), alpha=scale * 0.02)
            for who in names:
                path = os.path.join(root, f"run-{who}-{scale}")
                if who == "fs":
                    path = os.path.join(path, f"step{step}")
                kind = "full" if step == 1 else "incremental"
                run_times.setdefault(f"{who}_{scale}", []).append(
                    sync_time(lambda: dcp.save(state, storage_writer=writers[who](path, step, kind))))
                if rank == 0:
                    sizes[f"run_{who}_{scale}_{step}"] = dir_bytes(os.path.join(root, f"run-{who}-{scale}"))
        for who in names:
            clean(os.path.join(root, f"run-{who}-{scale}"))
    return {"times": res, "sizes": sizes, "run_times": run_times} if rank == 0 else {}


def main() -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the test harness: harness.dist
    from harness.dist import run_ranks

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mib", type=int, default=None, help="MiB of state per rank (default 512; quick 32)")
    ap.add_argument("--repeats", type=int, default=None)
    a = ap.parse_args()
    mib = a.mib or (32 if a.quick else 512)
    repeats = a.repeats or (1 if a.quick else 3)
    scales = [1e-3, 1e-4]
    root = tempfile.mkdtemp(prefix="trainstore-bench-dist-", dir=os.environ.get("BENCH_DIR"))
    try:
        t0 = time.time()
        results = run_ranks("distributed:rank_main", 2, {"root": root, "mib": mib, "repeats": repeats,
                                                         "scales": scales},
                            pythonpath=[HERE, os.path.join(HERE, "..", "src")], timeout_s=3600, pg_timeout_s=1800,
                            env={"OMP_NUM_THREADS": "1"})
        for r in results:
            if not r.ok:
                sys.exit(f"rank {r.rank} failed (rc={r.returncode}): {r.error}\n{r.stderr[-3000:]}")
        out = results[0].value
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in out["times"].items()}
    sz = out["sizes"]
    print(f"# 2 ranks x {mib} MiB float32, {repeats} interleaved repeats (medians), {time.time() - t0:.0f} s total")
    print("| measure | trainstore.dcp (default) | trainstore.dcp (zstd full) | FileSystemWriter/Reader | "
          "default / FS | zstd full / FS |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, m in [("full save (dcp.save) s", "save"), ("load (dcp.load) s", "load")]:
        a, b, c = med[f"ts_{m}"], med[f"ts-zstd_{m}"], med[f"fs_{m}"]
        print(f"| {label} | {a:.3f} | {b:.3f} | {c:.3f} | {a / c:.2f}x | {b / c:.2f}x |")
    for label, m in [("async_save blocking s", "async_block"), ("async_save to durable s", "async_durable")]:
        a, b, c = med[f"ts_{m}"], med[f"ts-cached_{m}"], med[f"fs_{m}"]
        print(f"| {label} (2nd column: cached staging) | {a:.3f} | {b:.3f} | {c:.3f} | {a / c:.2f}x | {b / c:.2f}x |")
    full = {w: statistics.median(v for k, v in sz.items() if k.startswith(f"{w}_full")) for w in ("ts", "ts-zstd", "fs")}
    print(f"| bytes of one full checkpoint (MiB) | {full['ts'] / 2**20:.0f} | {full['ts-zstd'] / 2**20:.0f} | "
          f"{full['fs'] / 2**20:.0f} | {full['ts'] / full['fs']:.2f}x | {full['ts-zstd'] / full['fs']:.2f}x |")
    for scale in scales:
        a, b, c = (sz[f"run_{w}_{scale}_5"] for w in ("ts", "ts-zstd", "fs"))
        print(f"| bytes after 5 saves, step {scale:g} (MiB) | {a / 2**20:.0f} | {b / 2**20:.0f} | {c / 2**20:.0f} | "
              f"{a / c:.2f}x | {b / c:.2f}x |")
    for scale in scales:
        added = [(sz[f"run_ts_{scale}_{s}"] - sz.get(f"run_ts_{scale}_{s - 1}", 0)) / 2**20 for s in range(1, 6)]
        print(f"step {scale:g}: trainstore (default) MiB added per save: " + ", ".join(f"{x:.0f}" for x in added)
              + "; save s (default/zstd full/FS): " + ", ".join(
                  f"{x:.2f}/{y:.2f}/{z:.2f}" for x, y, z in zip(*(out['run_times'][f'{w}_{scale}']
                                                                   for w in ("ts", "ts-zstd", "fs")))))
    print(json.dumps({"medians": med, "sizes": sz, "run_times": out["run_times"]}))


if __name__ == "__main__":
    main()
