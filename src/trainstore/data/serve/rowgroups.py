"""Decoded Parquet row groups kept for reuse: an LRU bounded by bytes, one decode per group.

Served Parquet rows come out of decoded row groups (numpy views over the Arrow columns).
``DecodedGroups`` keeps them, keyed by ``(shard, row group)``, least recently used first out
once ``budget_bytes`` is exceeded (the group just decoded always stays). Two threads asking
for the same group while it decodes share one decode: the second waits for the first's
result (or its error). Groups of different shards decode in parallel (pyarrow releases the GIL).
``decode_ahead`` decodes a group before it is asked for (``serve.decodeahead``) without
counting a hit; until first asked for, such a group goes only after every other one (else
groups in use, touched by every batch, would push out the ones decoded for coming batches). A
decode that raises is not kept: the next request decodes again (and raises again).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

GroupKey = tuple[int, int]
#: column name -> numpy view of the row group's rows
GroupViews = dict[str, np.ndarray]


@dataclass
class DecodeStats:
    """Counters of one process's decoded-group cache."""

    decoded: int = 0  # row groups decoded
    decoded_bytes: int = 0  # their decoded (Arrow) size
    decoded_ahead: int = 0  # of those, decoded ahead of a request (decode-ahead threads)
    failed: int = 0  # decodes that raised (a damaged row group)
    hits: int = 0  # requests served from the cache
    evicted: int = 0  # groups dropped for the budget


class DecodedGroups:
    """LRU of decoded row groups bounded by ``budget_bytes`` (see the module docstring)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.stats = DecodeStats()
        self._groups: OrderedDict[GroupKey, tuple[GroupViews, int]] = OrderedDict()
        self._decoding: dict[GroupKey, Future[GroupViews]] = {}
        self._unasked: set[GroupKey] = set()  # decoded ahead, not asked for yet
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        return self._held

    def raise_budget(self, at_least: int) -> None:
        """Make the budget at least ``at_least`` bytes (never lowers it)."""
        with self._lock:
            self.budget_bytes = max(self.budget_bytes, at_least)

    def clear(self) -> None:
        """Drop every decoded group held (to free the memory; later reads decode again)."""
        with self._lock:
            self._groups.clear()
            self._unasked.clear()
            self._held = 0

    def demote(self, shard: int) -> None:
        """Make ``shard``'s groups the first to go (its reader is done with it for now)."""
        with self._lock:
            for key in [k for k in self._groups if k[0] == shard]:
                self._groups.move_to_end(key, last=False)
                self._unasked.discard(key)

    def get(self, key: GroupKey, decode: Callable[[], tuple[GroupViews, int]]) -> GroupViews:
        """The views of group ``key``; ``decode()`` -> (views, bytes) runs if it is not held."""
        with self._lock:
            hit = self._groups.get(key)
            if hit is not None:
                self._groups.move_to_end(key)
                self._unasked.discard(key)
                self.stats.hits += 1
                return hit[0]
            pending = self._decoding.get(key)
            if pending is None:
                pending = self._decoding[key] = Future()
                owner = True
            else:
                owner = False
        if not owner:
            views = pending.result()
            with self._lock:
                self._unasked.discard(key)  # it was asked for while decoding ahead
            return views
        return self._decode(key, pending, decode, ahead=False)

    def decode_ahead(self, key: GroupKey, decode: Callable[[], tuple[GroupViews, int]]) -> bool:
        """Decode group ``key`` now unless it is held or being decoded; True if decoded here.
        Raises what ``decode`` raises (a request waiting on it gets the same error)."""
        with self._lock:
            if key in self._groups or key in self._decoding:
                return False
            pending = self._decoding[key] = Future()
        self._decode(key, pending, decode, ahead=True)
        return True

    def _decode(self, key: GroupKey, pending: Future[GroupViews], decode: Callable[[], tuple[GroupViews, int]],
                *, ahead: bool) -> GroupViews:
        try:
            views, size = decode()
        except BaseException as exc:
            with self._lock:
                del self._decoding[key]
                self.stats.failed += 1
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._decoding[key]
            self._groups[key] = (views, size)
            self._held += size
            self.stats.decoded += 1
            self.stats.decoded_ahead += ahead
            self.stats.decoded_bytes += size
            if ahead:
                self._unasked.add(key)
            self._evict(keep=key)
        pending.set_result(views)
        return views

    def _evict(self, keep: GroupKey) -> None:
        """Drop least recently used groups (those decoded ahead and not asked for last, ``keep``
        never) until the budget holds; the lock is held."""
        while self._held > self.budget_bytes and len(self._groups) > 1:
            victim = next((k for k in self._groups if k not in self._unasked and k != keep), None)
            if victim is None:
                victim = next(k for k in self._groups if k != keep)
            _, old = self._groups.pop(victim)
            self._unasked.discard(victim)
            self._held -= old
            self.stats.evicted += 1

__all__ = ["DecodeStats", "DecodedGroups", "GroupKey", "GroupViews"]
