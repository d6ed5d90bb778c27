"""Stores: where bytes live. ``open_store(url)`` is the one way to get one.

The URL's scheme picks a factory from the scheme registry (``register_scheme``); the
built-in schemes are registered here: ``file`` (and bare paths), ``memory``, ``s3``, ``gs``,
``az``.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields, replace

from ..errors import ConfigError
from .base import (
    Buffer,
    ObjectMeta,
    ReadOnlyStore,
    Store,
    StoreCapabilities,
    validate_key,
    validate_prefix,
)
from .local import LocalStore
from .objectstore import ObjectStore
from .obstore_clients import build_other, build_s3
from .options import RetryOptions, S3Options
from .schemes import (
    StoreFactory,
    factory_for,
    register_scheme,
    registered_schemes,
    unregister_scheme,
)
from .tiered import TieredStore

_SCHEME_TYPO = re.compile(r"^(file|memory|s3|gs|gcs|az|abfs|http|https):", re.IGNORECASE)
_S3_FIELDS = {f.name for f in fields(S3Options)}
_RETRY_FIELDS = {f.name for f in fields(RetryOptions)}


def open_store(url: str | os.PathLike[str] | Store, **options: object) -> Store:
    """Open a store from a URL.

    * a path, or ``file:///path``: ``LocalStore`` (temp + fsync + rename + dir fsync)
    * ``memory://NAME``: an in-process store, shared by name within the process
    * ``s3://BUCKET/PREFIX``: options ``endpoint``, ``region``, ``access_key_id``,
      ``secret_access_key``, ``session_token``, ``allow_http``, ``skip_signature``;
      unset ones come from the standard ``AWS_*`` environment variables
    * ``gs://BUCKET/PREFIX``, ``az://CONTAINER/PREFIX``: obstore config keys as options
    * every object store also takes ``retry=RetryOptions(...)`` (or its fields as options)
    * ``create=False`` (any scheme): open an existing local directory only, never create
      one (read-only callers); object stores never create buckets anyway
    * any scheme added with ``register_scheme``

    A string that starts like a known scheme but lacks ``://`` (``s3:/b``) is rejected
    rather than silently becoming a local directory of that name.

    A ``Store`` passed in is returned as is.
    """
    if isinstance(url, Store):
        return url
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"store URL must be a non-empty string or path, got {url!r}")
    scheme, sep, _ = url.partition("://")
    if not sep and _SCHEME_TYPO.match(url):
        raise ConfigError(f"malformed store URL {url!r}: expected SCHEME://..., e.g. s3://bucket/prefix")
    return factory_for(scheme if sep else "file", url)(url, **options)


def _open_local(url: str, *, fsync: object = True, create: object = True, **unknown: object) -> Store:
    path = url[len("file://"):] if url.startswith("file://") else url
    if not path:
        raise ConfigError(f"store URL {url!r} names no path")
    _retry_options(unknown)  # accepted (and checked) for every scheme; a local store has no use for it
    if unknown:
        raise ConfigError(f"unknown options for a local store {url!r}: {sorted(unknown)}")
    return LocalStore(path, fsync=bool(fsync), create=bool(create))


def _retry_options(opts: dict[str, object]) -> RetryOptions:
    """``retry=RetryOptions(...)`` or its fields as options (taken out of ``opts``)."""
    retry = opts.pop("retry", None)
    retry_kw = {k: opts.pop(k) for k in list(opts) if k in _RETRY_FIELDS}
    if retry is None:
        return RetryOptions(**retry_kw)  # type: ignore[arg-type]
    if not isinstance(retry, RetryOptions):
        raise ConfigError(f"retry must be a RetryOptions, got {type(retry).__name__}")
    return retry


def _open_s3(url: str, *, create: object = True, **options: object) -> Store:
    retry = _retry_options(options)
    unknown = set(options) - _S3_FIELDS
    if unknown:
        raise ConfigError(f"unknown options for s3:// store: {sorted(unknown)}")
    s3 = S3Options(**options)  # type: ignore[arg-type]
    # The twin without obstore's retries serves conditional creates (see retrying.py).
    return ObjectStore(build_s3(url, s3, retry), url, retry=retry,
                       commit_inner=build_s3(url, s3, replace(retry, max_retries=0)))


def _open_obstore(url: str, *, create: object = True, **options: object) -> Store:
    retry = _retry_options(options)
    if url.startswith("memory://") and options:
        raise ConfigError(f"unknown options for a memory store: {sorted(options)}")
    return ObjectStore(build_other(url, retry, dict(options)), url, retry=retry)


register_scheme("file", _open_local)
for _scheme, _factory in (("s3", _open_s3), ("memory", _open_obstore), ("gs", _open_obstore),
                          ("az", _open_obstore)):
    register_scheme(_scheme, _factory)


__all__ = [
    "Buffer", "LocalStore", "ObjectMeta", "ObjectStore", "ReadOnlyStore", "RetryOptions", "S3Options", "Store",
    "StoreCapabilities", "StoreFactory", "TieredStore", "open_store", "register_scheme", "registered_schemes",
    "unregister_scheme", "validate_key", "validate_prefix",
]
