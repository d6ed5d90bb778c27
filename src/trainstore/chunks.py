"""The content-addressed chunk store: bulk bytes named by the hash of their content.

* ``put(data)`` hashes the raw bytes (BLAKE3-256), skips the write if an object with that
  name exists (dedup), else compresses and writes it. It returns a ``ChunkRef`` carrying
  everything a reader needs: hash, codec, element size, raw and stored length.
* ``get(ref)`` reads, checks the stored length, decodes and re-hashes (BLAKE3, or the
  piece's xxh3 read check when the caller passes one: ``digests``). There is no unverified
  read path. A copy that fails (or a missing one) is **repaired**: the other
  copies are tried - every tier of a tiered store (``Store.tiers()``: hot, durable,
  archive), then the chunk's replica (``replica_key``) in each tier - and the first good one
  atomically replaces each bad copy seen (``RepairEvent``s go to the ``on_repair``
  listeners and the log). With no good copy anywhere: ``ChunkCorruptError`` naming the key,
  or the store error that kept a tier from answering (a transient failure never reads as
  corruption).
* ``verify(ref, deep=True)`` is a scrub: it reads *every* copy (all tiers, replicas) and
  repairs the bad ones, so a corrupt durable copy behind a good hot one is found too.
* Replicas (opt-in, ``put_replica``): a second copy of a chunk under ``<key>.replica`` in the
  same store, for chunks many checkpoints share (``lifecycle.redundancy`` picks them). GC keeps a
  replica exactly while its primary is referenced.
* Parallel writers bound the bytes in flight with ``bytebudget.ByteBudget`` (the checkpoint
  writer, the demo).

Why BLAKE3 names chunks, and xxh3 only checks reads: ``digests``, docs/design-choices.md.

Layout: ``<prefix>/<h[0:2]>/<h>.<codec>``, so listing by the first byte spreads load.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from .codecs import CODECS, LOSSY_CODECS, MAX_CHUNK_BYTES, CodecConfig, check_codec, decode, encode
from .digests import HASH_HEX_LEN, content_hash, is_hex, matches
from .errors import (
    AlreadyExistsError,
    ChunkCorruptError,
    ConfigError,
    ConflictError,
    ManifestError,
    NotFoundError,
    ReadOnlyError,
    StoreError,
)
from .store.base import Buffer, Store
from .store.checked import read_copies

log = logging.getLogger("trainstore.chunks")

#: A chunk's optional second copy lives at ``<key>.replica`` (same store, same prefix).
REPLICA_SUFFIX = ".replica"


def replica_key(key: str) -> str:
    """Key of the replica of chunk ``key`` (GC keeps it while ``key`` is referenced)."""
    return key + REPLICA_SUFFIX


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

    @property
    def max_stored(self) -> int:
        """The most bytes any copy of this chunk may take (raw size plus the worst codec
        overhead). ``stored`` is only what the writer's copy took: another writer's copy of
        the same name (another codec level or element size) may differ, so copies are
        checked against this bound, their container headers and the hash, never ``stored``."""
        return self.size if self.codec == "raw" else self.size + (self.size >> 6) + 4096

    def to_json(self) -> list:
        """Compact form for manifests: [hash, codec, size, stored, itemsize]."""
        return [self.hash, self.codec, self.size, self.stored, self.itemsize]

    @classmethod
    def from_json(cls, obj: object) -> ChunkRef:
        """Parse and validate a reference from a manifest (hostile input is rejected)."""
        if not isinstance(obj, list) or len(obj) != 5:
            raise ManifestError(f"chunk reference must be [hash, codec, size, stored, itemsize], got {obj!r:.120}")
        h, codec, size, stored, itemsize = obj
        if not is_hex(h, HASH_HEX_LEN):
            raise ManifestError(f"chunk reference has a malformed hash {h!r:.80}")
        if not isinstance(codec, str) or codec not in CODECS + LOSSY_CODECS:
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
class RepairEvent:
    """One bad copy of a chunk replaced by a good one."""

    key: str  # the key rewritten (a chunk key, or a replica key)
    store: str  # URL of the store (tier) whose copy was bad
    source: str  # "<url> <key>" of the good copy
    problem: str  # what was wrong with the bad copy

    def __str__(self) -> str:
        return f"repaired {self.key} in {self.store} from {self.source} ({self.problem})"


@dataclass(frozen=True)
class PutResult:
    """A ``ChunkRef`` plus whether this call wrote bytes (False: dedup hit)."""

    ref: ChunkRef
    written: bool


class ChunkStore:
    """Content-addressed, verified chunks on top of any ``Store``."""

    def __init__(self, store: Store, prefix: str = "chunks", codec: CodecConfig | None = None,
                 on_repair: Sequence[Callable[[RepairEvent], None]] = ()) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.codec = codec or CodecConfig()
        #: called with each ``RepairEvent`` (on the reading thread); errors are only logged
        self.on_repair: list[Callable[[RepairEvent], None]] = list(on_repair)
        self._known: dict[str, int] = {}  # key -> stored size, for keys this process wrote or saw
        self._known_lock = threading.Lock()
        self._repair_lock = threading.Lock()  # one repair at a time: rare, and no double repairs

    # -- writing ---------------------------------------------------------------------------
    def put(self, data: Buffer, codec: str | None = None, itemsize: int = 1,
            digest: str | None = None, cpu: AbstractContextManager[Any] | None = None) -> PutResult:
        """Store ``data`` unless identical content (same codec) is already there.

        The write is conditional (``put_if_absent``): of several writers of one name (other
        processes, jobs with other codec levels or element sizes) the first wins and the
        others reference its copy, recording its stored size. Existence is asked of the
        store's ``write_view()`` (a tiered store: hot and durable, not the archive), so a
        chunk found only in an archive is written again and the new checkpoint can become
        durable without it.

        ``cpu``: held while encoding only (not during the dedup check or the write), so a
        caller can bound how many cores its puts use while their I/O still overlaps.
        """
        view = memoryview(data).cast("B")
        if view.nbytes > MAX_CHUNK_BYTES:
            raise ConfigError(f"chunk of {view.nbytes} bytes exceeds the limit of {MAX_CHUNK_BYTES}")
        codec = check_codec(codec or self.codec.codec, lossy=True)
        h = digest or content_hash(view)
        key = f"{self.prefix}/{h[:2]}/{h}.{codec}"
        stored = self._stored_size(key)
        if stored is not None:
            return PutResult(ChunkRef(h, codec, view.nbytes, stored, itemsize), False)
        with cpu or contextlib.nullcontext():
            encoded = encode(view, codec, itemsize, level=self.codec.level, threads=self.codec.threads)
        for _attempt in range(3):  # a copy that won and then vanished (gc) is written again
            try:
                self.store.write_view().put_if_absent(key, encoded)
            except AlreadyExistsError:  # another writer won: reference its copy
                stored = self._stored_size(key, fresh=True)
                if stored is None:
                    continue
                return PutResult(ChunkRef(h, codec, view.nbytes, stored, itemsize), False)
            stored = memoryview(encoded).nbytes
            with self._known_lock:
                self._known[key] = stored
            return PutResult(ChunkRef(h, codec, view.nbytes, stored, itemsize), True)
        raise ConflictError(f"chunk {key} in {self.store.url} kept vanishing right after another writer created it")

    def _stored_size(self, key: str, fresh: bool = False) -> int | None:
        """Stored size of ``key`` in the write view if it exists (one HEAD at most per key
        and process, unless ``fresh``)."""
        with self._known_lock:
            if key in self._known and not fresh:
                return self._known[key]
        try:
            size = self.store.write_view().head(key).size
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
    def check(self, ref: ChunkRef, stored: Buffer, out: memoryview | None = None, key: str | None = None,
              check: str | None = None, strong: bool = False) -> Buffer:
        """Decode ``stored`` (one copy of ``ref``'s chunk, into ``out`` if given) and verify
        its length and hash - the read check ``check`` (xxh3-128 of the raw bytes, from the
        manifest) when given, else BLAKE3; ``strong``: BLAKE3 *and* ``check`` (a scrub).
        Raises ``ChunkCorruptError`` naming ``key``."""
        key = key or ref.key(self.prefix)
        n = memoryview(stored).nbytes
        if n > ref.max_stored:
            raise ChunkCorruptError(f"chunk {key}: {n} bytes stored, more than a {ref.size}-byte chunk can take")
        raw = decode(stored, ref.codec, ref.size, key=key, out=out, threads=self.codec.threads)
        if not matches(raw, ref.hash, check, strong):
            raise ChunkCorruptError(f"chunk {key}: content does not match its hash (corrupted)")
        return raw

    def get(self, ref: ChunkRef, out: memoryview | None = None, check: str | None = None) -> Buffer:
        """Read, decode (into ``out`` if given) and verify one chunk (against ``check`` when
        given: ``check``); repair a bad copy."""
        key = ref.key(self.prefix)
        if out is not None and memoryview(out).nbytes != ref.size:
            raise ConfigError(
                f"chunk {key}: output buffer has {memoryview(out).nbytes} bytes, the chunk {ref.size}"
            )
        try:
            return self.check(ref, self.store.get(key), out, key, check)
        except (ChunkCorruptError, NotFoundError) as exc:
            return self.recover(ref, out, exc, check)

    def get_stored(self, ref: ChunkRef) -> Buffer:
        """The stored (encoded) bytes of a verified good copy of ``ref``'s chunk - what a
        tier copy or a replica writes; a bad copy met on the way is repaired."""
        key = ref.key(self.prefix)
        try:
            stored = self.store.get(key)
            self.check(ref, stored, key=key)
            return stored
        except (ChunkCorruptError, NotFoundError) as exc:
            return self._recover(ref, None, exc)[0]

    def recover(self, ref: ChunkRef, out: memoryview | None, error: ChunkCorruptError | NotFoundError,
                check: str | None = None) -> Buffer:
        """After ``error`` (a bad or missing copy): find a good copy in any tier or replica,
        replace the bad copies with it, return the decoded chunk; else raise (module doc).
        Copies are judged like ``check`` judges them (``check``: the read check, if any)."""
        return self._recover(ref, out, error, check)[1]

    def _recover(self, ref: ChunkRef, out: memoryview | None,
                 error: ChunkCorruptError | NotFoundError, check: str | None = None) -> tuple[Buffer, Buffer]:
        """``recover``, returning (stored bytes, decoded chunk) of the good copy."""
        key = ref.key(self.prefix)
        with self._repair_lock:
            try:  # another thread may have repaired it while we waited
                stored = self.store.get(key)
                return stored, self.check(ref, stored, out, key, check)
            except (ChunkCorruptError, NotFoundError):
                pass
            good, bad, failed = self._scan(ref, out, every=False, check=check)
            if good is None:
                if failed is not None:
                    raise failed  # a tier could not answer: not known to be corrupt
                if isinstance(error, NotFoundError):
                    raise error
                problems = "; ".join(f"{s.url} {k}: {p}" for s, k, p in bad) or "no other copy"
                raise ChunkCorruptError(f"{error} - no good copy in any tier or replica ({problems})") from None
            stored, raw, src, src_key = good
            if isinstance(error, NotFoundError):  # lost everywhere but a replica: restore the primary there
                bad.append((src, key, "missing"))
            self._repair(bad, stored, src, src_key)
            return stored, raw

    def _copies(self) -> list[tuple[Store, str]]:
        """(tier, key kind) in the order copies are tried: primaries in every tier, then replicas."""
        return [(tier, kind) for kind in ("primary", "replica") for tier in self.store.tiers()]

    def _scan(self, ref: ChunkRef, out: memoryview | None, every: bool, check: str | None = None,
              strong: bool = False
              ) -> tuple[tuple[Buffer, Buffer, Store, str] | None, list[tuple[Store, str, str]], StoreError | None]:
        """Read the copies of ``ref`` (all with ``every``, else up to the first good one;
        judged like ``check`` judges them).
        Returns (good: (stored, raw, tier, key) or None, bad: [(tier, key, problem)],
        the first store error met)."""
        key = ref.key(self.prefix)
        good, bad, failed = None, [], []
        places = ((tier, key if kind == "primary" else replica_key(key)) for tier, kind in self._copies())
        for tier, k, stored in read_copies(places, failed):
            try:
                raw = self.check(ref, stored, out if good is None else None, k, check, strong)
            except ChunkCorruptError as exc:
                bad.append((tier, k, str(exc)))
                continue
            if good is None:
                good = (stored, raw, tier, k)
                if not every:
                    break
        return good, bad, failed[0] if failed else None

    def _repair(self, bad: list[tuple[Store, str, str]], stored: Buffer, src: Store, src_key: str) -> None:
        """Atomically replace each bad copy with the good ``stored`` bytes; report each."""
        for tier, k, problem in bad:
            try:
                tier.put(k, stored)
            except (StoreError, ReadOnlyError) as exc:  # the read still succeeds; a later read retries
                log.error("chunk %s: could not repair the bad copy in %s: %s", k, tier.url, exc)
                continue
            event = RepairEvent(k, tier.url, f"{src.url} {src_key}", problem)
            log.warning("chunk %s", event)
            for fn in self.on_repair:
                try:
                    fn(event)
                except Exception as exc:  # noqa: BLE001 - reporting never breaks a read
                    log.warning("repair listener %r failed: %s", fn, exc)

    def verify(self, ref: ChunkRef, deep: bool = True, check: str | None = None) -> None:
        """Raise if the chunk is missing (shallow) or has no copy that decodes to its hash
        (deep) - and to ``check``, the read check a manifest records for it. Deep is a scrub:
        every copy in every tier (and replica) is read, bad ones are repaired from a good one."""
        key = ref.key(self.prefix)
        if not deep:
            if self.store.head(key).size != ref.stored:
                # another writer's copy of the name may differ in size (``ChunkRef.max_stored``):
                # read it to tell a valid copy from a damaged one
                self.check(ref, self.store.get(key), key=key)
            return
        good, bad, failed = self._scan(ref, None, every=True, check=check, strong=True)
        if good is None:
            if failed is not None:
                raise failed
            if not bad:
                raise NotFoundError(f"no object {key!r} in {self.store.url}")
            raise ChunkCorruptError(f"chunk {key}: no good copy in any tier or replica ("
                                    + "; ".join(f"{s.url} {k}: {p}" for s, k, p in bad) + ")")
        stored, _raw, src, src_key = good
        if not any(k == key for _t, k, _p in bad) and src_key != key:
            # only a replica is left: the primary is missing (a missing copy in one tier of
            # several is normal - eviction - so only the primary key of the replica's tier)
            bad.append((src, key, "missing"))
        with self._repair_lock:
            self._repair(bad, stored, src, src_key)

    def put_replica(self, ref: ChunkRef) -> int:
        """Store a second copy of ``ref``'s chunk under ``replica_key`` (after verifying the
        primary: a corrupt one is never replicated). Returns the bytes written (0: exists)."""
        key = ref.key(self.prefix)
        rkey = replica_key(key)
        if self.store.exists(rkey):
            return 0
        stored = self.get_stored(ref)
        self.store.put(rkey, stored)
        return memoryview(stored).nbytes

    # -- housekeeping ----------------------------------------------------------------------
    def list_keys(self) -> Iterator[tuple[str, int, float | None]]:
        """(key, stored size, mtime) of every chunk object."""
        for meta in self.store.list(self.prefix + "/"):
            yield meta.key, meta.size, meta.mtime

    def delete_key(self, key: str) -> None:
        self.store.delete(key)
        self.forget({key})

