"""A Lance dataset folder as shards: its latest manifest, read with pylance, lists the fragments.

The ``_versions/`` files (small) are copied from the store into a temporary directory and
opened with ``lance.dataset``, which reads only the manifest: any store (local, S3, ...)
works without handing Lance its own credentials. Each fragment must be one data file holding
every column and no deleted rows (``ConfigError`` naming the fragment otherwise: compact the
dataset first); its data file ``data/<name>.lance`` is one shard of layout ``lance``.
"""

from __future__ import annotations

import os
import tempfile

import pyarrow as pa

from ...errors import ConfigError, NotFoundError
from ...store import ObjectMeta, Store
from ..lance_layout import import_lance
from ..versions import ShardInfo

VERSIONS = "_versions/"


def is_lance_folder(keys: set[str]) -> bool:
    return (any(k.startswith(VERSIONS) and k.endswith(".manifest") for k in keys)
            and any(k.startswith("data/") and k.endswith(".lance") for k in keys))


def describe_lance(store: Store, listed: dict[str, ObjectMeta]) -> tuple[pa.Schema, list[ShardInfo]]:
    """(schema, shards) of the Lance dataset at the store's root (latest version)."""
    lance = import_lance(f"{store.url} is a Lance dataset: serving it")
    with tempfile.TemporaryDirectory(prefix="trainstore-lance-") as tmp:
        for key in (k for k in listed if k.startswith(VERSIONS)):
            path = os.path.join(tmp, *key.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(bytes(store.get(key)))
        ds = lance.dataset(tmp)
        schema, fragments = ds.schema, [fr.metadata for fr in ds.get_fragments()]
    n_fields = len(schema)
    shards = []
    for md in fragments:
        where = f"{store.url}: Lance fragment {md.id}"
        if md.deletion_file is not None:
            raise ConfigError(f"{where} has deleted rows; serve a compacted version (dataset.optimize.compact_files())")
        if len(md.files) != 1 or len(md.files[0].fields) != n_fields:
            raise ConfigError(f"{where} spreads its columns over {len(md.files)} data files; serve a "
                              "version written in one go (or compacted)")
        key = f"data/{md.files[0].path}"
        if key not in listed:
            raise NotFoundError(f"{where}: data file {key} is not in the store")
        shards.append(ShardInfo(key, int(md.physical_rows), listed[key].size, ""))
    return schema, shards


__all__ = ["describe_lance", "is_lance_folder"]
