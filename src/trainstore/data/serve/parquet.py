"""Rows of Parquet shards, decoded one row group at a time.

``ParquetRows`` (one per ``Dataset`` and process) serves the rows of a ``parquet`` version
from two sources, both decoding only the row groups the requested rows fall in:

* **the cached file** (``open_cached``; what the ``Loader`` and ``take`` use): the whole shard
  sits in the node cache, filled once and BLAKE3-verified against the manifest's checksum;
  its footer is parsed once per process and each row group is decoded from the local file
  on first use (``CachedParquetShard``, shaped like ``OpenShard``).
* **byte ranges** (``row_ranged`` / ``gather_ranged``; ``ds[i]`` and ``take(ranges=True)``
  on a shard not cached): the footer once (one request for the file's tail), then per row
  group the column chunks of the served columns in one ``Store.get_ranges`` call
  (``RangeFile``). No whole-file hash can be checked on a part of a file; Parquet page CRCs
  are (``page_checksum_verification``), where the writer wrote them (trainstore's does).

Decoded groups are shared by both sources in one ``DecodedGroups`` LRU bounded in bytes, so
sequential or block-shuffled reading decodes each row group once. A row group that does not
decode (a damaged page, a CRC mismatch) raises ``IntegrityError`` naming the file and the
row group. ``parquet_footer`` reads just a footer (``Dataset.open`` of a Parquet directory).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import IntegrityError, TrainstoreError
from ...nodecache import check_unchanged
from ...store import Store
from ..versions import ShardInfo
from .open_shard import ColumnSpec, column_view, copy_rows
from .rangefile import RangeFile
from .rowgroups import DecodedGroups, DecodeStats, GroupViews

#: bytes fetched from the end of a file for its footer (one request for most files)
FOOTER_PROBE = 64 << 10
#: the decoded-group budget holds at least this many shards' decoded rows (a block-shuffle
#: window at the loader's default ``block_shards``, plus the next window's first shard),
#: unless ``max_open_bytes`` is set: an LRU under random access to a set just larger than
#: itself re-decodes nearly every row's group
WINDOW_SHARDS = 5


def _open_parquet(store: Store, key: str, size: int, footer: pq.FileMetaData | None = None,
                  verify: bool = True) -> tuple[RangeFile, pq.ParquetFile]:
    """Open ``key`` by ranges: one request for the tail unless its ``footer`` was read
    already; ``IntegrityError`` naming the file if it is not Parquet."""
    raw = RangeFile(store, key, size)
    try:
        if footer is None:
            tail = min(size, FOOTER_PROBE)
            raw.load([(size - tail, tail)])
        return raw, pq.ParquetFile(pa.PythonFile(raw, mode="r"), metadata=footer, page_checksum_verification=verify)
    except TrainstoreError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise IntegrityError(f"{store.url}/{key}: not a readable Parquet file ({exc})") from None


def parquet_footer(store: Store, key: str, size: int) -> pq.FileMetaData:
    """The footer of Parquet object ``key`` (read by ranges; ``IntegrityError`` if corrupt)."""
    return check_footer(_open_parquet(store, key, size)[1].metadata, f"{store.url}/{key}")


def check_footer(meta: pq.FileMetaData, where: str) -> pq.FileMetaData:
    """``meta`` if its row groups hold its row count and its column chunks name their columns
    readably (a footer from elsewhere may claim anything; serving indexes row groups by these
    numbers and picks chunks by these names); else ``IntegrityError`` naming ``where``."""
    try:
        leaves = meta.num_columns
        counts = []
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            counts.append(rg.num_rows)
            if rg.num_columns != leaves:  # pyarrow indexes the schema by chunk without a bound check
                raise IntegrityError(f"{where}: row group {g} has {rg.num_columns} column chunks, "
                                     f"the schema {leaves} columns")
        for c in range(leaves):
            meta.schema.column(c).path  # noqa: B018 - decodes the name: not UTF-8 raises here
    except (pa.ArrowException, ValueError) as exc:
        if isinstance(exc, IntegrityError):
            raise
        raise IntegrityError(f"{where}: the footer's row groups are not readable ({exc})") from None
    if any(n < 0 for n in counts) or sum(counts) != meta.num_rows:
        raise IntegrityError(f"{where}: footer says {meta.num_rows} rows, its row groups hold {counts[:20]}")
    return meta


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


def group_starts(meta: pq.FileMetaData) -> np.ndarray:
    """First row of each row group."""
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    return np.cumsum([0, *sizes[:-1]]).astype(np.int64)


def decoded_size(meta: pq.FileMetaData) -> int:
    """Uncompressed bytes of a file's row groups (what decoding it all would take)."""
    return sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))


class _RangedShard:
    """A shard read by byte ranges: its ``RangeFile`` and one lock (a file has one position)."""

    def __init__(self, store: Store, info: ShardInfo, footer: pq.FileMetaData | None, verify: bool,
                 tag: str | None) -> None:
        if tag is not None:  # an external file rewritten since it was listed: its footer is stale
            check_unchanged(store, info.key, tag, info.bytes)
        self.raw, self.file = _open_parquet(store, info.key, info.bytes, footer, verify)
        self.lock = threading.Lock()
        #: a file trainstore wrote: its column chunks are fetched in one call per row group.
        #: Another's footer is not read chunk by chunk here (pyarrow's accessors of a hostile
        #: chunk's metadata abort the process): its decoder fetches each chunk as it reads it.
        self.trusted = bool(info.checksum)


class ParquetRows:
    """Row-group reads of a version's Parquet shards (see the module docstring).

    ``budget_bytes`` bounds the decoded row groups kept; with ``window_floor`` it grows to
    ``WINDOW_SHARDS`` times the largest shard's decoded size seen. ``footers``: those read
    already, by key (shared with ``Dataset.open``). ``source_tags``: the content tags external
    files were listed with (checked when a file is first read by ranges in this process).
    ``fetched_bytes``: bytes read by ranges.
    """

    def __init__(self, store: Store, shards: Sequence[ShardInfo], specs: dict[str, ColumnSpec],
                 budget_bytes: int, footers: dict[str, pq.FileMetaData] | None = None, *,
                 window_floor: bool = True, verify: bool = True, source_tags: dict[str, str] | None = None) -> None:
        self.store, self.shards, self.specs = store, shards, specs
        self.source_tags = source_tags or {}
        self.footers = footers if footers is not None else {}
        self.groups = DecodedGroups(budget_bytes)
        self.window_floor, self.verify = window_floor, verify
        self._largest = 0  # the largest shard's uncompressed size (footer)
        self._ratio = 1.0  # the largest decoded (Arrow) / uncompressed (Parquet) size seen, at least 1
        self._seen_ratio = 0.0  # the same, as seen (0: nothing decoded yet)
        self._starts: dict[int, np.ndarray] = {}
        self._ranged: dict[int, _RangedShard] = {}
        self._lock = threading.Lock()

    @property
    def stats(self) -> DecodeStats:
        return self.groups.stats

    @property
    def fetched_bytes(self) -> int:
        return sum(f.raw.fetched for f in list(self._ranged.values()))

    def where(self, shard: int) -> str:
        return f"{self.store.url}/{self.shards[shard].key}"

    def _know(self, shard: int, meta: pq.FileMetaData) -> pq.FileMetaData:
        """Check ``meta`` against the manifest, keep it and the shard's row-group starts."""
        info = self.shards[shard]
        check_footer(meta, self.where(shard))
        if meta.num_rows != info.rows:
            raise IntegrityError(f"{self.where(shard)}: has {meta.num_rows} rows, manifest says {info.rows}")
        with self._lock:
            self.footers[info.key] = meta
            self._starts[shard] = group_starts(meta)
        self._largest = max(self._largest, decoded_size(meta))
        self._raise_floor()
        return meta

    def _raise_floor(self) -> None:
        if self.window_floor:
            self.groups.raise_budget(int(WINDOW_SHARDS * self._largest * self._ratio))

    def _views(self, shard: int, group: int, table: pa.Table) -> tuple[GroupViews, int]:
        key = self.shards[shard].key
        views = {n: column_view(table.column(n).combine_chunks(), spec, n, key) for n, spec in self.specs.items()}
        return views, table.nbytes

    def decode_group(self, shard: int, group: int, file: pq.ParquetFile) -> tuple[GroupViews, int]:
        try:
            table = file.read_row_group(group, columns=list(self.specs))
        except (pa.ArrowException, OSError) as exc:  # a damaged page, a page CRC mismatch
            raise IntegrityError(f"{self.where(shard)}: row group {group} does not decode ({exc})") from None
        expected = file.metadata.row_group(group).num_rows
        if table.num_rows != expected:
            raise IntegrityError(f"{self.where(shard)}: row group {group} decodes to {table.num_rows} rows, "
                                 f"its footer says {expected}")
        plain = file.metadata.row_group(group).total_byte_size
        if plain:
            self._seen_ratio = max(self._seen_ratio, table.nbytes / plain)
        if plain and table.nbytes > plain * self._ratio:
            self._ratio = table.nbytes / plain
            self._raise_floor()
        return self._views(shard, group, table)

    def group_of(self, shard: int, local: np.ndarray) -> np.ndarray:
        """Row group of each of ``shard``'s rows ``local`` (its footer read already)."""
        return np.searchsorted(self._starts[shard], local, side="right") - 1

    def decoded_estimate(self, meta: pq.FileMetaData, group: int) -> int:
        """Bytes row group ``group`` of a file with footer ``meta`` takes decoded (its
        uncompressed size times the largest decoded/uncompressed ratio seen, 1 before any)."""
        return int(meta.row_group(group).total_byte_size * (self._seen_ratio or 1.0))

    # -- rows by row group, from either source ---------------------------------------------------
    def row_from(self, shard: int, local: int, group_of: Callable[[int], GroupViews]) -> dict[str, np.ndarray]:
        starts = self._starts[shard]
        g = int(np.searchsorted(starts, local, side="right") - 1)
        views = group_of(g)
        i = local - int(starts[g])
        return {n: v[i] for n, v in views.items()}

    def gather_from(self, shard: int, local: np.ndarray, out: dict[str, np.ndarray], positions: np.ndarray,
                    group_of: Callable[[int], GroupViews]) -> None:
        starts = self._starts[shard]
        gid = np.searchsorted(starts, local, side="right") - 1
        for g in np.unique(gid):
            sel = gid == g
            views = group_of(int(g))
            rows = local[sel] - starts[g]
            for name, view in views.items():
                copy_rows(out[name], positions[sel], view, rows)

    # -- the cached file -------------------------------------------------------------------------
    def open_cached(self, shard: int, handle: Any, path: str, *, hash_verified: bool) -> CachedParquetShard:
        """Serve ``shard`` from its node-cache file ``path`` (pinned by ``handle``, closed
        with the returned shard); the footer is parsed on the first open in this process.
        ``hash_verified``: the file was checked against its BLAKE3 when filled, so page CRCs
        are not checked again (only a file without a checksum relies on them)."""
        info = self.shards[shard]
        meta = self.footers.get(info.key)
        if meta is None or shard not in self._starts:
            try:
                meta = meta or pq.read_metadata(path)
            except (pa.ArrowException, OSError) as exc:
                raise IntegrityError(f"{self.where(shard)}: not a readable Parquet file ({exc})") from None
            self._know(shard, meta)
        return CachedParquetShard(self, shard, handle, path, meta, verify_pages=self.verify and not hash_verified)

    # -- byte ranges -----------------------------------------------------------------------------
    def _ranged_shard(self, shard: int) -> _RangedShard:
        with self._lock:
            f = self._ranged.get(shard)
        if f is None:
            info = self.shards[shard]
            f = _RangedShard(self.store, info, self.footers.get(info.key), self.verify, self.source_tags.get(info.key))
            self._know(shard, f.file.metadata)
            with self._lock:
                f = self._ranged.setdefault(shard, f)
        return f

    def _ranged_group(self, shard: int, f: _RangedShard) -> Callable[[int], GroupViews]:
        def decode(group: int) -> tuple[GroupViews, int]:
            with f.lock:
                if f.trusted:
                    try:
                        ranges = column_chunk_ranges(f.file.metadata, group, list(self.specs))
                    except (pa.ArrowException, ValueError) as exc:
                        raise IntegrityError(f"{self.where(shard)}: row group {group}'s footer entry is not "
                                             f"readable ({exc})") from None
                    f.raw.load(ranges)
                try:
                    return self.decode_group(shard, group, f.file)
                finally:
                    f.raw.drop()

        return lambda g: self.groups.get((shard, g), lambda: decode(g))

    def row_ranged(self, shard: int, local: int) -> dict[str, np.ndarray]:
        f = self._ranged_shard(shard)
        return self.row_from(shard, local, self._ranged_group(shard, f))

    def gather_ranged(self, shard: int, local: np.ndarray, out: dict[str, np.ndarray],
                      positions: np.ndarray) -> None:
        """``out[name][positions] = rows local`` of ``shard``, read by byte ranges."""
        f = self._ranged_shard(shard)
        self.gather_from(shard, local, out, positions, self._ranged_group(shard, f))


class CachedParquetShard:
    """A pinned node-cache Parquet file, rows served by row group (``OpenShard``'s interface).

    Each decode opens the local file afresh (cheap: the footer is given), so threads decode
    different row groups in parallel; ``close`` releases the pin, decoded groups stay cached.
    """

    def __init__(self, rows: ParquetRows, shard: int, handle: Any, path: str, meta: pq.FileMetaData, *,
                 verify_pages: bool) -> None:
        self.rows, self.shard, self.handle, self.path, self.meta = rows, shard, handle, path, meta
        self.verify_pages = verify_pages
        self.info = rows.shards[shard]
        self.open_bytes = self.info.bytes  # decoded row groups are cached by the file (open budget)
        self.users = 0

    def _decode(self, group: int) -> tuple[GroupViews, int]:
        try:
            file = pq.ParquetFile(self.path, metadata=self.meta, page_checksum_verification=self.verify_pages)
        except (pa.ArrowException, OSError) as exc:
            raise IntegrityError(f"{self.rows.where(self.shard)}: not a readable Parquet file ({exc})") from None
        try:
            return self.rows.decode_group(self.shard, group, file)
        finally:
            file.close()

    def _group(self, group: int) -> GroupViews:
        return self.rows.groups.get((self.shard, group), lambda: self._decode(group))

    def group_of(self, local: np.ndarray) -> np.ndarray:
        """Row group of each of this shard's rows ``local``."""
        return self.rows.group_of(self.shard, local)

    def group_bytes(self, group: int) -> int:
        """Estimated decoded size of row group ``group``."""
        return self.rows.decoded_estimate(self.meta, group)

    def decode_ahead(self, group: int) -> bool:
        """Decode row group ``group`` into the shared LRU before it is asked for (unless it is
        held or being decoded); True if decoded here. Raises ``IntegrityError`` if it does not decode."""
        return self.rows.groups.decode_ahead((self.shard, group), lambda: self._decode(group))

    def row(self, local: int) -> dict[str, np.ndarray]:
        return self.rows.row_from(self.shard, local, self._group)

    def gather(self, local: np.ndarray, out: dict[str, np.ndarray], positions: np.ndarray) -> None:
        """``out[name][positions] = rows local`` for every column."""
        self.rows.gather_from(self.shard, local, out, positions, self._group)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


__all__ = ["FOOTER_PROBE", "WINDOW_SHARDS", "CachedParquetShard", "ParquetRows", "RangeFile", "check_footer",
           "column_chunk_ranges", "decoded_size", "group_starts", "parquet_footer"]
