"""The zygote's side (see ``harness.zygote``): import torch and trainstore once, stay
single-threaded, fork one rank process per request.

Run as ``python -c "from harness.forkserver import serve; serve()"`` with JSON lines on
stdin/stdout: ``{"env", "cwd", "stderr"}`` -> ``{"pid"}`` at once, and ``{"exited": pid,
"rc"}`` when that child ends (``rc`` as ``Popen.returncode``: -9 for SIGKILL). EOF on stdin
ends the server; children still running are left to finish or be killed by their test.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import sys
import threading
import traceback
from typing import Any

import numpy  # noqa: F401 - preloaded
import torch  # noqa: F401 - preloaded: the point of the zygote
import torch.distributed  # noqa: F401

import trainstore  # noqa: F401
import trainstore.checkpoint  # noqa: F401
import trainstore.dcp  # noqa: F401
import trainstore.peer  # noqa: F401

from .rank import main as rank_main


def _become(req: dict[str, Any]) -> None:
    """In the forked child: become the requested process (like ``Popen`` would have started
    it) and run the rank; never returns."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # fd 1 is the server's protocol pipe: nothing of the rank may reach it
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(err, 2)
        os.close(null)
        os.close(err)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        for p in reversed([p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
            if p not in sys.path:
                sys.path.insert(0, p)
        importlib.invalidate_caches()
        rank_main()  # ends with os._exit
    except BaseException:  # noqa: BLE001 - reported on the rank's stderr
        traceback.print_exc()
    finally:
        os._exit(1)


def _write(obj: dict[str, Any]) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def serve() -> None:
    """Select on stdin for requests; reap children between them (no threads: see the module)."""
    tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    if tasks != 1:
        _write({"refused": f"{tasks} threads after the imports: forking is not safe"})
        return
    _write({"ready": True})
    buf, children, eof = b"", set(), False
    while not eof:
        ready, _, _ = select.select([0], [], [], 0.02)
        if ready:
            chunk = os.read(0, 1 << 16)
            eof = not chunk
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _become(json.loads(line))
                children.add(pid)
                _write({"pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _write({"exited": pid, "rc": os.waitstatus_to_exitcode(status)})


__all__ = ["serve"]
