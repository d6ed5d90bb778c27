"""The save writers' thread pools: one per ``(workers, nice)``, kept for the life of the process.

A pool made per save (as ``write_tensors`` did) lost its threads at the end of every save, and
with them each thread's touched buffers: the 4 MiB ``O_DIRECT`` bounce buffer
(``fileio.write_direct``), the XOR scratch (``format.delta.scratch``) and the codecs' scratch.
Every save then faulted in fresh pages for all of them (8 threads x 4 MiB of bounce buffer
alone), at 0.4-7 GB/s on the machine measured, on the CPU the training shares. Kept threads
keep their buffers touched: memory held is what each thread used, at most ``workers`` x
(4 MiB bounce + XOR and codec scratch of up to a chunk each, and a chunk-sized base buffer
where an incremental reads its base from the store: ``chunkread.read_base``): with the defaults up to about
200 MiB by that count (not measured), far less when the codecs run raw.

Callers must wait for every task they submitted, also when one fails (a task still running
reads the caller's staged bytes). After ``fork`` the child starts with no pools (the parent's
threads do not exist there).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_pools: dict[tuple[str, int, int], ThreadPoolExecutor] = {}


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's niceness (Linux: threads are tasks) so that hashing and
    compression of a background save yield the CPU to the training loop."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        pass


def shared_pool(name: str, workers: int, nice: int) -> ThreadPoolExecutor:
    """The process's pool of ``workers`` threads named ``trainstore-<name>`` at niceness +``nice``."""
    key = (name, workers, nice)
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"trainstore-{name}",
                                                    initializer=lower_thread_priority, initargs=(nice,))
        return pool


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    _pools.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)

__all__ = ["lower_thread_priority", "shared_pool"]
