"""A ``Dataset``'s shards in the node cache: pinned, opened by layout, and let go (``ShardPins``).

``acquire`` / ``release`` open a shard (pin it in the ``NodeCache`` and map it, ``open_shard``;
a Parquet one through ``ParquetRows``) and count its users; idle open shards are closed LRU
first past the open-bytes budget, and all of them on cache pressure (then the pressure hooks
run: a loader's fill-ahead pins). ``pin_shard`` / ``want_shard`` / ``close_shard`` are the
loader's fill-ahead and eviction side. External shards are pinned by their content tag as
listed (``source_tag``), trainstore's own by their BLAKE3 checksum.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...nodecache import NodeCache, PinnedFile
from ..layouts import ShardLayout
from ..versions import DatasetVersion, ShardInfo
from .external import SOURCE_TAGS
from .open_shard import ColumnSpec, OpenShard
from .options import DatasetConfig
from .parquet import CachedParquetShard, ParquetRows
from .take_shard import TakeShard

#: an open shard: a mapped Arrow file, a Parquet file decoded by row group, or a file whose
#: rows are read per batch (Lance)
ServedShard = OpenShard | CachedParquetShard | TakeShard


def source_tags(version: DatasetVersion) -> dict[str, str]:
    """The content tags an external ``version``'s files were listed with, by key (else empty)."""
    tags = version.extra.get(SOURCE_TAGS) if version.operation == "external" else None
    return {k: v for k, v in tags.items() if isinstance(v, str)} if isinstance(tags, dict) else {}


class ShardPins:
    """The shard side of a ``Dataset`` (its attributes are set by ``Dataset``)."""

    config: DatasetConfig
    version: DatasetVersion
    shards: Sequence[ShardInfo]
    offsets: np.ndarray
    layout: ShardLayout
    _specs: dict[str, ColumnSpec]
    _cache: NodeCache
    _lock: threading.Condition
    _open: OrderedDict[int, ServedShard]
    _opening: set[int]
    _open_budget: int
    _ranges: ParquetRows | None
    _pressure_hooks: list[Callable[[], None]]
    _source_tags: dict[str, str]  # external shard key -> content tag as listed

    if TYPE_CHECKING:  # the Dataset's

        def _check_pid(self) -> None: ...

        @property
        def cache(self) -> NodeCache: ...

    # -- shards ---------------------------------------------------------------------------------
    def shard_of(self, index: int) -> int:
        return int(np.searchsorted(self.offsets, index, side="right") - 1)

    def acquire(self, shard: int) -> ServedShard:
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
            handle = self._cache.pin(info.key, checksum=self._checksum(info), size=info.bytes,
                                     tag=self.source_tag(shard))
            try:
                opened: ServedShard
                if self._ranges is not None:
                    opened = self._ranges.open_cached(shard, handle, handle.path,
                                                      hash_verified=bool(self._checksum(info)))
                elif self.layout.by_row:
                    opened = TakeShard(handle, handle.path, info, self.layout, self._specs)
                else:
                    opened = OpenShard(handle, handle.path, info, self.layout, self._specs)
            except BaseException:
                handle.close()
                raise
            with self._lock:
                opened.users = 1
                self._open[shard] = opened
            return opened
        finally:
            with self._lock:
                self._opening.discard(shard)
                self._lock.notify_all()

    def release(self, op: ServedShard) -> None:
        with self._lock:
            op.users -= 1

    def gather_shard(self, shard: int, local: np.ndarray, out: dict[str, np.ndarray], positions: np.ndarray) -> None:
        """``out[column][positions] = rows local of shard`` for each of this source's columns
        (``out`` may hold more), the shard opened (and pinned) for the copy."""
        op = self.acquire(shard)
        try:
            op.gather(local, out, positions)
        finally:
            self.release(op)

    def _shrink(self, incoming: int) -> None:
        """Close idle open shards (LRU first) until ``incoming`` more bytes fit the budget."""
        with self._lock:
            used = sum(o.open_bytes for o in self._open.values())
            for idx in list(self._open):
                if used + incoming <= self._open_budget:
                    break
                o = self._open[idx]
                if o.users == 0:
                    del self._open[idx]
                    o.close()
                    used -= o.open_bytes

    def _release_idle(self) -> None:
        with self._lock:
            for idx in list(self._open):
                o = self._open[idx]
                if o.users == 0:
                    del self._open[idx]
                    o.close()
        for hook in list(self._pressure_hooks):
            hook()

    def add_pressure_hook(self, hook: Callable[[], None]) -> None:
        """``hook()`` runs when a fill of this process finds the node cache full of pinned files."""
        self._check_pid()
        self._pressure_hooks.append(hook)

    def remove_pressure_hook(self, hook: Callable[[], None]) -> None:
        if hook in self._pressure_hooks:
            self._pressure_hooks.remove(hook)

    def close_shard(self, shard: int, evict: bool = False) -> None:
        """Unpin ``shard`` if idle (its decoded Parquet row groups become the first to be
        dropped); with ``evict`` also drop it from the hot tier."""
        with self._lock:
            o = self._open.get(shard)
            if o is not None and o.users == 0:
                del self._open[shard]
                o.close()
        if self._ranges is not None:  # done with this epoch: its decoded row groups go first
            self._ranges.groups.demote(shard)
        if evict:
            self._cache.evict(self.shards[shard].key, tag=self.source_tag(shard))

    def prefetch_shard(self, shard: int) -> None:
        """Fill ``shard`` into the hot tier without opening it."""
        self.pin_shard(shard).close()

    def want_shard(self, shard: int, rank: float, owner: int) -> None:
        """``owner`` reads ``shard`` again at ``rank`` (``NodeCache.want``): evicted last."""
        self._cache.want(self.shards[shard].key, rank, owner=owner, tag=self.source_tag(shard))

    def unwant_shard(self, shard: int, owner: int) -> None:
        self._cache.unwant(self.shards[shard].key, owner=owner, tag=self.source_tag(shard))

    def pin_shard(self, shard: int, *, ahead: bool = False,
                  needed: Callable[[], bool] | None = None) -> PinnedFile:
        """Fill ``shard`` into the node cache and hold it there (no process of the node can
        evict it) until the returned handle is closed; ``ahead``, ``needed``: see ``NodeCache.pin``."""
        info = self.shards[shard]
        self._check_pid()
        return self._cache.pin(info.key, checksum=self._checksum(info), size=info.bytes, ahead=ahead,
                               tag=self.source_tag(shard), needed=needed)

    def _checksum(self, info: ShardInfo) -> str | None:
        """What the node cache verifies a fill against (external files have no checksum)."""
        return (info.checksum or None) if self.config.verify else None

    def source_tag(self, shard: int) -> str | None:
        """The content tag external ``shard`` was listed with (``nodecache.source``): the node
        cache serves only that content of the file. None for trainstore's own shards (BLAKE3)."""
        info = self.shards[shard]
        return None if info.checksum else self._source_tags.get(info.key)

    def cached(self, shard: int) -> bool:
        """Whether ``shard`` (the content this dataset serves) is in the node cache."""
        return self.cache.contains(self.shards[shard].key, tag=self.source_tag(shard))


__all__ = ["ServedShard", "ShardPins", "source_tags"]
