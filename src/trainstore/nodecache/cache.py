"""The node cache: a node-local, size-limited, read-through cache of durable-store objects
(only ever copies of durable objects: not the checkpoint hot tier, ``store.tiered``).

Objects are plain files under ``cache_dir`` so they can be memory-mapped. Several processes
of one node may share one cache directory; coordination uses only the file system:

* **fill**: a per-key lock file (``filelock``) lets one process download while the others
  wait; the download goes to a temp file which is renamed into place (atomic).
* **in use**: a pinned file is held open with a shared ``flock``. Eviction takes a
  non-blocking exclusive ``flock`` and skips any file it cannot lock, so a file in use is
  never removed. (The lock lives on the inode; a reader re-checks after locking that the path
  still names the inode it locked, so it never pins an evicted file.)
* **LRU**: each access stamps the file's atime explicitly (``os.utime``); eviction scans the
  directory under a global eviction lock and removes the least recently used unpinned files.
* **wanted**: a reader of this process may mark files it reads again with the rank of their
  next use (``want``; the loader does in block mode). Those go after every other file, the one
  needed last first (``nodecache.wanted``); a fill ahead of use never evicts one needed sooner
  than itself, and a fill on demand first waits ``want_grace_s`` for other files to be freed
  (prefetch must not evict what the current batches still need).

Entries are namespaced by a hash of the durable store's URL, so jobs on different stores
sharing one directory never collide; nothing uses named shared memory. Keys are immutable in
trainstore (chunks are content-addressed, shard keys are versioned); when a checksum is
given, a cached copy that does not match it is re-fetched, and a durable copy that does not
match raises ``IntegrityError`` naming the key. Objects trainstore did not write (external
data) may be rewritten in place: they are pinned with the ``tag`` of the content they were
listed with (``nodecache.source``). A tagged copy lives under its own name (the tag's hash),
so a new content is a miss and is filled, never served from an older copy of the same size;
a fill checks the store still holds that tag after the download (else ``IntegrityError``
naming the object; nothing is kept), and drops the idle copies of other tags.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import filelock

from ..errors import CapacityError, ConfigError, IntegrityError, StoreError
from ..fileio import unlink_quietly
from ..store import Store, open_store
from .config import CacheConfig, CacheStats
from .evict import remove_idle, scan
from .fetch import RangedDownloads, download
from .files import TMP_PREFIX, PinnedFile, file_hash, stamp, temp_file_beside, touch
from .paths import KeyPaths
from .source import check_unchanged, other_contents
from .wanted import CachedFile, NotNeeded, wanted_files

log = logging.getLogger(__name__)

# Files this process has verified: path -> (inode, size, mtime_ns). Shared by every NodeCache
# in the process, so a new cache object (a new Dataset, a new epoch) does not re-hash them.
_VERIFIED: dict[str, tuple[int, int, int]] = {}


class NodeCache:
    """Read-through local cache in front of ``durable_store`` (see module docstring)."""

    def __init__(
        self,
        durable_store: Store | str,
        cache_dir: str | os.PathLike[str],
        limit_bytes: int | None = None,
        *,
        config: CacheConfig | None = None,
        **store_options: object,
    ) -> None:
        if config is None:
            if limit_bytes is None:
                raise ConfigError("NodeCache needs limit_bytes (or a CacheConfig)")
            config = CacheConfig(limit_bytes=int(limit_bytes))
        elif limit_bytes is not None and limit_bytes != config.limit_bytes:
            raise ConfigError("pass limit_bytes either directly or in config, not both")
        self.config = config
        self.store = open_store(durable_store, **store_options)
        self.root = os.path.abspath(os.fspath(cache_dir))
        ns = hashlib.sha256(self.store.url.encode()).hexdigest()[:16]
        self.namespace = ns
        self._objects = os.path.join(self.root, "objects")
        self._obj_ns = os.path.join(self._objects, ns)
        self._paths = KeyPaths(self._objects, ns)
        self._locks = os.path.join(self.root, "locks", ns)
        for d in (self._obj_ns, self._locks):
            os.makedirs(d, exist_ok=True)
        self._evict_lock_path = os.path.join(self.root, "evict.lock")
        self.stats = CacheStats()
        self._mu = threading.Lock()
        self._verified = _VERIFIED
        self._pins: set[int] = set()
        self._space_freed = threading.Condition(self._mu)
        #: Called (no arguments) when a fill finds nothing evictable, before it waits: an owner
        #: holding idle pins (e.g. a Dataset's open shards) can release them here.
        self.on_pressure: Callable[[], None] | None = None
        self._ranged: RangedDownloads | None = None
        #: files a reader of this process still needs (``want``): evicted after every other file
        self._wanted = wanted_files(self.root)  # shared by every cache on this directory

    # -- paths -----------------------------------------------------------------------------
    def path_of(self, key: str, tag: str | None = None) -> str:
        """Where ``key`` lives (or would live) in the cache; with ``tag``, the copy of that
        content of it (``nodecache.paths``)."""
        return self._paths.path_of(key, tag)

    def _key_lock(self, key: str) -> filelock.FileLock:
        name = hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock"
        return filelock.FileLock(os.path.join(self._locks, name), timeout=self.config.lock_timeout_s)

    # -- public API --------------------------------------------------------------------------
    def pin(self, key: str, *, checksum: str | None = None, size: int | None = None,
            tag: str | None = None, ahead: bool = False, rank: float | None = None,
            needed: Callable[[], bool] | None = None) -> PinnedFile:
        """Make ``key`` present in the cache and hold it in use until the handle is closed.

        ``checksum`` (BLAKE3 hex) and ``size``, when given, are verified on fill; a cached copy
        that fails them is re-fetched. ``tag``: the content of an object that may be rewritten
        in place (``nodecache.source``), checked against the store on fill. ``CapacityError``
        if the object cannot fit. ``ahead``: a fill ahead of use, which neither waits for space
        nor asks ``on_pressure`` for it (``CapacityError`` at once when nothing is evictable);
        ``rank``: when the fill ahead is needed (see ``want``): it evicts no file needed sooner.
        ``needed``: asked under the key's lock before a download; False raises ``NotNeeded`` (a
        reader that fetched and finished with the object meanwhile: no second download).
        """
        path = self.path_of(key, tag)
        if size is not None and size > self.config.limit_bytes:
            raise self._too_big(key, size)
        for _attempt in range(8):
            handle = self._try_pin(key, path)
            corrupt = None
            if handle is not None:
                if self._count_hit(handle, path, checksum, size):
                    return handle
                corrupt = stamp(handle._fd)
                handle.close()
            handle = self._fill(key, path, checksum, size, corrupt=corrupt, ahead=ahead, tag=tag, rank=rank,
                                needed=needed)
            if handle is not None:
                return handle
        raise StoreError(f"could not pin {key!r} in the node cache {self.root}: evicted repeatedly")

    @contextlib.contextmanager
    def open(self, key: str, *, checksum: str | None = None, size: int | None = None,
             tag: str | None = None) -> Iterator[str]:
        """``with cache.open(key) as path``: the file is pinned inside the block."""
        handle = self.pin(key, checksum=checksum, size=size, tag=tag)
        try:
            yield handle.path
        finally:
            handle.close()

    def get(self, key: str, *, checksum: str | None = None, size: int | None = None,
            tag: str | None = None) -> bytes:
        """The object's bytes, read through the cache."""
        with self.pin(key, checksum=checksum, size=size, tag=tag) as h:
            return h.read()

    def contains(self, key: str, *, tag: str | None = None) -> bool:
        return os.path.exists(self.path_of(key, tag))

    def prefetch(self, key: str, *, checksum: str | None = None, size: int | None = None,
                 tag: str | None = None) -> None:
        """Fill ``key`` without keeping it pinned."""
        self.pin(key, checksum=checksum, size=size, tag=tag).close()

    def want(self, key: str, rank: float, *, owner: int, tag: str | None = None) -> None:
        """``owner`` (any id) will read ``key`` again; ``rank`` orders its next use (lower =
        sooner). Eviction takes files nobody wants first (LRU), then wanted ones needed last
        first; a fill ahead of use never evicts a file wanted before its own ``rank``."""
        self._wanted.want(self.path_of(key, tag), rank, owner)

    def unwant(self, key: str, *, owner: int, tag: str | None = None) -> None:
        self._wanted.unwant(self.path_of(key, tag), owner)

    def evict(self, key: str, *, tag: str | None = None) -> bool:
        """Remove ``key`` (its copy of content ``tag``) now if it is not in use; True if removed."""
        path = self.path_of(key, tag)
        with filelock.FileLock(self._evict_lock_path, timeout=self.config.lock_timeout_s):
            freed = self._evict_file(path)
        return freed > 0 or (freed == 0 and not os.path.exists(path))

    def usage(self) -> int:
        """Bytes of cached files in this cache directory (all namespaces)."""
        return sum(size for _p, size, _a in self._scan())

    def clear(self) -> int:
        """Evict everything evictable; returns bytes freed."""
        with filelock.FileLock(self._evict_lock_path, timeout=self.config.lock_timeout_s):
            return sum(max(0, self._evict_file(p)) for p, _s, _a in self._scan())

    # -- internals ---------------------------------------------------------------------------
    def _too_big(self, key: str, size: int) -> CapacityError:
        return CapacityError(f"object {key!r} is {size} bytes, larger than the node-cache limit of "
                             f"{self.config.limit_bytes} bytes ({self.root}); raise the cache limit")

    def _try_pin(self, key: str, path: str) -> PinnedFile | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
            try:
                cur = os.stat(path)
            except FileNotFoundError:
                cur = None
            if cur is None or cur.st_ino != st.st_ino or st.st_nlink == 0:
                os.close(fd)  # evicted or replaced between open and lock
                return None
        except BaseException:
            os.close(fd)
            raise
        return self._handle(key, path, fd, st.st_size)

    def _handle(self, key: str, path: str, fd: int, size: int) -> PinnedFile:
        h = PinnedFile(key, path, fd, size, self._released)
        with self._mu:
            self._pins.add(id(h))
        return h

    def _released(self, handle: PinnedFile) -> None:
        with self._mu:
            self._pins.discard(id(handle))
            self._space_freed.notify_all()

    def _count_hit(self, handle: PinnedFile, path: str, checksum: str | None, size: int | None) -> bool:
        """True (and the hit counted, the file's LRU time refreshed) when the pinned copy is good."""
        if not self._hit_ok(handle, checksum, size):
            return False
        touch(path)
        with self._mu:
            self.stats.hits += 1
            self.stats.bytes_read_hits += handle.size
        return True

    def _hit_ok(self, handle: PinnedFile, checksum: str | None, size: int | None) -> bool:
        if size is not None and handle.size != size:
            return False
        if checksum is None or self.config.verify_hits == "never":
            return True
        copy = stamp(handle._fd)
        if self.config.verify_hits == "once":
            with self._mu:
                if self._verified.get(handle.path) == copy:
                    return True
        ok = file_hash(handle._fd, handle.size) == checksum
        if ok:
            with self._mu:
                self._verified[handle.path] = copy
        return ok

    def _fill(
        self, key: str, path: str, checksum: str | None, size: int | None,
        corrupt: tuple[int, int, int] | None = None, ahead: bool = False, tag: str | None = None,
        rank: float | None = None, needed: Callable[[], bool] | None = None,
    ) -> PinnedFile | None:
        """Download ``key`` into the cache, unless another thread or process filled (or replaced
        the corrupt copy ``corrupt`` = its inode/size/mtime) while we waited for the key lock.
        With ``tag``, the store must still hold that content after the download (one HEAD: a
        content changed before the download is still another content after it)."""
        with self._key_lock(key):
            handle = self._try_pin(key, path)
            if handle is not None:
                fresh = corrupt is None or stamp(handle._fd) != corrupt
                if fresh and self._count_hit(handle, path, checksum, size):
                    return handle
                if fresh:
                    corrupt = stamp(handle._fd)
                handle.close()
            if needed is not None and not needed():
                raise NotNeeded(f"{key!r} is no longer needed by the reader that asked for it ahead")
            if corrupt is not None:
                with self._mu:
                    self.stats.refetched_corrupt += 1
                log.warning("node-cache copy of %s is corrupt; re-fetching from %s", key, self.store.url)
            if size is None:
                size = self._object_size(key)
            if size > self.config.limit_bytes:
                raise self._too_big(key, size)
            self._make_room(size, key, ahead, rank)
            fd, tmp = temp_file_beside(path)
            try:
                ranged = (self.store.local_path(key) is None and size > self.config.part_bytes
                          and self.config.fetch_concurrency > 1)
                written = (self._ranged_downloads().download(self.store, key, fd, size)
                           if ranged else download(self.store, key, fd))
                if tag is not None:  # rewritten during the download: the bytes may be mixed
                    check_unchanged(self.store, key, tag, written)
                if size is not None and written != size:
                    raise IntegrityError(
                        f"object {key!r} in {self.store.url} is {written} bytes, expected {size}"
                    )
                if checksum is not None and file_hash(fd, written) != checksum:
                    raise IntegrityError(
                        f"object {key!r} in the durable store {self.store.url} does not match "
                        "its checksum (corrupted at the source)"
                    )
                if self.config.fsync:
                    os.fsync(fd)
                fcntl.flock(fd, fcntl.LOCK_SH)  # pinned before it becomes visible
                os.rename(tmp, path)
            except BaseException:
                os.close(fd)
                unlink_quietly(tmp)
                raise
            with self._mu:
                self.stats.misses += 1
                self.stats.bytes_fetched += written
                if checksum is not None:
                    self._verified[path] = stamp(fd)
            touch(path)
            handle = self._handle(key, path, fd, written)
            handle.fetched = True
        others = other_contents(path) if tag is not None else []
        if others:  # idle copies of contents the store no longer holds
            with filelock.FileLock(self._evict_lock_path, timeout=self.config.lock_timeout_s):
                for other in others:
                    self._evict_file(other)
        return handle

    def _object_size(self, key: str) -> int:
        return self.store.head(key).size

    def _ranged_downloads(self) -> RangedDownloads:
        """The pool and byte budget every ranged fill of this cache shares (made on first use)."""
        with self._mu:
            if self._ranged is None:
                self._ranged = RangedDownloads(self.config.part_bytes, self.config.fetch_concurrency)
            return self._ranged

    def _scan(self) -> Iterator[CachedFile]:
        """(path, size, atime) of every cached file; removes stale temp files on the way."""
        return scan(self._objects, self.config.stale_temp_s)

    def _make_room(self, incoming: int, key: str, ahead: bool = False, rank: float | None = None) -> None:
        """Evict unpinned files (``WantedFiles.victims`` order) until ``incoming`` more bytes fit the limit."""
        now = time.monotonic()
        deadline = now + (0.0 if ahead else self.config.capacity_wait_s)
        # until then, evict only files nobody wants (within the wait for space; a fill never
        # gives up before a pass that may evict wanted files too)
        spare_wanted = now + min(self.config.want_grace_s, self.config.capacity_wait_s)
        limit = self.config.limit_bytes
        relieved = False
        while True:
            with filelock.FileLock(self._evict_lock_path, timeout=self.config.lock_timeout_s):
                files = list(self._scan())
                used = sum(s for _p, s, _a in files)
                if used + incoming <= limit:
                    return
                grace = not ahead and time.monotonic() < spare_wanted
                for path, _sz, _atime in self._wanted.victims(files, ahead or grace, None if grace else rank):
                    if os.path.basename(path).startswith(TMP_PREFIX):
                        continue
                    freed = self._evict_file(path)
                    if freed > 0:
                        used -= freed
                        if used + incoming <= limit:
                            return
            if self.on_pressure is not None and not relieved and not ahead:
                relieved = True  # let the owner release idle pins, then scan once more
                self.on_pressure()
                continue
            relieved = False
            if time.monotonic() >= deadline and not grace:
                raise CapacityError(
                    f"node cache {self.root} is full: {used} of {limit} bytes are in use, and "
                    f"{key!r} needs {incoming} more; release pinned files or raise the limit"
                )
            with self._mu:
                self._space_freed.wait(timeout=0.05)

    def _evict_file(self, path: str) -> int:
        """Remove ``path`` if nobody uses it; bytes freed, -1 if busy."""
        freed = remove_idle(path)
        if freed is None:
            return 0
        if freed >= 0:
            with self._mu:
                self.stats.evictions += 1
                self.stats.bytes_evicted += freed
                self._verified.pop(path, None)
        return freed

    def __repr__(self) -> str:
        return f"NodeCache({self.store.url!r}, {self.root!r}, limit={self.config.limit_bytes})"


__all__ = ["NodeCache", "NotNeeded"]
