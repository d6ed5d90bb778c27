"""The ingest journal in the store: acknowledged shards that no version names yet.

An ``Ingestor`` acknowledges a stored shard (or the group of shards of one ``ingest_files``
call or one direct write) by writing one small entry, after the shards themselves::

    datasets/<name>/pending/<writer>-<seq:08d>.json         shards of plain writes
    datasets/<name>/pending/<writer>-<seq:08d>-files.json   shards + source files of an ingest

``writer`` is the Ingestor's WAL id and ``seq`` its first shard's sequence number, so entries
sort in write order per writer. ``commit`` publishes the shards of every entry it finds (its
own and those of writers that died, even with their local directory lost) and deletes the
entries after the version is committed. An entry names whole groups only, so a commit
publishes all of an ingest or none of it. An entry whose shards are already in the latest
version is stale (a writer replayed an upload a commit had already published) and is simply
deleted. A data GC must list entries *before* versions: an entry disappears only after the
version naming its shards exists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from ...chunks import content_hash
from ...errors import ManifestError, NotFoundError
from ...store.base import Store
from ..versions import ShardInfo, SourceFile, check_name, list_versions, load_version

PENDING_DIR = "pending"
_FILES_SUFFIX = "-files.json"


def pending_prefix(name: str) -> str:
    return f"datasets/{check_name(name)}/{PENDING_DIR}/"


@dataclass(frozen=True)
class PendingEntry:
    """Shards (in order) that one writer acknowledged together, and the files they came from."""

    dataset: str
    writer: str
    seq: int
    shards: tuple[ShardInfo, ...]
    sources: tuple[SourceFile, ...] = ()

    @property
    def key(self) -> str:
        suffix = _FILES_SUFFIX if self.sources else ".json"
        return f"{pending_prefix(self.dataset)}{self.writer}-{self.seq:08d}{suffix}"


def put_entry(store: Store, entry: PendingEntry) -> None:
    """Store ``entry`` (after its shards are durable): from now on its rows are acknowledged."""
    obj = {"writer": entry.writer, "seq": entry.seq, "shards": [asdict(s) for s in entry.shards],
           "sources": [asdict(s) for s in entry.sources]}
    body = json.dumps(obj, sort_keys=True).encode()
    store.put(entry.key, json.dumps({**obj, "checksum": content_hash(body)}, sort_keys=True).encode())


def _parse(dataset: str, key: str, raw: bytes) -> PendingEntry:
    try:
        obj = json.loads(raw)
        expected = obj.pop("checksum")
        if content_hash(json.dumps(obj, sort_keys=True).encode()) != expected:
            raise ManifestError(f"ingest journal entry {key}: checksum mismatch (corrupted)")
        return PendingEntry(
            dataset, str(obj["writer"]), int(obj["seq"]),
            tuple(ShardInfo(s["key"], int(s["rows"]), int(s["bytes"]), str(s["checksum"])) for s in obj["shards"]),
            tuple(SourceFile(str(s["path"]), str(s["blake3"]), int(s["rows"]), int(s["bytes"]))
                  for s in obj["sources"]),
        )
    except ManifestError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"ingest journal entry {key} is malformed: {type(exc).__name__}: {exc}") from None


def _writer_seq(name: str) -> tuple[str, int] | None:
    stem = name.removesuffix(_FILES_SUFFIX).removesuffix(".json")
    writer, _, seq = stem.rpartition("-")
    return (writer, int(seq)) if writer and seq.isdigit() else None


def list_entry_keys(store: Store, dataset: str) -> list[tuple[str, int, str]]:
    """(writer, seq, key) of every entry, sorted by writer then sequence number."""
    out = []
    for meta in store.list(pending_prefix(dataset)):
        parsed = _writer_seq(meta.key.rsplit("/", 1)[-1])
        if parsed is not None:
            out.append((*parsed, meta.key))
    return sorted(out)


def load_entries(store: Store, dataset: str, keys: Iterable[str]) -> list[PendingEntry]:
    """The entries at ``keys`` that still exist (one deleted meanwhile was committed)."""
    out = []
    for key in keys:
        try:
            raw = store.get(key)
        except NotFoundError:
            continue
        out.append(_parse(dataset, key, bytes(raw)))
    return out


def file_entry_keys(keys: Iterable[tuple[str, int, str]]) -> list[str]:
    """The keys of entries that record source files (the ones an ingest dedup must read)."""
    return [key for _, _, key in keys if key.endswith(_FILES_SUFFIX)]


def delete_entries(store: Store, keys: Iterable[str]) -> None:
    """Remove committed entries; one left behind (a failed delete) is stale and harmless."""
    for key in keys:
        try:
            store.delete(key)
        except (NotFoundError, OSError):
            continue


def live_shard_keys(store: Store, dataset: str) -> set[str]:
    """Shards a data GC must keep for ``dataset``: named by a journal entry or a version.

    Entries are listed before versions (see the module docstring)."""
    keys = {s.key for e in load_entries(store, dataset, [k for *_, k in list_entry_keys(store, dataset)])
            for s in e.shards}
    for ver in list_versions(store, dataset):
        keys.update(s.key for s in load_version(store, dataset, ver).shards)
    return keys


__all__ = ["PENDING_DIR", "PendingEntry", "delete_entries", "file_entry_keys", "list_entry_keys",
           "live_shard_keys", "load_entries", "pending_prefix", "put_entry"]
