"""Run a function on N real torch.distributed ranks (gloo on 127.0.0.1, one subprocess each).

    results = run_ranks("my_workers:save_and_load", world=4, args={"root": path}, pythonpath=[here])
    assert all(r.ok for r in results)

Each rank runs ``fn(rank, world, args) -> JSON`` after ``init_process_group("gloo")`` with a
process-group timeout of ``pg_timeout_s`` (so a dead peer turns into an error on the others
within a bounded time). ``RankResult`` carries the return code (-9 for a SIGKILLed rank),
the returned JSON or the raised error (type + message), and the tail of stderr. The whole
job is killed after ``timeout_s``: a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

from . import child_env


@dataclass
class RankResult:
    rank: int
    returncode: int | None  # None: killed by the harness after timeout_s
    value: Any = None
    error: str | None = None  # "<ExceptionType>: message" of what fn raised
    error_type: str | None = None
    stderr: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.error is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target: str, world: int, args: dict | None = None, *, timeout_s: float = 120.0,
              pg_timeout_s: float = 30.0, pythonpath: list[str] | None = None,
              env: dict[str, str] | None = None) -> list[RankResult]:
    """Start ``world`` ranks running ``target`` ("module:function"); wait for all; return results."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="trainstore-dist-")
    base_env = child_env({**os.environ, **(env or {})})  # the ranks import harness.dist
    paths = list(pythonpath or []) + [p for p in base_env["PYTHONPATH"].split(os.pathsep) if p]
    base_env["PYTHONPATH"] = os.pathsep.join(paths)
    base_env.setdefault("OMP_NUM_THREADS", "1")
    procs = []
    for rank in range(world):
        e = dict(base_env, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 TRAINSTORE_DIST_TARGET=target, TRAINSTORE_DIST_ARGS=json.dumps(args or {}),
                 TRAINSTORE_DIST_OUT=os.path.join(tmp, f"rank{rank}.json"),
                 TRAINSTORE_DIST_PG_TIMEOUT=str(pg_timeout_s))
        errf = open(os.path.join(tmp, f"rank{rank}.err"), "w+b")  # noqa: SIM115 - closed below
        p = subprocess.Popen([sys.executable, "-c", "from harness.dist import _rank_main; _rank_main()"],
                             env=e, stdout=subprocess.DEVNULL, stderr=errf)
        procs.append((p, errf, time.monotonic()))
    deadline = time.monotonic() + timeout_s
    results = []
    for rank, (p, errf, t0) in enumerate(procs):
        try:
            rc: int | None = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = None
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")[-4000:]
        errf.close()
        res = RankResult(rank, rc, stderr=stderr, seconds=time.monotonic() - t0)
        out = os.path.join(tmp, f"rank{rank}.json")
        if os.path.exists(out):
            with open(out) as f:
                payload = json.load(f)
            res.value, res.error, res.error_type = payload.get("value"), payload.get("error"), payload.get("error_type")
        results.append(res)
    return results


def _rank_main() -> None:
    import importlib
    from datetime import timedelta

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = os.environ["TRAINSTORE_DIST_OUT"]
    mod_name, fn_name = os.environ["TRAINSTORE_DIST_TARGET"].split(":")
    args = json.loads(os.environ["TRAINSTORE_DIST_ARGS"])
    payload: dict[str, Any]
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                                world_size=world,
                                timeout=timedelta(seconds=float(os.environ["TRAINSTORE_DIST_PG_TIMEOUT"])))
        fn = getattr(importlib.import_module(mod_name), fn_name)
        payload = {"value": fn(rank, world, args)}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        traceback.print_exc()
        payload = {"error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__}
    with open(out + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(out + ".tmp", out)
    try:
        if dist.is_initialized() and "error" not in payload:
            dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if "error" not in payload else 1)


__all__ = ["RankResult", "run_ranks", "free_port"]
