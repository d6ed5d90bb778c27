"""Stores: where bytes live. ``open_store(url)`` is the one way to get one."""

from __future__ import annotations

import os
from dataclasses import fields

from ..errors import ConfigError
from .base import Buffer, ObjectMeta, Store, validate_key, validate_prefix
from .local import LocalStore
from .objectstore import ObjectStore, RetryOptions, S3Options, build_other, build_s3

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

    A ``Store`` passed in is returned as is.
    """
    if isinstance(url, Store):
        return url
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"store URL must be a non-empty string or path, got {url!r}")
    opts = dict(options)
    retry = opts.pop("retry", None)
    retry_kw = {k: opts.pop(k) for k in list(opts) if k in _RETRY_FIELDS}
    if retry is None:
        retry = RetryOptions(**retry_kw)
    elif not isinstance(retry, RetryOptions):
        raise ConfigError(f"retry must be a RetryOptions, got {type(retry).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep or scheme == "file":
        path = url[len("file://"):] if sep else url
        fsync = opts.pop("fsync", True)
        if opts:
            raise ConfigError(f"unknown options for a local store {url!r}: {sorted(opts)}")
        return LocalStore(path, fsync=bool(fsync))
    if scheme == "s3":
        unknown = set(opts) - _S3_FIELDS
        if unknown:
            raise ConfigError(f"unknown options for {scheme}:// store: {sorted(unknown)}")
        return ObjectStore(build_s3(url, S3Options(**opts), retry), url)
    if scheme in ("memory", "gs", "az"):
        if scheme == "memory" and opts:
            raise ConfigError(f"unknown options for a memory store: {sorted(opts)}")
        return ObjectStore(build_other(url, retry, opts), url)
    raise ConfigError(
        f"unsupported store URL scheme {scheme!r} in {url!r}; use a path, file://, memory://, "
        "s3://, gs:// or az://"
    )


__all__ = [
    "Buffer", "LocalStore", "ObjectMeta", "ObjectStore", "RetryOptions", "S3Options", "Store",
    "open_store", "validate_key", "validate_prefix",
]
