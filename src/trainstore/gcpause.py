"""Pause CPython's cyclic garbage collector around short, allocation-heavy phases.

A process that has just imported torch (and a trainer, DCP, ...) owes a full collection: the
imports created hundreds of thousands of long-lived objects that no full collection has
visited yet, and CPython runs one (0.11-0.13 s on the 2-core machine measured) as soon as
enough new container objects have been allocated - whoever allocates them pays. A save's
staging and a restore's manifest parsing allocate thousands (manifest entries, futures), so
in a fresh process they paid it: 0.12 s of a 0.23 s first save, 0.12 s of a 0.30 s restore
(docs/benchmarks.md, "A full collection owed by the imports"). ``torch.load`` allocates few
such objects and never triggered it; ``dcp.async_save`` triggered it on its background thread.

These phases create no reference cycles, so pausing the collector loses nothing: the owed
collection runs at the first allocation after the phase, outside the caller's blocking time.
Only bounded phases on the caller's thread are paused (never a background save, which runs
beside training for seconds). Re-entrant, and a collector the application disabled stays so.
"""

from __future__ import annotations

import gc
import threading


class _Pause:
    """The one pause (a context manager): entering it allocates nothing the collector tracks,
    so entering cannot itself trigger the collection it is there to keep out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0  # phases paused now (any thread)
        self._resume = False  # whether the collector was enabled when the first of them started

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._resume:
                gc.enable()


_PAUSE = _Pause()


def gc_paused() -> _Pause:
    """The cyclic collector off for the ``with`` block (and any overlapping ones)."""
    return _PAUSE


__all__ = ["gc_paused"]
