"""The write path of an ``Ingestor``: records into the WAL, sealed segments into stored shards.

``IngestWriter`` is the part of ``Ingestor`` (``data.ingest.ingestor``, which adds
``ingest_files`` and ``commit``) that makes ``write`` durable: it opens the dataset's WAL
and its gc lease, replays what a crashed writer logged, appends each ``write`` as one WAL
frame (or, for large writes and mode ``"shard"``, stages it straight into shards), seals
segments into Parquet shards uploaded by a thread pool under backpressure, and acknowledges
each stored shard (or group of staged shards) with one journal entry in the store. Failed
uploads are kept and retried. See ``data.ingest.ingestor`` for the durability contract.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from ...chunks import content_hash
from ...errors import (
    AlreadyExistsError,
    BackgroundError,
    NotFoundError,
    SchemaError,
    TrainstoreError,
)
from ...store import Store, open_store
from ..layouts import PARQUET
from ..leases import ingest_lease
from ..versions import (
    DatasetVersion,
    ShardInfo,
    SourceFile,
    check_name,
    load_version,
    shards_prefix,
)
from .config import IngestConfig, default_wal_dir
from .files import SourcesIndex
from .journal import PendingEntry, put_entry
from .records import conform, to_table
from .wal import WriteAheadLog

log = logging.getLogger("trainstore.data.ingest")


class IngestWriter:
    """Append records to dataset ``dataset`` in ``store`` durably (see the module docstring)."""

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
            data = PARQUET.encode(table, compression=self.config.compression,
                                  compression_level=self.config.compression_level)
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
        rows = PARQUET.open(data).num_rows
        return ShardInfo(key, rows, memoryview(data).nbytes, content_hash(data))


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


    def flush(self) -> None:
        """Seal the buffered records into a shard and wait until every shard is uploaded."""
        self._seal()
        with self._mu:
            while self._futures:
                self._mu.wait()
        self._check()


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



__all__ = ["IngestWriter"]
