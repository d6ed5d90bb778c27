"""Restore of the newest (incremental) checkpoint of a 2-rank DCP job, with and without
restore-ready copies, against torch DCP's FileSystemReader; fresh processes, both cache states.

    .venv/bin/python benchmarks/ready_copies_dist.py                 # 2 ranks x 128 MiB, 3 rounds
    .venv/bin/python benchmarks/ready_copies_dist.py --mib 32 --rounds 1   # smoke

One 2-rank job (gloo on 127.0.0.1) builds the checkpoints. Each rank holds ``--mib`` MiB of
float32 weights, the Shard(0) DTensor shards of 8 tensors. Step 0 is saved full, then every
weight moves by N(0, (1e-3 * 0.02)^2) (an AdamW-sized step: every piece changes) and step 1 is
saved as an incremental by ``CheckpointManager`` (the ``dcp`` backend), once with restore-ready
copies (``on``) and once without (``off``: the delta path, what every multi-rank restore did
before), each in its own store; the same step-1 state is saved as a full trainstore checkpoint
(``full``) and with ``dcp.save`` + ``FileSystemWriter`` (``fs``, torch's own). The save job
reports each incremental's ``save`` + ``wait`` time (the copies' cost) and the bytes.

Then, per round and per method (order rotated each round), per cache state: the method's files
are evicted from the page cache (``posix_fadvise(DONTNEED)`` after ``fsync``, checked with
``mincore``) or read once (cached), and a NEW 2-rank job restores step 1 into preallocated
DTensors and checks every byte. Reported: the wall time between barriers around the restore
(``restore_into`` / ``dcp.load``; the manager's constructor is timed apart, before), medians of the
rounds, ratios to ``fs``.
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

from pagecache import cache, evict, files_under, resident_all  # noqa: E402

METHODS = ("on", "off", "full", "fs")
JOB = "bench"


def _state(world: int, mib: int, zero: bool = False):  # noqa: ANN202 - torch objects
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    rank = int(os.environ["RANK"])
    mesh = init_device_mesh("cpu", (world,))
    per = mib * (1 << 20) // 4 // 8
    g = torch.Generator().manual_seed(rank)
    local = [torch.randn(per // 1024, 1024, generator=g) * 0.02 for _ in range(8)]
    step1 = [t + torch.randn(t.shape, generator=g) * (1e-3 * 0.02) for t in local]
    if zero:
        local = [torch.empty_like(t) for t in local]
    wrap = lambda ts: {"model": {f"layer{i}.weight": DTensor.from_local(t, mesh, [Shard(0)])  # noqa: E731
                                 for i, t in enumerate(ts)}}
    return wrap(local), wrap(step1), step1


def save_main(rank: int, world: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from trainstore import CheckpointManager, CheckpointPolicy

    torch.set_num_threads(1)
    step0, step1, _ = _state(world, args["mib"])
    out: dict = {}
    for method in ("on", "off", "full"):
        policy = CheckpointPolicy(full_every=1000, incremental_every=1 if method != "full" else 0,
                                  ready_copies=method == "on")
        with CheckpointManager(os.path.join(args["root"], method), JOB, policy=policy) as mgr:
            if method != "full":
                mgr.save(0, step0, blocking=True)
            dist.barrier()
            t0 = time.perf_counter()
            mgr.save(1, step1).wait()
            dist.barrier()
            out[f"{method}_save_s"] = time.perf_counter() - t0
            out[f"{method}_kind"] = mgr.list()[-1].kind
    dist.barrier()
    t0 = time.perf_counter()
    dcp.save(step1, storage_writer=dcp.FileSystemWriter(os.path.join(args["root"], "fs")))
    dist.barrier()
    out["fs_save_s"] = time.perf_counter() - t0
    return out if rank == 0 else {}


def restore_main(rank: int, world: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from trainstore import CheckpointManager

    torch.set_num_threads(1)
    target, _, want = _state(world, args["mib"], zero=True)
    method, root = args["method"], os.path.join(args["root"], args["method"])
    events: list = []
    ctor = 0.0
    if method != "fs":
        t0 = time.perf_counter()
        mgr = CheckpointManager(root, JOB)
        ctor = time.perf_counter() - t0
        mgr.observers.append(lambda e, f: events.append(f) if e == "restore_ready_copies" else None)
    dist.barrier()
    t0 = time.perf_counter()
    if method == "fs":
        dcp.load(target, storage_reader=dcp.FileSystemReader(root))
    else:
        step = mgr.restore_into(target).step
        assert step == 1, step
    dist.barrier()
    wall = time.perf_counter() - t0
    for t, w in zip(target["model"].values(), want):
        assert torch.equal(t.to_local(), w), f"{method}: restored bytes differ"
    if method != "fs":
        mgr.close()
    return {"wall": wall, "ctor": ctor, "ready": events}


def _run(target: str, args: dict) -> list:
    from harness.dist import run_ranks

    results = run_ranks(f"ready_copies_dist:{target}", 2, args, pythonpath=[HERE, os.path.join(HERE, "..", "src")],
                        timeout_s=1800, pg_timeout_s=900, env={"OMP_NUM_THREADS": "1"})
    for r in results:
        if not r.ok:
            sys.exit(f"rank {r.rank} failed (rc={r.returncode}): {r.error}\n{r.stderr[-3000:]}")
    return [r.value for r in results]


def main() -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the test harness: harness.dist
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=128, help="MiB of state per rank")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="trainstore-bench-ready-dist-", dir=os.environ.get("BENCH_DIR"))
    t_start = time.time()
    try:
        saved = _run("save_main", {"root": root, "mib": a.mib})[0]
        sizes = {m: sum(os.path.getsize(p) for p in files_under(os.path.join(root, m))) for m in METHODS}
        ready_bytes = sum(os.path.getsize(p) for p in files_under(os.path.join(root, "on", "ready")))
        times: dict[str, list[float]] = {}
        ctors: dict[str, list[float]] = {}
        used: dict[str, list] = {}
        for rnd in range(a.rounds):
            order = METHODS[rnd % len(METHODS):] + METHODS[:rnd % len(METHODS)]
            for state in ("evicted", "cached"):
                for method in order:
                    files = files_under(os.path.join(root, method))
                    if state == "evicted":
                        evict(files)
                    else:
                        cache(files)
                    res, pages = resident_all(files)
                    vals = _run("restore_main", {"root": root, "mib": a.mib, "method": method})
                    times.setdefault(f"{method}_{state}", []).append(max(v["wall"] for v in vals))
                    ctors.setdefault(method, []).append(max(v["ctor"] for v in vals))
                    used[f"{method}_{state}"] = [v["ready"] for v in vals]
                    print(f"round {rnd} {state:7} {method:4} {times[f'{method}_{state}'][-1]:.3f} s "
                          f"(resident before: {res}/{pages} pages)", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n# 2 ranks x {a.mib} MiB float32 (Shard(0) DTensors), newest checkpoint = step 1; "
          f"{a.rounds} rounds, fresh 2-rank job per restore, medians; {time.time() - t_start:.0f} s total")
    print("| restore of step 1 | evicted s | x fs | cached s | x fs |")
    print("| --- | ---: | ---: | ---: | ---: |")
    labels = {"on": "trainstore incremental, with restore-ready copies", "off": "trainstore incremental, delta path",
              "full": "trainstore full checkpoint of the same state", "fs": "torch DCP FileSystemReader"}
    for m in METHODS:
        e, c = med[f"{m}_evicted"], med[f"{m}_cached"]
        print(f"| {labels[m]} | {e:.3f} | {e / med['fs_evicted']:.2f}x | {c:.3f} | {c / med['fs_cached']:.2f}x |")
    print("manager constructor (median, not in the times above): "
          + ", ".join(f"{m} {statistics.median(ctors[m]):.3f} s" for m in ("on", "off", "full")))
    print(f"save + wait of step 1: on {saved['on_save_s']:.3f} s, off {saved['off_save_s']:.3f} s "
          f"({saved['on_save_s'] / saved['off_save_s']:.2f}x), full {saved['full_save_s']:.3f} s, "
          f"fs {saved['fs_save_s']:.3f} s; kinds {saved['on_kind']}/{saved['off_kind']}/{saved['full_kind']}")
    print("bytes on disk (MiB): " + ", ".join(f"{m} {sizes[m] / 2**20:.0f}" for m in METHODS)
          + f"; of which restore-ready copies {ready_bytes / 2**20:.0f}")
    print("ready-copy events of the last 'on' restores (per rank): " + json.dumps(used.get("on_cached")))
    print(json.dumps({"medians": med, "times": times, "saved": saved, "sizes": sizes, "ready_bytes": ready_bytes}))


if __name__ == "__main__":
    main()
