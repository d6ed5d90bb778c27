"""Rank functions for tests/test_harness.py (imported by the ranks from ``tests/``)."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist


def describe(rank: int, world: int, args: dict) -> dict:
    """What a rank sees: its environment, cwd, path, an all_reduce, fresh randomness."""
    t = torch.tensor([rank + 1])
    dist.all_reduce(t)
    return {"rank": rank, "world": world, "sum": int(t.item()), "env": os.environ.get("HARNESS_PROBE"),
            "omp": os.environ.get("OMP_NUM_THREADS"), "cwd": os.getcwd(), "pid": os.getpid(),
            "path0": next(p for p in sys.path if p), "np": int(np.random.randint(0, 2**31)), "stdout": _stdout()}


def _stdout() -> str:
    """Where fd 1 goes, after printing to it (a forked rank's print must not reach the zygote's
    protocol pipe)."""
    print("a rank prints", flush=True)
    return os.readlink("/proc/self/fd/1")


def kill_one(rank: int, world: int, args: dict) -> dict:
    dist.barrier()  # both ranks joined (see ``fail``): the survivor's own start cannot race the kill
    if rank == args["victim"]:
        print("rank about to be killed", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return {"rank": rank}


def hang(rank: int, world: int, args: dict) -> dict:
    if rank == 1:
        time.sleep(120)
    return {"rank": rank}


def fail(rank: int, world: int, args: dict) -> dict:
    # both ranks pass a barrier first: rank 0 hosts the rendezvous store, and raising before
    # rank 1 has finished joining would reset rank 1's connection mid-init (seen in CI)
    dist.barrier()
    if rank == 0:
        raise ValueError("rank 0 says no")
    return {"rank": rank}
