"""A ``Mixture``'s sources made ready to serve together: one node-cache limit for the sources
in one cache directory, each reading exactly the mixture's columns, and their cache counters
summed (``Loader.stats``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from ...nodecache.config import CacheStats
from .dataset import Dataset
from .options import default_cache_limit, resolve_cache_dir


class CacheView:
    """The node-cache counters of every source, summed (what ``Loader.stats`` reads)."""

    def __init__(self, sources: Sequence[Dataset]) -> None:
        self._sources = sources

    @property
    def stats(self) -> CacheStats:
        total = CacheStats()
        for ds in self._sources:
            for k, v in vars(ds.cache.stats).items():
                setattr(total, k, getattr(total, k) + v)
        return total


def serve_together(sources: tuple[Dataset, ...], columns: tuple[str, ...]) -> tuple[Dataset, ...]:
    """The sources as the mixture serves them, each reopened at most once:

    * sources in one cache directory share its space: a source whose limit is the default (its
      own bytes + a shard) gets the default for all of them, else filling one source evicts the
      others' shards and every epoch fetches them again;
    * each reads exactly the mixture's ``columns``, so its rows are gathered straight into the
      mixture's batch arrays."""
    by_dir: dict[str, list[int]] = {}
    for i, ds in enumerate(sources):
        by_dir.setdefault(os.path.abspath(resolve_cache_dir(ds.config.cache_dir)), []).append(i)
    shared: dict[int, int] = {}
    for where, members in by_dir.items():
        limit, _why = default_cache_limit(where, sum(sources[i].source_bytes for i in members),
                                          max(sources[i].max_shard_bytes for i in members))
        shared.update(dict.fromkeys(members, limit))
    out = []
    for i, ds in enumerate(sources):
        change: dict = {}
        if ds.config.cache_limit is None and ds.cache_limit < shared[i]:
            change["cache_limit"] = shared[i]
        if set(ds.column_names) != set(columns):
            change["columns"] = columns
        out.append(Dataset(ds.store, ds.version, config=replace(ds.config, **change)) if change else ds)
    return tuple(out)


__all__ = ["CacheView", "serve_together"]
