"""Restore-ready copies: the newest incremental's changed pieces, raw, in the local tier.

An incremental checkpoint stores each changed piece as an XOR delta against its base full
checkpoint, or - where the delta compresses no better, as with AdamW moments that change
completely - as the piece itself compressed with the delta codec (zstd). Restoring it reads the
base, decodes the delta and XORs the two, or decodes the piece: on the GPT + AdamW state 0.59 s
of CPU against 0.31 s for a full checkpoint (docs/benchmarks.md). Yet the newest checkpoint is
the one a restart restores, and it is usually an incremental. So after an incremental is
committed, the saver (which still holds the staged bytes) writes the raw bytes of every piece
a restore would have to rebuild or decode (``ready_piece``: deltas, and the compressed pieces
the incremental wrote itself) to the store's local tier (a ``LocalStore``, or a tiered store's
hot tier) under ``ready/<job>/<step>/<piece hash>.raw``; a restore of that step reads each copy
like a raw piece of a full checkpoint (straight into the destination, checked as it is read)
and falls back to the stored piece, silently and correctly, when a copy is missing or does not
match. Unchanged pieces need no copy: they are the base's own chunks; nor do raw ones, which
are read like a copy already, nor lossy ones (their restore is what the codec decodes, not
the bytes the saver holds).

The copies are a cache, not part of any checkpoint: no manifest names them, so GC, tiering,
peer protection, verification and exports never see them, and losing them (a new node, a
wiped disk) costs only restore speed. After a save commits, the copies of every other step of
the job are deleted (a full checkpoint needs none), so the local tier holds at most one step's
changed pieces beside its chunks. Writing them is best effort: a failure (a full disk) is
logged, the step's copies are dropped, and the checkpoint stands as committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from ...codecs import LOSSY_CODECS
from ...errors import NotFoundError, TrainstoreError
from ...store.base import Buffer, Store
from .layout import STEP_DIGITS, check_job
from .manifest import ChunkEntry, Manifest, TensorEntry

log = logging.getLogger("trainstore.checkpoint.format.ready")

READY_PREFIX = "ready/"
#: puts of copies in flight at once (each an O_DIRECT write, an fsync, a rename)
WRITE_THREADS = 4


def ready_prefix(job: str) -> str:
    return f"{READY_PREFIX}{check_job(job)}/"


def ready_key(job: str, step: int, piece_hash: str) -> str:
    return f"{ready_prefix(job)}{step:0{STEP_DIGITS}d}/{piece_hash}.raw"


def local_tier(store: Store) -> Store | None:
    """The tier restore-ready copies live in: the fastest tier when its objects are local files."""
    fast = store.tiers()[0]
    return fast if fast.capabilities.local else None


def ready_piece(piece: ChunkEntry) -> bool:
    """Whether a restore of an incremental would rebuild or decode ``piece`` (so a raw copy
    saves it the work): an XOR delta, or a compressed piece the incremental stored itself."""
    if piece.is_delta:
        return bool(piece.content_hash)
    return not (piece.same_as_base or piece.is_packed or piece.ref.codec == "raw" or piece.ref.codec in LOSSY_CODECS)


def entry_ready_pieces(entry: TensorEntry) -> Iterable[tuple[str, int, int]]:
    """(piece hash, start byte, size) of every piece of one tensor that gets a copy."""
    start = 0
    for piece in entry.chunks:
        if ready_piece(piece):
            yield piece.logical_hash(), start, piece.size
        start += piece.size


def ready_pieces(manifest: Manifest) -> Iterable[tuple[str, str, int, int]]:
    """(tensor, piece hash, start byte, size) of every piece of ``manifest`` that gets a copy."""
    for name, entry in manifest.tensors.items():
        for h, start, size in entry_ready_pieces(entry):
            yield name, h, start, size


@dataclass
class ReadyReads:
    """What one restore got from restore-ready copies (filled by reader threads)."""

    #: the local file that may hold a piece, by its hash (``None``: read the stored piece)
    path: Callable[[str], str | None]
    used: int = 0  # pieces read from a copy
    used_bytes: int = 0
    fallbacks: int = 0  # pieces whose copy was missing or bad: read as stored

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def count(self, nbytes: int | None) -> None:
        """A piece read from its copy (``nbytes``), or (``None``) one that fell back."""
        with self._lock:
            if nbytes is None:
                self.fallbacks += 1
            else:
                self.used += 1
                self.used_bytes += nbytes


class ReadyCopies:
    """Writes, finds and prunes the restore-ready copies of one job (module docstring)."""

    def __init__(self, store: Store, job: str) -> None:
        self.job = job
        self.tier = local_tier(store)
        self._pool: ThreadPoolExecutor | None = None
        self._unknown = True  # copies of other steps may exist (an earlier process, an earlier save)

    @property
    def writable(self) -> bool:
        return self.tier is not None and not self.tier.capabilities.read_only

    def write(self, step: int, pieces: Iterable[tuple[str, Buffer]]) -> int:
        """Write ``(piece hash, raw bytes)`` as ``step``'s copies; returns the bytes written.
        A failure drops this step's copies (logged): the checkpoint does not depend on them."""
        tier = self.tier
        if tier is None or not self.writable:
            return 0
        if self._pool is None:  # a few puts in flight: each waits on its own fsync
            self._pool = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="trainstore-ready")
        futures = [self._pool.submit(tier.put, ready_key(self.job, step, h), data) for h, data in pieces]
        try:
            written = sum(f.result().size for f in futures)
        except (TrainstoreError, OSError) as exc:  # ENOSPC, EIO, a path that cannot be created
            for f in futures:
                f.cancel()
            wait(futures)
            log.warning("restore-ready copies of step %d (job %r) not written, the step restores through its "
                        "stored pieces: %s", step, self.job, exc)
            self.prune(keep=None)
            return 0
        return written

    def after_commit(self, step: int, kind: str, pieces: Callable[[], Iterable[tuple[str, Buffer]]],
                     enabled: bool, notify: Callable[..., None]) -> None:
        """A save committed ``step``: write its copies when it is an incremental (``pieces``:
        its ``ready_pieces``' ``(hash, raw bytes)``) and drop every other step's (best effort)."""
        if not self.writable:
            return
        if kind == "incremental" and enabled:
            t0 = time.perf_counter()
            n = self.write(step, pieces())
            self.prune(keep=step)
            self._unknown = True
            notify("ready_copies_written", step=step, bytes=n, seconds=time.perf_counter() - t0)
        elif self._unknown:
            self.prune(keep=None)
            self._unknown = False

    def prune(self, keep: int | None) -> int:
        """Delete the copies of every step but ``keep`` (None: all); returns how many."""
        tier = self.tier
        if tier is None or not self.writable:
            return 0
        keep_prefix = None if keep is None else f"{ready_prefix(self.job)}{keep:0{STEP_DIGITS}d}/"
        removed = 0
        try:
            for meta in list(tier.list(ready_prefix(self.job))):
                if keep_prefix is None or not meta.key.startswith(keep_prefix):
                    try:
                        tier.delete(meta.key)
                        removed += 1
                    except NotFoundError:
                        pass
        except (TrainstoreError, OSError) as exc:
            log.warning("could not prune restore-ready copies of job %r: %s", self.job, exc)
        return removed

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def reads(self, step: int) -> ReadyReads | None:
        """The copies of ``step`` for one restore (None: no local tier)."""
        tier = self.tier
        if tier is None:
            return None
        job = self.job
        return ReadyReads(lambda h: tier.local_path(ready_key(job, step, h)))

    @staticmethod
    def report(reads: ReadyReads | None, step: int, notify: Callable[..., None]) -> None:
        """The ``restore_ready_copies`` event of a restore that looked for copies."""
        if reads is not None and (reads.used or reads.fallbacks):
            notify("restore_ready_copies", step=step, pieces=reads.used, bytes=reads.used_bytes,
                   fallbacks=reads.fallbacks)


__all__ = ["READY_PREFIX", "ReadyCopies", "ReadyReads", "entry_ready_pieces", "local_tier", "ready_key", "ready_piece",
           "ready_pieces", "ready_prefix"]
