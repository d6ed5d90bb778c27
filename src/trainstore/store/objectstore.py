"""Object stores (s3://, gs://, az://, memory://) through obstore.

obstore (Rust ``object_store``) gives one API, connection pooling, retries with backoff,
multipart uploads and conditional puts (``mode="create"`` = If-None-Match) for every cloud.
This module only adapts it to the ``Store`` interface and maps its errors into the
``TrainstoreError`` hierarchy.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import obstore
import obstore.exceptions as oe
from obstore.store import AzureStore, GCSStore, MemoryStore, S3Store

from ..errors import (
    AlreadyExistsError,
    ConfigError,
    ConflictError,
    CredentialsError,
    IntegrityError,
    NotFoundError,
    StoreError,
    StoreUnavailableError,
)
from .base import Buffer, ObjectMeta, Store, validate_key, validate_prefix
from .retrying import backoff_delays, is_body_error


@dataclass(frozen=True)
class RetryOptions:
    """Bounded retries with exponential backoff and jitter (applied by obstore)."""

    max_retries: int = 5
    retry_timeout_s: float = 60.0
    init_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_retries, int) or isinstance(self.max_retries, bool) or not 0 <= self.max_retries <= 100:
            raise ConfigError(f"max_retries must be an int in [0, 100], got {self.max_retries!r}")
        for name in ("retry_timeout_s", "init_backoff_s", "max_backoff_s", "timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not 0 <= value <= 86_400 or value != value):
                raise ConfigError(f"{name} must be a number of seconds in [0, 86400], got {value!r}")


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible endpoint. Unset fields fall back to AWS_* env vars."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    allow_http: bool | None = None  # default: allowed when the endpoint is http://
    skip_signature: bool = False  # anonymous access to public buckets

    def __post_init__(self) -> None:
        for name in ("endpoint", "region", "access_key_id", "secret_access_key", "session_token"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"S3 option {name} must be a string, got {type(value).__name__}")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"S3 endpoint must start with http:// or https://, got {self.endpoint!r}")
        for name in ("allow_http", "skip_signature"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"S3 option {name} must be True or False, got {value!r}")


def _td(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def _client_and_retry(retry: RetryOptions, allow_http: bool) -> tuple[dict, dict]:
    client = {
        "timeout": _td(retry.timeout_s),
        "connect_timeout": _td(retry.connect_timeout_s),
        "allow_http": allow_http,
    }
    retry_config = {
        "max_retries": retry.max_retries,
        "retry_timeout": _td(retry.retry_timeout_s),
        "backoff": {
            "init_backoff": _td(retry.init_backoff_s),
            "max_backoff": _td(retry.max_backoff_s),
            "base": 2,
        },
    }
    return client, retry_config


_memory_stores: dict[str, MemoryStore] = {}
_memory_lock = threading.Lock()


def _split_bucket(url: str, scheme: str) -> tuple[str, str]:
    rest = url[len(scheme) + 3 :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"URL {url!r} names no bucket (expected {scheme}://BUCKET/PREFIX)")
    prefix = prefix.strip("/")
    if prefix:
        validate_key(prefix)
    return bucket, prefix


#: Environment variables of credential sources object_store resolves itself without
#: probing the instance-metadata endpoint (web identity / IRSA, ECS container credentials).
_FEDERATED_ENV = (
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def build_s3(url: str, s3: S3Options, retry: RetryOptions) -> S3Store:
    """An obstore S3Store for ``url``, failing early (no network) on missing credentials."""
    bucket, prefix = _split_bucket(url, "s3")
    endpoint = s3.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    key_id = s3.access_key_id or os.environ.get("AWS_ACCESS_KEY_ID")
    secret = s3.secret_access_key or os.environ.get("AWS_SECRET_ACCESS_KEY")
    token = s3.session_token or os.environ.get("AWS_SESSION_TOKEN")
    region = s3.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    federated = any(os.environ.get(v) for v in _FEDERATED_ENV)
    if not s3.skip_signature and not (key_id and secret) and not federated:
        # Without this check object_store would fall back to the instance-metadata endpoint
        # and hang on a machine that has none.
        raise CredentialsError(
            f"no credentials for {url}: pass access_key_id/secret_access_key or set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or skip_signature=True for a public bucket)"
        )
    allow_http = s3.allow_http if s3.allow_http is not None else bool(endpoint and endpoint.startswith("http://"))
    if endpoint and endpoint.startswith("http://") and not allow_http:
        raise ConfigError(f"endpoint {endpoint} is plain http; pass allow_http=True to allow it")
    config: dict = {"region": region}
    if endpoint:
        config["endpoint"] = endpoint
        config["virtual_hosted_style_request"] = False
    if s3.skip_signature:
        config["skip_signature"] = True
    elif key_id and secret:
        config["access_key_id"] = key_id
        config["secret_access_key"] = secret
        if token:
            config["session_token"] = token
    client, retry_config = _client_and_retry(retry, allow_http)
    try:
        return S3Store(
            bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry_config
        )
    except Exception as exc:  # obstore raises its own config errors
        raise ConfigError(f"cannot open {url}: {exc}") from None


def build_other(url: str, retry: RetryOptions, options: dict) -> object:
    """memory://NAME (shared per process by name), gs://BUCKET/PREFIX, az://CONTAINER/PREFIX."""
    if url.startswith("memory://"):
        name = url[len("memory://") :].strip("/") or "default"
        with _memory_lock:
            return _memory_stores.setdefault(name, MemoryStore())
    client, retry_config = _client_and_retry(retry, bool(options.pop("allow_http", False)))
    if url.startswith("gs://"):
        bucket, prefix = _split_bucket(url, "gs")
        cls = GCSStore
    elif url.startswith("az://"):
        bucket, prefix = _split_bucket(url, "az")
        cls = AzureStore
    else:
        raise ConfigError(f"unsupported URL scheme in {url!r}")
    try:
        return cls(bucket, prefix=prefix or None, config=options or None, client_options=client,
                   retry_config=retry_config)
    except Exception as exc:
        raise ConfigError(f"cannot open {url}: {exc}") from None


#: An HTTP 403 in an error message - not any "403" (ports and durations contain it too).
_FORBIDDEN = re.compile(r"\b403 Forbidden\b|status(?: code)?:? 403\b", re.IGNORECASE)


def _is_missing_bucket(exc: BaseException) -> bool:
    text = str(exc)
    return "NoSuchBucket" in text or "bucket does not exist" in text.lower()


class ObjectStore(Store):
    """A ``Store`` over any obstore backend."""

    def __init__(self, inner: object, url: str, *, retry: RetryOptions | None = None,
                 commit_inner: object | None = None) -> None:
        self._inner = inner
        self.url = url
        # Our own retries for what obstore does not retry (see store/retrying.py), and a twin
        # client without obstore's retries for conditional creates, so every attempt whose
        # outcome is unknown passes through put_if_absent's own-write check.
        self._retry = retry or RetryOptions()
        self._commit_inner = commit_inner if commit_inner is not None else inner
        # obstore's MemoryStore keeps a reference to the caller's buffer instead of copying;
        # callers reuse buffers (staging arenas), so give it a private copy.
        self._copy_on_put = isinstance(inner, MemoryStore)

    def _error(self, exc: BaseException, key: str, action: str) -> Exception:
        where = f"{key!r} in {self.url}" if key else self.url
        msg = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        # obstore 0.12 raises the built-in FileNotFoundError for a missing object (its own
        # NotFoundError class is kept for older versions).
        if isinstance(exc, (oe.NotFoundError, FileNotFoundError)):
            if _is_missing_bucket(exc):
                return NotFoundError(f"bucket of {self.url} does not exist ({action} {where})")
            return NotFoundError(f"no object {where}")
        if isinstance(exc, (oe.AlreadyExistsError, FileExistsError)):
            return AlreadyExistsError(f"object {where} already exists")
        if isinstance(exc, oe.PreconditionError):
            return ConflictError(f"conditional {action} of {where} lost a race: {msg}")
        if isinstance(exc, (oe.PermissionDeniedError, oe.UnauthenticatedError, PermissionError)):
            return CredentialsError(f"{action} {where} was refused: {msg}")
        text = str(exc)
        if _is_missing_bucket(exc):
            return NotFoundError(f"bucket of {self.url} does not exist ({action} {where})")
        if any(s in text for s in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied")) \
                or _FORBIDDEN.search(text):
            return CredentialsError(f"{action} {where} was refused: {msg}")
        if isinstance(exc, oe.GenericError) or "error sending request" in text or "timed out" in text:
            return StoreUnavailableError(f"{action} {where} failed after retries: {msg}")
        return StoreError(f"{action} {where} failed: {msg}")

    def get(self, key: str) -> Buffer:
        validate_key(key)
        try:
            return obstore.get(self._inner, key).bytes()
        except Exception as exc:
            raise self._error(exc, key, "get") from None

    def get_range(self, key: str, start: int, length: int) -> Buffer:
        return self.get_ranges(key, [(start, length)])[0]

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[Buffer]:
        validate_key(key)
        if not ranges:
            return []
        for start, length in ranges:
            if start < 0 or length < 0:
                raise ConfigError(f"bad range start={start} length={length} for {key!r}")
        nonempty = [(s, n) for s, n in ranges if n > 0]
        if not nonempty:
            self.head(key)  # only empty ranges: still a missing key is NotFoundError
        try:
            got = (
                obstore.get_ranges(
                    self._inner, key, starts=[s for s, _ in nonempty], lengths=[n for _, n in nonempty]
                )
                if nonempty
                else []
            )
        except Exception as exc:
            if "range" in str(exc).lower() and not isinstance(exc, oe.NotFoundError):
                raise IntegrityError(f"object {key!r} in {self.url} is shorter than a range asked for") from None
            raise self._error(exc, key, "get_ranges") from None
        out: list[Buffer] = []
        it = iter(got)
        for start, length in ranges:
            if length == 0:
                out.append(b"")
                continue
            data = next(it)
            if len(data) != length:
                raise IntegrityError(
                    f"object {key!r} in {self.url} is shorter than the range [{start}, {start + length})"
                )
            out.append(data)
        return out

    def _put(self, key: str, data: Buffer, mode: str) -> ObjectMeta:
        validate_key(key)
        view = self._owned(data)
        try:
            result = obstore.put(self._inner, key, view, mode=mode)
        except Exception as exc:
            raise self._error(exc, key, "put") from None
        return ObjectMeta(key, view.nbytes, result.get("e_tag") if isinstance(result, dict) else None)

    def _owned(self, data: Buffer) -> memoryview:
        view = memoryview(data).cast("B")
        return memoryview(bytes(view)) if self._copy_on_put else view

    def put(self, key: str, data: Buffer) -> ObjectMeta:
        return self._put(key, data, "overwrite")

    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        """Conditional create, retried on transient errors.

        An attempt that failed with an unknown outcome (reset, timeout, lost response) may
        have committed. If a later attempt finds the key taken, the stored bytes decide:
        equal to ours -> our own earlier attempt won (success); different -> another
        writer won (``AlreadyExistsError``).
        """
        validate_key(key)
        view = self._owned(data)
        uncertain = False
        delays = backoff_delays(self._retry)
        while True:
            try:
                result = obstore.put(self._commit_inner, key, view, mode="create")
                return ObjectMeta(key, view.nbytes, result.get("e_tag") if isinstance(result, dict) else None)
            except Exception as exc:
                err = self._error(exc, key, "put_if_absent")
            if isinstance(err, AlreadyExistsError) and uncertain and self._holds(key, view):
                return self.head(key)
            if not isinstance(err, StoreUnavailableError):
                raise err
            uncertain = True
            delay = next(delays, None)
            if delay is None:
                raise err
            time.sleep(delay)

    def _holds(self, key: str, view: memoryview) -> bool:
        """True if ``key`` currently stores exactly the bytes of ``view``."""
        try:
            meta = self.head(key)
            return meta.size == view.nbytes and memoryview(self.get(key)).cast("B") == view
        except NotFoundError:
            return False

    def head(self, key: str) -> ObjectMeta:
        validate_key(key)
        try:
            m = obstore.head(self._inner, key)
        except Exception as exc:
            raise self._error(exc, key, "head") from None
        return ObjectMeta(key, m["size"], m.get("e_tag"), m["last_modified"].timestamp())

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        validate_prefix(prefix)
        directory = prefix.rpartition("/")[0]
        # obstore does not retry a listing whose body was cut short: resume after the last
        # key yielded (listings come in lexicographic order), so nothing repeats or is lost.
        last: str | None = None
        delays = backoff_delays(self._retry)
        while True:
            try:
                kwargs = {"offset": last} if last is not None else {}
                stream = obstore.list(self._inner, directory or None, chunk_size=1000, **kwargs)
                for batch in stream:
                    for m in batch:
                        key = m["path"]
                        if key.startswith(prefix):
                            yield ObjectMeta(key, m["size"], m.get("e_tag"), m["last_modified"].timestamp())
                        last = key
                return
            except Exception as exc:
                err = self._error(exc, prefix, "list")
                body_error = is_body_error(str(exc))  # other failures obstore already retried
            delay = next(delays, None) if isinstance(err, StoreUnavailableError) and body_error else None
            if delay is None:
                raise err
            time.sleep(delay)

    def delete(self, key: str) -> None:
        validate_key(key)
        delays = backoff_delays(self._retry)  # delete is idempotent; obstore does not retry it
        while True:
            try:
                obstore.delete(self._inner, key)
                return
            except (oe.NotFoundError, FileNotFoundError) as exc:
                if _is_missing_bucket(exc):  # a missing key is fine; a missing bucket is not
                    raise self._error(exc, key, "delete") from None
                return
            except Exception as exc:
                err = self._error(exc, key, "delete")
            delay = next(delays, None) if isinstance(err, StoreUnavailableError) else None
            if delay is None:
                raise err
            time.sleep(delay)
