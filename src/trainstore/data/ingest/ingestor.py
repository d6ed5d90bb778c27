"""Durable ingestion: records in, Parquet shards and dataset versions out.

Durability contract (``IngestConfig.durability``):

* ``"wal"`` (default): when ``write`` returns, its records are in a local write-ahead log,
  fsynced (see ``data.ingest.wal``). A crashed ``Ingestor`` loses nothing acknowledged: the next
  ``Ingestor`` on the same WAL directory replays it on open, and the records appear in the
  next ``commit()``.
  A ``write`` of at least ``direct_bytes`` skips the log: it is stored as shards of its own
  before ``write`` returns (records already in the log are sealed into a shard first, so order
  is kept). Large writes are then written once instead of twice (log + shard).
* ``"shard"``: no log; when ``write`` returns, its records are in Parquet shards that are
  durable in the store (each ``write`` call ends its own shard, so batch your writes).

In both modes, shards become part of a published dataset version only at ``commit()``, which
writes the version manifest last (``put_if_absent``). Shards that are uploaded but not yet
committed are journaled in the store (``data.ingest.journal``, one entry per upload, direct
write or ``ingest_files`` call) and in the WAL directory; any later ``commit`` on any node
publishes them, even if this node and its local directory are gone. Replay is idempotent:
segment ``seq`` always becomes shard ``ingest-<wal_id>-<seq>.parquet`` (``put_if_absent``),
and a shard already named by the latest version is never added again, so nothing is
duplicated.

Direct writes and ``ingest_files`` are staged: their shards get a journal entry only once all
of them are stored, so a call that fails leaves nothing to commit (its shards are garbage).
``ingest_files`` records each file's BLAKE3 in the version (``DatasetVersion.sources``) and
skips a file whose bytes the dataset already holds, unless ``allow_duplicate_files``.

A failed upload is kept and retried (``upload_retries``, exponential backoff from
``retry_backoff_s``) at the next ``write``, ``flush`` or ``commit``; while it fails, they
raise ``BackgroundError`` and ``commit`` publishes nothing.

Throughput: Parquet encoding (zstd) and uploads run on ``upload_workers`` threads while
``write`` keeps accepting input; ``write`` blocks once ``max_buffered_bytes`` of sealed
segments wait for upload (backpressure bounds memory). An ``Ingestor`` is used from one
thread at a time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

import pyarrow as pa

from ...errors import AlreadyExistsError, SchemaError, TrainstoreError
from ..layouts import PARQUET
from ..leases import ingest_lease
from ..versions import DatasetVersion, ShardInfo, SourceFile, derive, read_shard
from .files import expand_paths
from .journal import delete_entries, file_entry_keys, list_entry_keys, load_entries
from .plan import is_blank, plan_commit, plan_files
from .records import to_table
from .sources import detect_format, read_file
from .writer import IngestWriter

log = logging.getLogger("trainstore.data.ingest")


class Ingestor(IngestWriter):
    """Append records to dataset ``dataset`` in ``store`` durably; ``commit()`` publishes.

    ``Ingestor(store, dataset, schema=None, *, config=IngestConfig(), **store_options)``."""

    def ingest_files(
        self,
        paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        *,
        format: str | None = None,
        batch_bytes: int = 16 << 20,
        progress: Callable[[str, int], None] | None = None,
        allow_duplicate_files: bool = False,
    ) -> int:
        """Ingest JSONL, CSV, Parquet or raw binary files (a path, a glob, or a list of them),
        all or nothing: rows of every file are acknowledged together when this returns; if
        one file fails, nothing of the call is kept. Returns the rows ingested.

        The format comes from the extension (``.jsonl``/``.ndjson``/``.json``, ``.csv``,
        ``.parquet``/``.pq``; anything else is binary: one row ``{name, data}`` per file)
        unless ``format`` says. An empty (or whitespace-only) JSONL/CSV file has no rows. A
        file whose bytes (BLAKE3) the dataset already holds, committed or acknowledged, is
        skipped and listed in ``skipped_files`` with where it is, unless
        ``allow_duplicate_files``. ``progress(path, rows)`` is called after each file.
        """
        self._check()
        files = expand_paths(paths)
        known = {} if allow_duplicate_files else self._known_sources()
        plans, self.skipped_files = plan_files(files, known, allow_duplicate_files)
        for path, where in self.skipped_files:
            log.info("skipped %s: its content is already in %s", path, where)
        self._seal()  # records written before this call keep their place
        schema_before = self.schema
        sources: list[SourceFile] = []
        try:
            for plan in plans:
                rows = self._stage_file(plan.path, plan.name, format, batch_bytes)
                sources.append(SourceFile(plan.name, plan.blake3, rows, plan.bytes))
                if progress is not None:
                    progress(plan.path, rows)
            self._accept_staged(tuple(sources))
        except BaseException:
            self._discard_staged()
            self.schema = schema_before
            raise
        return sum(s.rows for s in sources)

    def _stage_file(self, path: str, name: str, format: str | None, batch_bytes: int) -> int:
        """Read one file into staged shards; its row count. ``SchemaError`` names the file."""
        fmt = format or detect_format(path)
        if fmt in ("jsonl", "csv") and is_blank(path):
            return 0
        rows = 0
        try:
            for table in read_file(path, format=format, schema=self.schema, batch_bytes=batch_bytes, name=name):
                if table.num_rows == 0:
                    continue  # an empty batch (a header-only CSV) fixes no schema
                table = to_table(table, self.schema)
                if self.schema is None:
                    self.schema = table.schema
                self._stage(table)
                rows += table.num_rows
        except SchemaError as exc:
            text = str(exc)
            raise SchemaError(text if text.startswith(path) else f"{path}: {text}") from None
        return rows


    def _known_sources(self) -> dict[str, str]:
        """``{blake3: where}`` of files the dataset holds: committed, or acknowledged by any
        writer and not yet committed."""
        known = self._sources.refresh()
        with self._mu:
            entries = list(self._entries.values())
        mine = {e.key for e in entries}
        others = [k for k in file_entry_keys(list_entry_keys(self.store, self.dataset)) if k not in mine]
        for entry in [*entries, *load_entries(self.store, self.dataset, others)]:
            for src in entry.sources:
                known.setdefault(src.blake3, f"an acknowledged, uncommitted ingest ({entry.key})")
        for src in self._empty_sources:
            known.setdefault(src.blake3, "an acknowledged, uncommitted ingest")
        return known


    # -- publishing ------------------------------------------------------------------------
    def pending_shards(self) -> list[ShardInfo]:
        """Uploaded shards the next ``commit`` will publish, in write order."""
        with self._mu:
            return [info for _, info in sorted(self._pending.values(), key=lambda p: p[0])]

    def commit(self, extra: dict | None = None) -> DatasetVersion:
        """Flush and publish a new version: the previous version's shards plus every
        acknowledged shard in the store's journal (this writer's, and those of writers that
        died). Raises, publishing nothing, while an upload fails. With nothing to add it
        returns the latest version (or publishes an empty one that fixes no schema)."""
        self.flush()
        for _attempt in range(10):
            listing = list_entry_keys(self.store, self.dataset)
            with self._mu:
                mine = dict(self._entries)
                own_pending = [info for _, info in sorted(self._pending.values(), key=lambda p: p[0])]
            entries = [*mine.values(), *load_entries(self.store, self.dataset,
                                                     [k for *_, k in listing if k not in mine])]
            parent = self._load_latest()
            have = {s.key for s in parent.shards} if parent else set()
            plan = plan_commit(entries, self.wal.wal_id, own_pending, have, self._empty_sources)
            if parent is not None and not plan.fresh:
                self._latest = parent
                self._forget_pending(plan.retire)
                return parent
            schema = self.schema
            if schema is None and plan.fresh:  # a new node adopting a dead writer's shards
                schema = self.schema = self._shard_schema(plan.fresh[0])
            if parent is not None and parent.rows and schema is None:
                schema = parent.schema
            cfg = {
                "shard_bytes": self.config.shard_bytes,
                "compression": self.config.compression,
                "compression_level": self.config.compression_level,
                "durability": self.config.durability,
            }
            try:
                version = derive(
                    self.store, (parent,) if parent else (), "ingest", cfg,
                    (*(parent.shards if parent else ()), *plan.fresh), name=self.dataset, layout=PARQUET.name,
                    schema=schema if schema is not None else pa.schema([]),
                    extra={"added_shards": len(plan.fresh), "added_rows": sum(s.rows for s in plan.fresh),
                           **(extra or {})},
                    sources=plan.sources, version=(parent.version + 1) if parent else 1,
                )
            except AlreadyExistsError:
                continue  # another writer committed first: rebase on its version
            self._latest = version
            self._forget_pending(plan.retire)
            return version
        raise AlreadyExistsError(f"could not commit {self.dataset!r}: lost the race 10 times")

    def _shard_schema(self, info: ShardInfo) -> pa.Schema:
        return PARQUET.open(read_shard(self.store, info)).schema

    def _forget_pending(self, retire: tuple[str, ...] = ()) -> None:
        """After a commit: clear what it published and retire its journal entries."""
        with self._mu:
            self._pending.clear()
            self._entries.clear()
            self._empty_sources.clear()
            self.wal.reset_journal([], high_seq=self._seq)
        delete_entries(self.store, retire)
        try:  # every shard below _seq is now committed: the lease keeps only later ones
            ingest_lease(self.store, self.dataset, self.wal.wal_id, from_seq=self._seq).write()
        except TrainstoreError as exc:  # the wider lease stays: safe, it only delays gc
            log.warning("could not narrow the gc lease of %s: %s", self.dataset, exc)


    def __enter__(self) -> Ingestor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



__all__ = ["Ingestor"]
