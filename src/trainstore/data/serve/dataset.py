"""Map-style access to a servable feature dataset version, memory-mapped from the hot tier.

Served layouts are those ``data.layouts`` marks ``servable`` (``"arrow-ipc"``, ``"parquet"``,
``"arrow-stream"``); fixed-shape tensor columns are ``fixed_size_list<primitive>``
whose per-row shape is in ``extra["columns"]`` (or field metadata ``shape``). A shard is
pinned in the ``NodeCache`` while open and read by its layout (``serve.open_shard``): column
arrays are zero-copy numpy views of the mapped file. ``ds[i]`` returns a dict of per-row views; ``ds.take(indices)`` gathers rows from many
shards into fresh batched arrays (one copy, no per-row Python work).

Parquet versions are served as well, one row group at a time (``serve.parquet``): decoded
from the node-cache file (the ``Loader``, ``take``), or, for ``ds[i]`` and
``take(..., ranges=True)`` on a shard not cached, fetched by byte ranges; decoded row groups
are kept in a per-process LRU (``row_group_stats()``). ``Dataset.open(url)``
serves a Parquet directory or a Hugging Face ``datasets`` folder as it is (``serve.external``).
Reading options and the default cache directory and limit are in ``serve.options``.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from ...errors import CapacityError, ConfigError, SchemaError
from ...nodecache import CacheConfig, NodeCache
from ...store import Store, open_store
from ..layouts import PARQUET, get_layout, layout_names
from ..versions import DatasetVersion, load_version, parse_ref
from .external import describe_external
from .groups import by_key
from .open_shard import column_spec
from .options import CACHE_FREE_FRACTION, DatasetConfig, default_cache_limit, resolve_cache_dir
from .parquet import ParquetRows
from .rowgroups import DecodedGroups
from .shardpins import ServedShard, ShardPins, source_tags
from .source import Alloc, SamplerPlanned, batch_array


class Dataset(ShardPins, SamplerPlanned):
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
            cfg = replace(
                cfg,
                cache_dir=os.fspath(cache_dir) if cache_dir is not None else cfg.cache_dir,
                cache_limit=cache_limit if cache_limit is not None else cfg.cache_limit,
                columns=tuple(columns) if columns is not None else cfg.columns,
            )
        self.config = cfg
        self._store_options = store_options
        self.store = open_store(source, **store_options)
        if isinstance(ref, DatasetVersion):
            self.version = ref
        else:
            name, ver = parse_ref(ref)
            self.version = load_version(self.store, name, ver)
        self.layout = get_layout(self.version.layout)
        if not self.layout.servable:
            served = [n for n in layout_names() if get_layout(n).servable]
            raise ConfigError(
                f"dataset {self.version.id} has layout {self.version.layout!r}; the loader reads "
                f"{', '.join(map(repr, served))} feature versions (run a transform to produce one)"
            )
        self.shards = self.version.shards
        self.offsets = np.concatenate([[0], np.cumsum([s.rows for s in self.shards])]).astype(np.int64)
        schema = self.version.schema
        names = list(cfg.columns) if cfg.columns else list(schema.names)
        for n in names:
            if n not in schema.names:
                raise SchemaError(f"dataset {self.version.id} has no column {n!r} (has {schema.names})")
        self.column_names = tuple(names)
        self._specs = {n: column_spec(self.version, n) for n in names}
        self.max_shard_bytes = max((s.bytes for s in self.shards), default=0)
        self._cache_dir = resolve_cache_dir(cfg.cache_dir)
        #: Parquet footers read already (by ``open``), by shard key
        self._footers: dict[str, pq.FileMetaData] = {}
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
        self._source_tags = source_tags(self.version)  # read on every pin: worked out once
        self._reset_process_state()

    @classmethod
    def open(
        cls,
        url: Store | str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        columns: Sequence[str] | None = None,
        config: DatasetConfig | None = None,
        **store_options: Any,
    ) -> Dataset:
        """Serve the data at ``url`` as it is, read-only: a directory of Parquet files or a
        Hugging Face ``datasets`` folder (``save_to_disk``), detected from its files."""
        store = open_store(url, create=False, **store_options) if not isinstance(url, Store) else url
        cache_root = resolve_cache_dir(cache_dir if cache_dir is not None else (config or DatasetConfig()).cache_dir)
        sizes = [m.size for m in store.list("")]
        limit = cache_limit or (config.cache_limit if config else None) or default_cache_limit(
            cache_root, sum(sizes), max(sizes, default=0))[0]
        counting = NodeCache(store, cache_root, config=CacheConfig(limit))
        footers: dict[str, pq.FileMetaData] = {}
        version = describe_external(store, lambda key, size, tag: counting.open(key, size=size, tag=tag), footers)
        ds = cls(store, version, cache_dir=cache_root, cache_limit=cache_limit, columns=columns, config=config)
        ds._footers.update(footers)
        return ds

    from_parquet = open
    from_hf = open

    # -- process-local state (rebuilt after fork / unpickling) --------------------------------
    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._cache = NodeCache(
            self.store, self._cache_dir,
            config=CacheConfig(self.cache_limit, capacity_wait_s=self.config.capacity_wait_s),
        )
        self._cache.on_pressure = self._release_idle
        #: called on cache pressure after idle shards are closed (a loader's fill-ahead pins)
        self._pressure_hooks: list[Callable[[], None]] = []
        self._lock = threading.Condition()
        self._open: OrderedDict[int, ServedShard] = OrderedDict()
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
        self._ranges = (ParquetRows(self.store, self.shards, self._specs, self._open_budget, self._footers,
                                    window_floor=self.config.max_open_bytes is None, verify=self.config.verify,
                                    source_tags=self._source_tags)
                        if self.layout is PARQUET else None)

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_cache", "_lock", "_open", "_opening", "_ranges", "_footers",
                              "_pressure_hooks")}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._footers = {}
        self._reset_process_state()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # forked (torch DataLoader worker): fresh locks and pins
            self._reset_process_state()

    def _ranged(self, shard: int) -> bool:
        """Whether rows of ``shard`` are read by byte ranges: a Parquet shard neither open nor
        in the node cache."""
        if self._ranges is None:
            return False
        self._check_pid()
        with self._lock:
            if shard in self._open:
                return False
        return not self.cached(shard)

    def row_group_stats(self) -> dict[str, int]:
        """This process's Parquet row-group decoding: groups ``decoded`` (and their
        ``decoded_bytes``; ``decoded_ahead`` of them by the loader's decode-ahead), decodes that
        ``failed``, cache ``hits``, ``evicted``, ``held_bytes`` / ``budget_bytes``, and
        ``fetched_bytes`` read by byte ranges (all 0 for other layouts)."""
        self._check_pid()
        if self._ranges is None:
            return dict.fromkeys(("decoded", "decoded_bytes", "decoded_ahead", "failed", "hits", "evicted",
                                  "held_bytes", "budget_bytes", "fetched_bytes"), 0)
        groups = self._ranges.groups
        return {**asdict(groups.stats), "held_bytes": groups.held_bytes, "budget_bytes": groups.budget_bytes,
                "fetched_bytes": self._ranges.fetched_bytes}

    @property
    def decoded_groups(self) -> DecodedGroups | None:
        """This process's decoded Parquet row groups (``None`` for other layouts)."""
        self._check_pid()
        return self._ranges.groups if self._ranges is not None else None

    @property
    def source_id(self) -> str:
        """What a loader state names (``serve.source``): the version id."""
        return self.version.id

    @property
    def source_bytes(self) -> int:
        return self.version.bytes

    @property
    def cache(self) -> NodeCache:
        self._check_pid()
        return self._cache

    def close(self) -> None:
        """Unpin idle shards and drop this process's decoded Parquet row groups."""
        self._release_idle()
        if self._ranges is not None:
            self._ranges.groups.clear()

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
        if self._ranged(s):
            assert self._ranges is not None
            return self._ranges.row_ranged(s, i - int(self.offsets[s]))
        op = self.acquire(s)
        try:
            return op.row(i - int(self.offsets[s]))
        finally:
            self.release(op)

    def take(self, indices: Sequence[int] | np.ndarray, *, ranges: bool = False,
             gathered: Callable[[int], None] | None = None, alloc: Alloc | None = None) -> dict[str, np.ndarray]:
        """Rows ``indices`` as a dict of batched arrays (one gather per shard). ``ranges``: a
        Parquet shard not cached is read by row groups (byte ranges) instead of whole.
        ``gathered(shard)`` runs as each shard's rows are copied out (the loader lets go of a
        shard no later batch reads). ``alloc``: where fixed-size columns are gathered
        (``source.Alloc``; default ``np.empty``)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"indices out of range for {self.version.id} ({n} rows)")
        idx = np.where(idx < 0, idx + n, idx)
        out: dict[str, np.ndarray] = {}
        for name in self.column_names:
            dtype, shape = self._specs[name]
            out[name] = batch_array(alloc, name, (len(idx), *shape), dtype)
        shard_ids = np.searchsorted(self.offsets, idx, side="right") - 1
        for s, group in by_key(shard_ids):
            local = idx[group] - self.offsets[s]
            if ranges and self._ranged(s):
                assert self._ranges is not None
                self._ranges.gather_ranged(s, local, out, group)
                continue
            self.gather_shard(s, local, out, group)
            if gathered is not None:
                gathered(s)
        return out

    def __repr__(self) -> str:
        return f"Dataset({self.version.id}, rows={len(self)}, shards={len(self.shards)})"


__all__ = ["CACHE_FREE_FRACTION", "Dataset", "DatasetConfig", "default_cache_limit", "resolve_cache_dir"]
