"""Build real checkpoints with chosen creation times (the test controls the clock)."""

from __future__ import annotations

import numpy as np

from trainstore.checkpoint.format import manifest as mf
from trainstore.chunks import ChunkStore

DAY = 86400.0
NOW = 1_800_000_000.0  # a fixed "now" for retention tests


def make_ckpt(store, job: str, step: int, *, kind: str = "full", created: float = NOW, base: int | None = None,
              metrics: dict | None = None, nbytes: int = 4096, seed: int | None = None) -> mf.Manifest:
    """Commit a one-tensor checkpoint (its chunk really stored) with metadata we choose."""
    chunks = ChunkStore(store)
    rng = np.random.default_rng(step if seed is None else seed)
    data = rng.integers(0, 255, nbytes, dtype=np.uint8)
    put = chunks.put(memoryview(data), "raw")
    entry = mf.ChunkEntry(put.ref)
    tensor = mf.TensorEntry("numpy:|u1", (nbytes,), nbytes, (entry,))
    m = mf.Manifest(job=job, step=step, kind=kind, tensors={"w": tensor}, skeleton={"$ndarray": "w"},
                    base_step=base if kind == "incremental" else None, chunk_bytes=8 << 20,
                    metadata={"created": created, "metrics": metrics or {}, "config": {}},
                    logical_bytes=nbytes, stored_bytes=put.ref.stored, written_bytes=put.ref.stored)
    mf.commit_manifest(store, m)
    return m
