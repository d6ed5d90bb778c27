"""Opt-in redundancy for shared chunks: a second copy of every chunk that many checkpoints
(or a registered model) depend on, so that one flipped bit in a deduplicated chunk no longer
makes every checkpoint that shares it unrestorable.

    red = Redundancy(RedundancyPolicy(min_refs=2, registered=True))
    mgr = CheckpointManager(url, job, hooks=[red.hook])   # after each commit: replicate new shared chunks
    red.protect(store)                                    # or once, by hand / from cron

A chunk qualifies when at least ``min_refs`` committed manifests (of any job: chunks are
shared across jobs) reference it, or when a checkpoint that a model version in the registry
points at references it. Its replica is a byte copy of the verified primary under
``chunks.replica_key`` (``<key>.replica``) in the same store; ``ChunkStore`` reads fall back
to it and repair the primary (see docs/checkpoints.md "Repair"); GC keeps a replica exactly
while its primary is referenced.

Why a second copy rather than Reed-Solomon parity: a replica repairs any damage (a flipped
bit, a truncated or deleted object) with one read and needs no per-block hashes to locate the
damage; it costs 1x the bytes of the replicated chunks only, and those are the chunks dedup
already stores once for many checkpoints (measured in docs/checkpoints.md).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..checkpoint.format import manifest as mf
from ..chunks import ChunkRef, ChunkStore
from ..errors import ConfigError, ManifestError, NotFoundError
from ..store.base import Store
from .registry import Registry

log = logging.getLogger("trainstore.lifecycle.redundancy")


@dataclass(frozen=True)
class RedundancyPolicy:
    """Which chunks get a replica: referenced by ``min_refs`` or more checkpoints (None: by
    count never), or by a checkpoint registered as a model version (``registered``)."""

    min_refs: int | None = 2
    registered: bool = True

    def __post_init__(self) -> None:
        if self.min_refs is not None and (not isinstance(self.min_refs, int) or isinstance(self.min_refs, bool)
                                          or self.min_refs < 2):
            raise ConfigError(f"min_refs must be None or an int >= 2, got {self.min_refs!r}")


@dataclass(frozen=True)
class RedundancyReport:
    """What ``protect`` did: chunks that qualified, replicas written now, their bytes."""

    chunks: int
    written: int
    bytes_written: int


class Redundancy:
    """Writes replicas of shared chunks (see module doc). Manifests are cached by key
    (committed manifests never change), so a hook after each save reads only new ones."""

    def __init__(self, policy: RedundancyPolicy | None = None) -> None:
        self.policy = policy or RedundancyPolicy()
        self._refs: dict[str, frozenset[ChunkRef]] = {}  # manifest key -> its chunk refs
        self._lock = threading.Lock()

    def hook(self, info: Any, manager: Any) -> None:
        """``CheckpointManager`` hook: protect the store after each committed save."""
        self.protect(manager.store)

    def plan(self, store: Store) -> set[ChunkRef]:
        """The chunk refs that qualify for a replica under the policy."""
        counts: Counter[str] = Counter()
        by_key: dict[str, ChunkRef] = {}
        wanted: set[str] = set()
        registered = self._registered_steps(store)
        for job in mf.list_jobs(store):
            for step in mf.list_steps(store, job):
                refs = self._manifest_refs(store, job, step)
                for r in refs:
                    by_key.setdefault(r.key(), r)
                counts.update({r.key() for r in refs})
                if (job, step) in registered:
                    wanted |= {r.key() for r in refs}
        if self.policy.min_refs is not None:
            wanted |= {k for k, n in counts.items() if n >= self.policy.min_refs}
        return {by_key[k] for k in wanted}

    def protect(self, store: Store) -> RedundancyReport:
        """Write the replicas the policy asks for and the store lacks. A corrupt primary is
        repaired first from another tier if it can be, else ``ChunkCorruptError`` (never
        replicated)."""
        with self._lock:
            refs = self.plan(store)
            chunks = ChunkStore(store)
            written = [self._replicate(chunks, r) for r in sorted(refs, key=lambda r: r.hash)]
        report = RedundancyReport(len(refs), sum(1 for n in written if n), sum(written))
        if report.written:
            log.info("redundancy: %d replicas written (%.1f MB) in %s; %d chunks protected", report.written,
                     report.bytes_written / 1e6, store.url, report.chunks)
        return report

    @staticmethod
    def _replicate(chunks: ChunkStore, ref: ChunkRef) -> int:
        """``put_replica``; 0 when the chunk is gone: another job's GC collected it after the
        plan counted it (its manifests were deleted meanwhile), so it needs no replica."""
        try:
            return chunks.put_replica(ref)
        except NotFoundError:
            log.warning("redundancy: chunk %s vanished before its replica was written (collected, or missing: "
                        "verify reports a missing chunk of a live checkpoint)", ref.key(chunks.prefix))
            return 0

    def _manifest_refs(self, store: Store, job: str, step: int) -> frozenset[ChunkRef]:
        key = mf.manifest_key(job, step)
        refs = self._refs.get(key)
        if refs is None:
            try:
                refs = frozenset(mf.manifest_refs(mf.load_manifest(store, job, step)))
            except NotFoundError:  # deleted since it was listed (that job's retention)
                return frozenset()
            except ManifestError as exc:  # unreadable: it protects nothing; verify reports it
                log.warning("redundancy: skipping %s: %s", key, exc)
                return frozenset()
            self._refs[key] = refs
        return refs

    def _registered_steps(self, store: Store) -> set[tuple[str, int]]:
        if not self.policy.registered:
            return set()
        reg = Registry(store)
        return {(mv.job, mv.step) for model in reg.models() for mv in reg.versions(model)}


__all__ = ["Redundancy", "RedundancyPolicy", "RedundancyReport"]
