"""One byte budget for parallel writers: a bound on the bytes being processed at once.

torchsnapshot's idea: a producer that cuts data into pieces faster than the store takes them
must not hold every piece's scratch and compressed buffers at once. ``acquire(nbytes)``
blocks while the bytes in flight plus ``nbytes`` would exceed the budget; ``release(nbytes)``
gives them back. A single item larger than the whole budget is admitted alone (it waits
until nothing else is in flight), so no size can deadlock. ``submit`` runs a function on an
executor under the budget and releases it when the future finishes - done, failed or
cancelled - so a failed or cancelled item never leaks budget.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import ParamSpec, TypeVar

from .errors import ConfigError

P = ParamSpec("P")
T = TypeVar("T")


class ByteBudget:
    """At most ``limit`` bytes in flight (one larger item alone); thread-safe."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ConfigError(f"byte budget must be positive, got {limit}")
        self.limit = limit
        self._inflight = 0
        self._peak = 0
        self._cv = threading.Condition()

    def _cost(self, nbytes: int) -> int:
        if nbytes < 0:
            raise ConfigError(f"cannot reserve a negative byte count ({nbytes})")
        return min(nbytes, self.limit)  # an oversized item counts as the whole budget

    def acquire(self, nbytes: int, cancel: threading.Event | None = None) -> bool:
        """Reserve ``nbytes``; blocks while that would exceed the budget. With ``cancel``,
        gives up (reserving nothing, returning False) once that event is set."""
        cost = self._cost(nbytes)
        with self._cv:
            while self._inflight and self._inflight + cost > self.limit:
                if cancel is not None and cancel.is_set():
                    return False
                self._cv.wait(None if cancel is None else 0.1)
            if cancel is not None and cancel.is_set():
                return False
            self._inflight += cost
            self._peak = max(self._peak, self._inflight)
            return True

    def try_acquire(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` if that fits now; False (reserving nothing) where ``acquire``
        would wait - for a holder that must not block while it holds other bytes."""
        cost = self._cost(nbytes)
        with self._cv:
            if self._inflight and self._inflight + cost > self.limit:
                return False
            self._inflight += cost
            self._peak = max(self._peak, self._inflight)
            return True

    def release(self, nbytes: int) -> None:
        """Give back what ``acquire(nbytes)`` reserved."""
        cost = self._cost(nbytes)
        with self._cv:
            if cost > self._inflight:
                raise ConfigError(f"released {cost} bytes, only {self._inflight} are in flight")
            self._inflight -= cost
            self._cv.notify_all()

    def submit(self, pool: Executor, nbytes: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """``pool.submit(fn, ...)`` once ``nbytes`` are reserved; released when the future ends."""
        self.acquire(nbytes)
        try:
            fut = pool.submit(fn, *args, **kwargs)
        except BaseException:
            self.release(nbytes)
            raise
        fut.add_done_callback(lambda _f: self.release(nbytes))
        return fut

    @property
    def inflight(self) -> int:
        """Bytes reserved now."""
        with self._cv:
            return self._inflight

    @property
    def peak(self) -> int:
        """The most bytes reserved at once so far."""
        with self._cv:
            return self._peak


__all__ = ["ByteBudget"]
