"""Ready-made transform functions (``fn`` for ``data.transform``), vectorised with numpy.

Every function maps a ``pa.RecordBatch`` to a ``pa.RecordBatch`` and is importable by
worker processes (``trainstore.data.features:byte_tokens`` on the CLI, a documented path that
``data/features.py`` re-exports).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SchemaError


def byte_tokens(batch: pa.RecordBatch, column: str = "text", length: int = 128, keep: list[str] | None = None) -> pa.RecordBatch:
    """Byte-level tokenisation: UTF-8 bytes of ``column`` + 1 (0 is padding), cut or padded to
    ``length`` -> ``tokens`` (fixed_size_list<int32>[length]) and ``n_tokens`` (int32).

    ``keep`` names input columns copied through unchanged (default: none).
    """
    if column not in batch.schema.names:
        raise SchemaError(f"byte_tokens: column {column!r} not in batch ({', '.join(batch.schema.names)})")
    text = batch.column(column)
    if pa.types.is_string(text.type) or pa.types.is_large_string(text.type):
        text = pc.cast(text, pa.large_binary())
    elif not pa.types.is_large_binary(text.type):
        text = pc.cast(text, pa.large_binary())
    text = pc.fill_null(text, b"")
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)[text.offset:text.offset + len(text) + 1]
    data = text.buffers()[2]
    values = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    n = np.minimum(ends - starts, length).astype(np.int64)
    out = np.zeros((len(text), length), dtype=np.int32)
    rows = np.repeat(np.arange(len(text)), n)
    cols = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    out[rows, cols] = values[starts[rows] + cols].astype(np.int32) + 1
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1)), length)
    arrays = [batch.column(k) for k in keep or []]
    names = list(keep or [])
    return pa.RecordBatch.from_arrays([*arrays, tokens, pa.array(n.astype(np.int32))], names=[*names, "tokens", "n_tokens"])
