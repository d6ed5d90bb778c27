"""Random row access to Parquet shards by byte ranges: the footer once, then only the column
chunks of the row groups (and columns) the requested rows need.

``RangeFile`` is a read-only, seekable file over one store object assembled from ranges
fetched with ``Store.get_ranges`` (coalesced and concurrent on object stores); pyarrow's
``ParquetFile`` reads the footer and the column chunks through it. ``ParquetRanges`` keeps one
open ``ParquetFile`` per shard (footer parsed once) and an LRU of decoded row groups bounded
in bytes, and gathers rows into batched arrays like ``OpenShard.gather``. ``parquet_footer``
reads just a file's footer (``Dataset.open`` of a Parquet directory). Whole shards read by the
``Loader`` go through the node cache instead (``OpenShard``).
"""

from __future__ import annotations

import bisect
import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import IntegrityError, TrainstoreError
from ...store import Store
from ..versions import ShardInfo
from .open_shard import ColumnSpec, column_view, copy_rows

#: bytes fetched from the end of a file for its footer (one request for most files)
FOOTER_PROBE = 64 << 10


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


def _open_parquet(store: Store, key: str, size: int,
                  footer: pq.FileMetaData | None = None) -> tuple[RangeFile, pq.ParquetFile]:
    """Open ``key`` by ranges: one request for the tail unless its ``footer`` was read
    already; ``IntegrityError`` naming the file if it is not Parquet."""
    raw = RangeFile(store, key, size)
    try:
        if footer is None:
            tail = min(size, FOOTER_PROBE)
            raw.load([(size - tail, tail)])
        return raw, pq.ParquetFile(pa.PythonFile(raw, mode="r"), metadata=footer)
    except TrainstoreError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise IntegrityError(f"{store.url}/{key}: not a readable Parquet file ({exc})") from None


def parquet_footer(store: Store, key: str, size: int) -> pq.FileMetaData:
    """The footer of Parquet object ``key`` (read by ranges; ``IntegrityError`` if corrupt)."""
    return _open_parquet(store, key, size)[1].metadata


def column_chunk_ranges(meta: pq.FileMetaData, group: int, columns: Sequence[str]) -> list[tuple[int, int]]:
    """``(offset, length)`` of the column chunks of row group ``group`` holding ``columns``
    (top-level field names; every leaf of a nested column)."""
    wanted = set(columns)
    rg = meta.row_group(group)
    out = []
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.path_in_schema.split(".")[0] not in wanted:
            continue
        start = col.data_page_offset
        if col.has_dictionary_page and 0 < col.dictionary_page_offset < start:
            start = col.dictionary_page_offset
        out.append((start, col.total_compressed_size))
    return out


class _Shard:
    def __init__(self, store: Store, info: ShardInfo, footer: pq.FileMetaData | None) -> None:
        self.raw, self.file = _open_parquet(store, info.key, info.bytes, footer)
        meta = self.file.metadata
        if meta.num_rows != info.rows:
            raise IntegrityError(f"{store.url}/{info.key}: has {meta.num_rows} rows, manifest says {info.rows}")
        sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        #: first row of each row group
        self.starts = np.cumsum([0, *sizes[:-1]]).astype(np.int64)


class ParquetRanges:
    """Rows of a version's Parquet shards read by byte ranges (see the module docstring).

    ``budget_bytes`` bounds the decoded row groups kept for reuse; ``fetched_bytes`` counts
    the bytes read from the store (footers included). ``footers``: those read already, by key.
    """

    def __init__(self, store: Store, shards: Sequence[ShardInfo], specs: dict[str, ColumnSpec],
                 budget_bytes: int, footers: dict[str, pq.FileMetaData] | None = None) -> None:
        self.store, self.shards, self.specs = store, shards, specs
        self.footers = footers if footers is not None else {}
        self.budget_bytes = budget_bytes
        self._files: dict[int, _Shard] = {}
        self._groups: OrderedDict[tuple[int, int], tuple[dict[str, np.ndarray], int]] = OrderedDict()
        self._held = 0
        self._lock = threading.RLock()

    @property
    def fetched_bytes(self) -> int:
        return sum(f.raw.fetched for f in self._files.values())

    def _file(self, shard: int) -> _Shard:
        f = self._files.get(shard)
        if f is None:
            info = self.shards[shard]
            f = self._files[shard] = _Shard(self.store, info, self.footers.get(info.key))
        return f

    def _group(self, shard: int, group: int) -> dict[str, np.ndarray]:
        hit = self._groups.get((shard, group))
        if hit is not None:
            self._groups.move_to_end((shard, group))
            return hit[0]
        f = self._file(shard)
        names = list(self.specs)
        key = self.shards[shard].key
        f.raw.load(column_chunk_ranges(f.file.metadata, group, names))
        try:
            table = f.file.read_row_group(group, columns=names)
        except (pa.ArrowException, OSError) as exc:
            raise IntegrityError(f"{self.store.url}/{key}: row group {group} does not decode ({exc})") from None
        finally:
            f.raw.drop()
        views = {n: column_view(table.column(n).combine_chunks(), spec, n, key) for n, spec in self.specs.items()}
        size = table.nbytes
        self._groups[(shard, group)] = (views, size)
        self._held += size
        while self._held > self.budget_bytes and len(self._groups) > 1:
            _, (_, old) = self._groups.popitem(last=False)
            self._held -= old
        return views

    def row(self, shard: int, local: int) -> dict[str, np.ndarray]:
        with self._lock:
            starts = self._file(shard).starts
            g = int(np.searchsorted(starts, local, side="right") - 1)
            views = self._group(shard, g)
        i = local - int(starts[g])
        return {n: v[i] for n, v in views.items()}

    def gather(self, shard: int, local: np.ndarray, out: dict[str, np.ndarray], positions: np.ndarray) -> None:
        """``out[name][positions] = rows local`` of ``shard``, one row group at a time."""
        with self._lock:
            starts = self._file(shard).starts
            gid = np.searchsorted(starts, local, side="right") - 1
            for g in np.unique(gid):
                sel = gid == g
                views = self._group(shard, int(g))
                rows = local[sel] - starts[g]
                for name, view in views.items():
                    copy_rows(out[name], positions[sel], view, rows)


__all__ = ["FOOTER_PROBE", "ParquetRanges", "RangeFile", "column_chunk_ranges", "parquet_footer"]
