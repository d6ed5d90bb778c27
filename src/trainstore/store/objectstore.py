"""Object stores (s3://, gs://, az://, memory://) through obstore.

obstore (Rust ``object_store``) gives one API, connection pooling, retries with backoff,
multipart uploads and conditional puts (``mode="create"`` = If-None-Match) for every cloud.
This module only adapts it to the ``Store`` interface and maps its errors into the
``TrainstoreError`` hierarchy.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence

import obstore
import obstore.exceptions as oe
from obstore.store import MemoryStore

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
from .options import RetryOptions
from .retrying import backoff_delays, is_body_error

#: An HTTP 403 in an error message - not any "403" (ports and durations contain it too).
_FORBIDDEN = re.compile(r"\b403 Forbidden\b|status(?: code)?:? 403\b", re.IGNORECASE)


def _is_missing_bucket(exc: BaseException) -> bool:
    text = str(exc)
    return "NoSuchBucket" in text or "bucket does not exist" in text.lower()


_ORIGIN = re.compile(r"Error performing \w+ (https?://[^/\s?]+)")


def _unreachable(text: str) -> str | None:
    """``connection refused at http://host:port`` (or the host unknown) from an obstore error's
    text, whose first line says only "Generic S3 error"; None when the server was reached."""
    origin = _ORIGIN.search(text)
    at = origin.group(1) if origin else "the endpoint"
    if "ConnectionRefused" in text or "Connection refused" in text:
        return f"connection refused at {at}"
    if "dns error" in text or "failed to lookup address" in text:
        return f"cannot resolve the host of {at}"
    if "tcp connect error" in text or "kind: Connect," in text:
        return f"cannot connect to {at}"
    return None


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
        unreachable = _unreachable(text)
        if unreachable:
            return StoreUnavailableError(f"{unreachable} ({action} {where}): check the endpoint (--endpoint, "
                                         "endpoint= or AWS_ENDPOINT_URL) and that the server is running")
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
