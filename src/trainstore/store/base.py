"""The store interface: the one small API every byte in trainstore goes through.

A ``Store`` maps string keys (``a/b/c``) to immutable byte objects. Implementations:
``LocalStore`` (a directory; the embedded default), ``ObjectStore`` (obstore: s3://,
gs://, az://, memory://) and ``TieredStore`` (hot -> durable -> archive). Every implementation
passes the shared suite ``trainstore.testing.store_suite``. ``with_read_only()`` gives a view
of any store whose writes raise ``ReadOnlyError``.

Contract, per method:

* ``put(key, data)`` replaces the object atomically: a reader sees the old bytes or the
  new ones, never a mix. When it returns, the bytes are durable (fsynced locally).
* ``put_if_absent(key, data)`` is the commit primitive: exactly one of several racing
  writers wins; the others get ``AlreadyExistsError``. Manifests are written with it, last.
* ``get`` / ``get_range`` / ``get_ranges`` read; a missing key is ``NotFoundError``.
  ``get_range(key, start, length)`` returns exactly ``length`` bytes or raises.
* ``head(key)`` returns ``ObjectMeta`` (size, etag, mtime) without reading the body.
* ``list(prefix)`` yields ``ObjectMeta`` for every key under ``prefix`` (no order
  promised; callers sort). Keys of in-progress local writes are never listed.
* ``delete(key)`` is idempotent: deleting a missing key is not an error.

Keys are validated by ``validate_key`` before any I/O: relative, ``/``-separated, no empty,
``.`` or ``..`` segments, no backslashes or control characters. So no key can escape the
store's root or prefix.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from ..errors import InvalidKeyError, NotFoundError, ReadOnlyError

#: Anything exposing the buffer protocol (bytes, bytearray, memoryview, numpy arrays).
Buffer = bytes | bytearray | memoryview

_MAX_KEY_LEN = 1024
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


@dataclass(frozen=True)
class StoreCapabilities:
    """What a store can do, asked through the interface (never by ``isinstance`` or duck
    typing): ``local`` - objects are files on this machine (``local_path`` answers);
    ``fsync`` - a returned ``put`` is on stable storage of this machine (local stores with
    fsync on); ``tiered`` - the store fronts other stores (``tiers()`` lists them, fastest
    first); ``read_only`` - writes raise ``ReadOnlyError``."""

    local: bool = False
    fsync: bool = False
    tiered: bool = False
    read_only: bool = False


@dataclass(frozen=True)
class ObjectMeta:
    """What ``head`` and ``list`` report about one object."""

    key: str
    size: int
    etag: str | None = None
    mtime: float | None = None


def validate_key(key: object) -> str:
    """Return ``key`` if it is a safe relative key, else raise ``InvalidKeyError``."""
    if not isinstance(key, str):
        raise InvalidKeyError(f"store key must be a str, got {type(key).__name__}: {key!r}")
    if not key:
        raise InvalidKeyError("store key is empty")
    if len(key) > _MAX_KEY_LEN:
        raise InvalidKeyError(f"store key is longer than {_MAX_KEY_LEN} characters: {key[:64]!r}...")
    if key.startswith("/"):
        raise InvalidKeyError(f"store key must be relative, got absolute key {key!r}")
    if _BAD_CHARS.search(key):
        raise InvalidKeyError(f"store key contains a control character or backslash: {key!r}")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidKeyError(
                f"store key {key!r} has an empty, '.' or '..' segment; keys may not escape "
                "their prefix"
            )
    return key


def validate_prefix(prefix: object) -> str:
    """Validate a listing prefix: '' (everything) or a key, optionally ending with '/'."""
    if prefix == "":
        return ""
    if not isinstance(prefix, str):
        raise InvalidKeyError(f"store prefix must be a str, got {type(prefix).__name__}")
    validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


class Store(abc.ABC):
    """A flat key -> bytes store with atomic puts and a conditional create."""

    #: The URL this store was opened from (credentials never included).
    url: str

    @abc.abstractmethod
    def get(self, key: str) -> Buffer:
        """Return the whole object. ``NotFoundError`` if missing."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> Buffer:
        """Return ``length`` bytes from ``start``; ``IntegrityError`` if the object is shorter."""

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[Buffer]:
        """Return several ``(start, length)`` ranges of one object (coalesced where possible)."""
        return [self.get_range(key, start, length) for start, length in ranges]

    @abc.abstractmethod
    def put(self, key: str, data: Buffer) -> ObjectMeta:
        """Write (or replace) the object atomically and durably."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        """Create the object only if the key is free; else ``AlreadyExistsError``."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectMeta:
        """Size, etag and mtime of the object. ``NotFoundError`` if missing."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Every object whose key starts with ``prefix``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error."""

    def exists(self, key: str) -> bool:
        """True if ``key`` names an object."""
        try:
            self.head(key)
        except NotFoundError:
            return False
        return True

    def local_path(self, key: str) -> str | None:
        """A filesystem path holding the object's bytes, if the store is local; else None."""
        return None

    @property
    def capabilities(self) -> StoreCapabilities:
        """What this store can do (see ``StoreCapabilities``); stores override it."""
        return StoreCapabilities()

    def tiers(self) -> tuple[Store, ...]:
        """The stores behind this one, fastest first (hot, durable, archive); a plain store
        is its own single tier."""
        return (self,)

    def with_read_only(self) -> Store:
        """A view of this store that reads through and refuses every write with
        ``ReadOnlyError`` (zarr's ``with_read_only``): for callers that must only look, such
        as ``trainstore ckpt ls``. Closing the view does not close this store."""
        return ReadOnlyStore(self)

    def write_view(self) -> Store:
        """The store as a writer of new content-addressed objects sees it: the tiers a write
        lands in or is copied to. An object there makes writing it again redundant; an object
        elsewhere (a tiered store's archive) does not, so a new checkpoint never depends on
        the archive to become durable. A plain store is its own write view."""
        return self

    def close(self) -> None:
        """Release resources (connections, thread pools). The store is unusable after."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class ForwardingStore(Store):
    """A store that passes every data call to ``inner``: the base of wrappers (read-only views,
    throttles, test instruments) that change a few calls and forward the rest. It forwards the
    data calls only; tiers, capabilities, local paths and closing keep ``Store``'s defaults
    unless a wrapper decides otherwise (a wrapper that hands out ``inner``'s local paths or
    tiers would let callers bypass it)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url

    def get(self, key: str) -> Buffer:
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> Buffer:
        return self.inner.get_range(key, start, length)

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[Buffer]:
        return self.inner.get_ranges(key, ranges)

    def put(self, key: str, data: Buffer) -> ObjectMeta:
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        return self.inner.put_if_absent(key, data)

    def head(self, key: str) -> ObjectMeta:
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)


class ReadOnlyStore(ForwardingStore):
    """A read-only view of ``inner``: reads pass through, writes raise ``ReadOnlyError``
    naming the key and the store. Its tiers are read-only views too, so a reader that walks
    the tiers (chunk repair) cannot write through them either."""

    def _refuse(self, action: str, key: str) -> ReadOnlyError:
        validate_key(key)  # a bad key is still InvalidKeyError, as on any store
        return ReadOnlyError(f"cannot {action} {key!r}: {self.url} is opened read-only")

    def put(self, key: str, data: Buffer) -> ObjectMeta:
        raise self._refuse("put", key)

    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        raise self._refuse("create", key)

    def delete(self, key: str) -> None:
        raise self._refuse("delete", key)

    def local_path(self, key: str) -> str | None:
        return self.inner.local_path(key)

    @property
    def capabilities(self) -> StoreCapabilities:
        return replace(self.inner.capabilities, read_only=True)

    def tiers(self) -> tuple[Store, ...]:
        inner = self.inner.tiers()
        return (self,) if len(inner) == 1 else tuple(t.with_read_only() for t in inner)

    def write_view(self) -> Store:
        return self

    def with_read_only(self) -> Store:
        return self

    def close(self) -> None:  # the inner store belongs to whoever opened it
        pass

    def __repr__(self) -> str:
        return f"ReadOnlyStore({self.url!r})"
