"""Where each cached object lives: ``objects/<namespace>/<key>``, and a tagged copy (external
data listed with a content tag, ``nodecache.source``) ``objects/<namespace>.v/<dirs>/<hash of
tag>.<name>``.

The mapping is remembered: a loader asks for the path of every shard of every batch (its
eviction hints), and checking and joining the key each time was a sixth of its per-batch cost."""

from __future__ import annotations

import os
import threading

from ..errors import ConfigError
from ..store import validate_key
from .files import TMP_PREFIX
from .source import tagged_name

#: paths remembered at most (then forgotten all at once: a dataset's shards are re-learned)
PATHS_KEPT = 1 << 16


class KeyPaths:
    """``path_of(key, tag)`` under ``objects`` for the store ``namespace``; thread-safe."""

    def __init__(self, objects: str, namespace: str) -> None:
        self._objects = objects
        self._namespace = namespace
        self._plain = os.path.join(objects, namespace)
        self._known: dict[tuple[str, str | None], str] = {}
        self._mu = threading.Lock()

    def path_of(self, key: str, tag: str | None = None) -> str:
        got = self._known.get((key, tag))
        if got is None:
            got = self._work_out(key, tag)
            with self._mu:
                if len(self._known) >= PATHS_KEPT:
                    self._known.clear()
                self._known[(key, tag)] = got
        return got

    def _work_out(self, key: str, tag: str | None) -> str:
        validate_key(key)
        parts = key.split("/")
        if any(p.startswith(TMP_PREFIX) for p in parts):
            raise ConfigError(f"cache key segment may not start with {TMP_PREFIX!r}: {key!r}")
        if tag is None:
            return os.path.join(self._plain, *parts)
        parts[-1] = tagged_name(tag, parts[-1])
        return os.path.join(self._objects, f"{self._namespace}.v", *parts)


__all__ = ["PATHS_KEPT", "KeyPaths"]
