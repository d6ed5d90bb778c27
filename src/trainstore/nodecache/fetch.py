"""Copy one durable-store object into an open cache file: whole, or as concurrent ranges.

A local durable store is copied in-kernel; a remote object larger than a part is fetched as
range requests on a pool shared by every fill of the cache, written in order. The fetched
parts of all those fills share one byte budget of ``part_bytes x concurrency``: a part holds
its share from before its request until it is written, so the memory a cache's downloads
hold is bounded however many objects fill at once.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from ..bytebudget import ByteBudget
from ..errors import NotFoundError
from ..fileio import write_all
from ..store import Store
from .files import copy_file


def download(store: Store, key: str, fd: int) -> int:
    """Copy the object into ``fd``; returns the bytes written."""
    src = store.local_path(key)
    if src is not None:
        try:
            with open(src, "rb") as f:
                return copy_file(f.fileno(), fd)
        except FileNotFoundError:
            raise NotFoundError(f"object {key!r} not found in {store.url}") from None
    data = memoryview(store.get(key)).cast("B")
    write_all(fd, data)
    return data.nbytes


class RangedDownloads:
    """Ranged downloads of one cache: ``concurrency`` requests at once on one pool, and at
    most ``part_bytes x concurrency`` bytes of fetched parts held, across all its fills."""

    def __init__(self, part_bytes: int, concurrency: int) -> None:
        self.part_bytes = part_bytes
        self.budget = ByteBudget(part_bytes * concurrency)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="trainstore-range")

    def download(self, store: Store, key: str, fd: int, size: int) -> int:
        """The object as ``part_bytes`` range requests, written to ``fd`` in order; returns the
        bytes written. A fill holding parts never waits for budget (it writes its oldest part
        first); only a fill holding none does, so fills never wait on each other in a circle."""
        starts = deque(range(0, size, self.part_bytes))
        window: deque[tuple[Future, int]] = deque()
        written = 0
        try:
            while starts or window:
                while starts:
                    nbytes = min(self.part_bytes, size - starts[0])
                    if window and not self.budget.try_acquire(nbytes):
                        break
                    if not window:
                        self.budget.acquire(nbytes)
                    window.append((self._submit(store, key, starts.popleft(), nbytes), nbytes))
                fut, nbytes = window.popleft()
                try:
                    written += _write_result(fd, fut)
                finally:
                    del fut  # the future holds the part: drop it before giving its bytes back
                    self.budget.release(nbytes)
        finally:
            for fut, nbytes in window:
                if fut.cancel():
                    self.budget.release(nbytes)
                else:  # running: its bytes are held until it ends
                    fut.add_done_callback(lambda _f, n=nbytes: self.budget.release(n))
        return written

    def _submit(self, store: Store, key: str, start: int, nbytes: int) -> Future:
        try:
            return self._pool.submit(store.get_range, key, start, nbytes)
        except BaseException:
            self.budget.release(nbytes)
            raise


def _write_result(fd: int, fut: Future) -> int:
    data = memoryview(fut.result()).cast("B")
    write_all(fd, data)
    return data.nbytes


__all__ = ["RangedDownloads", "download"]
