"""Interpreter exit: finish (or report) the saves of every open checkpoint manager.

A training script that ends without ``close()`` must not lose its last checkpoint. Managers
register here while open; at exit each is closed, which waits for its pending save, and a
failure is logged (never raised at exit).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Protocol

log = logging.getLogger("trainstore.checkpoint")


class Closable(Protocol):
    job: str

    def pending(self) -> int | None: ...

    def close(self) -> None: ...


_open: weakref.WeakSet[Closable] = weakref.WeakSet()  # type: ignore[type-var]


def track(manager: Closable) -> None:
    """Close ``manager`` at interpreter exit unless it was closed before."""
    _open.add(manager)


def untrack(manager: Closable) -> None:
    _open.discard(manager)


def _finish_at_exit() -> None:
    for mgr in list(_open):
        pending = mgr.pending()
        try:
            if pending is not None:
                log.warning("interpreter exit: waiting for checkpoint step %d of job %r", pending, mgr.job)
            mgr.close()
        except BaseException as exc:  # noqa: BLE001 - report, never raise at exit
            log.error("trainstore: checkpoint save of job %r did not complete at exit: %s", mgr.job, exc)


# Run before concurrent.futures shuts its pools down at interpreter exit (threading's exit
# hooks run in reverse order of registration and concurrent.futures registered at import,
# before this module), so a pending save can still use its thread pool; atexit as a fallback.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_finish_at_exit)
else:  # pragma: no cover
    atexit.register(_finish_at_exit)

__all__ = ["track", "untrack"]
