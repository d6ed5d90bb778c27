"""Local, verified access to a dataset shard: the store's own file, or a hot-tier copy.

A local store's file is used in place (after checking its BLAKE3 against the manifest); any
other store's shard is read through ``trainstore.nodecache.NodeCache`` (download once, verify,
memory-mappable file) under ``cache_dir`` (default ``$TRAINSTORE_CACHE_DIR`` or
``~/.cache/trainstore/hot``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import blake3

from ..errors import IntegrityError, NotFoundError
from ..nodecache import NodeCache
from ..store import Store
from .versions import ShardInfo

DEFAULT_CACHE_BYTES = 16 << 30


def default_cache_dir() -> str:
    return os.environ.get("TRAINSTORE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "trainstore", "hot"
    )


def file_checksum(path: str) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(path)
    return hasher.hexdigest()


def verify_local_file(path: str, info: ShardInfo) -> None:
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise NotFoundError(f"shard {info.key} is missing ({path})") from None
    if size != info.bytes:
        raise IntegrityError(f"shard {info.key}: {size} bytes, manifest says {info.bytes}")
    if size and file_checksum(path) != info.checksum:
        raise IntegrityError(f"shard {info.key}: checksum mismatch (corrupted)")


@contextlib.contextmanager
def local_shard(store: Store, info: ShardInfo, cache_dir: str | None = None,
                cache_bytes: int = DEFAULT_CACHE_BYTES) -> Iterator[str]:
    """``with local_shard(store, info) as path``: a verified local file with the shard's bytes."""
    path = store.local_path(info.key)
    if path is not None:
        verify_local_file(path, info)
        yield path
        return
    cache = NodeCache(store, cache_dir or default_cache_dir(), max(cache_bytes, info.bytes))
    with cache.open(info.key, checksum=info.checksum, size=info.bytes) as cached:
        yield cached
