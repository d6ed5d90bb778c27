"""One open shard of a served version: its record batches as zero-copy numpy column views.

``OpenShard`` opens a shard file of a servable layout (``data.layouts``; Arrow IPC files are
memory-mapped) and turns each column of each record batch into a numpy view shaped by
``column_spec`` (dtype and per-row shape from the schema, ``extra["columns"]`` or field
metadata); ``row`` and ``gather`` read rows out of them without per-row Python work.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import IntegrityError, SchemaError
from ..layouts import ShardLayout
from ..versions import DatasetVersion, ShardInfo, tensor_layout

#: (numpy dtype or None for a non-tensor column, per-row shape)
ColumnSpec = tuple[np.dtype | None, tuple[int, ...]]


def column_spec(version: DatasetVersion, name: str) -> ColumnSpec:
    """(numpy dtype, per-row shape) of a column; dtype None = not a tensor (object array)."""
    field = version.schema.field(name)
    desc = version.extra.get("columns", {}).get(name) or {}
    t, shape, numeric = tensor_layout(field.type)
    if not numeric:
        if shape:
            raise SchemaError(f"column {name!r}: fixed-size list of {t} is not a tensor")
        return None, ()
    width = int(np.prod(shape)) if shape else 1
    declared = desc.get("shape")
    try:
        if declared is None and field.metadata and b"shape" in field.metadata:
            declared = json.loads(field.metadata[b"shape"])
        if declared is not None and shape:
            declared = [int(x) for x in declared]
            if any(d < 0 for d in declared):
                raise ValueError(declared)
    except (ValueError, TypeError, RecursionError):  # metadata of a file trainstore did not write
        where = version.extra.get("source") or version.id
        raise SchemaError(f"{where}: column {name!r} has a shape {str(declared)[:80]!r} that is not a list "
                          "of sizes") from None
    if declared is not None and shape:
        if int(np.prod(declared)) != width:
            raise SchemaError(f"column {name!r}: shape {declared} does not match list size {width}")
        shape = declared  # a flat list may carry a multi-dimensional shape
    return np.dtype(t.to_pandas_dtype()), tuple(shape)


def object_rows(values: list) -> np.ndarray:
    """A 1-D object array, one entry per row. ``np.asarray`` would turn rows that are lists of
    one length into a second axis (and nested ones into more), which no row gather expects."""
    return np.fromiter(values, dtype=object, count=len(values))


def column_view(arr: pa.Array, spec: ColumnSpec, name: str, key: str) -> np.ndarray:
    """Zero-copy numpy view of one record batch's column (booleans: one unpacking copy)."""
    dtype, shape = spec
    if arr.null_count and dtype is not None:
        raise SchemaError(f"shard {key}: column {name!r} has nulls; tensor columns may not")
    if dtype is None:
        try:
            return object_rows(arr.to_pylist())
        except (pa.ArrowException, ValueError) as exc:  # a string that is not UTF-8 (an external file)
            raise IntegrityError(f"shard {key}: column {name!r} does not decode ({exc})") from None
    n = len(arr)
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    while pa.types.is_fixed_size_list(arr.type):
        arr = arr.flatten()  # accounts for slice offsets, no copy
    flat = arr.to_numpy(zero_copy_only=not pa.types.is_boolean(arr.type))
    return flat.reshape((n, *shape))


_ROW_COPY_BYTES = 2048


def copy_rows(dst: np.ndarray, positions: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:
    """dst[positions] = src[rows]. Large rows are copied one by one (a straight memcpy each,
    the GIL released, no temporary); fancy indexing would gather into a temporary first and
    then scatter, and is 2-20x slower for rows of 100 KB and up."""
    row_bytes = src.itemsize * math.prod(src.shape[1:])
    if src.dtype == object or row_bytes < _ROW_COPY_BYTES:
        dst[positions] = src[rows]
        return
    for p, r in zip(positions.tolist(), rows.tolist()):
        dst[p] = src[r]


class OpenShard:
    """A pinned, memory-mapped shard: per record batch, zero-copy column views of ``specs``'
    columns. ``handle`` (the hot-tier pin) is closed by ``close``."""

    def __init__(self, handle: Any, path: str, info: ShardInfo, layout: ShardLayout,
                 specs: dict[str, ColumnSpec]) -> None:
        self.handle = handle
        self.info = info
        self.open_bytes = info.bytes  # held while open: the mapping (ShardPins' open budget)
        self.users = 0
        try:
            batches = layout.open(path).batches()
            if not info.checksum:  # an external file, not hash-checked: its buffers must not be trusted
                for b in batches:
                    b.validate(full=True)
        except (pa.ArrowException, OSError) as exc:  # an external file has no checksum to catch it earlier
            raise IntegrityError(f"shard {info.key}: not a readable {layout.title} file ({exc})") from None
        rows = sum(b.num_rows for b in batches)
        if rows != info.rows:
            raise SchemaError(f"shard {info.key} has {rows} rows, manifest says {info.rows}")
        batches = [b for b in batches if b.num_rows] or batches[:1]
        #: first row of each record batch (the same for every column)
        self.starts = np.cumsum([0] + [b.num_rows for b in batches[:-1]]).astype(np.int64)
        self.chunks = {
            name: [column_view(b.column(name), spec, name, info.key) for b in batches]
            for name, spec in specs.items()
        }

    def row(self, local: int) -> dict[str, np.ndarray]:
        c = int(np.searchsorted(self.starts, local, side="right") - 1)
        i = local - int(self.starts[c])
        return {name: chunks[c][i] for name, chunks in self.chunks.items()}

    def gather(self, local: np.ndarray, out: dict[str, np.ndarray], positions: np.ndarray) -> None:
        """``out[name][positions] = rows local`` for every column."""
        if len(self.starts) == 1:
            for name, chunks in self.chunks.items():
                copy_rows(out[name], positions, chunks[0], local)
            return
        cid = np.searchsorted(self.starts, local, side="right") - 1
        for c in np.unique(cid):
            sel = cid == c
            rows = local[sel] - self.starts[c]
            for name, chunks in self.chunks.items():
                copy_rows(out[name], positions[sel], chunks[c], rows)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


__all__ = ["ColumnSpec", "OpenShard", "column_spec", "column_view", "copy_rows", "object_rows"]
