"""Checked reads of small metadata objects (manifests, records) across the tiers of a store.

What ``ChunkStore`` does for chunks, for any object whose bytes a ``check`` function can
validate: ``read_checked(store, key, check)`` returns ``check(bytes)`` of a good copy.

* The first copy read is the store's own answer (a tiered store: the fastest tier holding it).
  When it fails ``check`` (an ``IntegrityError``: a checksum mismatch, bytes that do not
  parse), the copy in every tier of ``store.tiers()`` (hot, durable, archive) is tried in
  order, and the first good one atomically replaces each bad copy seen (``tier.put``; a
  read-only view cannot write and only logs). A copy missing from a tier is not repaired:
  eviction removes hot copies on purpose.
* ``IntegrityError`` is raised only when no tier holds a good copy; it names each copy's
  problem. A tier that could not answer (a store error) is not corruption: with no good copy
  found, that error is raised instead, so a transient failure never marks anything bad.
* ``scrub=True`` reads every tier's copy even when the first is good and repairs the bad ones
  (a corrupt durable copy behind a good hot one): deep verification uses it.

Leases and other objects rewritten in place by their owners are not read this way: a copy
in another tier may be older, and "repairing" with it would roll the owner's state back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from ..errors import IntegrityError, NotFoundError, ReadOnlyError, StoreError
from .base import Buffer, Store

log = logging.getLogger("trainstore.store.checked")

T = TypeVar("T")


@dataclass(frozen=True)
class MetadataRepair:
    """One bad copy of a metadata object replaced by a good one."""

    key: str
    store: str  # URL of the tier whose copy was bad
    source: str  # URL of the tier the good copy came from
    problem: str

    def __str__(self) -> str:
        return f"repaired {self.key} in {self.store} from {self.source} ({self.problem})"


def read_checked(store: Store, key: str, check: Callable[[Buffer], T], *, scrub: bool = False,
                 on_repair: Callable[[MetadataRepair], None] | None = None) -> T:
    """``check(bytes)`` of a good copy of ``key`` (module doc). ``check`` raises
    ``IntegrityError`` for bad bytes; ``NotFoundError`` when no tier holds ``key``."""
    tiers = store.tiers()
    if not scrub or len(tiers) == 1:
        data = store.get(key)
        try:
            return check(data)
        except IntegrityError as exc:
            if len(tiers) == 1:
                raise
            first: IntegrityError | None = exc
    else:
        first = None
    good, bad, failed = _scan(tiers, key, check, every=scrub)
    if good is None:
        if failed is not None:
            raise failed
        if first is None and not bad:
            raise NotFoundError(f"no object {key!r} in any tier of {store.url}")
        err = bad[0][2] if bad else first
        problems = "; ".join(f"{t.url}: {p}" for t, p, _e in bad)
        raise type(err)(f"no good copy of {key} in any tier of {store.url}: {problems or err}") from None
    value, data, src = good
    for tier, problem, _e in bad:
        _repair(tier, key, data, src, problem, on_repair)
    return value


def read_copies(places: Iterable[tuple[Store, str]], failed: list[StoreError]) -> Iterator[tuple[Store, str, Buffer]]:
    """(tier, key, bytes) of each copy that exists among ``places`` ((tier, key) pairs, in the
    order to try them). A tier that cannot answer is logged and its error appended to
    ``failed``: it says nothing about the copy (``ChunkStore`` walks its copies with this too)."""
    for tier, key in places:
        try:
            data = tier.get(key)
        except NotFoundError:
            continue
        except StoreError as exc:
            failed.append(exc)
            log.warning("%s: could not read the copy in %s: %s", key, tier.url, exc)
            continue
        yield tier, key, data


def _scan(tiers: tuple[Store, ...], key: str, check: Callable[[Buffer], T], every: bool
          ) -> tuple[tuple[T, Buffer, Store] | None, list[tuple[Store, str, IntegrityError]], StoreError | None]:
    """(good: (value, bytes, tier) or None, bad: [(tier, problem, error)], the first store error)."""
    good, bad, failed = None, [], []
    for tier, _key, data in read_copies(((t, key) for t in tiers), failed):
        try:
            value = check(data)
        except IntegrityError as exc:
            bad.append((tier, str(exc), exc))
            continue
        if good is None:
            good = (value, data, tier)
            if not every:
                break
    return good, bad, failed[0] if failed else None


def _repair(tier: Store, key: str, data: Buffer, src: Store, problem: str,
            on_repair: Callable[[MetadataRepair], None] | None) -> None:
    try:
        tier.put(key, data)
    except (StoreError, ReadOnlyError) as exc:  # the read succeeds anyway; a later read retries
        log.error("%s: could not repair the bad copy in %s: %s", key, tier.url, exc)
        return
    event = MetadataRepair(key, tier.url, src.url, problem)
    log.warning("%s", event)
    if on_repair is not None:
        try:
            on_repair(event)
        except Exception as exc:  # noqa: BLE001 - reporting never breaks a read
            log.warning("metadata repair listener %r failed: %s", on_repair, exc)


__all__ = ["MetadataRepair", "read_checked", "read_copies"]
