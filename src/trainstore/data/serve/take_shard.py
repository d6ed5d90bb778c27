"""A shard served by its format's own row access (Lance's ``take``), read per batch.

``OpenShard`` maps a whole Arrow file, so keeping it open costs nothing but address space.
A Lance data file has no zero-copy mapping: opening it whole means decoding every row, and
a random batch touching more shards than the open budget holds then decodes whole files
again and again (measured: a 64-row take over 10 fragments 24 ms, 20x Lance's own take).
``TakeShard`` keeps only the file reader open (no open bytes) and reads the rows a batch
asks for, in the order asked.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import IntegrityError, SchemaError
from ..layouts import ShardLayout
from ..versions import ShardInfo
from .open_shard import ColumnSpec, column_view, copy_rows


class TakeShard:
    """A pinned shard whose rows are read on demand (``ShardLayout.by_row``); ``close``
    releases the node-cache pin."""

    #: what an idle open one holds in memory (``ShardPins``' open budget): the reader only
    open_bytes = 0

    def __init__(self, handle: Any, path: str, info: ShardInfo, layout: ShardLayout,
                 specs: dict[str, ColumnSpec]) -> None:
        self.handle, self.info, self.specs, self.users = handle, info, specs, 0
        self._lock = threading.Lock()  # a Lance file reader serves one call at a time ("Already borrowed")
        try:
            self.file = layout.open(path)
            rows = self.file.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise IntegrityError(f"shard {info.key}: not a readable {layout.title} file ({exc})") from None
        if rows != info.rows:
            raise SchemaError(f"shard {info.key} has {rows} rows, manifest says {info.rows}")

    def _read(self, local: np.ndarray) -> dict[str, np.ndarray]:
        try:
            with self._lock:
                table = self.file.take(local)
            cols = {name: table.column(name).combine_chunks() for name in self.specs}
            if not self.info.checksum:  # an external file, not hash-checked: validate what was read
                for arr in cols.values():
                    arr.validate(full=True)
        except (pa.ArrowException, OSError, KeyError) as exc:
            raise IntegrityError(f"shard {self.info.key}: rows do not read ({exc})") from None
        return {name: column_view(arr, self.specs[name], name, self.info.key) for name, arr in cols.items()}

    def gather(self, local: np.ndarray, out: dict[str, np.ndarray], positions: np.ndarray) -> None:
        """``out[name][positions] = rows local`` for every column."""
        rows = np.arange(len(local))
        for name, values in self._read(np.asarray(local, dtype=np.int64)).items():
            copy_rows(out[name], positions, values, rows)

    def row(self, local: int) -> dict[str, np.ndarray]:
        return {name: values[0] for name, values in self._read(np.array([local], dtype=np.int64)).items()}

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


__all__ = ["TakeShard"]
