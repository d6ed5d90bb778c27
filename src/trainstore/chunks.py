"""The content-addressed chunk store: bulk bytes named by the hash of their content.

* ``put(data)`` hashes the raw bytes (BLAKE3-256), skips the write if an object with that
  name exists (dedup), else compresses and writes it. It returns a ``ChunkRef`` carrying
  everything a reader needs: hash, codec, element size, raw and stored length.
* ``get(ref)`` reads, checks the stored length, decodes and re-hashes: a mismatch raises
  ``ChunkCorruptError`` naming the key. There is no unverified read path.
* ``ChunkWriter`` writes many chunks in parallel with a bound on bytes in flight
  (torchsnapshot's byte budget): ``submit`` blocks while the budget is used up.

Why BLAKE3 and not xxh3: names double as dedup keys, so a collision would silently swap
one tensor's bytes for another's. xxh3 is not collision resistant against crafted input;
BLAKE3 is a cryptographic hash and still runs at several GB/s per core (faster than the
disk and the compressor), so integrity costs little. See docs/design-choices.md.

Layout: ``<prefix>/<h[0:2]>/<h>.<codec>``, so listing by the first byte spreads load.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import blake3

from .codecs import CODECS, MAX_CHUNK_BYTES, CodecConfig, check_codec, decode, encode
from .errors import ChunkCorruptError, ConfigError, ManifestError, NotFoundError
from .store.base import Buffer, Store

HASH_HEX_LEN = 64


def content_hash(data: Buffer) -> str:
    """BLAKE3-256 of ``data`` as hex."""
    return blake3.blake3(data).hexdigest()


@dataclass(frozen=True)
class ChunkRef:
    """What a manifest records about one chunk."""

    hash: str
    codec: str
    size: int  # raw bytes
    stored: int  # bytes in the store
    itemsize: int = 1

    def key(self, prefix: str = "chunks") -> str:
        return f"{prefix}/{self.hash[:2]}/{self.hash}.{self.codec}"

    def to_json(self) -> list:
        """Compact form for manifests: [hash, codec, size, stored, itemsize]."""
        return [self.hash, self.codec, self.size, self.stored, self.itemsize]

    @classmethod
    def from_json(cls, obj: object) -> ChunkRef:
        """Parse and validate a reference from a manifest (hostile input is rejected)."""
        if not isinstance(obj, list) or len(obj) != 5:
            raise ManifestError(f"chunk reference must be [hash, codec, size, stored, itemsize], got {obj!r:.120}")
        h, codec, size, stored, itemsize = obj
        if not (isinstance(h, str) and len(h) == HASH_HEX_LEN and all(c in "0123456789abcdef" for c in h)):
            raise ManifestError(f"chunk reference has a malformed hash {h!r:.80}")
        if not isinstance(codec, str) or codec not in CODECS:
            raise ManifestError(f"chunk reference has an unknown codec {codec!r:.40}")
        for name, v in (("size", size), ("stored", stored), ("itemsize", itemsize)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ManifestError(f"chunk reference {h[:12]}: {name} must be a non-negative int, got {v!r:.40}")
        if size > MAX_CHUNK_BYTES or stored > MAX_CHUNK_BYTES + (1 << 20):
            raise ManifestError(f"chunk reference {h[:12]}: size {size}/{stored} exceeds the chunk limit")
        if not 1 <= itemsize <= 255:
            raise ManifestError(f"chunk reference {h[:12]}: itemsize {itemsize} out of range")
        if codec == "raw" and stored != size:
            raise ManifestError(f"chunk reference {h[:12]}: a raw chunk must store {size} bytes, not {stored}")
        return cls(h, codec, size, stored, itemsize)


@dataclass(frozen=True)
class PutResult:
    """A ``ChunkRef`` plus whether this call wrote bytes (False: dedup hit)."""

    ref: ChunkRef
    written: bool


class ChunkStore:
    """Content-addressed, verified chunks on top of any ``Store``."""

    def __init__(self, store: Store, prefix: str = "chunks", codec: CodecConfig | None = None) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.codec = codec or CodecConfig()
        self._known: dict[str, int] = {}  # key -> stored size, for keys this process wrote or saw
        self._known_lock = threading.Lock()

    # -- writing ---------------------------------------------------------------------------
    def put(self, data: Buffer, codec: str | None = None, itemsize: int = 1,
            digest: str | None = None, cpu: AbstractContextManager[Any] | None = None) -> PutResult:
        """Store ``data`` unless identical content (same codec) is already there.

        ``cpu``: held while encoding only (not during the dedup check or the write), so a
        caller can bound how many cores its puts use while their I/O still overlaps.
        """
        view = memoryview(data).cast("B")
        if view.nbytes > MAX_CHUNK_BYTES:
            raise ConfigError(f"chunk of {view.nbytes} bytes exceeds the limit of {MAX_CHUNK_BYTES}")
        codec = check_codec(codec or self.codec.codec)
        h = digest or content_hash(view)
        key = f"{self.prefix}/{h[:2]}/{h}.{codec}"
        stored = self._stored_size(key)
        if stored is not None:
            return PutResult(ChunkRef(h, codec, view.nbytes, stored, itemsize), False)
        with cpu or contextlib.nullcontext():
            encoded = encode(view, codec, itemsize, level=self.codec.level, threads=self.codec.threads)
        stored = memoryview(encoded).nbytes
        self.store.put(key, encoded)
        with self._known_lock:
            self._known[key] = stored
        return PutResult(ChunkRef(h, codec, view.nbytes, stored, itemsize), True)

    def _stored_size(self, key: str) -> int | None:
        """Stored size of ``key`` if it exists (one HEAD at most per key and process)."""
        with self._known_lock:
            if key in self._known:
                return self._known[key]
        try:
            size = self.store.head(key).size
        except NotFoundError:
            return None
        with self._known_lock:
            self._known[key] = size
        return size

    def _exists(self, key: str) -> bool:
        return self._stored_size(key) is not None

    def forget(self, keys: set[str] | None = None) -> None:
        """Drop cached existence knowledge (after GC deleted chunks)."""
        with self._known_lock:
            if keys is None:
                self._known.clear()
            else:
                for key in keys:
                    self._known.pop(key, None)

    # -- reading ---------------------------------------------------------------------------
    def get(self, ref: ChunkRef, out: memoryview | None = None) -> Buffer:
        """Read, decode (into ``out`` if given) and verify one chunk."""
        key = ref.key(self.prefix)
        if out is not None and memoryview(out).nbytes != ref.size:
            raise ConfigError(
                f"chunk {key}: output buffer has {memoryview(out).nbytes} bytes, the chunk {ref.size}"
            )
        stored = self.store.get(key)
        n = memoryview(stored).nbytes
        if n != ref.stored:
            raise ChunkCorruptError(f"chunk {key}: {n} bytes stored, reference says {ref.stored}")
        raw = decode(stored, ref.codec, ref.size, key=key, out=out, threads=self.codec.threads)
        if content_hash(raw) != ref.hash:
            raise ChunkCorruptError(f"chunk {key}: content does not match its hash (corrupted)")
        return raw

    def verify(self, ref: ChunkRef, deep: bool = True) -> None:
        """Raise if the chunk is missing (shallow) or does not decode to its hash (deep)."""
        key = ref.key(self.prefix)
        if deep:
            self.get(ref)
            return
        size = self.store.head(key).size
        if size != ref.stored:
            raise ChunkCorruptError(f"chunk {key}: {size} bytes stored, reference says {ref.stored}")

    # -- housekeeping ----------------------------------------------------------------------
    def list_keys(self) -> Iterator[tuple[str, int, float | None]]:
        """(key, stored size, mtime) of every chunk object."""
        for meta in self.store.list(self.prefix + "/"):
            yield meta.key, meta.size, meta.mtime

    def delete_key(self, key: str) -> None:
        self.store.delete(key)
        self.forget({key})


class ChunkWriter:
    """Writes chunks in parallel with at most ``max_inflight_bytes`` of input held.

    ``submit`` returns a future of ``PutResult``; it blocks while the budget is spent, so a
    producer that is faster than the store cannot run the machine out of memory. ``close``
    waits for everything. The caller must keep each submitted buffer alive and unchanged
    until its future is done.
    """

    def __init__(self, chunks: ChunkStore, *, workers: int = 4, max_inflight_bytes: int = 512 << 20) -> None:
        if max_inflight_bytes <= 0:
            raise ConfigError("max_inflight_bytes must be positive")
        self.chunks = chunks
        self.max_inflight = max_inflight_bytes
        self._inflight = 0
        self._cv = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainstore-chunk")

    def submit(self, data: Buffer, codec: str | None = None, itemsize: int = 1) -> Future[PutResult]:
        n = memoryview(data).nbytes
        cost = min(n, self.max_inflight)  # one oversized chunk may still pass alone
        with self._cv:
            while self._inflight and self._inflight + cost > self.max_inflight:
                self._cv.wait()
            self._inflight += cost
        try:
            fut = self._pool.submit(self.chunks.put, data, codec, itemsize)
        except BaseException:
            self._release(cost)
            raise
        fut.add_done_callback(lambda _f: self._release(cost))
        return fut

    def _release(self, cost: int) -> None:
        with self._cv:
            self._inflight -= cost
            self._cv.notify_all()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
