"""Deleting one checkpoint so that it vanishes atomically: its manifest first, then the
files that only describe it. Chunks are left to ``gc`` (or retention's reclaim pass)."""

from __future__ import annotations

from ..checkpoint.format import manifest as mf
from ..checkpoint.format.lineage import prune_empty_dirs
from ..store.base import Store


def delete_abandoned(store: Store, key: str) -> int:
    """Remove one abandoned checkpoint (its manifest first, then its advisory records)."""
    store.delete(key)
    n = 1
    run_dir = key.rsplit("/", 1)[0] + "/"
    for meta in list(store.list(run_dir)):
        store.delete(meta.key)
        n += 1
    prune_empty_dirs(store, [run_dir, run_dir.rsplit("/", 2)[0] + "/"])
    return n


def delete_checkpoint(store: Store, job: str, step: int) -> int:
    """Remove one checkpoint: its manifest first (it vanishes atomically), then its other
    files (verify records, tier marks). Chunks stay for ``gc``. Returns objects deleted."""
    store.delete(mf.manifest_key(job, step))
    n = 1
    for meta in list(store.list(mf.step_prefix(job, step))):
        store.delete(meta.key)
        n += 1
    prune_empty_dirs(store, [mf.step_prefix(job, step)])
    return n


__all__ = ["delete_abandoned", "delete_checkpoint"]
