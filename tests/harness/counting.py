"""A read-only store view that counts the bytes its reads return: how tests and benchmarks
measure what a loader fetched from the object store (per rank, per epoch)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from trainstore.store import Buffer, ReadOnlyStore, Store


class CountingStore(ReadOnlyStore):
    """Reads pass through to ``inner``; ``bytes_read`` counts every byte they return (thread
    safe: loaders read from worker threads). Writes raise ``ReadOnlyError`` as on any
    read-only view."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.bytes_read = 0
        self._lock = threading.Lock()

    def _count(self, data: Buffer) -> Buffer:
        with self._lock:
            self.bytes_read += memoryview(data).nbytes
        return data

    def get(self, key: str) -> Buffer:
        return self._count(self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> Buffer:
        return self._count(self.inner.get_range(key, start, length))

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[Buffer]:
        return [self._count(b) for b in self.inner.get_ranges(key, ranges)]


__all__ = ["CountingStore"]
