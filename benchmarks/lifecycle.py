"""Checkpoint lifecycle benchmark: gc throughput, the gc lease's cost per save, tiering latency.

    .venv/bin/python benchmarks/lifecycle.py            # full run
    .venv/bin/python benchmarks/lifecycle.py --quick    # smoke run

(a) GC sweep of a local store with C chunks (half unreferenced) vs the floor a user would
    otherwise script: unlinking exactly the same files with a plain loop (no listing of
    manifests, no markers, no safety). Medians of interleaved repetitions.
(b) The gc-safe commit (lease put + sweep-marker listing + lease delete) per save: saves of
    a small state with the lease vs with it disabled, on a local directory and on S3 (moto
    server on loopback), interleaved.
(c) Tiering: a state of S MiB saved through a hot local dir + durable S3 (moto): created ->
    restore-ready and created -> durable, vs a save straight to S3 (what users do without a
    hot tier: restore-ready only when durable).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from trainstore import CheckpointManager, CheckpointPolicy, open_store  # noqa: E402
from trainstore.checkpoint.format import manifest as mf  # noqa: E402
from trainstore.checkpoint.save import lease as leasemod  # noqa: E402
from trainstore.checkpoint.save.writer import WriteOptions  # noqa: E402
from trainstore.chunks import ChunkStore  # noqa: E402
from trainstore.lifecycle.gc import GcOptions, collect_garbage  # noqa: E402
from trainstore.lifecycle.retention import delete_checkpoint  # noqa: E402
from trainstore.lifecycle.tiering import Tiering, TierPolicy  # noqa: E402
from trainstore.testing.s3server import start_s3_server  # noqa: E402


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def fill(root: str, chunks: int, per_ckpt: int) -> list[str]:
    """``chunks`` 4 KiB raw chunks in checkpoints of ``per_ckpt``; delete every other
    checkpoint. Returns the keys that became garbage."""
    store = open_store(root, fsync=False)
    cs = ChunkStore(store)
    rng = np.random.default_rng(0)
    garbage = []
    for step in range(chunks // per_ckpt):
        entries = []
        for _ in range(per_ckpt):
            ref = cs.put(memoryview(rng.integers(0, 255, 4096, dtype=np.uint8)), "raw").ref
            entries.append(mf.ChunkEntry(ref))
        t = mf.TensorEntry("numpy:|u1", (4096 * per_ckpt,), 4096 * per_ckpt, tuple(entries))
        m = mf.Manifest("bench", step, "full", {"w": t}, {"$ndarray": "w"}, metadata={"created": time.time()})
        mf.commit_manifest(store, m)
        if step % 2:
            garbage += sorted(mf.manifest_chunk_keys(m))
            delete_checkpoint(store, "bench", step)
    return garbage


def bench_gc(chunks: int, reps: int) -> None:
    print(f"\n(a) gc of {chunks} chunks (4 KiB, half unreferenced), local dir, {reps} interleaved reps")
    base = tempfile.mkdtemp(prefix="lc-gc-")
    ours, floor = [], []
    try:
        for _ in range(reps):
            for which in ("gc", "unlink"):
                root = os.path.join(base, uuid.uuid4().hex)
                garbage = fill(root, chunks, 64)
                t = time.perf_counter()
                if which == "gc":
                    rep = collect_garbage(open_store(root), GcOptions(grace=0, workers=8))
                    assert rep.deleted == len(garbage)
                    ours.append(time.perf_counter() - t)
                else:
                    for k in garbage:
                        os.unlink(os.path.join(root, k))
                    floor.append(time.perf_counter() - t)
                shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    n = chunks // 2
    print(f"  trainstore gc (list, read manifests, markers, delete): {med(ours):.3f} s = {n / med(ours):,.0f} deleted chunks/s, "
          f"{chunks / med(ours):,.0f} chunks swept/s")
    print(f"  plain unlink loop of the same files (floor, no safety): {med(floor):.3f} s = {n / med(floor):,.0f} chunks/s")
    print(f"  ratio gc / unlink: {med(ours) / med(floor):.2f}x")


@contextlib.contextmanager
def lease_disabled():
    orig = leasemod.commit_lease

    @contextlib.contextmanager
    def none(store, chunks, m, pieces, started, poll_s=0.2):
        yield m

    leasemod.commit_lease = none
    try:
        yield
    finally:
        leasemod.commit_lease = orig


def bench_lease(url: str, opts: dict, saves: int, reps: int, label: str) -> None:
    """Two managers side by side; every save alternates between with and without the lease."""
    state = {"w": np.random.default_rng(1).standard_normal(1 << 16).astype(np.float32)}
    times: dict[str, list[float]] = {"on": [], "off": []}
    orig = leasemod.commit_lease
    with lease_disabled():
        off_impl = leasemod.commit_lease
    policy = CheckpointPolicy(full_every=1, incremental_every=None)
    tag = uuid.uuid4().hex[:6]
    with CheckpointManager(open_store(url, **opts), f"on-{tag}", policy, options=WriteOptions(nice=0)) as on, \
            CheckpointManager(open_store(url, **opts), f"off-{tag}", policy, options=WriteOptions(nice=0)) as off:
        for i in range(saves * reps):
            for mode, mgr in (("on", on), ("off", off)) if i % 2 else (("off", off), ("on", on)):
                leasemod.commit_lease = orig if mode == "on" else off_impl
                state["w"][0] = i + (0.5 if mode == "on" else 0.0)  # one new chunk per save
                t = time.perf_counter()
                mgr.save(i, state, blocking=True)
                times[mode].append(time.perf_counter() - t)
    leasemod.commit_lease = orig
    a, b = med(times["on"]), med(times["off"])
    print(f"  {label}: {len(times['on'])} saves each, median with gc lease {a * 1e3:.1f} ms, without {b * 1e3:.1f} ms "
          f"({(a - b) * 1e3:+.1f} ms, {a / b:.2f}x)")
    store = open_store(url, **opts)
    m = mf.load_manifest(store, f"on-{tag}", 0)
    cs = ChunkStore(store)
    lease = []
    for _ in range(saves * reps):
        t = time.perf_counter()
        with leasemod.commit_lease(store, cs, m, None, time.time()):
            pass
        lease.append(time.perf_counter() - t)
    print(f"  {label}: the lease alone (put, marker listing, delete; no sweep running): {med(lease) * 1e3:.2f} ms")


def bench_tiering(url: str, opts: dict, mib: int, reps: int) -> None:
    print(f"\n(c) {mib} MiB float32 state: hot local dir + durable S3 (moto) vs a save straight to S3, {reps} reps")
    n = mib * (1 << 20) // 4
    ready, durable, direct = [], [], []
    for r in range(reps):
        state = {"w": np.random.default_rng(r).standard_normal(n).astype(np.float32)}
        hot = tempfile.mkdtemp(prefix="lc-hot-")
        tiers = Tiering(hot, f"{url}/tiered-{r}", durable_options=opts, policy=TierPolicy(hot_keep_last=1))
        with tiers.manager("run", options=WriteOptions(nice=0)) as mgr:
            mgr.save(0, state, blocking=True)
            tiers.wait()
            st = tiers.status("run", 0)[0]
            ready.append(st.restore_ready_s)
            durable.append(st.durable_s)
        tiers.close()
        shutil.rmtree(hot)
        with CheckpointManager(open_store(f"{url}/direct-{r}", **opts), "run", options=WriteOptions(nice=0)) as mgr:
            mgr.save(0, state, blocking=True)
            direct.append(mgr.manifest(0).created and time.time() - mgr.manifest(0).created)
    print(f"  tiered: created -> restore-ready {med(ready):.2f} s, created -> durable {med(durable):.2f} s")
    print(f"  straight to S3: created -> restore-ready (= durable) {med(direct):.2f} s")
    print(f"  restore-ready ratio tiered / direct: {med(ready) / med(direct):.2f}x; "
          f"durable ratio: {med(durable) / med(direct):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="abc", help="which parts to run (a: gc, b: lease, c: tiering)")
    a = ap.parse_args()
    chunks, reps, mib = (2048, 1, 8) if a.quick else (16384, 3, 64)
    print(f"lifecycle benchmark ({'quick' if a.quick else 'full'}), cpus={os.cpu_count()}, load={os.getloadavg()[0]:.1f}")
    if "a" in a.parts:
        bench_gc(chunks, reps)
    if not set(a.parts) & {"b", "c"}:
        return
    server = start_s3_server()
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        server.create_bucket(bucket)
        url, opts = f"s3://{bucket}/lc", server.options()
        if "b" in a.parts:
            print("\n(b) gc lease cost per save (256 KiB state, one new chunk per save), saves alternating")
            local = tempfile.mkdtemp(prefix="lc-lease-")
            bench_lease(local, {}, 10 if a.quick else 30, reps, "local dir")
            bench_lease(url, opts, 5 if a.quick else 15, reps, "S3 (moto)")
            shutil.rmtree(local)
        if "c" in a.parts:
            bench_tiering(url, opts, mib, reps)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
