"""The demo's feature function (``fn`` of ``data.transform``): split, then byte tokens.

Top-level and importable, so transform workers (spawned processes or Ray) can run it.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..data.transforms import byte_tokens
from ..errors import ConfigError

SPLITS = ("train", "val")


def split_tokens(batch: pa.RecordBatch, split: str = "train", val_every: int = 10, length: int = 64) -> pa.RecordBatch:
    """Rows of ``split`` (``val``: ids divisible by ``val_every``) -> ``label``, ``tokens``,
    ``n_tokens``. The split is a function of the id, so it is stable across runs."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    if val_every < 1:
        raise ConfigError(f"val_every must be >= 1, got {val_every}")
    ids = batch.column("id")
    remainder = pc.subtract(ids, pc.multiply(pc.divide(ids, val_every), val_every))  # integer division
    is_val = pc.equal(remainder, 0)
    rows = batch.filter(is_val if split == "val" else pc.invert(is_val))
    return byte_tokens(rows, column="text", length=length, keep=["label"])


__all__ = ["SPLITS", "split_tokens"]
