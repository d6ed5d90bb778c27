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

from ...errors import IntegrityError, InvalidKeyError, NotFoundError
from ...nodecache import source_tag
from ...store import ObjectMeta, Store, validate_key
from ..layouts import ARROW_STREAM
from ..versions import ShardInfo

STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
_DATA_FILE = re.compile(r"(?:.*/)?data-\d+-of-\d+\.arrow$")

#: opens a store object as a local file path for the block: (key, size, content tag) -> context of path
LocalOpener = Callable[[str, int, str | None], AbstractContextManager[str]]


def is_hf_folder(keys: set[str]) -> bool:
    return STATE_FILE in keys or INFO_FILE in keys


def hf_data_files(store: Store, listed: dict[str, ObjectMeta]) -> list[str]:
    """The folder's data files in order (``state.json``'s ``_data_files``, else by name);
    ``IntegrityError`` naming ``state.json`` if it is not a state file listing files of the folder."""
    if STATE_FILE in listed:
        where = f"{store.url}/{STATE_FILE}"
        try:
            state = json.loads(bytes(store.get(STATE_FILE)))
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested past the parser
            raise IntegrityError(f"{where}: not a Hugging Face datasets state file: not JSON "
                                 f"({type(exc).__name__}: {str(exc)[:200]})") from None
        files = _listed_files(state, where)
        for name in files:
            if name not in listed:
                raise NotFoundError(f"{where} lists {name!r}, which is not in {store.url}")
        return files
    return sorted(k for k in listed if _DATA_FILE.match(k))


def _listed_files(state: object, where: str) -> list[str]:
    """``state["_data_files"][i]["filename"]``, each a store key, none twice, at least one."""
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(entries, list) or not entries:
        raise IntegrityError(f"{where}: not a Hugging Face datasets state file (needs a non-empty "
                             f"'_data_files' list, got {str(entries)[:80]!r})")
    files: list[str] = []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise IntegrityError(f"{where}: entry {str(entry)[:80]!r} of '_data_files' has no 'filename' string")
        try:
            validate_key(name)
        except InvalidKeyError as exc:
            raise IntegrityError(f"{where}: data file {name[:80]!r} is not a file of the folder ({exc})") from None
        if name in files:
            raise IntegrityError(f"{where}: lists data file {name!r} twice")
        files.append(name)
    return files


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
                file_schema.names  # noqa: B018 - decodes every name: not UTF-8 raises here, not later
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise IntegrityError(f"{store.url}/{key}: not a readable Arrow IPC stream ({exc})") from None
        if schema is None:
            schema = file_schema
        elif not file_schema.equals(schema):
            raise IntegrityError(f"{store.url}/{key}: schema {file_schema} differs from the first file's {schema}")
        shards.append(ShardInfo(key, rows, meta.size, ""))
    assert schema is not None
    return schema, shards


__all__ = ["INFO_FILE", "STATE_FILE", "describe_hf", "hf_data_files", "is_hf_folder"]
