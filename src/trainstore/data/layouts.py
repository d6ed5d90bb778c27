"""Shard layouts by name: how the shards of a dataset version are encoded and read.

A version's manifest names its layout (``DatasetVersion.layout``); every place that writes
or reads shard bytes asks this registry (``get_layout(name)``) instead of testing layout
strings, like mosaic-streaming's reader registry or litdata's ``register_downloader``.
Built in:

* ``"parquet"``: compressed, columnar (raw and cleaned data; what ``clean`` and
  ``transform`` read). Written in row groups of about ``ROW_GROUP_BYTES`` with page CRCs;
  served directly, one row group at a time, from the node-cache file or fetched by byte
  ranges (``serve.parquet``).
* ``"arrow-ipc"``: uncompressed Arrow IPC *files* (features): memory-mapped, zero-copy
  record batches, what ``Dataset`` / ``Loader`` serve fastest.
* ``"arrow-stream"``: Arrow IPC *streams* (the ``data-*.arrow`` files of a Hugging Face
  ``datasets`` folder written by ``save_to_disk``): memory-mapped, zero-copy, served.

A layout opens one shard file (``ShardLayout.open``) into a ``ShardFile``: row count,
schema, record batches, rows by range, and the byte ranges of the file that hold a row range
(what a reader fetching parts of a shard from the store needs). ``register_layout`` adds a
layout; a manifest naming an unregistered layout does not load.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from .. import naming
from ..errors import ConfigError

#: a local file path, or the shard's bytes
ShardSource = str | pa.Buffer | bytes | memoryview


def _input(source: Any, memory_map: bool) -> Any:
    if isinstance(source, str):
        return pa.memory_map(source, "r") if memory_map else source
    return pa.BufferReader(pa.py_buffer(source))


class ShardFile(ABC):
    """One open shard: what a reader of shards needs."""

    @property
    @abstractmethod
    def num_rows(self) -> int: ...

    @property
    @abstractmethod
    def schema(self) -> pa.Schema: ...

    @abstractmethod
    def batches(self) -> list[pa.RecordBatch]:
        """Every record batch of the shard, in order (zero-copy where the layout maps)."""

    @abstractmethod
    def iter_batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows in order, as batches of at most ``batch_rows`` rows (bounded memory)."""

    @abstractmethod
    def read_rows(self, start: int, stop: int) -> pa.Table:
        """Rows ``[start, stop)``."""

    @abstractmethod
    def byte_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        """``(offset, length)`` of the parts of the file that hold rows ``[start, stop)``
        (the whole file where the layout cannot say finer)."""

    def close(self) -> None:  # noqa: B027 - optional: most layouts hold nothing to release
        """Release what the open file holds."""


class ShardLayout(ABC):
    """A named shard encoding: writes shard bytes and opens shard files."""

    #: the name manifests record
    name: str
    #: how messages name it ("Parquet")
    title: str
    #: file name suffix of its shards
    suffix: str
    #: whether ``Dataset`` serves versions of this layout (random row access, memory-mapped)
    servable: bool = False
    #: served by reading the rows each batch asks for (``ShardFile.take``) instead of opening
    #: the whole file (a format with no zero-copy mapping: Lance)
    by_row: bool = False

    @abstractmethod
    def encode(self, table: pa.Table, **options: Any) -> pa.Buffer:
        """The bytes of one shard holding ``table``."""

    @abstractmethod
    def open(self, source: ShardSource) -> ShardFile:
        """Open one shard (a local path, memory-mapped where the layout allows, or bytes)."""


# -- parquet ------------------------------------------------------------------------------------
#: target Arrow bytes per Parquet row group written by ``ParquetLayout.encode``
ROW_GROUP_BYTES = 4 << 20


def rows_per_group(table: pa.Table, target_bytes: int = ROW_GROUP_BYTES) -> int:
    """Rows per row group so that each holds about ``target_bytes`` of ``table``'s data."""
    if table.num_rows == 0 or table.nbytes <= target_bytes:
        return max(table.num_rows, 1)
    return max(1, table.num_rows * target_bytes // table.nbytes)


def _leaf_path(name: str, t: pa.DataType) -> tuple[str, pa.DataType]:
    """The Parquet column path of a field's leaf values (``x.list.element`` for a list of
    floats) and their type."""
    while True:
        if isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            name, t = f"{name}.list.element", t.value_type
        else:
            return name, t


def split_columns(schema: pa.Schema) -> dict[str, str]:
    """``BYTE_STREAM_SPLIT`` for float32/float64 leaves (tensors, embeddings): their bytes
    grouped by significance compress smaller and decode ~1.4x faster than plain pages
    (docs/benchmarks.md, "Serving Parquet directly"). Not float16: DuckDB cannot read it."""
    out = {}
    for f in schema:
        path, leaf = _leaf_path(f.name, f.type)
        if pa.types.is_float32(leaf) or pa.types.is_float64(leaf):
            out[path] = "BYTE_STREAM_SPLIT"
    return out


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth dictionary encoding: all but floating-point ones (tensors, embeddings),
    whose values rarely repeat - there the writer's attempt only falls back to plain pages
    after a dictionary page, larger files and several times slower decoding."""
    return [f.name for f in schema if not pa.types.is_floating(_leaf_path(f.name, f.type)[1])]


class _ParquetFile(ShardFile):
    def __init__(self, source: ShardSource) -> None:
        self._file = pq.ParquetFile(_input(source, memory_map=False), memory_map=isinstance(source, str),
                                    page_checksum_verification=True)
        self._meta = self._file.metadata

    @property
    def num_rows(self) -> int:
        return self._meta.num_rows

    @property
    def schema(self) -> pa.Schema:
        return self._file.schema_arrow

    def batches(self) -> list[pa.RecordBatch]:
        return self._file.read().to_batches()

    def iter_batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        return self._file.iter_batches(batch_size=batch_rows)

    def _groups(self, start: int, stop: int) -> tuple[list[int], int]:
        """Row groups overlapping ``[start, stop)`` and the first row of the first one."""
        groups, first, row = [], 0, 0
        for i in range(self._meta.num_row_groups):
            n = self._meta.row_group(i).num_rows
            if row < stop and row + n > start:
                if not groups:
                    first = row
                groups.append(i)
            row += n
        return groups, first

    def read_rows(self, start: int, stop: int) -> pa.Table:
        groups, first = self._groups(start, stop)
        if not groups:
            return self.schema.empty_table()
        return self._file.read_row_groups(groups).slice(start - first, stop - start)

    def byte_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        out = []
        for i in self._groups(start, stop)[0]:
            group = self._meta.row_group(i)
            for c in range(group.num_columns):
                col = group.column(c)
                offset = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
                out.append((offset, col.total_compressed_size))
        return out

    def close(self) -> None:
        self._file.close()


class ParquetLayout(ShardLayout):
    name, title, suffix, servable = "parquet", "Parquet", ".parquet", True

    def encode(self, table: pa.Table, *, compression: str = "zstd", compression_level: int | None = None,
               row_group_size: int | None = None, **_: Any) -> pa.Buffer:
        """Row groups of ``row_group_size`` rows (default: about ``ROW_GROUP_BYTES`` of
        Arrow data each, the unit a row-group reader decodes), with page CRCs (what a reader
        of byte ranges, which cannot check the whole file's hash, verifies), float columns
        byte-stream-split (``split_columns``), the others dictionary-encoded."""
        if row_group_size is None:
            row_group_size = rows_per_group(table)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression=compression, compression_level=compression_level,
                       row_group_size=row_group_size, write_page_checksum=True,
                       use_dictionary=dictionary_columns(table.schema),
                       column_encoding=split_columns(table.schema))
        return sink.getvalue()

    def open(self, source: ShardSource) -> ShardFile:
        return _ParquetFile(source)


# -- arrow ipc ----------------------------------------------------------------------------------
class _ArrowIpcFile(ShardFile):
    def __init__(self, source: ShardSource) -> None:
        self._source = _input(source, memory_map=True)
        self._reader = ipc.open_file(self._source)
        self._batches = [self._reader.get_batch(i) for i in range(self._reader.num_record_batches)]

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for b in self._batches)

    @property
    def schema(self) -> pa.Schema:
        return self._reader.schema

    def batches(self) -> list[pa.RecordBatch]:
        return list(self._batches)

    def iter_batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        for batch in self._batches:
            for start in range(0, batch.num_rows, batch_rows):
                yield batch.slice(start, batch_rows)

    def read_rows(self, start: int, stop: int) -> pa.Table:
        return pa.Table.from_batches(self._batches, schema=self.schema).slice(start, stop - start)

    def byte_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        return [(0, self._source.size())]  # pyarrow does not expose the footer's batch offsets

    def close(self) -> None:
        self._source.close()


class ArrowIpcLayout(ShardLayout):
    name, title, suffix, servable = "arrow-ipc", "Arrow IPC", ".arrow", True

    def encode(self, table: pa.Table, **_: Any) -> pa.Buffer:
        """Uncompressed, one record batch per ``table`` chunk."""
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=max(table.num_rows, 1)):
                writer.write_batch(batch)
        return sink.getvalue()

    def open(self, source: ShardSource) -> ShardFile:
        return _ArrowIpcFile(source)


# -- arrow ipc stream (Hugging Face datasets) ----------------------------------------------------
class _ArrowStreamFile(_ArrowIpcFile):
    def __init__(self, source: ShardSource) -> None:  # noqa: PLW0231 - a stream has no footer to open
        self._source = _input(source, memory_map=True)
        self._reader = ipc.open_stream(self._source)
        self._batches = list(self._reader)


class ArrowStreamLayout(ShardLayout):
    name, title, suffix, servable = "arrow-stream", "Arrow IPC stream", ".arrow", True

    def encode(self, table: pa.Table, **_: Any) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue()

    def open(self, source: ShardSource) -> ShardFile:
        return _ArrowStreamFile(source)


# -- registry -----------------------------------------------------------------------------------
_LAYOUTS: dict[str, ShardLayout] = {}


def register_layout(layout: ShardLayout, *, replace: bool = False) -> ShardLayout:
    """Make ``layout`` known by ``layout.name`` (``ConfigError`` if taken, unless ``replace``)."""
    name = naming.check_name(layout.name, "layout name")
    if name in _LAYOUTS and not replace:
        raise ConfigError(f"shard layout {name!r} is already registered")
    _LAYOUTS[name] = layout
    return layout


def get_layout(name: str) -> ShardLayout:
    """The layout registered as ``name``; ``ConfigError`` naming the known ones if none."""
    try:
        return _LAYOUTS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown shard layout {name!r} (known: {', '.join(sorted(_LAYOUTS))})") from None


def layout_names() -> tuple[str, ...]:
    return tuple(sorted(_LAYOUTS))


PARQUET = register_layout(ParquetLayout())
ARROW_IPC = register_layout(ArrowIpcLayout())
ARROW_STREAM = register_layout(ArrowStreamLayout())

__all__ = ["ARROW_IPC", "ARROW_STREAM", "PARQUET", "ROW_GROUP_BYTES", "ShardFile", "ShardLayout", "ShardSource", "get_layout", "layout_names",
           "dictionary_columns", "register_layout", "rows_per_group"]
