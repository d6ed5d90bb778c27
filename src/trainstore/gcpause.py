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
Only bounded phases are paused: the caller's, and the planning and commit of a DCP save on
the save thread (``dcp.writer.StorageWriter(pause_gc=True)``), whose short-lived objects,
promoted by collections the training set off meanwhile, otherwise brought on a full
collection every few saves; never a save's writes, which run beside training for seconds.
Re-entrant, and a collector the application disabled stays so.
"""

from __future__ import annotations

import gc
import threading

_LOCK = threading.Lock()
_STATE = [0, False]  # [phases paused now (any thread), whether the collector was on when the first began]


def _enter() -> None:
    _LOCK.acquire()  # acquire/release, not ``with``: a ``with`` on a lock allocates bound methods
    try:
        if _STATE[0] == 0:
            _STATE[1] = gc.isenabled()
            gc.disable()
        _STATE[0] += 1
    finally:
        _LOCK.release()


def _exit(exc_type: object, exc: object, tb: object) -> None:
    _LOCK.acquire()
    try:
        _STATE[0] -= 1
        if _STATE[0] == 0 and _STATE[1]:
            gc.enable()
    finally:
        _LOCK.release()


class _Pause:
    """The one pause (a context manager) whose entry allocates nothing the collector tracks,
    so entering cannot itself trigger the collection it is there to keep out. A ``with`` looks
    ``__enter__``/``__exit__`` up on the type before calling them; a plain method would be a
    new bound-method object each time, and an owed collection ran right there, on the caller's
    thread (tests/checkpoint/test_gc_pause.py). Static methods are looked up as themselves.
    ``__exit__`` may allocate: the collector is still off while it runs."""

    __slots__ = ()
    __enter__ = staticmethod(_enter)
    __exit__ = staticmethod(_exit)


_PAUSE = _Pause()


def gc_paused() -> _Pause:
    """The cyclic collector off for the ``with`` block (and any overlapping ones)."""
    return _PAUSE


__all__ = ["gc_paused"]
