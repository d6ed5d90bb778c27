"""One rank of a ``harness.dist`` job: the process's entry point, whether it was started with
``Popen`` (``python -c "from harness.rank import main; main()"``) or forked by the zygote
(``harness.forkserver``).

Reads its part from the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``,
``TRAINSTORE_DIST_TARGET`` / ``_ARGS`` / ``_OUT`` / ``_PG_TIMEOUT``), joins the gloo group,
runs ``fn(rank, world, args)`` and writes ``{"value"}`` or ``{"error", "error_type"}`` to the
out file; exits 0 or 1 with ``os._exit`` (no interpreter teardown).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from datetime import timedelta
from typing import Any

import torch.distributed as dist


def main() -> None:
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


__all__ = ["main"]
