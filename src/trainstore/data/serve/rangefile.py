"""A read-only, seekable file over one store object, assembled from byte ranges.

``RangeFile`` fetches ranges with ``Store.get_ranges`` (coalesced and concurrent on object
stores) and serves reads from them, so pyarrow's ``ParquetFile`` can read a footer and the
column chunks of chosen row groups without the rest of the object (``serve.parquet``).
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Sequence
from typing import Any

from ...store import Store


class RangeFile(io.RawIOBase):
    """Read-only view of store object ``key`` (``size`` bytes) built from fetched ranges.

    ``load(ranges)`` fetches the missing ones in one ``get_ranges`` call; a read outside the
    loaded ranges fetches just what it asks for. ``fetched`` counts bytes read from the store.
    """

    def __init__(self, store: Store, key: str, size: int) -> None:
        super().__init__()
        self.store, self.key, self.size = store, key, size
        self.fetched = 0
        self._starts: list[int] = []
        self._parts: list[memoryview] = []
        self._pos = 0

    def _covering(self, start: int, length: int) -> memoryview | None:
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and self._starts[i] + len(self._parts[i]) >= start + length:
            offset = start - self._starts[i]
            return self._parts[i][offset:offset + length]
        return None

    def _add(self, start: int, data: Any) -> None:
        i = bisect.bisect_right(self._starts, start)  # after a shorter part at the same offset
        self._starts.insert(i, start)
        self._parts.insert(i, memoryview(data).cast("B"))

    def load(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch the ``(offset, length)`` ranges not held yet."""
        missing: list[tuple[int, int]] = []
        for s, n in sorted(r for r in ranges if r[1] > 0 and self._covering(*r) is None):
            if missing and s <= missing[-1][0] + missing[-1][1]:  # adjacent: one part, as pyarrow reads it
                start, length = missing[-1]
                missing[-1] = (start, max(length, s + n - start))
            else:
                missing.append((s, n))
        if missing:
            for (start, n), data in zip(missing, self.store.get_ranges(self.key, missing)):
                self.fetched += n
                self._add(start, data)

    def drop(self) -> None:
        """Forget the loaded ranges except the file's tail (the footer)."""
        keep = [(s, p) for s, p in zip(self._starts, self._parts) if s + len(p) >= self.size]
        self._starts = [s for s, _ in keep]
        self._parts = [p for _, p in keep]

    # -- io.RawIOBase ------------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self.size - self._pos))
        if n == 0:
            return 0
        view = self._covering(self._pos, n)
        if view is None:
            self.load([(self._pos, n)])
            view = self._covering(self._pos, n)
            assert view is not None
        memoryview(buffer).cast("B")[:n] = view
        self._pos += n
        return n


__all__ = ["RangeFile"]
