"""Staging FSDP2-style DTensor shards from a GPU: trainstore's side-stream copy against torch's
state-dict copy (the path of DCP's own stager), host blocked and training stream stalled.

    .venv/bin/python benchmarks/gpu_dtensor.py --gib 4 --out dtensor.json   # on a GPU machine (gpu.sh runs it)
    .venv/bin/python benchmarks/gpu_dtensor.py --gib 0.05                    # CPU: plumbing only

A one-rank process group (NCCL on a GPU, gloo on the CPU) and a mesh of one device; the state is
16 bf16 DTensors sharded on dim 0 (``distribute_tensor``), what FSDP2 hands ``dcp.save``. Both
methods copy into a pinned host copy made once (``_create_cpu_state_dict``, not timed) and are
timed over ``--repeats`` steady saves, the state changed between saves:

* ``trainstore``: ``dcp.statedict.StateDictCopy.copy_async`` (``non_blocking`` copies on the
  side stream, the training stream made to wait for them on the GPU);
* ``torch``: ``_copy_state_dict(state, cache)`` as torch's ``DefaultStager`` calls it without
  its async options (one synchronous copy per shard) - what trainstore did before.

``blocked`` = until the call returned (the host is free), ``released`` = until the training
stream runs a kernel enqueued right after the call, ``done`` = until the copy finished; GB/s
of the copy against one plain pinned device-to-host copy of the same bytes (``limit``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from trainstore.dcp.statedict import StateDictCopy

DEV = "cuda" if torch.cuda.is_available() else "cpu"
GiB = 1 << 30


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def stream_free(t0: float) -> float:
    """Seconds from t0 until the current stream runs a kernel enqueued now."""
    if DEV == "cuda":
        ev = torch.cuda.Event()
        ev.record()
        ev.synchronize()
    return time.perf_counter() - t0


def make_state(gib: float, n: int = 16) -> dict:
    mesh = init_device_mesh(DEV, (1,))
    per = max(int(gib * GiB) // 2 // n // 1024, 1)
    g = torch.Generator(device=DEV).manual_seed(0)
    return {"model": {f"w{i}": distribute_tensor(torch.randn(per, 1024, device=DEV, generator=g, dtype=torch.bfloat16),
                                                 mesh, [Shard(0)]) for i in range(n)}, "step": 1}


def perturb(state: dict) -> None:
    with torch.no_grad():
        for t in state["model"].values():
            t.to_local().view(-1)[::2048] += 1
    sync()


def limit(nbytes: int) -> float:
    """GB/s of one pinned device-to-host copy of ``nbytes``."""
    if DEV != "cuda":
        return float("nan")
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = float("inf")
    for _ in range(3):
        sync()
        t = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def bench(state: dict, method: str, repeats: int) -> dict:
    nbytes = sum(t.to_local().numel() * 2 for t in state["model"].values())
    if method == "trainstore":
        copy = StateDictCopy(None, "stream")
        out, fence = copy.copy_async(state)  # first save: makes the pinned copy (not timed)
        if fence is not None:
            fence.wait()
    else:
        cache = _create_cpu_state_dict(state, pin_memory=DEV == "cuda")
    rows = []
    for _ in range(repeats):
        perturb(state)
        t = time.perf_counter()
        if method == "trainstore":
            out, fence = copy.copy_async(state)
        else:
            out, fence = _copy_state_dict(state, cache), None
        blocked = time.perf_counter() - t
        released = stream_free(t)
        if fence is not None:
            fence.wait()
        done = time.perf_counter() - t
        rows.append({"blocked": blocked, "released": released, "done": done, "gbps": nbytes / done / 1e9})
    first = next(iter(out["model"].values())).to_local()
    assert first.device.type == "cpu"
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} | {"bytes": nbytes, "repeats": repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ts-dtensor-")
    dist.init_process_group("nccl" if DEV == "cuda" else "gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
    try:
        state = make_state(a.gib)
        nbytes = sum(t.to_local().numel() * 2 for t in state["model"].values())
        result = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "limit_gbps": limit(nbytes)}
        for method in ("torch", "trainstore", "torch", "trainstore"):  # interleaved, the second pair reported
            result[method] = bench(state, method, a.repeats)
            print(method, json.dumps(result[method]), flush=True)
        print(json.dumps(result, indent=1))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        dist.destroy_process_group()
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    sys.exit(0)


if __name__ == "__main__":
    main()
