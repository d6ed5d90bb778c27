"""The ``lance`` shard layout: one data file of a Lance dataset fragment, read with pylance.

A Lance dataset (``pylance``, the ``lance`` extra) is served as it is, read-only, like an
external Parquet directory (``serve.lancedir`` describes it from its manifest): each fragment's
data file is one shard. ``LanceFileReader`` reads a local file (the node-cache copy): whole
(``batches``, decoded into Arrow memory when the shard is opened), by row range, or by Lance's
own take for chosen rows (``take``). Writing Lance files is Lance's job: ``encode`` refuses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from .layouts import ShardFile, ShardLayout, ShardSource, register_layout


def import_lance(what: str = "serving a Lance dataset") -> ModuleType:
    """The ``lance`` module (pylance, an optional extra, imported on use); ``ConfigError`` saying
    how to install it if it is missing."""
    try:
        import lance  # noqa: PLC0415
        import lance.file  # noqa: PLC0415
    except ImportError:
        raise ConfigError(f"{what} needs pylance (pip install 'trainstore[lance]')") from None
    return lance


def _reader(path: str) -> Any:
    return import_lance().file.LanceFileReader(path)


class _LanceFile(ShardFile):
    def __init__(self, source: ShardSource) -> None:
        if not isinstance(source, str):
            raise ConfigError("a Lance data file is read from a local path (the node-cache copy), not from bytes")
        self._reader = _reader(source)
        self._table: pa.Table | None = None

    def _all(self) -> pa.Table:
        if self._table is None:
            self._table = self._reader.read_all().to_table()
        return self._table

    @property
    def num_rows(self) -> int:
        return int(self._reader.metadata().num_rows)

    @property
    def schema(self) -> pa.Schema:
        return self._all().schema

    def batches(self) -> list[pa.RecordBatch]:
        return self._all().to_batches()

    def iter_batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        for start in range(0, self.num_rows, batch_rows):
            yield from self.read_rows(start, min(start + batch_rows, self.num_rows)).to_batches()

    def read_rows(self, start: int, stop: int) -> pa.Table:
        return self._reader.read_range(start, max(0, stop - start)).to_table()

    def take(self, rows: Sequence[int]) -> pa.Table:
        """Rows in the order asked, by Lance's own take (which wants them ascending and unique)."""
        wanted = np.asarray(rows, dtype=np.int64)
        unique, back = np.unique(wanted, return_inverse=True)
        return self._reader.take_rows(unique.tolist()).to_table().take(pa.array(back))

    def byte_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        raise ConfigError("byte ranges of a Lance file are Lance's own business: read it from a local copy")


class LanceLayout(ShardLayout):
    name, title, suffix, servable, by_row = "lance", "Lance", ".lance", True, True

    def encode(self, table: pa.Table, **options: Any) -> pa.Buffer:
        raise ConfigError("trainstore serves Lance datasets as they are; write them with lance.write_dataset")

    def open(self, source: ShardSource) -> ShardFile:
        return _LanceFile(source)


LANCE = register_layout(LanceLayout())

__all__ = ["LANCE", "LanceLayout", "import_lance"]
