"""A resumed job in a fresh process: restore the newest checkpoint into the live state, train,
save. The restore and the first save after it, against DCP and torch doing the same.

Every restart of a long job runs this sequence: a new process builds its model, restores the
newest checkpoint (usually an incremental) into it, and its first save after the restore is,
under trainstore's default policy, an incremental whose base full checkpoint is not in memory
(the save reads it from the store). benchmarks/checkpoint_cold.py measures a fresh process's
first save into an empty store and its restore into fresh memory; this one measures them as a
resumed job does, back to back, in the same fresh process.

    .venv/bin/python benchmarks/resume_first_save.py                 # GPT + AdamW (0.31 GiB), 3 rounds
    .venv/bin/python benchmarks/resume_first_save.py --gib 1 --rounds 5
    .venv/bin/python benchmarks/resume_first_save.py --cached        # files left in the page cache

The parent writes: the live state (``state.pt``: what the new process built, torch.loaded
untimed), a trainstore store with step 1 full and step 2 incremental (``full_every=4,
incremental_every=1``), and step 2 as a DCP checkpoint and a torch file. Each child (one per
method and round, rounds interleaved, medians) copies the trainstore store (so every child
saves into the same history), evicts every file from the page cache (``--cached``: reads
them once instead), then times:

* ``trainstore``: ``restore_into`` (newest, step 2) ; one training-like step on the state
  (every float scaled by 1 + 1e-4) ; ``save(3)``: an incremental against step 1 (blocking,
  durable) ; then ``save(4)`` (full: ``full_every=4``) and ``save(5)`` (incremental, base
  in memory): what the steady state costs in the same process.
* ``trainstore_full``: the same with ``save(3, kind="full")``.
* ``dcp``: ``dcp.load`` into the live state ; the step ; ``dcp.async_save`` + fsync of its files.
* ``torch``: ``torch.load`` + ``copy_`` into the live state ; the step ; ``torch.save`` + fsync.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pagecache  # noqa: E402
from checkpoint import trained_gpt_state  # noqa: E402
from checkpoint_cold import flat_tensors, fsync_path, stepped  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402

POLICY = CheckpointPolicy(full_every=4, incremental_every=1)
METHODS = ("trainstore", "trainstore_full", "dcp", "torch")


def make_state(gib: float | None) -> dict:
    if gib is None:
        return trained_gpt_state(False)
    g = torch.Generator().manual_seed(0)
    n = int(gib * (1 << 30)) // 4 // 16
    return {f"t{i}": torch.randn(n, generator=g) for i in range(16)}


def prepare(work: str, gib: float | None) -> int:
    state = make_state(gib)
    torch.save(state, os.path.join(work, "state.pt"))
    with CheckpointManager(os.path.join(work, "ts"), job="resume", policy=POLICY) as mgr:
        mgr.save(1, state, blocking=True, kind="full")
        state2 = stepped(state)
        mgr.save(2, state2, blocking=True, kind="incremental")
    import torch.distributed.checkpoint as dcp

    dcp.save(flat_tensors(state2), checkpoint_id=os.path.join(work, "dcp"))
    torch.save(state2, os.path.join(work, "state2.pt"))
    return sum(t.nbytes for t in flat_tensors(state).values())


def _copy_into(dst, src) -> None:  # noqa: ANN001
    if isinstance(dst, dict):
        for k in dst:
            _copy_into(dst[k], src[k])
    elif isinstance(dst, torch.Tensor):
        dst.copy_(src)


def child(work: str, method: str, cached: bool) -> dict:
    """One resumed job in this (fresh) process."""
    import torch.distributed.checkpoint as dcp

    state = torch.load(os.path.join(work, "state.pt"), weights_only=True)  # the model the job built
    root = os.path.join(work, f"ts-{os.getpid()}")
    if method.startswith("trainstore"):
        shutil.copytree(os.path.join(work, "ts"), root)
    files = pagecache.files_under(work)
    if cached:
        pagecache.cache(files)
    else:
        pagecache.evict(files)
    out: dict = {"method": method}
    scratch = os.path.join(work, f"out-{os.getpid()}")
    try:
        t, cpu = time.perf_counter(), time.process_time()
        if method.startswith("trainstore"):
            mgr = CheckpointManager(root, job="resume", policy=POLICY)
            mgr.restore_into(state)
        elif method == "dcp":
            flat = flat_tensors(state)
            dcp.load(flat, checkpoint_id=os.path.join(work, "dcp"))
        else:
            _copy_into(state, torch.load(os.path.join(work, "state2.pt"), weights_only=True))
        out["restore"] = time.perf_counter() - t
        out["restore_cpu"] = time.process_time() - cpu
        state = stepped(state)
        t = time.perf_counter()
        if method.startswith("trainstore"):
            h = mgr.save(3, state, kind="full" if method == "trainstore_full" else None)
            out["blocking"] = time.perf_counter() - t
            h.wait()
            out["durable"] = time.perf_counter() - t
            out["kind"] = h.kind
            for step in (4, 5):  # the steady state of the same process, for reference
                state = stepped(state)
                t = time.perf_counter()
                h = mgr.save(step, state)
                h.wait()
                out[f"durable_{step}_{h.kind}"] = time.perf_counter() - t
            mgr.close()
        elif method == "dcp":
            fut = dcp.async_save(flat_tensors(state), checkpoint_id=scratch)
            out["blocking"] = time.perf_counter() - t
            fut.result()
            for path in pagecache.files_under(scratch):
                fsync_path(path)
            out["durable"] = time.perf_counter() - t
        else:
            with open(scratch, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            out["blocking"] = out["durable"] = time.perf_counter() - t
    finally:
        for p in (root, scratch):
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.unlink(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=None, help="random float32 state of this size (default: GPT + AdamW)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--cached", action="store_true", help="leave the files in the page cache (default: evicted)")
    ap.add_argument("--work", default=None, help="prepared directory to reuse (default: a new temporary one)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(child(a.work, a.one, a.cached)))
        return
    methods = [m for m in a.methods.split(",") if m]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; known: {METHODS}")
    work = a.work or tempfile.mkdtemp(prefix="ts-resume-")
    nbytes = prepare(work, a.gib) if not os.path.exists(os.path.join(work, "state.pt")) else None
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    try:
        for r in range(a.rounds):
            for m in (methods if r % 2 == 0 else methods[::-1]):
                cmd = [sys.executable, os.path.abspath(__file__), "--one", m, "--work", work]
                res = subprocess.run(cmd + (["--cached"] if a.cached else []), capture_output=True, text=True)
                if res.returncode:
                    raise SystemExit(f"{m} failed:\n{res.stderr[-3000:]}")
                rows[m].append(json.loads(res.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[m][-1]), flush=True)
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    keys = ("restore", "restore_cpu", "blocking", "durable")
    summary = {m: {k: statistics.median(x[k] for x in rs) for k in keys} for m, rs in rows.items()}
    for m, rs in rows.items():
        for k in sorted({k for x in rs for k in x if k.startswith("durable_")}):
            summary[m][k] = statistics.median(x[k] for x in rs if k in x)
    base = {k: summary.get("dcp", {}).get(k) for k in keys}
    print(json.dumps({"state_bytes": nbytes, "cache": "cached" if a.cached else "evicted", "medians": summary,
                      "x_dcp": {m: {k: v[k] / base[k] for k in keys if base[k]} for m, v in summary.items()}}, indent=1))


if __name__ == "__main__":
    main()
