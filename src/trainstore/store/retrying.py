"""Our own bounded retries, for the object-store calls obstore does not retry.

obstore (Rust ``object_store``) retries 5xx answers, connection errors and timeouts with
backoff, but only for requests it considers safe to repeat. Measured against the fault
proxy (``tests/reliability``): it does *not* retry

* a conditional create (``put(mode="create")``, our ``put_if_absent``) after a reset,
  timeout or a lost response: the request may have been applied;
* ``delete`` (sent as a multi-object ``POST ?delete``) after a reset or timeout;
* a ``list`` whose response body was cut short.

``ObjectStore`` wraps those calls with ``backoff_delays`` below. The conditional create is
the delicate one: if an attempt failed in a way that leaves its outcome unknown and a
later attempt is told the key already exists, the winner may be *our own* earlier
attempt. ``ObjectStore.put_if_absent`` then reads the object back and counts the call as
won exactly when the stored bytes equal ours (see ``docs/reliability.md``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

from .options import RetryOptions


def backoff_delays(retry: RetryOptions) -> Iterator[float]:
    """The pauses before each retry of one operation: exponential with jitter, at most
    ``max_retries`` of them, and none that would start after ``retry_timeout_s`` counted
    from this call (the operation's start), so retries cannot pile up without bound."""
    return _delays(retry, time.monotonic() + retry.retry_timeout_s)


def _delays(retry: RetryOptions, deadline: float) -> Iterator[float]:
    backoff = retry.init_backoff_s
    for _ in range(retry.max_retries):
        delay = random.uniform(0.5, 1.0) * min(backoff, retry.max_backoff_s)
        if time.monotonic() + delay > deadline:
            return
        yield delay
        backoff *= 2


def is_body_error(message: str) -> bool:
    """True for obstore's "response body" read failures (a cut-short body)."""
    return "body" in message.lower()


__all__ = ["backoff_delays", "is_body_error"]
