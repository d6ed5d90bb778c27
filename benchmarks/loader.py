"""Data-loader benchmark, DLIO / MLPerf Storage style.

The accelerator is emulated by sleeping a fixed compute time per batch. For each loader and
workload we find the smallest compute time per batch that keeps accelerator utilisation
AU = compute / wall (first batch excluded) >= 90%, and report samples/s and the wait
fraction there. Loaders, on the same samples and with the same number of workers:

* ``trainstore`` (block shuffle) and ``trainstore-full`` (full shuffle): Loader over an
  arrow-ipc dataset version, read through the hot tier (a local cache dir);
* ``torch-npy``: torch DataLoader over one .npy file per sample (DLIO's layout);
* ``streaming``: mosaicml-streaming StreamingDataset (MDS shards) + torch DataLoader;
* ``litdata``: litdata StreamingDataset (binary chunks) + StreamingDataLoader.

Also measures shuffle quality of the sampler modes. Run: ``.venv/bin/python benchmarks/loader.py``
(about 10 minutes on 2 busy cores) or with ``--quick`` (half the samples, shorter tries).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
import warnings
from dataclasses import dataclass

import numpy as np

warnings.filterwarnings("ignore")
logging.getLogger("trainstore").setLevel(logging.ERROR)  # AU tries below 90% are expected here
os.environ.setdefault("TQDM_DISABLE", "1")


@dataclass(frozen=True)
class Workload:
    name: str
    sample_shape: tuple[int, ...]
    batch_size: int
    samples: int

    @property
    def sample_bytes(self) -> int:
        return int(np.prod(self.sample_shape)) * 4


def workloads(quick: bool) -> list[Workload]:
    k = 1 if quick else 2
    return [
        # unet3d-like: tens of MB per sample, small batches
        Workload("large (unet3d-like)", (4, 128, 128, 96), 2, 12 * k),  # 25 MB
        # cosmoflow-like: ~2.8 MB samples, batch 1
        Workload("medium (cosmoflow-like)", (4, 128, 128, 11), 1, 96 * k),  # 2.9 MB
        # resnet50-like: ~115 KB samples, large batches
        Workload("small (resnet50-like)", (3, 98, 98), 128, 1536 * k),  # 115 KB
    ]


SHARD_BYTES = 64 << 20
WORKERS = 2


def sample_array(w: Workload, i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    return rng.standard_normal(w.sample_shape, dtype=np.float32)


# -- loaders: write + iterate ------------------------------------------------------------------
def import_streaming():
    """Import mosaicml-streaming's core without its vision subpackage (needs torchvision,
    which has no CPU wheel matching torch 2.13 here)."""
    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None:
            raise ImportError("mosaicml-streaming is not installed")
        pkg = types.ModuleType("streaming")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["streaming"] = pkg
    from streaming.base import MDSWriter, StreamingDataset

    return MDSWriter, StreamingDataset


class TrainstoreLoader:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def write(self, w: Workload, root: str) -> None:
        from trainstore.data import Dataset, Loader
        from trainstore.data.serve import write_arrow_dataset

        x = np.stack([sample_array(w, i) for i in range(w.samples)])
        rows = max(1, SHARD_BYTES // w.sample_bytes)
        write_arrow_dataset(root + "/durable", "bench", {"x": x}, rows)
        del x
        ds = Dataset(root + "/durable", "bench@1", cache_dir=root + "/hot")
        self.loader = Loader(ds, w.batch_size, seed=0, shuffle_mode=self.mode, workers=WORKERS,
                             prefetch=4, block_shards=2)

    def epoch(self):
        for b in self.loader:
            yield b["x"]


class NpyLoader:
    def write(self, w: Workload, root: str) -> None:
        from torch.utils.data import DataLoader

        for i in range(w.samples):
            np.save(f"{root}/{i:06d}.npy", sample_array(w, i))
        self.loader = DataLoader(_NpyDataset(root, w.samples), batch_size=w.batch_size, shuffle=True,
                                 num_workers=WORKERS, prefetch_factor=4, persistent_workers=True)

    def epoch(self):
        yield from self.loader


class _NpyDataset:
    def __init__(self, root: str, n: int) -> None:
        self.root, self.n = root, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.load(f"{self.root}/{i:06d}.npy")


class StreamingLoader:
    def write(self, w: Workload, root: str) -> None:
        from torch.utils.data import DataLoader

        MDSWriter, StreamingDataset = import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        cols = {"x": "ndarray:float32:" + ",".join(map(str, w.sample_shape))}
        with MDSWriter(out=root, columns=cols, size_limit=SHARD_BYTES) as out:
            for i in range(w.samples):
                out.write({"x": sample_array(w, i)})
        clean_stale_shared_memory()
        ds = StreamingDataset(local=root, shuffle=True, batch_size=w.batch_size)
        self.loader = DataLoader(ds, batch_size=w.batch_size, num_workers=WORKERS, prefetch_factor=4,
                                 persistent_workers=True)

    def epoch(self):
        for b in self.loader:
            yield b["x"]


class LitdataLoader:
    def write(self, w: Workload, root: str) -> None:
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming.writer import BinaryWriter

        writer = BinaryWriter(cache_dir=root, chunk_bytes=SHARD_BYTES)
        for i in range(w.samples):
            writer.add_item(i, {"x": sample_array(w, i)})
        writer.done()
        writer.merge()
        ds = StreamingDataset(root, shuffle=True, seed=0)
        self.loader = StreamingDataLoader(ds, batch_size=w.batch_size, num_workers=WORKERS,
                                          prefetch_factor=4, persistent_workers=True)

    def epoch(self):
        for b in self.loader:
            yield b["x"]


SYSTEMS = {
    "trainstore": lambda: TrainstoreLoader("block"),
    "trainstore-full": lambda: TrainstoreLoader("full"),
    "torch-npy": NpyLoader,
    "streaming": StreamingLoader,
    "litdata": LitdataLoader,
}


# -- measurement ----------------------------------------------------------------------------------
def batches(system):
    """Batches across epochs, as a training loop would see them."""
    while True:
        yield from system.epoch()


def run_epoch(system, w: Workload, compute_s: float, max_batches: int) -> dict:
    """``max_batches`` steps with a fixed compute time per batch; AU excludes the first batch."""
    it = batches(system)
    t_first = None
    wait = 0.0
    n = 0
    samples = 0
    t_call = time.perf_counter()
    for batch in it:
        now = time.perf_counter()
        if t_first is None:
            t_first = now
        else:
            wait += now - t_call
            samples += len(batch)
        n += 1
        if n >= max_batches:
            break
        if compute_s:
            time.sleep(compute_s)
        t_call = time.perf_counter()
    end = time.perf_counter()
    it.close()
    wall = end - t_first
    steps = n - 1
    compute = steps * compute_s
    return {"batches": n, "au": compute / wall if wall > 0 else 0.0, "wall_s": wall,
            "samples_per_s": samples / wall if wall > 0 else 0.0,
            "wait_fraction": wait / wall if wall > 0 else 0.0, "per_batch_s": wall / max(steps, 1)}


def find_min_compute(system, w: Workload, base: float, steps: int, budget_s: float, log) -> dict:
    """Smallest compute time per batch with AU >= 90%: a geometric ladder from the loader's
    own per-batch time, then one bisection step between the last miss and the first hit.
    Each try runs ``steps`` batches, fewer (at least 8) when that would exceed ``budget_s``."""
    ladder = [0.75, 1.0, 1.5, 2.5, 4.0, 6.5, 10.0, 16.0]
    prev = None
    r = {}
    for f in ladder:
        t = max(base * f, 1e-4)
        n = max(8, min(steps, int(budget_s / (t + base))))
        r = run_epoch(system, w, t, n)
        log(f"    compute {t * 1e3:8.2f} ms/batch x {n}: AU {r['au']:.1%}")
        if r["au"] >= 0.9:
            if prev is not None:
                mid = (prev + t) / 2
                r2 = run_epoch(system, w, mid, max(8, min(steps, int(budget_s / (mid + base)))))
                log(f"    compute {mid * 1e3:8.2f} ms/batch: AU {r2['au']:.1%}")
                if r2["au"] >= 0.9:
                    return {"compute_s": mid, **r2}
            return {"compute_s": t, **r}
        prev = t
    return {"compute_s": None, **r}


def shuffle_quality(n: int = 100_000, shards: int = 100, batch: int = 64, epochs: int = 5) -> list[dict]:
    """Shuffle statistics of the sampler modes, averaged over ``epochs`` epochs.

    |spearman|: rank correlation of new position vs original index (uniform shuffle: ~0).
    displacement: mean |new position - original position| / n (uniform: ~1/3).
    adjacent-same-shard: consecutive samples from one shard (uniform: ~1/shards).
    shards/batch: distinct shards a batch touches (I/O and cache footprint per batch).
    """
    from trainstore.data.serve.sampler import PlanSpec, rank_streams

    rows = tuple([n // shards] * shards)
    out = []
    for mode, window in [("none", 1), ("block", 1), ("block", 4), ("block", 16), ("full", 1)]:
        spec = PlanSpec(n, rows, batch, seed=0, shuffle_mode=mode, block_shards=window)
        stats = []
        for epoch in range(epochs):
            order = rank_streams(spec, epoch, 1)[0]
            pos = np.arange(n)
            rank = np.empty(n)
            rank[order] = pos
            shard_of = order // (n // shards)
            stats.append((
                abs(float(np.corrcoef(rank, pos)[0, 1])),
                float(np.mean(np.abs(rank - pos)) / n),
                float(np.mean(shard_of[1:] == shard_of[:-1])),
                float(np.mean([len(np.unique(shard_of[i:i + batch])) for i in range(0, n, batch)])),
            ))
        m = np.mean(stats, axis=0)
        out.append({"mode": mode if mode != "block" else f"block (window {window} shards)",
                    "spearman": float(m[0]), "mean_displacement": float(m[1]),
                    "adjacent_same_shard": float(m[2]), "shards_per_batch": float(m[3])})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workloads", default="large,medium,small")
    ap.add_argument("--reps", type=int, default=None, help="no-compute repetitions (3, quick 1)")
    ap.add_argument("--steps", type=int, default=None, help="batches per AU try (30, quick 16)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per AU try (4, quick 1.5)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    names = [s for s in args.systems.split(",") if s]
    log = lambda m: print(m, flush=True)  # noqa: E731
    results = {"shuffle_quality": shuffle_quality(), "workloads": []}
    log("shuffle quality (100k samples, 100 shards, batch 64, mean of 5 epochs):")
    for q in results["shuffle_quality"]:
        log(f"  {q['mode']:<26} |spearman| {q['spearman']:.3f}  displacement {q['mean_displacement']:.3f}"
            f"  adjacent-same-shard {q['adjacent_same_shard']:.3f}  shards/batch {q['shards_per_batch']:.1f}")
    wanted = args.workloads.split(",")
    tmp = tempfile.mkdtemp(prefix="trainstore-loader-bench-")
    try:
        for w in workloads(args.quick):
            if w.name.split()[0] not in wanted:
                continue
            max_batches = args.steps or (16 if args.quick else 30)
            budget = args.budget or (1.5 if args.quick else 4.0)
            log(f"\n== {w.name}: {w.samples} samples x {w.sample_bytes / 1e6:.2f} MB, batch {w.batch_size}, "
                f"{WORKERS} workers")
            systems = {}
            for name in names:
                root = os.path.join(tmp, w.name.split()[0], name)
                os.makedirs(root)
                try:
                    s = SYSTEMS[name]()
                    s.write(w, root)
                    run_epoch(s, w, 0.0, max_batches)  # warm: workers, page cache, hot tier
                    systems[name] = s
                except Exception as exc:  # noqa: BLE001 - a peer that cannot run here is reported
                    log(f"  {name}: cannot run here: {type(exc).__name__}: {exc}")
                    results["workloads"].append({"workload": w.name, "system": name, "error": str(exc)})
            base = {n: [] for n in systems}
            # interleaved repetitions without compute: each loader's own per-batch time
            for _rep in range(args.reps or (1 if args.quick else 3)):
                for name, s in systems.items():
                    base[name].append(run_epoch(s, w, 0.0, max_batches))
            for name, s in systems.items():
                per_batch = statistics.median(r["per_batch_s"] for r in base[name])
                sps = statistics.median(r["samples_per_s"] for r in base[name])
                log(f"  {name}: no-compute {per_batch * 1e3:.2f} ms/batch, {sps:.1f} samples/s")
                best = find_min_compute(s, w, per_batch, max_batches, budget, log)
                row = {"workload": w.name, "system": name, "nocompute_ms_per_batch": per_batch * 1e3,
                       "nocompute_samples_per_s": sps, "min_compute_ms_au90":
                       best["compute_s"] * 1e3 if best["compute_s"] else None,
                       "au": best["au"], "samples_per_s_at_au90": best["samples_per_s"],
                       "wait_fraction": best["wait_fraction"]}
                results["workloads"].append(row)
            for s in systems.values():  # stop persistent workers before the next workload
                if hasattr(s.loader, "close"):
                    s.loader.close()
                s.loader = None
            systems.clear()
            gc.collect()
            shutil.rmtree(os.path.join(tmp, w.name.split()[0]), ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log("\n| workload | loader | no-compute ms/batch | min compute ms/batch for AU>=90% | AU | samples/s there "
        "| wait fraction | vs trainstore |")
    log("|---|---|---|---|---|---|---|---|")
    for wname in dict.fromkeys(r["workload"] for r in results["workloads"]):
        rows = [r for r in results["workloads"] if r["workload"] == wname and "error" not in r]
        ts = next((r for r in rows if r["system"] == "trainstore"), None)
        for r in rows:
            mc = r["min_compute_ms_au90"]
            ratio = (f"{mc / ts['min_compute_ms_au90']:.2f}x" if ts and mc and ts["min_compute_ms_au90"]
                     else "-")
            log(f"| {wname} | {r['system']} | {r['nocompute_ms_per_batch']:.2f} | "
                f"{mc:.2f} | {r['au']:.1%} | {r['samples_per_s_at_au90']:.1f} | {r['wait_fraction']:.1%} | {ratio} |"
                if mc else f"| {wname} | {r['system']} | {r['nocompute_ms_per_batch']:.2f} | not reached | - | - | - | - |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
