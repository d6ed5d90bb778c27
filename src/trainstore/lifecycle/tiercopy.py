"""One checkpoint copied between tiers (hot -> durable, durable -> archive), verified.

Chunks the destination lacks first, under a ``CopyLease`` on the destination (so its gc
keeps what the copy reuses or writes), then the manifest with a conditional create.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..checkpoint.format import manifest as mf
from ..checkpoint.save.lease import CopyLease
from ..chunks import ChunkStore, RepairEvent
from ..errors import AlreadyExistsError, ConflictError
from ..store.base import Store
from ..store.tiered import TieredStore


def copy_checkpoint(src: Store, dst: Store, job: str, step: int, workers: int = 4, *,
                    fallbacks: Sequence[Store] = (),
                    on_repair: Sequence[Callable[[RepairEvent], None]] = ()) -> int:
    """Copy one checkpoint: chunks ``dst`` lacks, then the manifest (conditional create).
    Returns the chunk bytes copied. Chunks missing in ``src`` must already be in ``dst``.

    Every chunk is verified (length, decode, BLAKE3) before it is written, so bit rot in
    ``src`` never spreads: a bad ``src`` copy is replaced by a good one from ``fallbacks``
    (other tiers) or a replica, and the good bytes are copied; with no good copy anywhere the
    copy raises ``ChunkCorruptError`` naming the chunk, and the manifest is not written.
    """
    raw = src.get(mf.manifest_key(job, step))
    m = mf.Manifest.from_bytes(raw, mf.manifest_key(job, step))
    view = TieredStore(src, *fallbacks[:2]) if fallbacks else src
    reader = ChunkStore(view, on_repair=on_repair)
    refs = {r.key(reader.prefix): r for r in mf.manifest_refs(m)}

    def one(key: str) -> int:
        if dst.exists(key):
            return 0
        data = reader.get_stored(refs[key])
        dst.put(key, data)
        return memoryview(data).nbytes

    # the lease comes before any look at dst: a dst gc keeps what the copy reuses or writes
    with CopyLease(dst, job, step, refs) as lease:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainstore-tier-copy") as pool:
            copied = sum(pool.map(one, sorted(refs)))
        lease.check()
        try:
            dst.put_if_absent(mf.manifest_key(job, step), raw)
        except AlreadyExistsError:
            if bytes(memoryview(dst.get(mf.manifest_key(job, step)))) != bytes(memoryview(raw)):
                raise ConflictError(f"step {step} of job {job!r} exists in {dst.url} with different content") from None
    return copied


__all__ = ["copy_checkpoint"]
