"""The ingest write-ahead log: what makes ``Ingestor.write`` durable when it returns.

A WAL directory belongs to one (store, dataset) and to one ``Ingestor`` at a time (a lock
file). It holds:

* ``wal.json``: the store URL, dataset name and a random ``wal_id`` fixed at creation.
* ``seg-<seq:012d>.wal``: segments of framed records. Each frame is
  ``MAGIC | u64 payload length | 16-byte BLAKE3 of payload | payload`` where the payload is
  one Arrow IPC stream (schema + batches). A frame is appended and ``fsync``'d before
  ``write`` returns. A crash mid-append leaves a torn tail, which ``read_segment`` stops at
  (that write was never acknowledged). An append that *fails* (ENOSPC, EIO) cuts the
  segment back to its last good frame before raising, so later frames never land behind a
  broken one (replay would stop there and drop them); if that cut fails too, the log
  refuses every further append until it is reopened (replay then cuts the torn tail).
* ``uploaded.jsonl``: one line per segment that is now a durable shard in the store
  (``ShardInfo`` + ``seq``), appended and fsynced before the segment file is deleted.

A segment ``seq`` always becomes the shard ``ingest-<wal_id>-<seq>.parquet`` and is uploaded
with ``put_if_absent``, so replaying a segment whose upload had already finished (crash
between upload and delete) finds the same shard instead of writing a duplicate.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import blake3
import filelock
import pyarrow as pa

from ...errors import ConfigError, StoreError
from ...fileio import fsync_dir, io_error, remove_temp_leftovers, write_all, write_atomic
from ..versions import ShardInfo

MAGIC = b"TSW1"
_HEADER = struct.Struct("<4sQ16s")
_SEG_PREFIX = "seg-"
_SEG_SUFFIX = ".wal"


def encode_frame(table: pa.Table) -> list[Any]:
    """The buffers of one WAL frame holding ``table`` (header first)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    payload = sink.getvalue()
    digest = blake3.blake3(payload).digest(length=16)
    return [_HEADER.pack(MAGIC, payload.size, digest), payload]


def read_segment(path: str) -> tuple[list[pa.Table], int]:
    """Valid frames of a segment, and the byte length they span (a torn tail is ignored)."""
    tables: list[pa.Table] = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + _HEADER.size <= len(data):
        magic, length, digest = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        if magic != MAGIC or end > len(data):
            break
        payload = memoryview(data)[pos + _HEADER.size:end]
        if blake3.blake3(payload).digest(length=16) != digest:
            break
        try:
            tables.append(pa.ipc.open_stream(pa.py_buffer(payload)).read_all())
        except pa.ArrowException:
            break
        pos = end
    return tables, pos


class SegmentIO:
    """The system calls the WAL appends segments with; a test passes a subclass that fails
    at a chosen byte or call (EIO, ENOSPC) to check what a failed append leaves behind."""

    def write(self, fd: int, data: Any) -> None:
        write_all(fd, data)

    def sync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)


class WriteAheadLog:
    """Segments of acknowledged records, and the journal of segments already uploaded.

    ``io``: how segment bytes are written, synced and cut back (default: plain ``os`` calls).
    """

    def __init__(self, directory: str, store_url: str, dataset: str, *, io: SegmentIO | None = None) -> None:
        self.io = io or SegmentIO()
        self.dir = os.path.abspath(directory)
        os.makedirs(self.dir, exist_ok=True)
        self._lock = filelock.FileLock(os.path.join(self.dir, "lock"), timeout=0)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise ConfigError(f"WAL directory {self.dir} is in use by another Ingestor") from None
        remove_temp_leftovers(self.dir)  # a crash between a temp file and its rename
        self.wal_id = self._load_or_create_meta(store_url, dataset)
        self._journal = os.path.join(self.dir, "uploaded.jsonl")
        self._fd: int | None = None
        self._active_seq: int | None = None
        self.active_bytes = 0
        self._broken: str | None = None  # why appends are refused (a failed cut-back)

    def _load_or_create_meta(self, store_url: str, dataset: str) -> str:
        path = os.path.join(self.dir, "wal.json")
        if os.path.exists(path):
            with open(path) as f:
                meta = json.load(f)
            if meta.get("store") != store_url or meta.get("dataset") != dataset:
                self.close()
                raise ConfigError(
                    f"WAL directory {self.dir} belongs to {meta.get('dataset')!r} in "
                    f"{meta.get('store')!r}, not {dataset!r} in {store_url!r}"
                )
            return str(meta["wal_id"])
        wal_id = secrets.token_hex(6)
        write_atomic(path, json.dumps({"store": store_url, "dataset": dataset, "wal_id": wal_id}))
        return wal_id

    # -- segments --------------------------------------------------------------------------
    def segment_path(self, seq: int) -> str:
        return os.path.join(self.dir, f"{_SEG_PREFIX}{seq:012d}{_SEG_SUFFIX}")

    def segments(self) -> list[int]:
        """Sequence numbers of the segment files present, ascending."""
        out = []
        for name in os.listdir(self.dir):
            if name.startswith(_SEG_PREFIX) and name.endswith(_SEG_SUFFIX):
                stem = name[len(_SEG_PREFIX):-len(_SEG_SUFFIX)]
                if stem.isdigit():
                    out.append(int(stem))
        return sorted(out)

    def open_segment(self, seq: int) -> None:
        """Start appending to a fresh segment ``seq``."""
        self.close_segment()
        path = self.segment_path(seq)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise io_error(exc, f"creating WAL segment {path}") from exc
        try:
            fsync_dir(self.dir)
        except OSError as exc:
            os.close(fd)
            raise io_error(exc, f"creating WAL segment {path}") from exc
        self._fd = fd
        self._active_seq = seq
        self.active_bytes = os.fstat(self._fd).st_size

    def append(self, table: pa.Table) -> None:
        """Append one frame and fsync: after this returns the records survive a crash.

        On failure the frame is cut off again (the segment ends at its last good frame) and
        ``CapacityError`` (disk full) or ``StoreError`` is raised: the records are not
        logged. If the cut fails as well, this log refuses appends until reopened.
        """
        if self._broken is not None:
            raise StoreError(self._broken)
        if self._fd is None:
            raise StoreError("no open WAL segment")
        path = self.segment_path(self._active_seq or 0)
        buffers = encode_frame(table)
        try:
            for b in buffers:
                self.io.write(self._fd, b)
            self.io.sync(self._fd)
        except OSError as exc:
            self._cut_back(path, exc)
            raise io_error(exc, f"appending to WAL segment {path} (the write was not logged)") from exc
        self.active_bytes += sum(memoryview(b).nbytes for b in buffers)

    def _cut_back(self, path: str, cause: OSError) -> None:
        """Truncate the active segment to its last good frame after a failed append."""
        assert self._fd is not None
        try:
            self.io.truncate(self._fd, self.active_bytes)
            self.io.sync(self._fd)
        except OSError as exc:
            self._broken = (
                f"WAL {self.dir} refuses appends until reopened: after a failed append to {path} "
                f"({cause}), cutting it back to its last good frame ({self.active_bytes} bytes) "
                f"failed too: {exc}"
            )
            raise StoreError(self._broken) from cause

    def close_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._active_seq = None

    def truncate_torn_tail(self, seq: int) -> list[pa.Table]:
        """Read segment ``seq`` and cut off a torn tail, so later reads see the same frames."""
        path = self.segment_path(seq)
        tables, valid = read_segment(path)
        if os.path.getsize(path) != valid:
            with open(path, "r+b") as f:
                f.truncate(valid)
                f.flush()
                os.fsync(f.fileno())
        return tables

    def drop_segment(self, seq: int) -> None:
        try:
            os.unlink(self.segment_path(seq))
        except FileNotFoundError:
            return
        fsync_dir(self.dir)

    # -- journal of uploaded segments ------------------------------------------------------
    def record_uploaded(self, seq: int, info: ShardInfo) -> None:
        line = json.dumps({"seq": seq, **asdict(info)}) + "\n"
        fd = os.open(self._journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            write_all(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def uploaded(self) -> Iterator[tuple[int, ShardInfo]]:
        """Journal entries (a torn last line is skipped)."""
        try:
            with open(self._journal) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                obj = json.loads(line)
                if obj.get("marker"):
                    continue
                yield int(obj["seq"]), ShardInfo(obj["key"], int(obj["rows"]), int(obj["bytes"]), obj["checksum"])
            except (ValueError, KeyError, TypeError):
                continue

    def max_seq(self) -> int:
        """Highest segment number ever used here (journal, markers, segment files), or 0."""
        seqs = [0, *self.segments()]
        try:
            with open(self._journal) as f:
                for line in f.read().splitlines():
                    try:
                        seqs.append(int(json.loads(line)["seq"]))
                    except (ValueError, KeyError, TypeError):
                        continue
        except FileNotFoundError:
            pass
        return max(seqs)

    def reset_journal(self, keep: list[tuple[int, ShardInfo]], high_seq: int) -> None:
        """Atomically replace the journal with ``keep`` (after a commit published the rest).

        A marker line keeps ``high_seq`` so segment numbers (and so shard names) are never
        reused.
        """
        lines = [json.dumps({"seq": high_seq, "marker": True})]
        lines += [json.dumps({"seq": seq, **asdict(info)}) for seq, info in keep]
        write_atomic(self._journal, "".join(line + "\n" for line in lines))

    def close(self) -> None:
        self.close_segment()
        if self._lock.is_locked:
            self._lock.release()
