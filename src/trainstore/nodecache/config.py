"""How the node cache behaves (``CacheConfig``) and what it counted (``CacheStats``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class CacheConfig:
    """How the node cache behaves.

    ``limit_bytes``: total bytes of cached files.
    ``verify_hits``: "once" re-hashes a cached file the first time this process uses it
    (and again if its size or mtime changed), "always" on every pin, "never" trusts it.
    ``capacity_wait_s``: how long a fill waits for pinned files to be released when nothing
    can be evicted, before raising ``CapacityError`` (0 = fail at once).
    ``fsync``: fsync filled files (a cache can always re-fetch, so off by default).
    ``part_bytes`` / ``fetch_concurrency``: an object larger than ``part_bytes`` is fetched
    from a remote store as concurrent range requests of that size, at most
    ``fetch_concurrency`` in flight per cache; the fetched parts of all its fills share one
    byte budget of their product (``nodecache.fetch.RangedDownloads``).
    ``want_grace_s``: how long a fill on demand waits for files nobody wants (``NodeCache.want``)
    to be freed before it evicts one a reader still needs (which would be fetched again).
    """

    limit_bytes: int
    verify_hits: str = "once"
    capacity_wait_s: float = 30.0
    lock_timeout_s: float = 600.0
    want_grace_s: float = 0.25
    fsync: bool = False
    stale_temp_s: float = 3600.0
    part_bytes: int = 8 << 20
    fetch_concurrency: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.limit_bytes, int) or self.limit_bytes <= 0:
            raise ConfigError(f"cache limit_bytes must be a positive int, got {self.limit_bytes!r}")
        if self.verify_hits not in ("once", "always", "never"):
            raise ConfigError(f"verify_hits must be once|always|never, got {self.verify_hits!r}")
        if self.capacity_wait_s < 0 or self.lock_timeout_s <= 0:
            raise ConfigError("capacity_wait_s must be >= 0 and lock_timeout_s > 0")
        if self.part_bytes <= 0 or self.fetch_concurrency <= 0:
            raise ConfigError(f"part_bytes and fetch_concurrency must be positive, got "
                              f"{self.part_bytes}, {self.fetch_concurrency}")


@dataclass
class CacheStats:
    """Counters of this process's use of the cache."""

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    bytes_read_hits: int = 0
    evictions: int = 0
    bytes_evicted: int = 0
    refetched_corrupt: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def as_dict(self) -> dict:
        return {**self.__dict__, "hit_rate": self.hit_rate}


__all__ = ["CacheConfig", "CacheStats"]
