"""Rank processes forked from one pre-imported interpreter, so a test's N ranks do not each pay
``import torch`` (~2-3 s of CPU per process here; six ranks on two cores ~8 s per job).

One zygote per test process, started at its first use (``harness.forkserver``): it imports
torch, ``torch.distributed``, numpy and trainstore, checks it is still single-threaded (a
fork copies only the forking thread: one holding a lock would leave it held in the child),
then forks a child per request. A child is a real process like one ``subprocess.Popen``
starts: its own environment (replaced whole), working directory, ``sys.path`` (PYTHONPATH's
entries first), stdin and stdout on ``/dev/null``, stderr into the requested file, and it
runs ``harness.rank.main`` (real gloo, real SIGKILL). Its exit status comes back as
``Popen.returncode`` would have it (-9: SIGKILLed). Where the zygote cannot start (or
``TRAINSTORE_TEST_FORK=0``), ``harness.dist`` starts ranks with ``Popen``.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading

from . import child_env


class Zygote:
    """The test process's side: start the zygote, fork ranks, learn their exit codes."""

    def __init__(self) -> None:
        env = child_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen([sys.executable, "-c", "from harness.forkserver import serve; serve()"],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        first = json.loads(self.proc.stdout.readline() or b'{"refused": "the zygote exited"}')
        if not first.get("ready"):
            self.proc.kill()
            raise RuntimeError(f"zygote: {first.get('refused')}")
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._spawned: list[int] = []
        self._exited: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._cond:
                if "pid" in msg:
                    self._spawned.append(msg["pid"])
                else:
                    self._exited[msg["exited"]] = msg["rc"]
                self._cond.notify_all()
        with self._cond:  # the zygote is gone: no exit code will come
            self._cond.notify_all()

    def spawn(self, env: dict[str, str], stderr_path: str) -> int:
        """Fork one rank process; returns its pid."""
        assert self.proc.stdin is not None
        with self._lock, self._cond:
            n = len(self._spawned)
            self.proc.stdin.write((json.dumps({"env": env, "cwd": os.getcwd(), "stderr": stderr_path}) + "\n").encode())
            self.proc.stdin.flush()
            if not self._cond.wait_for(lambda: len(self._spawned) > n or not self._reader.is_alive(), timeout=30):
                raise RuntimeError("zygote: no pid within 30 s")
            if len(self._spawned) <= n:
                raise RuntimeError("zygote: it exited")
            return self._spawned[n]

    def wait(self, pid: int, timeout: float) -> int | None:
        """The exit code of ``pid`` (as ``Popen.returncode``), or None if it still runs after ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exited or not self._reader.is_alive(), timeout=timeout)
            return self._exited.pop(pid, None)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_zygote: Zygote | None = None
_failed = False
_start_lock = threading.Lock()


def zygote() -> Zygote | None:
    """The test process's zygote (started at first use), or None where it cannot run (then
    ranks are started with ``Popen``)."""
    global _zygote, _failed
    with _start_lock:
        if _zygote is None and not _failed:
            try:
                _zygote = Zygote()
                atexit.register(_zygote.close)
            except (RuntimeError, OSError) as exc:
                print(f"harness.zygote: ranks start with Popen instead: {exc}", file=sys.stderr)
                _failed = True
        return _zygote


__all__ = ["Zygote", "zygote"]
