"""trainstore's own test harness (not shipped with the package): real torch.distributed ranks
(``dist``), a fault-injecting S3 proxy (``faultproxy``), crash children (``crashkit``) and a
tiny training job (``trainjob``).

It is imported as ``harness`` with ``tests/`` on ``sys.path``: pytest puts it there (rootdir
import mode, and ``pythonpath`` in pyproject.toml); benchmarks insert ``TESTS_DIR`` themselves;
child processes get it through ``child_env()``. What users need for their own store tests
stays public in ``trainstore.testing`` (the store suite and the moto S3 server).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: The ``tests/`` folder: the sys.path entry under which ``harness`` is importable.
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with ``TESTS_DIR`` first on PYTHONPATH,
    so that a child process (``python -m harness.crashkit``, a rank) can import ``harness``."""
    out = dict(os.environ if env is None else env)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != TESTS_DIR]
    out["PYTHONPATH"] = os.pathsep.join([TESTS_DIR, *rest])
    return out


def module_command(module: str, *args: str) -> list[str]:
    """The command line running ``harness.<module>`` as a script in a child process (pair it
    with ``env=child_env()``)."""
    return [sys.executable, "-m", f"harness.{module}", *args]


__all__ = ["TESTS_DIR", "child_env", "module_command"]
