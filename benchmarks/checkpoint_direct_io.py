"""O_DIRECT writes of raw checkpoint pieces vs buffered writes: steady-state save (blocking,
durable) and full restore right after the save, interleaved in one process.

Two CheckpointManagers on local directories, one with ``LocalStore(direct_io=True)`` (the
default) and one with ``direct_io=False``; each repeat perturbs the state (one element per 4 KiB),
saves it with both (two warm-up saves first: staging touched) and restores the step just saved.
torch.save+fsync and torch.load(weights_only=True) of the same state are the reference. A
restore right after the save reads direct-written pieces from disk (they never entered the page
cache) and buffered ones from the page cache: the price O_DIRECT pays for not filling the cache.

    .venv/bin/python benchmarks/checkpoint_direct_io.py --gib 0.5 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.store.local import LocalStore


def perturb(state: dict) -> None:
    for t in state.values():
        t.view(-1)[::1024] += 1.0


def timed_save(mgr: CheckpointManager, step: int, state: dict) -> tuple[float, float]:
    t = time.perf_counter()
    h = mgr.save(step, state)
    blocking = time.perf_counter() - t
    h.wait()
    return blocking, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    per = int(args.gib * (1 << 30)) // 4 // 16
    state = {f"t{i}": torch.randn(per) for i in range(16)}
    root = tempfile.mkdtemp(prefix="ts-direct-bench-")
    policy = CheckpointPolicy(full_every=1, incremental_every=None)
    mgrs = {name: CheckpointManager(LocalStore(os.path.join(root, name), direct_io=direct), job="b", policy=policy)
            for name, direct in (("direct", True), ("buffered", False))}
    rows: dict[str, list[tuple[float, float, float]]] = {"torch": [], "direct": [], "buffered": []}
    try:
        print(f"{args.gib:g} GiB float32 in 16 tensors, load average {os.getloadavg()[0]:.1f}")
        step = 0
        for mgr in mgrs.values():  # warm-up: staging touched
            for _ in range(2):
                step += 1
                timed_save(mgr, step, state)
        for _ in range(args.repeats):
            perturb(state)
            path = os.path.join(root, "state.pt")
            t = time.perf_counter()
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            d = time.perf_counter() - t
            t = time.perf_counter()
            torch.load(path, weights_only=True)
            rows["torch"].append((d, d, time.perf_counter() - t))
            for name, mgr in mgrs.items():
                step += 1
                blocking, durable = timed_save(mgr, step, state)
                t = time.perf_counter()
                mgr.restore(step=step)
                rows[name].append((blocking, durable, time.perf_counter() - t))
        ref = statistics.median(r[1] for r in rows["torch"]), statistics.median(r[2] for r in rows["torch"])
        print(f"medians of {args.repeats} interleaved repeats; load average at the end {os.getloadavg()[0]:.1f}")
        print(f"  {'method':<22}{'blocking s':>12}{'durable s':>12}{'restore s':>12}{'durable/torch':>15}"
              f"{'restore/torch':>15}")
        for name, rs in rows.items():
            b, d, r = (statistics.median(x[i] for x in rs) for i in range(3))
            print(f"  {name:<22}{b:>12.3f}{d:>12.3f}{r:>12.3f}{d / ref[0]:>15.3f}{r / ref[1]:>15.3f}")
    finally:
        for mgr in mgrs.values():
            mgr.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
