"""Hugging Face ``datasets`` folders (``Dataset.save_to_disk``) as read-only shard lists.

Such a folder holds ``data-0000i-of-0000N.arrow`` (Arrow IPC *streams*, layout
``"arrow-stream"``), ``state.json`` (``_data_files``: the files in order) and
``dataset_info.json`` (features). A stream has no footer, so its row count is known only
after reading it: each file is read once through the node cache (where serving reads it
again without another fetch from the store).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextlib import AbstractContextManager

import pyarrow as pa

from ...errors import IntegrityError, NotFoundError
from ...nodecache import source_tag
from ...store import ObjectMeta, Store
from ..layouts import ARROW_STREAM
from ..versions import ShardInfo

STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
_DATA_FILE = re.compile(r"(?:.*/)?data-\d+-of-\d+\.arrow$")

#: opens a store object as a local file path for the block: (key, size, content tag) -> context of path
LocalOpener = Callable[[str, int, str | None], AbstractContextManager[str]]


def is_hf_folder(keys: set[str]) -> bool:
    return STATE_FILE in keys or INFO_FILE in keys


def hf_data_files(store: Store, sizes: dict[str, ObjectMeta]) -> list[str]:
    """The folder's data files in order (``state.json``'s ``_data_files``, else by name)."""
    if STATE_FILE in sizes:
        where = f"{store.url}/{STATE_FILE}"
        try:
            state = json.loads(bytes(store.get(STATE_FILE)))
            files = [f["filename"] for f in state["_data_files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"{where}: not a Hugging Face datasets state file ({exc})") from None
        for name in files:
            if name not in sizes:
                raise NotFoundError(f"{where} lists {name!r}, which is not in {store.url}")
        return files
    return sorted(k for k in sizes if _DATA_FILE.match(k))


def describe_hf(store: Store, listed: dict[str, ObjectMeta],
                open_local: LocalOpener) -> tuple[pa.Schema, list[ShardInfo]]:
    """(schema, shards) of the folder (``listed``: the store's objects by key); ``IntegrityError``
    naming a file that is not an Arrow stream or whose schema differs from the first file's."""
    files = hf_data_files(store, listed)
    if not files:
        raise NotFoundError(f"{store.url}: Hugging Face datasets folder without data-*.arrow files")
    schema: pa.Schema | None = None
    shards = []
    for key in files:
        meta = listed[key]
        with open_local(key, meta.size, source_tag(meta)) as path:
            try:
                shard = ARROW_STREAM.open(path)
                rows, file_schema = shard.num_rows, shard.schema
                shard.close()
            except (pa.ArrowException, OSError) as exc:
                raise IntegrityError(f"{store.url}/{key}: not a readable Arrow IPC stream ({exc})") from None
        if schema is None:
            schema = file_schema
        elif not file_schema.equals(schema):
            raise IntegrityError(f"{store.url}/{key}: schema {file_schema} differs from the first file's {schema}")
        shards.append(ShardInfo(key, rows, meta.size, ""))
    assert schema is not None
    return schema, shards


__all__ = ["INFO_FILE", "STATE_FILE", "describe_hf", "hf_data_files", "is_hf_folder"]
