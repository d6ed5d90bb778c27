"""A tiered store: a hot tier (local, fast) in front of a durable tier and an optional archive.

Reads fall through hot -> durable -> archive; listings merge the tiers (one entry per key);
``delete`` removes a key from every tier. Where a write lands depends on the mode:

* **write-through** (the default): the durable tier is the truth and hot is a cache of it.
  ``put`` writes durable, then hot. ``put_if_absent`` commits with the durable tier's
  conditional create - atomic across every writer of that durable tier, on any node - and
  then fills hot; a failed fill is logged and the hot copy dropped (the commit stands).
* **write-back** (``write_back=True``; the checkpoint hot tier of
  ``trainstore.lifecycle.tiering``): ``put`` and ``put_if_absent`` land in hot only, so a
  save is restore-ready at local-disk speed; the tiering engine copies each checkpoint to
  durable later (chunks, then the manifest with the durable tier's ``put_if_absent``).
  "Atomic" then means: the commit is atomic in the tier that receives it (exactly one of
  the writers sharing this hot tier wins), a key a lower tier already holds is refused, and
  a same-named commit made meanwhile on another node's hot tier is caught by the durable
  copy's conditional create (``ConflictError`` for different bytes) - never overwritten.
  A hot commit never depends on the durable tier: the write view is hot alone (a chunk only
  durable holds is written again), and a durable tier that cannot be asked (unreachable)
  does not stop a commit - the durable copy's conditional create catches a clash later.

Both modes refuse ``put_if_absent`` of a key the archive holds (the archive only receives
moves of durable objects, so that check cannot race a writer); an archive (or, write-back, a
durable tier) that cannot be asked does not stop the commit (logged): reads then return the
new object first, and the clash surfaces as a ``ConflictError`` when that step is copied.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import (
    AlreadyExistsError,
    ConfigError,
    NotFoundError,
    StoreError,
    StoreUnavailableError,
)
from .base import Buffer, ObjectMeta, Store, StoreCapabilities

log = logging.getLogger("trainstore.store.tiered")


class TieredStore(Store):
    """hot -> durable [-> archive] as one ``Store`` (see the module docstring for the modes)."""

    def __init__(self, hot: Store, durable: Store, archive: Store | None = None, *,
                 write_back: bool = False) -> None:
        for name, tier in (("hot", hot), ("durable", durable), ("archive", archive)):
            if tier is not None and not isinstance(tier, Store):
                raise ConfigError(f"the {name} tier of a TieredStore must be a Store, got {type(tier).__name__}")
        self.hot, self.durable, self.archive = hot, durable, archive
        self.write_back = bool(write_back)
        self._tiers = tuple(s for s in (hot, durable, archive) if s is not None)
        self.url = f"tiered({hot.url} -> {durable.url}" + (f" -> {archive.url})" if archive else ")")
        if write_back:
            self._write_view: Store = hot
        else:
            self._write_view = self if archive is None else TieredStore(hot, durable)

    def write_view(self) -> Store:
        """Where a new content-addressed object counts as present. Write-through: hot and
        durable, without the archive (a chunk only in the archive is written again: the
        durable copy never depends on the archive, which may be cold, slow, or collected
        independently). Write-back: hot alone (the tier the commit happens in), so a hot
        checkpoint restores from hot and saves never wait on a durable tier that is down."""
        return self._write_view

    def tiers(self) -> tuple[Store, ...]:
        """hot, durable[, archive]: readers verify and repair copies tier by tier (``ChunkStore``)."""
        return self._tiers

    @property
    def capabilities(self) -> StoreCapabilities:
        return StoreCapabilities(tiered=True)

    def _first(self, key: str, fn: Callable[[Store], Any]) -> Any:
        for s in self._tiers:
            try:
                return fn(s)
            except NotFoundError:
                continue
        raise NotFoundError(f"no object {key!r} in any tier of {self.url}")

    def get(self, key: str) -> Buffer:
        return self._first(key, lambda s: s.get(key))

    def get_range(self, key: str, start: int, length: int) -> Buffer:
        return self._first(key, lambda s: s.get_range(key, start, length))

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[Buffer]:
        return self._first(key, lambda s: s.get_ranges(key, ranges))

    def head(self, key: str) -> ObjectMeta:
        return self._first(key, lambda s: s.head(key))

    def put(self, key: str, data: Buffer) -> ObjectMeta:
        if self.write_back:
            return self.hot.put(key, data)
        meta = self.durable.put(key, data)
        self._fill_hot(key, data)
        return meta

    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        if self.archive is not None and self._holds(self.archive, key):
            raise AlreadyExistsError(f"object {key!r} already exists in {self.archive.url}")
        if not self.write_back:
            meta = self.durable.put_if_absent(key, data)  # the commit point
            self._fill_hot(key, data)
            return meta
        if self._holds(self.durable, key):  # a step evicted from hot still exists
            raise AlreadyExistsError(f"object {key!r} already exists in {self.durable.url}")
        return self.hot.put_if_absent(key, data)

    def _holds(self, tier: Store, key: str) -> bool:
        """Whether a tier the commit does not happen in holds ``key``; False (logged) when it
        cannot be asked: the commit does not depend on that tier. A clash is caught later:
        by the durable copy's conditional create, or by ``archive()``'s (``ConflictError``)."""
        try:
            return tier.exists(key)
        except StoreUnavailableError as exc:
            log.warning("tiered store: could not check %r in %s (%s); committing without it", key, tier.url, exc)
            return False

    def _fill_hot(self, key: str, data: Buffer) -> None:
        """Cache a durable write in hot. A failed fill drops the hot copy, so reads fall
        through to durable and never see an older version; if even that fails, raise."""
        try:
            self.hot.put(key, data)
        except StoreError as exc:
            log.warning("tiered store: caching %r in the hot tier %s failed: %s", key, self.hot.url, exc)
            try:
                self.hot.delete(key)
            except StoreError as exc2:
                raise StoreError(
                    f"{key!r} was written to the durable tier {self.durable.url}, but the hot tier "
                    f"{self.hot.url} could neither cache it ({exc}) nor drop its older copy ({exc2})"
                ) from exc2

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        seen: set[str] = set()
        for s in self._tiers:
            for meta in s.list(prefix):
                if meta.key not in seen:
                    seen.add(meta.key)
                    yield meta

    def delete(self, key: str) -> None:
        for s in self._tiers:
            s.delete(key)

    def local_path(self, key: str) -> str | None:
        path = self.hot.local_path(key)
        return path if path is not None and os.path.isfile(path) else None

    def close(self) -> None:
        for s in self._tiers:
            s.close()


__all__ = ["TieredStore"]
