"""Reading options of a served dataset, and where and how large its hot tier is by default.

``DatasetConfig`` holds a ``Dataset``'s reading options; ``resolve_cache_dir`` and
``default_cache_limit`` pick the node-cache directory and limit when the caller does not (the
limit never takes more than ``CACHE_FREE_FRACTION`` of the directory's free space).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

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


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> str:
    """``cache_dir``, else ``$TRAINSTORE_CACHE_DIR``, else ``~/.cache/trainstore/hot``."""
    if cache_dir is not None:
        return os.fspath(cache_dir)
    default = os.environ.get("TRAINSTORE_CACHE_DIR")
    return default or os.path.join(os.path.expanduser("~"), ".cache", "trainstore", "hot")


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


__all__ = ["CACHE_FREE_FRACTION", "DatasetConfig", "default_cache_limit", "resolve_cache_dir"]
