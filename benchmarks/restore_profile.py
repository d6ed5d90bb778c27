"""Where a fresh-process restore spends its time: read, decode, XOR, hash, first touch.

The parent writes a full checkpoint of ``--gib`` GiB float32 (16 tensors, step 1) and an
incremental of it scaled by (1 + 1e-4) (step 2: XOR deltas), like
benchmarks/checkpoint_cold.py. Each measurement is a new process that wraps the restore
path's steps with CPU timers (``thread_time``: CPU seconds summed over the read threads,
robust to a loaded machine, page faults included; "total" is wall time, "cpu" the process's
CPU seconds), then restores one step and prints one JSON line. ``pretouch``
variants fault in every destination page before the clock starts: the difference is the
first-touch cost; ``dropped`` variants drop the chunk files from the page cache first (a
restore after the cache lost them: raw pieces then come with ``O_DIRECT``; evicted with
``pagecache.evict``); ``VARIANT@N`` restores with N read threads (default 4), ``VARIANT/M``
reads and hashes raw chunks in blocks of M MiB (``chunkread.READ_BLOCK``, default 1),
``VARIANT:buffered`` reads raw chunks through the page cache (``chunkread.USE_DIRECT`` off).
``torch_load`` is the same-sized torch file, for comparison (``torch_load_dropped``: that file
evicted first). An unknown variant is refused before anything runs.

    .venv/bin/python benchmarks/restore_profile.py --gib 1 --repeats 2
    .venv/bin/python benchmarks/restore_profile.py --gpt --variants torch_load,full,incr --repeats 3
    .venv/bin/python benchmarks/restore_profile.py --variants torch_load_dropped,full_dropped,full_dropped/4 --repeats 4

``--gpt``: the GPT + AdamW state of benchmarks/checkpoint.py (b) instead, its step 2 the same
state scaled by (1 + 1e-4) (``checkpoint_cold.stepped``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch
from checkpoint import trained_gpt_state  # benchmarks/, the script's folder
from checkpoint_cold import stepped
from pagecache import evict, files_under

from trainstore import codecs_bytegroup, hostmem
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.restore import chunkread, reader

VARIANTS = ("torch_load", "torch_load_dropped", "full", "full_pretouch", "incr", "incr_pretouch", "full_dropped",
            "incr_dropped")

_times: dict[str, float] = collections.defaultdict(float)
_lock = threading.Lock()


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            with _lock:
                _times[name] += time.thread_time() - t
    return wrapper


def _instrument(pretouch: bool) -> None:
    """Wrap the restore path's steps (module attributes the callers look up at call time)."""
    for mod, attr, name in [(chunkread, "pread_into", "read (preadv)"),
                            (chunkread, "decode", "decode (whole)"),
                            (codecs_bytegroup, "decode_frame_into", "decode: zstd frames"),
                            (chunkread, "matches", "hash (whole piece)"),
                            (reader, "matches", "hash (whole piece)"),
                            (reader, "xor_into", "xor"),
                            (reader, "_get_into", "get_into (whole)"),
                            (reader, "empty_tensor", "allocate")]:
        if hasattr(mod, attr):
            setattr(mod, attr, _timed(name, getattr(mod, attr)))
    if pretouch:
        alloc = reader.empty_tensor

        def touched(*args, **kwargs):
            t = alloc(*args, **kwargs)
            t.reshape(-1).view(torch.uint8).numpy()[::hostmem.PAGE] = 0
            return t
        reader.empty_tensor = touched


def parse_variant(v: str) -> tuple[str, int, int, bool]:
    """``NAME[@THREADS][/BLOCK_MIB][:buffered]`` -> (name, read threads, read block bytes,
    ``O_DIRECT`` allowed); defaults 4, ``chunkread.READ_BLOCK`` and ``chunkread.USE_DIRECT``
    (``:buffered``: raw pieces through the page cache). Raises ValueError for an unknown name
    or options on torch.load."""
    v, _, mode = v.partition(":")
    head, _, block = v.partition("/")
    name, _, workers = head.partition("@")
    if (name not in VARIANTS or mode not in ("", "buffered")
            or (name.startswith("torch_load") and (workers or block or mode))):
        raise ValueError(v)
    return (name, int(workers or 4), int(block) << 20 if block else chunkread.READ_BLOCK,
            chunkread.USE_DIRECT and mode != "buffered")


def child(variant: str, work: str) -> dict:
    variant, workers, chunkread.READ_BLOCK, chunkread.USE_DIRECT = parse_variant(variant)
    if variant.endswith("dropped"):
        evict(files_under(os.path.join(work, "state.pt" if variant.startswith("torch_load") else "ts")))
    t, cpu = time.perf_counter(), time.process_time()
    if variant.startswith("torch_load"):
        state = torch.load(os.path.join(work, "state.pt"), weights_only=True)
        return {"total": time.perf_counter() - t, "cpu": time.process_time() - cpu}
    _instrument(variant.endswith("pretouch"))
    step = 1 if variant.startswith("full") else 2
    t, cpu = time.perf_counter(), time.process_time()
    mgr = CheckpointManager(os.path.join(work, "ts"), job="prof", read_workers=workers)
    opened = time.perf_counter() - t
    state = mgr.restore(step=step)
    total, cpu = time.perf_counter() - t, time.process_time() - cpu
    mgr.close()
    assert state
    return {"total": total, "cpu": cpu, "open manager": opened, **dict(_times)}


def prepare(work: str, gib: float, gpt: bool = False) -> None:
    if gpt:
        state = trained_gpt_state(False)
        step2 = stepped(state)
    else:
        torch.manual_seed(0)
        per = int(gib * (1 << 30)) // 4 // 16
        state = {f"t{i}": torch.randn(per) for i in range(16)}
        step2 = {k: v * (1 + 1e-4) for k, v in state.items()}
    torch.save(state, os.path.join(work, "state.pt"))
    mgr = CheckpointManager(os.path.join(work, "ts"), job="prof",
                            policy=CheckpointPolicy(full_every=1, incremental_every=None))
    mgr.save(1, state, blocking=True)
    mgr.save(2, step2, blocking=True, kind="incremental")
    mgr.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--gpt", action="store_true", help="the GPT + AdamW state instead of --gib float32")
    ap.add_argument("--keep", help="prepare into (or reuse) this directory and keep it")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.one:
        print(json.dumps(child(args.one, args.work)))
        return
    variants = args.variants.split(",")
    unknown = []
    for v in variants:
        try:
            parse_variant(v)
        except ValueError:
            unknown.append(v)
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)} "
                 "(trainstore ones take @THREADS, /BLOCK_MIB and :buffered)")
    work = args.keep or tempfile.mkdtemp(prefix="ts-restore-prof-")
    try:
        if not os.path.exists(os.path.join(work, "state.pt")):
            os.makedirs(work, exist_ok=True)
            prepare(work, args.gib, args.gpt)
        runs: dict[str, list[dict]] = collections.defaultdict(list)
        for _ in range(args.repeats):
            for v in variants:
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", v, "--work", work],
                                     capture_output=True, text=True, check=True).stdout
                runs[v].append(json.loads(out.strip().splitlines()[-1]))
        what = "GPT + AdamW state" if args.gpt else f"{args.gib:g} GiB float32, 16 tensors"
        print(f"{what}; medians of {args.repeats} fresh processes; "
              f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        for v, rs in runs.items():
            keys = sorted({k for r in rs for k in r if k != "variant"}, key=lambda k: (k != "total", k != "cpu", k))
            print(f"  {v:<20}" + "  ".join(f"{k} {statistics.median(r.get(k, 0.0) for r in rs):.3f}" for k in keys))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
