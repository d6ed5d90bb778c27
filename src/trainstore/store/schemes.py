"""The registry of URL schemes: ``open_store("s3://...")`` looks ``s3`` up here.

A backend registers a factory once (``register_scheme("s3", open_s3)``, as litdata's
``register_downloader``); ``open_store`` then needs no if/elif over scheme names, and a new
backend (a plugin, a test double) is one call away. A factory is called as
``factory(url, **options)`` with the full URL and the caller's options, and returns a
``Store``; it rejects options it does not know with ``ConfigError``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from ..errors import ConfigError
from .base import Store

#: ``factory(url, **options) -> Store``.
StoreFactory = Callable[..., Store]

_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")
_factories: dict[str, StoreFactory] = {}
_lock = threading.Lock()


def register_scheme(scheme: str, factory: StoreFactory, *, replace: bool = False) -> None:
    """Make ``open_store`` open ``SCHEME://...`` URLs with ``factory``. Registering a scheme
    twice is a ``ConfigError`` unless ``replace=True`` (so two plugins never silently fight)."""
    if not isinstance(scheme, str) or not _SCHEME.match(scheme):
        raise ConfigError(f"store URL scheme must be lower-case letters, digits, '+', '-' or '.', got {scheme!r}")
    if not callable(factory):
        raise ConfigError(f"factory for scheme {scheme!r} must be callable, got {type(factory).__name__}")
    with _lock:
        if scheme in _factories and not replace and _factories[scheme] is not factory:
            raise ConfigError(f"store URL scheme {scheme!r} is already registered; pass replace=True")
        _factories[scheme] = factory


def unregister_scheme(scheme: str) -> None:
    """Forget ``scheme`` (a missing one is not an error)."""
    with _lock:
        _factories.pop(scheme, None)


def registered_schemes() -> tuple[str, ...]:
    """The schemes ``open_store`` can open, sorted."""
    with _lock:
        return tuple(sorted(_factories))


def factory_for(scheme: str, url: str) -> StoreFactory:
    """The factory of ``scheme``; ``ConfigError`` naming ``url`` and the known schemes if none."""
    with _lock:
        factory = _factories.get(scheme)
    if factory is None:
        raise ConfigError(
            f"unsupported store URL scheme {scheme!r} in {url!r}; use a path or one of "
            + ", ".join(f"{s}://" for s in registered_schemes())
        )
    return factory


__all__ = ["StoreFactory", "factory_for", "register_scheme", "registered_schemes", "unregister_scheme"]
