"""Write numpy or Arrow data straight into a servable feature version (``write_arrow_dataset``).

Shards are uncompressed Arrow IPC files (layout ``"arrow-ipc"``, one record batch each),
stored with ``put`` before the version is committed with ``versions.derive``; numpy tensor
columns become ``fixed_size_list`` columns whose per-row shape goes to
``extra["columns"]`` (``table_from_numpy``). What a transform produces, without a transform.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from ...chunks import content_hash
from ...errors import ConfigError, SchemaError
from ...store import Store, open_store
from ..layouts import ARROW_IPC
from ..versions import DatasetVersion, ShardInfo, derive, next_version, shards_prefix


def _to_arrow_column(arr: np.ndarray) -> tuple[pa.Array, dict]:
    arr = np.ascontiguousarray(arr)
    shape = list(arr.shape[1:])
    if arr.dtype == object or arr.dtype.kind in "US":
        col = pa.array(arr.tolist())
        return col, {"arrow": str(col.type), "dtype": None, "shape": None}
    if not shape:
        col = pa.array(arr)
        return col, {"arrow": str(col.type), "dtype": arr.dtype.name, "shape": []}
    width = int(np.prod(shape))
    col = pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1)), width)
    return col, {"arrow": str(col.type), "dtype": arr.dtype.name, "shape": shape}


def table_from_numpy(columns: dict[str, np.ndarray]) -> tuple[pa.Table, dict]:
    """Numpy columns (first axis = rows) -> Arrow table + the ``extra["columns"]`` description."""
    arrays, desc, n = {}, {}, None
    for name, value in columns.items():
        value = np.asarray(value)
        if n is None:
            n = len(value)
        elif len(value) != n:
            raise SchemaError(f"column {name!r} has {len(value)} rows, expected {n}")
        arrays[name], desc[name] = _to_arrow_column(value)
    return pa.table(arrays), desc


def write_arrow_dataset(
    store: Store | str,
    name: str,
    data: pa.Table | dict[str, np.ndarray] | Iterable[pa.RecordBatch],
    rows_per_shard: int,
    *,
    version: int | None = None,
    parents: Sequence[str] = (),
    operation: str = "features",
    config: dict | None = None,
    columns: dict | None = None,
) -> DatasetVersion:
    """Write ``data`` as uncompressed Arrow IPC file shards and commit an "arrow-ipc" version.

    Each shard is one record batch of at most ``rows_per_shard`` rows, written with ``put``
    (atomic) before the manifest is committed with ``put_if_absent``.
    """
    store = open_store(store)
    if rows_per_shard <= 0:
        raise ConfigError(f"rows_per_shard must be positive, got {rows_per_shard}")
    if isinstance(data, dict):
        table, desc = table_from_numpy(data)
    elif isinstance(data, pa.Table):
        table, desc = data, {}
    else:
        table, desc = pa.Table.from_batches(list(data)), {}
    desc = {**desc, **(columns or {})}
    version = next_version(store, name) if version is None else version
    shards = []
    for i, start in enumerate(range(0, max(table.num_rows, 1), rows_per_shard)):
        part = table.slice(start, rows_per_shard).combine_chunks()
        buf = ARROW_IPC.encode(part)
        key = f"{shards_prefix(name)}v{version:06d}-{i:05d}.arrow"
        store.put(key, buf)
        shards.append(ShardInfo(key, part.num_rows, buf.size, content_hash(buf)))
        if table.num_rows == 0:
            break
    return derive(store, parents, operation, dict(config or {}), shards, name=name, layout=ARROW_IPC.name,
                  schema=table.schema, extra={"columns": desc}, version=version)


__all__ = ["table_from_numpy", "write_arrow_dataset"]
