"""Map-style access to an "arrow-ipc" feature dataset version, memory-mapped from the hot tier.

Feature shards are Arrow IPC *files* (uncompressed); fixed-shape tensor columns are
``fixed_size_list<primitive>`` whose per-row shape is in ``extra["columns"]`` (or field
metadata ``shape``). A shard is pinned in the ``NodeCache`` while open and read with
``pa.memory_map`` + ``ipc.open_file``: column arrays are zero-copy numpy views of the mapped
file. ``ds[i]`` returns a dict of per-row views; ``ds.take(indices)`` gathers rows from many
shards into fresh batched arrays (one copy, no per-row Python work).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from ..chunks import content_hash
from ..errors import CapacityError, ConfigError, SchemaError
from ..nodecache import CacheConfig, NodeCache
from ..store import Store, open_store
from .versions import (
    DatasetVersion,
    ShardInfo,
    commit_version,
    load_version,
    next_version,
    parse_ref,
    shards_prefix,
    tensor_layout,
)

LAYOUT = "arrow-ipc"


# -- writing ---------------------------------------------------------------------------------
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
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, part.schema) as writer:
            for batch in part.to_batches(max_chunksize=max(part.num_rows, 1)):
                writer.write_batch(batch)
        buf = sink.getvalue()
        key = f"{shards_prefix(name)}v{version:06d}-{i:05d}.arrow"
        store.put(key, buf)
        shards.append(ShardInfo(key, part.num_rows, buf.size, content_hash(buf)))
        if table.num_rows == 0:
            break
    manifest = DatasetVersion(
        name=name, version=version, layout=LAYOUT, schema=table.schema, shards=tuple(shards),
        parents=tuple(parents), operation=operation, config=dict(config or {}),
        extra={"columns": desc},
    )
    return commit_version(store, manifest)


# -- reading ---------------------------------------------------------------------------------
#: the default hot-tier limit takes at most this fraction of the cache directory's free space
CACHE_FREE_FRACTION = 0.5


def default_cache_limit(cache_dir: str, dataset_bytes: int, max_shard_bytes: int) -> tuple[int, str]:
    """(limit, why): the whole dataset plus one shard of headroom, but at most half the free
    space of ``cache_dir``'s file system (so a default never fills the disk); never below
    one shard (the loader then evicts shards it is done with)."""
    want = max(dataset_bytes + max_shard_bytes, 1 << 20)
    probe = os.path.abspath(cache_dir)
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    cap = int(free * CACHE_FREE_FRACTION)
    if want <= cap:
        return want, f"dataset ({dataset_bytes} B) + one shard of headroom; fits in half the free space"
    return max(cap, max_shard_bytes), (f"half the free space of {probe} ({free} B free); the dataset "
                                        f"({dataset_bytes} B) does not fit, shards are evicted after use")


@dataclass(frozen=True)
class DatasetConfig:
    """Reading options. ``max_open_bytes``: bytes of shards kept open (pinned) per process
    (default: half the cache limit, split among torch DataLoader workers)."""

    cache_dir: str | None = None
    cache_limit: int | None = None
    columns: tuple[str, ...] | None = None
    max_open_bytes: int | None = None
    verify: bool = True
    capacity_wait_s: float = 30.0


_ROW_COPY_BYTES = 2048


def _copy_rows(dst: np.ndarray, positions: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:
    """dst[positions] = src[rows]. Large rows are copied one by one (a straight memcpy each,
    the GIL released, no temporary); fancy indexing would gather into a temporary first and
    then scatter, and is 2-20x slower for rows of 100 KB and up."""
    row_bytes = src.itemsize * (int(np.prod(src.shape[1:])) if src.ndim > 1 else 1)
    if src.dtype == object or row_bytes < _ROW_COPY_BYTES:
        dst[positions] = src[rows]
        return
    for p, r in zip(positions.tolist(), rows.tolist()):
        dst[p] = src[r]


class _OpenShard:
    """A pinned, memory-mapped shard: per record batch, zero-copy column views."""

    def __init__(self, handle: Any, path: str, info: ShardInfo, ds: Dataset) -> None:
        self.handle = handle
        self.info = info
        self.users = 0
        reader = ipc.open_file(pa.memory_map(path, "r"))
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        rows = sum(b.num_rows for b in batches)
        if rows != info.rows:
            raise SchemaError(f"shard {info.key} has {rows} rows, manifest says {info.rows}")
        batches = [b for b in batches if b.num_rows] or batches[:1]
        #: first row of each record batch (the same for every column)
        self.starts = np.cumsum([0] + [b.num_rows for b in batches[:-1]]).astype(np.int64)
        self.chunks = {
            name: [ds._column_view(b.column(name), name, info.key) for b in batches]
            for name in ds.column_names
        }

    def row(self, local: int) -> dict[str, np.ndarray]:
        c = int(np.searchsorted(self.starts, local, side="right") - 1)
        i = local - int(self.starts[c])
        return {name: chunks[c][i] for name, chunks in self.chunks.items()}

    def gather(self, local: np.ndarray, out: dict[str, np.ndarray], positions: np.ndarray) -> None:
        """``out[name][positions] = rows local`` for every column."""
        if len(self.starts) == 1:
            for name, chunks in self.chunks.items():
                _copy_rows(out[name], positions, chunks[0], local)
            return
        cid = np.searchsorted(self.starts, local, side="right") - 1
        for c in np.unique(cid):
            sel = cid == c
            rows = local[sel] - self.starts[c]
            for name, chunks in self.chunks.items():
                _copy_rows(out[name], positions[sel], chunks[c], rows)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


class Dataset:
    """``Dataset(store_or_url, "name@version", cache_dir=..., cache_limit=...)``: map-style rows."""

    def __init__(
        self,
        source: Store | str,
        ref: str | DatasetVersion,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        columns: Sequence[str] | None = None,
        config: DatasetConfig | None = None,
        **store_options: Any,
    ) -> None:
        cfg = config or DatasetConfig()
        if cache_dir is not None or cache_limit is not None or columns is not None:
            cfg = DatasetConfig(
                cache_dir=os.fspath(cache_dir) if cache_dir is not None else cfg.cache_dir,
                cache_limit=cache_limit if cache_limit is not None else cfg.cache_limit,
                columns=tuple(columns) if columns is not None else cfg.columns,
                max_open_bytes=cfg.max_open_bytes, verify=cfg.verify,
                capacity_wait_s=cfg.capacity_wait_s,
            )
        self.config = cfg
        self._store_options = store_options
        self.store = open_store(source, **store_options)
        if isinstance(ref, DatasetVersion):
            self.version = ref
        else:
            name, ver = parse_ref(ref)
            self.version = load_version(self.store, name, ver)
        if self.version.layout != LAYOUT:
            raise ConfigError(
                f"dataset {self.version.id} has layout {self.version.layout!r}; the loader reads "
                f"{LAYOUT!r} feature versions (run a transform to produce one)"
            )
        self.shards = self.version.shards
        self.offsets = np.concatenate([[0], np.cumsum([s.rows for s in self.shards])]).astype(np.int64)
        schema = self.version.schema
        names = list(cfg.columns) if cfg.columns else list(schema.names)
        for n in names:
            if n not in schema.names:
                raise SchemaError(f"dataset {self.version.id} has no column {n!r} (has {schema.names})")
        self.column_names = tuple(names)
        self._specs = {n: self._spec(n) for n in names}
        self.max_shard_bytes = max((s.bytes for s in self.shards), default=0)
        if cfg.cache_dir is None:
            default = os.environ.get("TRAINSTORE_CACHE_DIR")
            self._cache_dir = default or os.path.join(os.path.expanduser("~"), ".cache", "trainstore", "hot")
        else:
            self._cache_dir = cfg.cache_dir
        if cfg.cache_limit:
            self.cache_limit, self.cache_limit_reason = cfg.cache_limit, "set by the caller"
        else:
            self.cache_limit, self.cache_limit_reason = default_cache_limit(
                self._cache_dir, self.version.bytes, self.max_shard_bytes)
        if self.max_shard_bytes > self.cache_limit:
            big = max(self.shards, key=lambda s: s.bytes)
            raise CapacityError(
                f"cache limit {self.cache_limit} bytes is smaller than shard {big.key} "
                f"({big.bytes} bytes) of {self.version.id}; raise cache_limit"
            )
        self._reset_process_state()

    # -- process-local state (rebuilt after fork / unpickling) --------------------------------
    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._cache = NodeCache(
            self.store, self._cache_dir,
            config=CacheConfig(self.cache_limit, capacity_wait_s=self.config.capacity_wait_s),
        )
        self._cache.on_pressure = self._release_idle
        self._lock = threading.Condition()
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self._opening: set[int] = set()
        budget = self.config.max_open_bytes or self.cache_limit // 2
        try:
            from torch.utils.data import get_worker_info  # noqa: PLC0415

            info = get_worker_info()
            if info is not None and self.config.max_open_bytes is None:
                budget //= max(1, info.num_workers)
        except ImportError:
            pass
        self._open_budget = max(budget, self.max_shard_bytes)

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_cache", "_lock", "_open", "_opening")}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # forked (torch DataLoader worker): fresh locks and pins
            self._reset_process_state()

    # -- schema ---------------------------------------------------------------------------------
    def _spec(self, name: str) -> tuple[np.dtype | None, tuple[int, ...]]:
        """(numpy dtype, per-row shape) of a column; dtype None = not a tensor (object array)."""
        field = self.version.schema.field(name)
        desc = self.version.extra.get("columns", {}).get(name) or {}
        t, shape, numeric = tensor_layout(field.type)
        if not numeric:
            if shape:
                raise SchemaError(f"column {name!r}: fixed-size list of {t} is not a tensor")
            return None, ()
        width = int(np.prod(shape)) if shape else 1
        declared = desc.get("shape")
        if declared is None and field.metadata and b"shape" in field.metadata:
            declared = json.loads(field.metadata[b"shape"])
        if declared is not None and shape:
            declared = [int(x) for x in declared]
            if int(np.prod(declared)) != width:
                raise SchemaError(f"column {name!r}: shape {declared} does not match list size {width}")
            shape = declared  # a flat list may carry a multi-dimensional shape
        return np.dtype(t.to_pandas_dtype()), tuple(shape)

    def _column_view(self, arr: pa.Array, name: str, key: str) -> np.ndarray:
        """Zero-copy numpy view of one record batch's column (booleans: one unpacking copy)."""
        dtype, shape = self._specs[name]
        if arr.null_count and dtype is not None:
            raise SchemaError(f"shard {key}: column {name!r} has nulls; tensor columns may not")
        if dtype is None:
            return np.asarray(arr.to_pylist(), dtype=object)
        n = len(arr)
        if isinstance(arr, pa.ExtensionArray):
            arr = arr.storage
        while pa.types.is_fixed_size_list(arr.type):
            arr = arr.flatten()  # accounts for slice offsets, no copy
        flat = arr.to_numpy(zero_copy_only=not pa.types.is_boolean(arr.type))
        return flat.reshape((n, *shape))

    # -- shards ---------------------------------------------------------------------------------
    def shard_of(self, index: int) -> int:
        return int(np.searchsorted(self.offsets, index, side="right") - 1)

    def acquire(self, shard: int) -> _OpenShard:
        """Open (pin + map) ``shard`` and mark it in use; pair with ``release``."""
        self._check_pid()
        with self._lock:
            while True:
                op = self._open.get(shard)
                if op is not None:
                    self._open.move_to_end(shard)
                    op.users += 1
                    return op
                if shard not in self._opening:
                    self._opening.add(shard)
                    break
                self._lock.wait()
        try:
            self._shrink(self.shards[shard].bytes)
            info = self.shards[shard]
            handle = self._cache.pin(
                info.key, checksum=info.checksum if self.config.verify else None, size=info.bytes
            )
            try:
                op = _OpenShard(handle, handle.path, info, self)
            except BaseException:
                handle.close()
                raise
            with self._lock:
                op.users = 1
                self._open[shard] = op
            return op
        finally:
            with self._lock:
                self._opening.discard(shard)
                self._lock.notify_all()

    def release(self, op: _OpenShard) -> None:
        with self._lock:
            op.users -= 1

    def _shrink(self, incoming: int) -> None:
        """Close idle open shards (LRU first) until ``incoming`` more bytes fit the budget."""
        with self._lock:
            used = sum(o.info.bytes for o in self._open.values())
            for idx in list(self._open):
                if used + incoming <= self._open_budget:
                    break
                o = self._open[idx]
                if o.users == 0:
                    del self._open[idx]
                    o.close()
                    used -= o.info.bytes

    def _release_idle(self) -> None:
        with self._lock:
            for idx in list(self._open):
                o = self._open[idx]
                if o.users == 0:
                    del self._open[idx]
                    o.close()

    def close_shard(self, shard: int, evict: bool = False) -> None:
        """Unpin ``shard`` if idle; with ``evict`` also drop it from the hot tier."""
        with self._lock:
            o = self._open.get(shard)
            if o is not None and o.users == 0:
                del self._open[shard]
                o.close()
        if evict:
            self._cache.evict(self.shards[shard].key)

    def prefetch_shard(self, shard: int) -> None:
        """Fill ``shard`` into the hot tier without opening it."""
        info = self.shards[shard]
        self._check_pid()
        self._cache.prefetch(info.key, checksum=info.checksum if self.config.verify else None,
                             size=info.bytes)

    @property
    def cache(self) -> NodeCache:
        self._check_pid()
        return self._cache

    def close(self) -> None:
        self._release_idle()

    # -- map-style API --------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _check_index(self, index: int) -> int:
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for {self.version.id} ({n} rows)")
        return i

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        i = self._check_index(index)
        s = self.shard_of(i)
        op = self.acquire(s)
        try:
            return op.row(i - int(self.offsets[s]))
        finally:
            self.release(op)

    def take(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Rows ``indices`` as a dict of batched arrays (one gather per shard)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"indices out of range for {self.version.id} ({n} rows)")
        idx = np.where(idx < 0, idx + n, idx)
        out: dict[str, np.ndarray] = {}
        for name in self.column_names:
            dtype, shape = self._specs[name]
            out[name] = np.empty((len(idx), *shape), dtype=dtype if dtype is not None else object)
        shard_ids = np.searchsorted(self.offsets, idx, side="right") - 1
        order = np.argsort(shard_ids, kind="stable")
        bounds = np.flatnonzero(np.diff(shard_ids[order])) + 1
        for group in np.split(order, bounds) if len(order) else []:
            s = int(shard_ids[group[0]])
            local = idx[group] - self.offsets[s]
            op = self.acquire(s)
            try:
                op.gather(local, out, group)
            finally:
                self.release(op)
        return out

    def __repr__(self) -> str:
        return f"Dataset({self.version.id}, rows={len(self)}, shards={len(self.shards)})"


__all__ = ["Dataset", "DatasetConfig", "table_from_numpy", "write_arrow_dataset"]
