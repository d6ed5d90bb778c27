"""Run a function on N real torch.distributed ranks (gloo on 127.0.0.1, one process each: forked
from the pre-imported zygote under pytest, ``harness.zygote``; a fresh interpreter otherwise).

    results = run_ranks("my_workers:save_and_load", world=4, args={"root": path}, pythonpath=[here])
    assert all(r.ok for r in results)

Each rank runs ``fn(rank, world, args) -> JSON`` after ``init_process_group("gloo")`` with a
process-group timeout of ``pg_timeout_s`` (so a dead peer turns into an error on the others
within a bounded time). ``RankResult`` carries the return code (-9 for a SIGKILLed rank),
the returned JSON or the raised error (type + message), and the tail of stderr. The whole
job is killed after ``timeout_s``: a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from . import child_env
from .zygote import Zygote, zygote


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
              env: dict[str, str] | None = None, fork: bool | None = None) -> list[RankResult]:
    """Start ``world`` ranks running ``target`` ("module:function"); wait for all; return results.

    ``fork``: fork the ranks from the pre-imported zygote (``harness.zygote``) instead of
    starting interpreters; None: under pytest (where every second of import counts), unless
    ``TRAINSTORE_TEST_FORK=0``. Benchmarks keep fresh interpreters."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="trainstore-dist-")
    base_env = child_env({**os.environ, **(env or {})})  # the ranks import harness.rank
    paths = list(pythonpath or []) + [p for p in base_env["PYTHONPATH"].split(os.pathsep) if p]
    base_env["PYTHONPATH"] = os.pathsep.join(paths)
    base_env.setdefault("OMP_NUM_THREADS", "1")
    forker = zygote() if _fork_ranks(fork) else None
    procs: list[tuple[Any, Any, float]] = []
    for rank in range(world):
        e = dict(base_env, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 TRAINSTORE_DIST_TARGET=target, TRAINSTORE_DIST_ARGS=json.dumps(args or {}),
                 TRAINSTORE_DIST_OUT=os.path.join(tmp, f"rank{rank}.json"),
                 TRAINSTORE_DIST_PG_TIMEOUT=str(pg_timeout_s))
        errf = open(os.path.join(tmp, f"rank{rank}.err"), "w+b")  # noqa: SIM115 - closed below
        if forker is not None:
            p: Any = forker.spawn(e, errf.name)
        else:
            p = subprocess.Popen([sys.executable, "-c", "from harness.rank import main; main()"],
                                 env=e, stdout=subprocess.DEVNULL, stderr=errf)
        procs.append((p, errf, time.monotonic()))
    deadline = time.monotonic() + timeout_s
    results = []
    for rank, (p, errf, t0) in enumerate(procs):
        rc = _wait(forker, p, max(0.1, deadline - time.monotonic()))
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


def _fork_ranks(fork: bool | None) -> bool:
    if fork is not None:
        return fork
    return "pytest" in sys.modules and os.environ.get("TRAINSTORE_TEST_FORK", "1") != "0"


def _wait(forker: Zygote | None, p: Any, timeout: float) -> int | None:
    """A rank's return code; it is SIGKILLed (None) when still running after ``timeout``."""
    if forker is not None:
        rc = forker.wait(p, timeout)
        if rc is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
            forker.wait(p, 10)
        return rc
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None


__all__ = ["RankResult", "run_ranks", "free_port"]
