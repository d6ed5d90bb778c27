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

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402

SAVE_METHODS = ("torch_save", "safetensors", "dcp_async", "trainstore", "trainstore_reserve")
RESTORE_METHODS = ("torch_load", "torch_load_mmap", "safetensors_load", "trainstore_restore",
                   "trainstore_restore_incr")
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

def _save(method: str, state, out: str) -> tuple[float, float, float]:
    """(blocking s, durable s, s spent before the clock started: ``reserve()``) of one save of
    ``state`` under ``out``."""
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
        mgr = CheckpointManager(out, job="cold", policy=CheckpointPolicy(full_every=1, incremental_every=None))
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
    """Seconds to restore the prepared checkpoint into fresh memory, every page read once."""
    t = time.perf_counter()
    if method == "torch_load":
        state = torch.load(os.path.join(work, "state.pt"), weights_only=True)
    elif method == "torch_load_mmap":
        state = torch.load(os.path.join(work, "state.pt"), weights_only=True, mmap=True)
    elif method == "safetensors_load":
        from safetensors.torch import load_file

        state = load_file(os.path.join(work, "state.safetensors"))
    elif method == "trainstore_restore":
        mgr = CheckpointManager(os.path.join(work, "ts"), job="cold")
        state = mgr.restore(step=1)
        mgr.close()
    elif method == "trainstore_restore_incr":  # step 2: XOR deltas against step 1 (two reads a piece)
        mgr = CheckpointManager(os.path.join(work, "ts"), job="cold")
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
            blocking, durable, before = _save(method, state, out)
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
    mgr = CheckpointManager(os.path.join(work, "ts"), job="cold",
                            policy=CheckpointPolicy(full_every=1, incremental_every=None))
    mgr.save(1, state, blocking=True)
    mgr.save(2, stepped(state), blocking=True, kind="incremental")  # for trainstore_restore_incr
    mgr.close()
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


def _run_child(method: str, work: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--work", work]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return {"method": method, "error": (res.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_cold(label: str, state, work: str, repeats: int, methods: list[str]) -> dict:
    """Interleaved fresh-process rounds of ``methods``; prints and returns the medians."""
    nbytes = prepare(state, work)
    results: dict[str, list[dict]] = {m: [] for m in methods}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for m in methods:
            if m in errors:
                continue
            r = _run_child(m, work)
            if "error" in r:
                errors[m] = r["error"]
            else:
                results[m].append(r)
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
    tl = med.get("torch_load", {}).get("restore")
    restores = [m for m in methods if m in RESTORE_METHODS and m in med]
    if restores:
        print(f"  {'restore method':<20}{'s':>12}{'/torch.load':>13}")
        for m in restores:
            r = med[m]["restore"]
            print(f"  {m:<20}{r:>12.3f}{(f'{r / tl:>13.3f}' if tl else f'{chr(45):>13}')}")
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
