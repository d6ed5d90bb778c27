"""Fresh-process checkpoint figures: every save and restore method in its own new process.

A job's first checkpoint, a one-off save and every restore after a crash run in a fresh
process, where nothing is staged yet and every byte lands in never-touched memory. This
harness measures that regime; benchmarks/checkpoint.py measures the steady state (many saves
in one process) and calls ``run_cold`` for ``--cold``.

The parent writes the state once as a torch file (``state.pt``, also the torch.load source),
a safetensors file and a trainstore checkpoint. Each measurement is one child process
(``python benchmarks/checkpoint_cold.py --one METHOD --work DIR``) that torch.loads the state
(untimed: it is the training process's own memory), measures the first-touch speed of fresh
anonymous memory, then times one method and prints one JSON line (``trainstore_reserve`` also
reports how long ``reserve()`` took before the clock started: "off-clock s"). Rounds are interleaved
(every method once per round); figures are medians, ratios are to torch.save+fsync (saves)
and torch.load(weights_only=True) (restores) of the same run.

Rerun one method (e.g. while optimising the first save)::

    .venv/bin/python benchmarks/checkpoint.py --cold --cold-only --methods trainstore,torch_save --gib 1
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pagecache  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.checkpoint.save.writer import WriteOptions  # noqa: E402

SAVE_METHODS = ("plain_write", "torch_save", "safetensors", "dcp_async", "trainstore", "trainstore_reserve")
RESTORE_METHODS = ("torch_load", "torch_load_mmap", "safetensors_load", "dcp_load", "trainstore_restore",
                   "trainstore_restore_incr", "trainstore_restore_incr_deltas")
#: page-cache states a restore is measured in: every method's files dropped from the cache
#: (fsync + posix_fadvise DONTNEED, checked with mincore) or all of them read once before
CACHE_STATES = ("evicted", "cached")
#: the files each restore method reads, under the prepared work directory
METHOD_FILES = {"torch_load": ("state.pt",), "torch_load_mmap": ("state.pt",),
                "safetensors_load": ("state.safetensors",), "dcp_load": ("dcp",),
                "trainstore_restore": ("ts",), "trainstore_restore_incr": ("ts",),
                "trainstore_restore_incr_deltas": ("ts-deltas",)}
TOUCH_MIB = 256


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flat_tensors(state, prefix="") -> dict[str, torch.Tensor]:
    out = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(flat_tensors(v, f"{prefix}{k}."))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(flat_tensors(v, f"{prefix}{i}."))
    elif isinstance(state, torch.Tensor):
        out[prefix.rstrip(".")] = state.contiguous()
    return out


def first_touch_gbps(mib: int = TOUCH_MIB) -> float:
    """GB/s of writing one byte per page into ``mib`` MiB of fresh anonymous memory."""
    n = mib << 20
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        a = np.frombuffer(m, dtype=np.uint8)
        t = time.perf_counter()
        a[::4096] = 1
        d = time.perf_counter() - t
        del a
    finally:
        m.close()
    return n / d / 1e9


# -- the timed methods (each runs once, in a fresh child) -----------------------------------

def save_once(method: str, state, out: str, options: WriteOptions | None = None) -> tuple[float, float, float]:
    """(blocking s, durable s, s spent before the clock started: ``reserve()``) of one save of
    ``state`` under ``out``; ``options``: the trainstore methods' ``WriteOptions`` (default: its own)."""
    if method == "plain_write":  # the floor of time to durable: the same bytes, one sequential write + fsync
        views = [t.reshape(-1).view(torch.uint8).numpy() for t in flat_tensors(state).values()]
        t = time.perf_counter()
        with open(out, "wb", buffering=0) as f:
            for v in views:
                f.write(v)
            os.fsync(f.fileno())
        d = time.perf_counter() - t
        return d, d, 0.0
    if method == "torch_save":
        t = time.perf_counter()
        with open(out, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        d = time.perf_counter() - t
        return d, d, 0.0
    if method == "safetensors":
        from safetensors.torch import save_file

        t = time.perf_counter()
        save_file(flat_tensors(state), out)
        fsync_path(out)
        d = time.perf_counter() - t
        return d, d, 0.0
    if method == "dcp_async":
        import torch.distributed.checkpoint as dcp

        t = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=out)
        blocking = time.perf_counter() - t
        fut.result()
        for d, _, fs in os.walk(out):
            for f in fs:
                fsync_path(os.path.join(d, f))
        return blocking, time.perf_counter() - t, 0.0
    if method in ("trainstore", "trainstore_reserve"):
        mgr = CheckpointManager(out, job="cold", policy=CheckpointPolicy(full_every=1, incremental_every=None),
                                options=options)
        t = time.perf_counter()
        if method == "trainstore_reserve":  # staging allocated and touched off the clock (model build time)
            mgr.reserve(state)
        reserve = time.perf_counter() - t
        t = time.perf_counter()
        h = mgr.save(1, state)
        blocking = time.perf_counter() - t
        h.wait()
        durable = time.perf_counter() - t
        mgr.close()
        return blocking, durable, reserve
    raise SystemExit(f"unknown save method {method!r}")


def _restore(method: str, work: str) -> float:
    """Seconds to restore the prepared checkpoint into fresh memory, every page read once
    (libraries imported before the clock starts, as trainstore is at module level)."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    t = time.perf_counter()
    if method == "torch_load":
        state = torch.load(os.path.join(work, "state.pt"), weights_only=True)
    elif method == "torch_load_mmap":
        state = torch.load(os.path.join(work, "state.pt"), weights_only=True, mmap=True)
    elif method == "safetensors_load":
        state = load_file(os.path.join(work, "state.safetensors"))
    elif method == "dcp_load":  # into fresh tensors of the state's shapes (what a resume allocates)
        with open(os.path.join(work, "shapes.json")) as f:
            shapes = json.load(f)
        state = {k: torch.empty(v[0], dtype=getattr(torch, v[1])) for k, v in shapes.items()}
        dcp.load(state, checkpoint_id=os.path.join(work, "dcp"))
    elif method == "trainstore_restore":
        mgr = CheckpointManager(os.path.join(work, "ts"), job="cold")
        state = mgr.restore(step=1)
        mgr.close()
    elif method in ("trainstore_restore_incr", "trainstore_restore_incr_deltas"):
        # step 2: XOR deltas against step 1; "ts" has its restore-ready copies (read instead of
        # the deltas), "ts-deltas" was saved with ready_copies=False (base + delta per piece)
        mgr = CheckpointManager(os.path.join(work, "ts" if method == "trainstore_restore_incr" else "ts-deltas"),
                                job="cold")
        state = mgr.restore(step=2)
        mgr.close()
    else:
        raise SystemExit(f"unknown restore method {method!r}")
    # mmap-backed loads (torch mmap=True, safetensors) are lazy: a page is read when first
    # used. Reading one byte per page of every tensor makes all of them pay that, as a
    # training step would (cheap for loads that already copied everything).
    for v in flat_tensors(state).values():
        if v.numel():
            v.reshape(-1).view(torch.uint8)[::4096].sum()
    return time.perf_counter() - t


def child(method: str, work: str) -> dict:
    """One measurement in this (fresh) process."""
    if method in SAVE_METHODS:
        state = torch.load(os.path.join(work, "state.pt"), weights_only=True)
        touch = first_touch_gbps()
        out = os.path.join(work, f"out-{method}-{os.getpid()}")
        try:
            blocking, durable, before = save_once(method, state, out)
        finally:
            if os.path.isdir(out):
                shutil.rmtree(out, ignore_errors=True)
            elif os.path.exists(out):
                os.unlink(out)
        return {"method": method, "blocking": blocking, "durable": durable, "before_clock": before,
                "touch_gbps": touch}
    touch = first_touch_gbps()
    return {"method": method, "restore": _restore(method, work), "touch_gbps": touch}


# -- the parent -----------------------------------------------------------------------------

def prepare(state, work: str) -> int:
    """Write the state as torch file, safetensors file and trainstore checkpoint; returns bytes."""
    from safetensors.torch import save_file

    os.makedirs(work, exist_ok=True)
    torch.save(state, os.path.join(work, "state.pt"))
    save_file(flat_tensors(state), os.path.join(work, "state.safetensors"))
    for name, copies in (("ts", True), ("ts-deltas", False)):
        mgr = CheckpointManager(os.path.join(work, name), job="cold",
                                policy=CheckpointPolicy(full_every=1, incremental_every=None, ready_copies=copies))
        mgr.save(1, state, blocking=True)
        mgr.save(2, stepped(state), blocking=True, kind="incremental")  # for trainstore_restore_incr*
        mgr.close()
    import torch.distributed.checkpoint as dcp

    flat = flat_tensors(state)
    dcp.save(flat, checkpoint_id=os.path.join(work, "dcp"))
    with open(os.path.join(work, "shapes.json"), "w") as f:
        json.dump({k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in flat.items()}, f)
    return sum(t.nbytes for t in flat_tensors(state).values())


def stepped(state):
    """``state`` after a small training-like step: every float tensor scaled by (1 + 1e-4),
    which changes low mantissa bits everywhere (an incremental of it stores XOR deltas)."""
    if isinstance(state, dict):
        return {k: stepped(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(stepped(v) for v in state)
    if isinstance(state, torch.Tensor) and state.is_floating_point():
        return state * (1 + 1e-4)
    return state


def method_files(method: str, work: str) -> list[str]:
    return pagecache.files_under(*(os.path.join(work, p) for p in METHOD_FILES.get(method, ())))


def set_cache_state(work: str, state: str) -> None:
    """Every restore method's files evicted from the page cache, or all read once."""
    files = pagecache.files_under(*(os.path.join(work, p) for p in sorted({p for ps in METHOD_FILES.values() for p in ps})))
    (pagecache.evict if state == "evicted" else pagecache.cache)(files)


def residency(work: str, methods) -> dict[str, float]:
    """Fraction of each restore method's files in the page cache now (mincore; not a timing)."""
    out = {}
    for m in methods:
        r, n = pagecache.resident_all(method_files(m, work))
        out[m] = r / n if n else 0.0
    return out


def _run_child(method: str, work: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--work", work]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return {"method": method, "error": (res.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_cold(label: str, state, work: str, repeats: int, methods: list[str],
             cache_states: tuple[str, ...] = CACHE_STATES) -> dict:
    """Interleaved fresh-process rounds of ``methods``; prints and returns the medians. Restores
    run once per page-cache state in ``cache_states`` (as ``method@state``); before each, every
    method's files are set to that state and each method's own resident fraction is recorded."""
    nbytes = prepare(state, work)
    restores_in = [m for m in methods if m in RESTORE_METHODS]
    as_written = residency(work, restores_in)
    print(f"\n[{label}] page cache right after writing (what a same-run restore found before --cache): "
          + ", ".join(f"{m} {v:.0%}" for m, v in as_written.items()))
    runs = [m for m in methods if m in SAVE_METHODS] + [f"{m}@{c}" for c in cache_states for m in restores_in]
    results: dict[str, list[dict]] = {m: [] for m in runs}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for key in runs:
            if key in errors:
                continue
            m, _, cstate = key.partition("@")
            os.sync()  # no writeback of the previous child in this one's clock
            if cstate:
                set_cache_state(work, cstate)
                res_before = residency(work, [m])[m]
            r = _run_child(m, work)
            if "error" in r:
                errors[key] = r["error"]
                continue
            if cstate:
                r["resident"] = res_before
            results[key].append(r)
    touches = [r["touch_gbps"] for rs in results.values() for r in rs]
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "method"}
           for m, rs in results.items() if rs}
    print(f"\n[{label}, fresh process per measurement: {nbytes / 2**30:.2f} GiB] medians of {repeats} "
          f"interleaved rounds; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if touches:
        print(f"  first-touch of fresh memory ({TOUCH_MIB} MiB, in each child): median "
              f"{statistics.median(touches):.2f} GB/s, range {min(touches):.2f}-{max(touches):.2f}")
    ts = med.get("torch_save", {}).get("durable")
    saves = [m for m in methods if m in SAVE_METHODS and m in med]
    if saves:
        print(f"  {'save method':<20}{'blocking s':>12}{'durable s':>12}{'block/torch':>13}{'durable/torch':>15}"
              f"{'off-clock s':>13}")
        for m in saves:
            b, d = med[m]["blocking"], med[m]["durable"]
            rel = f"{b / ts:>13.3f}{d / ts:>15.3f}" if ts else f"{'-':>13}{'-':>15}"
            print(f"  {m:<20}{b:>12.3f}{d:>12.3f}{rel}{med[m].get('before_clock', 0.0):>13.3f}")
    floor = med.get("plain_write", {}).get("durable")
    if floor and "trainstore" in med:
        print(f"  trainstore durable / plain sequential write+fsync (the floor): {med['trainstore']['durable'] / floor:.3f}"
              + (f"; after reserve(): {med['trainstore_reserve']['durable'] / floor:.3f}" if "trainstore_reserve" in med else ""))
    if "trainstore" in med and "dcp_async" in med:
        print(f"  first save blocking / DCP async_save's first save: {med['trainstore']['blocking'] / med['dcp_async']['blocking']:.3f}")
    for cstate in cache_states:
        tl = med.get(f"torch_load@{cstate}", {}).get("restore")
        restores = [m for m in restores_in if f"{m}@{cstate}" in med]
        if restores:
            print(f"  {'restore, files ' + cstate:<28}{'s':>10}{'/torch.load':>13}{'resident before':>17}")
            for m in restores:
                r, res = med[f"{m}@{cstate}"]["restore"], med[f"{m}@{cstate}"]["resident"]
                print(f"  {m:<28}{r:>10.3f}{(f'{r / tl:>13.3f}' if tl else f'{chr(45):>13}')}{res:>17.0%}")
    for m, e in errors.items():
        print(f"  {m:<20} unavailable: {e}")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", required=True, help="method to measure in this process")
    ap.add_argument("--work", required=True, help="directory prepared by run_cold")
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(json.dumps(child(args.one, args.work)))


if __name__ == "__main__":
    main()
