"""Background writes of staged tensors: hashing, compression and puts on a thread pool.

``write_tensors`` cuts every staged tensor into pieces of ``chunk_bytes``, encodes each
piece with ``PieceEncoder`` (plain for full checkpoints; against the base for incrementals)
on ``workers`` threads, and returns the manifest entries. At most ``max_inflight_bytes`` of
pieces are being processed at once (a ``ByteBudget``, charged by each piece's size), which
bounds the scratch and compressed buffers alive (the staged input itself lives in the
reusable arena). Hashing (BLAKE3), XOR (numpy)
and the zstd codecs release the GIL, so the threads really run in parallel with each other
and with training; at most ``cpu_threads`` of them use a core at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import dataclass

from ...bytebudget import ByteBudget
from ...chunks import ChunkStore
from ...codecs import MAX_CHUNK_BYTES, check_codec
from ...errors import ConfigError
from ..format.delta import PieceEncoder, PieceResult
from ..format.manifest import ChunkEntry, TensorEntry
from ..format.packs import pack_group, plan_packs
from ..format.ratios import RatioMemo
from .pool import shared_pool
from .staging import StagedTensor


@dataclass(frozen=True)
class WriteOptions:
    """How checkpoint bytes are cut, compressed and written.

    ``codec`` is used for the pieces of full checkpoints; a piece whose sampled compressed
    size exceeds ``raw_above`` of raw is stored raw instead. ``None`` (default) picks it by
    whether the codec keeps up with the store (``format.delta.auto_raw_above``): 0.9 (compress
    what saves 10%) for network and tiered stores and writers with 4+ CPU threads, 0.5 (only
    what halves: zeros, masks, ids) for a local directory with fewer, where compressing float
    data that saves 6-16% makes the save slower to become durable. ``delta_codec`` is used for every
    piece of an incremental checkpoint (XOR deltas and plain fallbacks): that is where the
    bytes are won, so it compresses harder (bytegroup-zstd: 1-4% smaller than shuffle-zstd
    on weights, bf16 and AdamW moments, benchmarks/codecs.py); such pieces are stored raw
    above ``incompressible_ratio`` (a delta that would be is stored as the plain piece: as
    many bytes, no base to read at restore). ``None`` (default) picks it like ``raw_above``
    (``format.delta.auto_incompressible_ratio``): 0.97 with CPU to spare or a network store,
    0.5 for a local directory and fewer than 4 CPU threads, where compressing float deltas
    to ~0.75 made an incremental 2-3x slower to become durable.

    ``cpu_threads``: at most this many of the ``workers`` hash, XOR and compress at once (the
    others wait on I/O). CPU threads are scheduled fairly, so 8 busy save threads next to a
    1-thread training loop on 2 cores left it ~1/4 of a core (a 4-5x slower step during a
    save); the default, half the usable cores (at least 1, at most 8), leaves the rest to
    training and the data loader. Raise it when time until durable matters more.

    ``pack_below``: tensors smaller than this (bytes, > 0) are packed together into chunks of
    up to ``pack_bytes`` (``packs.py``: one object and one fsync per pack instead of per
    tensor; each tensor keeps its own hash). 0: every tensor is its own chunk(s).

    ``resample_every``: a piece's sampled compression ratio (what picks its codec) is reused
    the next ``resample_every - 1`` times the piece is saved with that codec in the same job
    (the backend's ``format.ratios.RatioMemo``, which a restore seeds with what the restored
    checkpoint's pieces came to), then sampled again; 1 samples every piece of every save.

    ``nice``: background threads raise their niceness by this much. The default 0 favours
    time until durable; set e.g. 10 when training throughput matters more than how soon a
    checkpoint is safe (docs/checkpoints.md, "Performance trade-offs").
    """

    chunk_bytes: int = 8 << 20
    codec: str = "shuffle-lz4"
    delta_codec: str = "bytegroup-zstd"
    level: int = 1
    workers: int = 8  # more than the cores: hides fsync latency of many small tensors
    codec_threads: int = 1
    cpu_threads: int | None = None  # None: default_cpu_threads()
    max_inflight_bytes: int = 256 << 20
    incompressible_ratio: float | None = None
    raw_above: float | None = None
    nice: int = 0
    pack_below: int = 1 << 20
    pack_bytes: int = 4 << 20
    resample_every: int = 4

    def __post_init__(self) -> None:
        check_codec(self.codec)
        check_codec(self.delta_codec)
        if self.chunk_bytes < 4096 or self.chunk_bytes % 64 or self.chunk_bytes > 512 << 20:
            raise ConfigError(f"chunk_bytes must be a multiple of 64 in [4 KiB, 512 MiB], got {self.chunk_bytes}")
        if self.workers < 1 or self.codec_threads < 1:
            raise ConfigError("workers and codec_threads must be >= 1")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError(f"cpu_threads must be >= 1 (or None for the default), got {self.cpu_threads}")
        if self.max_inflight_bytes < self.chunk_bytes:
            raise ConfigError("max_inflight_bytes must hold at least one chunk")
        if self.incompressible_ratio is not None and not 0.0 < self.incompressible_ratio <= 1.0:
            raise ConfigError(f"incompressible_ratio must be in (0, 1] or None (auto), got {self.incompressible_ratio}")
        if self.raw_above is not None and not 0.0 < self.raw_above <= 1.0:
            raise ConfigError(f"raw_above must be in (0, 1] or None (auto), got {self.raw_above}")
        if self.pack_below < 0 or self.pack_below > self.pack_bytes:
            raise ConfigError(f"pack_below must be in [0, pack_bytes={self.pack_bytes}], got {self.pack_below}")
        if self.resample_every < 1:
            raise ConfigError(f"resample_every must be >= 1 (1: sample every save), got {self.resample_every}")
        if not 4096 <= self.pack_bytes <= MAX_CHUNK_BYTES:
            raise ConfigError(f"pack_bytes must be in [4 KiB, {MAX_CHUNK_BYTES}], got {self.pack_bytes}")


def default_cpu_threads() -> int:
    """Half the cores this process may run on: at least 1, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 2
    return max(1, min(8, cores // 2))


@dataclass
class WriteStats:
    logical_bytes: int = 0
    stored_bytes: int = 0
    written_bytes: int = 0
    pieces: int = 0
    same_as_base: int = 0
    deltas: int = 0


#: base lookup: (tensor name, piece index, piece size) -> (base ChunkEntry, lazy raw bytes) or None
BaseLookup = Callable[[str, str, int, int], "tuple[ChunkEntry, Callable[[], memoryview]] | None"]


def write_tensors(chunks: ChunkStore, staged: list[StagedTensor], opts: WriteOptions,
                  base: BaseLookup | None = None, cancel: threading.Event | None = None,
                  ratios: RatioMemo | None = None) -> tuple[dict[str, TensorEntry], WriteStats]:
    """Store every staged tensor; returns manifest entries and byte counts. ``ratios``: the
    sampled compression ratios of earlier saves of the same job (``format.ratios``; the
    caller keeps one across saves), or None to sample every piece."""
    enc = PieceEncoder(chunks, codec=opts.codec, delta_codec=opts.delta_codec, level=opts.level,
                       threads=opts.codec_threads, incompressible_ratio=opts.incompressible_ratio,
                       cpu_threads=opts.cpu_threads or default_cpu_threads(), raw_above=opts.raw_above,
                       ratios=ratios)
    budget = ByteBudget(opts.max_inflight_bytes)
    results: dict[str, list[Future[PieceResult] | None]] = {}
    pending: set[Future] = set()
    stats = WriteStats()

    def work(t: StagedTensor, data: memoryview, idx: int) -> PieceResult:
        found = base(t.name, t.dtype, idx, data.nbytes) if base is not None else None
        if found is None:
            return enc.plain(data, t.itemsize, key=(t.name, idx))
        entry, raw = found
        return enc.against_base(data, t.itemsize, entry, raw, key=(t.name, idx))

    def pack_work(members: list[StagedTensor]) -> list[PieceResult]:
        found = [base(t.name, t.dtype, 0, t.data.nbytes) if base is not None else None for t in members]
        return enc.pack([(t.data, f[0] if f is not None else None) for t, f in zip(members, found)],
                        members[0].itemsize, incremental=base is not None, key=(members[0].name, len(members)))

    # a pack is one chunk: never larger than chunk_bytes, so it fits the in-flight byte budget
    # like any piece (max_inflight_bytes >= chunk_bytes); a tensor a pack cannot hold is chunked
    pack_limit = min(opts.pack_bytes, opts.chunk_bytes)
    small = [t for t in staged if 0 < t.data.nbytes < min(opts.pack_below, pack_limit)]
    packed = {t.name for t in small}
    pack_futs: dict[str, tuple[Future[list[PieceResult]], int]] = {}  # tensor -> (its pack's future, index)
    pool = shared_pool("ckpt-write", opts.workers, opts.nice)  # kept threads keep their buffers touched
    try:
        for members in plan_packs(((t, t.data.nbytes, pack_group(t.name, t.itemsize)) for t in small),
                                  pack_limit):
            pfut = budget.submit(pool, sum(t.data.nbytes for t in members), pack_work, members)
            pending.add(pfut)
            for i, t in enumerate(members):
                pack_futs[t.name] = (pfut, i)
        for t in staged:
            if t.name in packed:
                continue
            futs: list[Future[PieceResult] | None] = []
            results[t.name] = futs
            n = t.data.nbytes
            for idx, start in enumerate(range(0, n, opts.chunk_bytes)):
                if cancel is not None and cancel.is_set():
                    raise ConfigError("checkpoint save cancelled")
                piece = t.data[start:start + opts.chunk_bytes]
                fut = budget.submit(pool, piece.nbytes, work, t, piece, idx)
                futs.append(fut)
                pending.add(fut)
                # fail fast: stop submitting as soon as any piece failed
                done = {f for f in pending if f.done()}
                for f in done:
                    f.result()
                pending -= done
        finished, _ = wait(pending, return_when=FIRST_EXCEPTION)
        for f in finished:
            f.result()
    except BaseException:
        for f in pending:
            f.cancel()
        wait(pending)  # a task still running reads the staged bytes the caller reuses next
        raise

    entries: dict[str, TensorEntry] = {}
    for t in staged:
        if t.name in pack_futs:
            pfut, i = pack_futs[t.name]
            pieces = [pfut.result()[i]]
        else:
            pieces = [f.result() for f in results[t.name]]  # type: ignore[union-attr]
        for p in pieces:
            stats.pieces += 1
            stats.written_bytes += p.written
            stats.stored_bytes += p.owned
            stats.same_as_base += p.entry.same_as_base
            stats.deltas += p.entry.is_delta
        stats.logical_bytes += t.data.nbytes
        entries[t.name] = TensorEntry(t.dtype, t.shape, t.data.nbytes, tuple(p.entry for p in pieces))
    return entries, stats


__all__ = ["BaseLookup", "WriteOptions", "WriteStats", "default_cpu_threads", "write_tensors"]
