"""Existing data on any store URL as a read-only ``DatasetVersion``, with no conversion.

``describe_external`` lists the store and detects the layout: a Hugging Face ``datasets``
folder (``state.json`` / ``dataset_info.json``, see ``serve.hf``), a Lance dataset
(``_versions/`` + ``data/*.lance``, see ``serve.lancedir``) or a directory of Parquet
files (``*.parquet``, recursively, in name order; names starting with ``_`` or ``.`` such as
``_SUCCESS`` are skipped). Parquet row counts and schema come from the footers, read by byte
ranges. Every file must have the first file's schema (``IntegrityError`` naming the file).
The version is not committed anywhere: number 0, operation ``"external"``, no checksums.
Such files can be rewritten in place, so each shard's content tag as listed (ETag, or a local
file's mtime/size/inode: ``nodecache.source``) goes into ``extra["source_tags"]``: the node
cache and byte-range reads serve only that content (``IntegrityError`` naming a file changed
since), and a new ``Dataset.open`` sees the new one.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import IntegrityError, NotFoundError
from ...nodecache import source_tag
from ...store import ObjectMeta, Store
from ..lance_layout import LANCE
from ..layouts import ARROW_STREAM, PARQUET
from ..versions import DatasetVersion, ShardInfo
from .hf import LocalOpener, describe_hf, is_hf_folder
from .lancedir import describe_lance, is_lance_folder
from .parquet import parquet_footer

#: ``DatasetVersion.extra`` entry of an external version: shard key -> content tag as listed
SOURCE_TAGS = "source_tags"


def _visible(key: str) -> bool:
    return not any(part.startswith(("_", ".")) for part in key.split("/"))


def describe_parquet(store: Store, listed: dict[str, ObjectMeta],
                     footers: dict[str, pq.FileMetaData]) -> tuple[pa.Schema, list[ShardInfo]]:
    """(schema, shards) of the Parquet files (``listed``: the store's objects by key); their
    footers are added to ``footers``."""
    keys = sorted(k for k in listed if k.endswith(".parquet") and _visible(k))
    if not keys:
        raise NotFoundError(f"{store.url}: no Parquet files and no Hugging Face datasets folder")
    schema: pa.Schema | None = None
    shards = []
    for key in keys:
        meta = footers[key] = parquet_footer(store, key, listed[key].size)
        try:
            file_schema = meta.schema.to_arrow_schema()
            file_schema.names  # noqa: B018 - decodes every name: not UTF-8 raises here, not later
        except (pa.ArrowException, ValueError) as exc:
            raise IntegrityError(f"{store.url}/{key}: the footer's schema is not readable ({exc})") from None
        if schema is None:
            schema = file_schema
        elif not file_schema.remove_metadata().equals(schema.remove_metadata()):
            raise IntegrityError(f"{store.url}/{key}: schema {file_schema} differs from the first file's {schema}")
        shards.append(ShardInfo(key, meta.num_rows, listed[key].size, ""))
    assert schema is not None
    return schema, shards


def describe_external(store: Store, open_local: LocalOpener,
                      footers: dict[str, pq.FileMetaData]) -> DatasetVersion:
    """The data at ``store``'s root as a version (see the module docstring); the Parquet
    footers read are added to ``footers`` (so that serving does not read them again)."""
    listed = {m.key: m for m in store.list("")}
    if is_hf_folder(set(listed)):
        layout = ARROW_STREAM.name
        schema, shards = describe_hf(store, listed, open_local)
    elif is_lance_folder(set(listed)):
        layout = LANCE.name
        schema, shards = describe_lance(store, listed)
    else:
        layout = PARQUET.name
        schema, shards = describe_parquet(store, listed, footers)
    name = store.url.rstrip("/").rsplit("/", 1)[-1] or "external"
    tags = {s.key: tag for s in shards if (tag := source_tag(listed[s.key])) is not None}
    return DatasetVersion(name=name, version=0, layout=layout, schema=schema, shards=tuple(shards),
                          operation="external", extra={"source": store.url, SOURCE_TAGS: tags})


__all__ = ["SOURCE_TAGS", "describe_external", "describe_parquet"]
