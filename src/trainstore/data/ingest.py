"""Durable ingestion: records in, Parquet shards and dataset versions out.

Durability contract (``IngestConfig.durability``):

* ``"wal"`` (default): when ``write`` returns, its records are in a local write-ahead log,
  fsynced (see ``data.wal``). A crashed ``Ingestor`` loses nothing acknowledged: the next
  ``Ingestor`` on the same WAL directory replays it on open, and the records appear in the
  next ``commit()``.
  A ``write`` of at least ``direct_bytes`` skips the log: it is stored as shards of its own
  before ``write`` returns (records already in the log are sealed into a shard first, so order
  is kept). Large writes are then written once instead of twice (log + shard).
* ``"shard"``: no log; when ``write`` returns, its records are in Parquet shards that are
  durable in the store (each ``write`` call ends its own shard, so batch your writes).

In both modes, shards become part of a published dataset version only at ``commit()``, which
writes the version manifest last (``put_if_absent``). Shards that are uploaded but not yet
committed are journaled in the store (``data.ingest_journal``, one entry per upload, direct
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

import glob as globlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..chunks import content_hash
from ..errors import (
    AlreadyExistsError,
    BackgroundError,
    ConfigError,
    NotFoundError,
    SchemaError,
    TrainstoreError,
)
from ..provenance import code_version, trainstore_version
from ..store import Store, open_store
from .ingest_journal import (
    PendingEntry,
    delete_entries,
    file_entry_keys,
    list_entry_keys,
    load_entries,
    put_entry,
)
from .ingest_plan import is_blank, plan_commit, plan_files
from .leases import ingest_lease
from .lineage import SourcesIndex, config_hash
from .records import conform, to_table
from .sources import detect_format, read_file
from .versions import (
    DatasetVersion,
    ShardInfo,
    SourceFile,
    check_name,
    commit_version,
    load_version,
    read_shard,
    shards_prefix,
)
from .wal import WriteAheadLog

DURABILITY = ("wal", "shard")
log = logging.getLogger("trainstore.data.ingest")


@dataclass(frozen=True)
class IngestConfig:
    """How an ``Ingestor`` buffers, logs and uploads.

    ``shard_bytes``: target in-memory (Arrow) size of one shard before compression.
    ``max_buffered_bytes``: sealed-but-not-uploaded bytes above which ``write`` blocks.
    ``wal_dir``: local directory of the write-ahead log and upload journal; default
    ``$TRAINSTORE_WAL_DIR`` or ``~/.cache/trainstore/wal``, one subdirectory per store+dataset.
    ``direct_bytes``: in "wal" mode, a ``write`` of at least this many (Arrow) bytes goes
    straight to shards, not through the log (None: always the log). Measured with 1 MB
    records in 64 MiB writes: a published version 0.50x -> ~1.0x of a plain pyarrow write.
    ``upload_retries``: how often a failed shard upload is retried per ``write`` / ``flush`` /
    ``commit`` call (waiting ``retry_backoff_s``, doubling) before that call raises; the shard
    is kept and retried again at the next call.
    """

    shard_bytes: int = 64 << 20
    durability: str = "wal"
    max_buffered_bytes: int = 256 << 20
    upload_workers: int = 4
    wal_dir: str | None = None
    compression: str = "zstd"
    compression_level: int | None = 1
    direct_bytes: int | None = 16 << 20
    upload_retries: int = 3
    retry_backoff_s: float = 0.5

    def __post_init__(self) -> None:
        if self.durability not in DURABILITY:
            raise ConfigError(f"durability must be one of {DURABILITY}, got {self.durability!r}")
        if self.shard_bytes <= 0 or self.max_buffered_bytes <= 0 or self.upload_workers <= 0:
            raise ConfigError("shard_bytes, max_buffered_bytes and upload_workers must be positive")
        if self.direct_bytes is not None and self.direct_bytes <= 0:
            raise ConfigError(f"direct_bytes must be positive or None, got {self.direct_bytes}")
        if self.upload_retries < 0 or self.retry_backoff_s < 0:
            raise ConfigError("upload_retries and retry_backoff_s must not be negative")


def default_wal_dir(store_url: str, dataset: str) -> str:
    base = os.environ.get("TRAINSTORE_WAL_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "trainstore", "wal"
    )
    tag = hashlib.sha256(f"{store_url}\n{dataset}".encode()).hexdigest()[:16]
    return os.path.join(base, f"{dataset}-{tag}")


def encode_parquet(table: pa.Table, compression: str, level: int | None) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression, compression_level=level)
    return sink.getvalue()


class Ingestor:
    """Append records to dataset ``dataset`` in ``store`` durably; ``commit()`` publishes."""

    def __init__(
        self,
        store: Store | str,
        dataset: str,
        schema: pa.Schema | None = None,
        *,
        config: IngestConfig | None = None,
        **store_options: object,
    ) -> None:
        self.config = config or IngestConfig()
        self.store = open_store(store, **store_options)
        self.dataset = check_name(dataset)
        self._latest = self._load_latest()
        if self._latest is not None and self._latest.rows:  # an empty version fixes no schema
            if schema is not None and not schema.equals(self._latest.schema, check_metadata=False):
                raise SchemaError(
                    f"schema differs from {self._latest.id}'s: given {schema}, dataset has "
                    f"{self._latest.schema}"
                )
            schema = self._latest.schema
        self.schema: pa.Schema | None = schema
        wal_dir = self.config.wal_dir or default_wal_dir(self.store.url, self.dataset)
        self.wal = WriteAheadLog(wal_dir, self.store.url, self.dataset)
        try:  # data gc keeps this WAL id's uncommitted shards, even after a crash (data/leases.py)
            ingest_lease(self.store, self.dataset, self.wal.wal_id).write()
        except BaseException:
            self.wal.close()
            raise
        self._mu = threading.Condition()
        self._pool = ThreadPoolExecutor(self.config.upload_workers, thread_name_prefix="ts-ingest")
        self._futures: set[Future] = set()
        self._inflight_bytes = 0
        self._pending: dict[str, tuple[int, ShardInfo]] = {}
        self._failed: dict[int, tuple[pa.Table, bool]] = {}  # seq -> (table, staged): retried
        self._staged: dict[int, ShardInfo] = {}  # stored shards of the running staged call
        self._entries: dict[str, PendingEntry] = {}  # journal entries this Ingestor wrote
        self._empty_sources: list[SourceFile] = []  # ingested files without rows
        self._sources = SourcesIndex(self.store, self.dataset)
        self.skipped_files: list[tuple[str, str]] = []  # last ingest_files: (path, where it is)
        self._buffer: list[pa.Table] = []
        self._buffer_bytes = 0
        self._seq = 0
        self._segment_open = False
        self.recovered_rows = 0
        try:
            self._recover()
        except BaseException:
            self.close()
            raise

    # -- recovery --------------------------------------------------------------------------
    def _load_latest(self) -> DatasetVersion | None:
        try:
            return load_version(self.store, self.dataset)
        except NotFoundError:
            return None

    def _recover(self) -> None:
        committed = {s.key for s in self._latest.shards} if self._latest else set()
        for seq, info in self.wal.uploaded():
            if info.key not in committed:
                self._pending[info.key] = (seq, info)
        for seq in self.wal.segments():
            tables = self.wal.truncate_torn_tail(seq)
            if tables:
                table = pa.concat_tables(tables)
                if self.schema is None:
                    self.schema = table.schema
                table = conform(table, self.schema)
                self.recovered_rows += table.num_rows
                self._upload(seq, table, 0)
            else:
                self.wal.drop_segment(seq)
        self._seq = max(self.wal.max_seq(), self._max_stored_seq()) + 1

    def _max_stored_seq(self) -> int:
        """Highest segment number with a shard in the store: a crash can leave a shard whose
        journal line was torn (never acknowledged); its number must not be reused."""
        prefix = f"{shards_prefix(self.dataset)}ingest-{self.wal.wal_id}-"
        seqs = [0]
        for meta in self.store.list(prefix):
            stem = meta.key[len(prefix):].removesuffix(".parquet")
            if stem.isdigit():
                seqs.append(int(stem))
        return max(seqs)

    # -- writing ---------------------------------------------------------------------------
    def _check(self) -> None:
        """Retry failed uploads (with backoff); raise while some still fail. They are kept:
        an upload error is reported at every call until the shard is stored."""
        delay = self.config.retry_backoff_s
        last: BaseException | None = None
        for attempt in range(self.config.upload_retries + 1):
            if not self._failed:
                return
            if attempt:
                time.sleep(delay)
                delay *= 2
            for seq in sorted(self._failed):
                table, staged = self._failed[seq]
                try:
                    self._upload(seq, table, 0, staged)
                except Exception as exc:  # noqa: BLE001 - kept and reported below, never dropped
                    last = exc
                    break  # the store still fails: back off before the next round
                del self._failed[seq]
        if self._failed:
            raise BackgroundError(
                f"{len(self._failed)} shard upload(s) of {self.dataset!r} still fail after "
                f"{self.config.upload_retries} retries (kept; retried at the next call): {last}") from last

    def write(self, data: Any) -> int:
        """Append records; durable on return (see the module docstring). Returns the row count."""
        self._check()
        table = to_table(data, self.schema)
        if table.num_rows == 0:
            return 0
        direct = self.config.durability == "shard" or (
            self.config.direct_bytes is not None and table.nbytes >= self.config.direct_bytes)
        if not direct:
            self._log(table)
            self._fix_schema(table.schema)
            return table.num_rows
        self._fix_schema(table.schema)
        if self.config.durability == "wal":
            self._seal()  # records already in the log become a shard first: order is kept
        self._stage(table)
        self._accept_staged()  # durable on return: every shard of this write is stored
        return table.num_rows

    def _fix_schema(self, schema: pa.Schema) -> None:
        """The first stored write fixes the schema (a write that failed does not)."""
        if self.schema is None:
            self.schema = schema

    def _log(self, table: pa.Table) -> None:
        """Log one write as one WAL frame, so it is logged whole or (if the append fails) not
        at all: a write is never split across segments, and a write larger than
        ``shard_bytes`` becomes a shard of its own."""
        if self._buffer and self._buffer_bytes + table.nbytes > self.config.shard_bytes:
            self._seal()
        self._append(table)
        if self._buffer_bytes >= self.config.shard_bytes:
            self._seal()

    def _append(self, table: pa.Table, logged: bool = True) -> None:
        if logged:
            if not self._segment_open:
                self.wal.open_segment(self._seq)
                self._segment_open = True
            self.wal.append(table)
        self._buffer.append(table)
        self._buffer_bytes += table.nbytes

    def _seal(self) -> None:
        """Hand the buffered segment to an upload worker (blocking while over budget)."""
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        nbytes = self._buffer_bytes
        seq = self._seq
        staged = not self._segment_open  # not in the log: acknowledged by _accept_staged
        self.wal.close_segment()
        self._segment_open = False
        self._buffer, self._buffer_bytes = [], 0
        self._seq += 1
        with self._mu:
            while self._futures and self._inflight_bytes + nbytes > self.config.max_buffered_bytes:
                self._mu.wait()
            self._inflight_bytes += nbytes
            future = self._pool.submit(self._upload, seq, table, nbytes, staged)
            self._futures.add(future)
        future.add_done_callback(lambda f: self._done(f, seq, table, staged))

    def _done(self, future: Future, seq: int, table: pa.Table, staged: bool) -> None:
        with self._mu:
            self._futures.discard(future)
            exc = future.exception()
            if exc is not None:
                self._failed[seq] = (table, staged)  # kept and retried by _check
            self._mu.notify_all()

    def _upload(self, seq: int, table: pa.Table, nbytes: int, staged: bool = False) -> ShardInfo:
        """Store segment ``seq`` as a shard; unless ``staged``, journal it (store, then WAL
        directory) and drop its log segment."""
        try:
            key = f"{shards_prefix(self.dataset)}ingest-{self.wal.wal_id}-{seq:08d}.parquet"
            data = encode_parquet(table, self.config.compression, self.config.compression_level)
            info = ShardInfo(key, table.num_rows, data.size, content_hash(data))
            try:
                self.store.put_if_absent(key, data)
            except AlreadyExistsError:
                info = self._existing(key)  # replay of a segment whose upload had finished
            if staged:
                with self._mu:
                    self._staged[seq] = info
                return info
            self._journal(PendingEntry(self.dataset, self.wal.wal_id, seq, (info,)))
            with self._mu:
                self.wal.record_uploaded(seq, info)
                self._pending[key] = (seq, info)
            self.wal.drop_segment(seq)
            return info
        finally:
            with self._mu:
                self._inflight_bytes -= nbytes

    def _journal(self, entry: PendingEntry) -> None:
        put_entry(self.store, entry)
        with self._mu:
            self._entries[entry.key] = entry

    def _accept_staged(self, sources: tuple[SourceFile, ...] = ()) -> None:
        """Store every staged shard, then acknowledge them together with one journal entry.
        On failure the staged shards are discarded (the caller's call was not acknowledged)."""
        try:
            self.flush()
        except BaseException:
            self._discard_staged()
            raise
        with self._mu:
            staged = sorted(self._staged.items())
            self._staged.clear()
        if not staged:
            self._empty_sources.extend(sources)
            return
        try:
            self._journal(PendingEntry(self.dataset, self.wal.wal_id, staged[0][0], tuple(i for _, i in staged),
                                       sources))
        except BaseException:
            self._discard_staged(staged)
            raise
        with self._mu:
            for seq, info in staged:
                self.wal.record_uploaded(seq, info)
                self._pending[info.key] = (seq, info)

    def _discard_staged(self, stored: list[tuple[int, ShardInfo]] | None = None) -> None:
        """Forget the staged call's shards (unacknowledged); delete stored ones if we can."""
        self._buffer, self._buffer_bytes = [], 0
        with self._mu:
            while self._futures:
                self._mu.wait()
            stored = stored if stored is not None else list(self._staged.items())
            self._staged.clear()
            for seq in [q for q, (_, staged) in self._failed.items() if staged]:
                del self._failed[seq]
        for _, info in stored:
            try:
                self.store.delete(info.key)
            except (TrainstoreError, OSError) as exc:  # garbage for the data GC
                log.warning("could not delete discarded shard %s: %s", info.key, exc)

    def _existing(self, key: str) -> ShardInfo:
        data = self.store.get(key)
        rows = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data))).metadata.num_rows
        return ShardInfo(key, rows, memoryview(data).nbytes, content_hash(data))

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

    def _stage(self, table: pa.Table) -> None:
        """Buffer ``table`` outside the log, sealed into shards of ``shard_bytes``."""
        per_row = max(1, table.nbytes // table.num_rows)
        start = 0
        while start < table.num_rows:
            piece = table.slice(start, max(1, (self.config.shard_bytes - self._buffer_bytes) // per_row))
            start += piece.num_rows
            self._append(piece, logged=False)
            if self._buffer_bytes >= self.config.shard_bytes:
                self._seal()

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

    def flush(self) -> None:
        """Seal the buffered records into a shard and wait until every shard is uploaded."""
        self._seal()
        with self._mu:
            while self._futures:
                self._mu.wait()
        self._check()

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
            version = DatasetVersion(
                name=self.dataset,
                version=(parent.version + 1) if parent else 1,
                layout="parquet",
                schema=schema if schema is not None else pa.schema([]),
                shards=(*(parent.shards if parent else ()), *plan.fresh),
                parents=(parent.id,) if parent else (),
                operation="ingest",
                config=cfg,
                config_hash=config_hash(cfg),
                code_version=code_version(), trainstore_version=trainstore_version(),
                extra={"added_shards": len(plan.fresh), "added_rows": sum(s.rows for s in plan.fresh),
                       **(extra or {})},
                sources=plan.sources,
            )
            try:
                version = commit_version(self.store, version)
            except AlreadyExistsError:
                continue  # another writer committed first: rebase on its version
            self._latest = version
            self._forget_pending(plan.retire)
            return version
        raise AlreadyExistsError(f"could not commit {self.dataset!r}: lost the race 10 times")

    def _shard_schema(self, info: ShardInfo) -> pa.Schema:
        return pq.read_schema(pa.BufferReader(pa.py_buffer(read_shard(self.store, info))))

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

    def close(self) -> None:
        """Stop the upload workers (waiting for running uploads) and release the WAL.

        Buffered records of mode "wal" stay in the log and are replayed by the next Ingestor.
        """
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)
        wal = getattr(self, "wal", None)
        if wal is not None:
            wal.close()

    def __enter__(self) -> Ingestor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Paths and globs -> sorted existing files; ``NotFoundError`` naming what matched nothing."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[str] = []
    for item in items:
        text = os.fspath(item)
        if any(c in text for c in "*?["):
            matches = sorted(p for p in globlib.glob(text, recursive=True) if os.path.isfile(p))
            if not matches:
                raise NotFoundError(f"no file matches {text!r}")
            out.extend(matches)
        elif os.path.isfile(text):
            out.append(text)
        elif os.path.isdir(text):
            found = sorted(
                os.path.join(d, f) for d, _, fs in os.walk(text) for f in fs if not f.startswith(".")
            )
            out.extend(found)
        else:
            raise NotFoundError(f"input file {text!r} does not exist")
    return out


__all__ = ["IngestConfig", "Ingestor", "default_wal_dir", "encode_parquet", "expand_paths"]
