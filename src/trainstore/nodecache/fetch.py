"""Copy one durable-store object into an open cache file: whole, or as concurrent ranges.

A local durable store is copied in-kernel; a remote object larger than a part is fetched as
range requests, a bounded window of them in flight on a shared pool, written in order.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Executor, Future

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


def download_ranges(store: Store, key: str, fd: int, size: int, pool: Executor, *, part_bytes: int,
                    in_flight: int) -> int:
    """The object as ``part_bytes`` range requests, at most ``in_flight`` at once on ``pool``,
    written to ``fd`` in order; returns the bytes written."""
    starts = iter(range(0, size, part_bytes))
    window: deque[Future] = deque()
    written = 0
    try:
        while True:
            while len(window) < in_flight:
                start = next(starts, None)
                if start is None:
                    break
                window.append(pool.submit(store.get_range, key, start, min(part_bytes, size - start)))
            if not window:
                return written
            data = memoryview(window.popleft().result()).cast("B")
            write_all(fd, data)
            written += data.nbytes
    finally:
        for f in window:
            f.cancel()


__all__ = ["download", "download_ranges"]
