"""Stores: where bytes live. ``open_store(url)`` is the one way to get one."""

from __future__ import annotations

import os
import re
from dataclasses import fields, replace

from ..errors import ConfigError
from .base import Buffer, ObjectMeta, Store, validate_key, validate_prefix
from .local import LocalStore
from .objectstore import ObjectStore, RetryOptions, S3Options, build_other, build_s3

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
    opts = dict(options)
    create = bool(opts.pop("create", True))
    retry = opts.pop("retry", None)
    retry_kw = {k: opts.pop(k) for k in list(opts) if k in _RETRY_FIELDS}
    if retry is None:
        retry = RetryOptions(**retry_kw)
    elif not isinstance(retry, RetryOptions):
        raise ConfigError(f"retry must be a RetryOptions, got {type(retry).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep and _SCHEME_TYPO.match(url):
        raise ConfigError(f"malformed store URL {url!r}: expected SCHEME://..., e.g. s3://bucket/prefix")
    if not sep or scheme == "file":
        path = url[len("file://"):] if sep else url
        if not path:
            raise ConfigError(f"store URL {url!r} names no path")
        fsync = opts.pop("fsync", True)
        if opts:
            raise ConfigError(f"unknown options for a local store {url!r}: {sorted(opts)}")
        return LocalStore(path, fsync=bool(fsync), create=create)
    if scheme == "s3":
        unknown = set(opts) - _S3_FIELDS
        if unknown:
            raise ConfigError(f"unknown options for {scheme}:// store: {sorted(unknown)}")
        s3 = S3Options(**opts)
        # The twin without obstore's retries serves conditional creates (see retrying.py).
        return ObjectStore(build_s3(url, s3, retry), url, retry=retry,
                           commit_inner=build_s3(url, s3, replace(retry, max_retries=0)))
    if scheme in ("memory", "gs", "az"):
        if scheme == "memory" and opts:
            raise ConfigError(f"unknown options for a memory store: {sorted(opts)}")
        return ObjectStore(build_other(url, retry, opts), url, retry=retry)
    raise ConfigError(
        f"unsupported store URL scheme {scheme!r} in {url!r}; use a path, file://, memory://, "
        "s3://, gs:// or az://"
    )


__all__ = [
    "Buffer", "LocalStore", "ObjectMeta", "ObjectStore", "RetryOptions", "S3Options", "Store",
    "open_store", "validate_key", "validate_prefix",
]
