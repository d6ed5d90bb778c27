"""The node cache: a node-local, size-limited, read-through cache of durable-store objects
(shards, chunks), memory-mappable, shared by the processes of one node.

Not to be confused with the checkpoint *hot tier* (``trainstore.store.TieredStore``'s hot
store, where saves commit first). The data loader reads shards through this cache.
"""

from __future__ import annotations

from .cache import NodeCache, NotNeeded
from .config import CacheConfig, CacheStats
from .files import PinnedFile
from .source import check_unchanged, source_tag

__all__ = ["CacheConfig", "CacheStats", "NodeCache", "NotNeeded", "PinnedFile", "check_unchanged", "source_tag"]
