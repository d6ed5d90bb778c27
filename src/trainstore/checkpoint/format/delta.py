"""How one piece (chunk) of a tensor is stored: plain, same-as-base, or an XOR delta.

Full checkpoints store every piece plainly with the fast full codec (shuffle-lz4 by default),
or raw when a sample shows it would compress to more than ``raw_above`` of its size: a full
save is about time until durable, and the codec's CPU must not cost more than the disk time it
saves (``auto_raw_above``). Identical pieces dedup by content hash, also across checkpoints.

Incremental checkpoints compare each piece with the same piece of their base FULL
checkpoint (same tensor name, dtype, size, position):

* identical content hash -> a reference to the base's chunk: nothing is written (frozen
  parameters cost a manifest line);
* otherwise XOR(new, base), byte-shuffled and zstd-compressed: the sign/exponent and high
  mantissa bytes of a weight that moved a little are mostly zero after XOR, so the delta
  compresses far better than the value itself; when the delta does not compress well (the
  base is unrelated) the plain compressed piece is tried too and the smaller one wins;
* a delta that would be stored raw (it compresses to more than ``incompressible_ratio``) is
  not stored at all: the plain piece takes as many bytes and restores without reading the
  base. ``auto_incompressible_ratio`` sets that limit as ``auto_raw_above`` does for full
  saves: a writer short of CPU on a local disk compresses only what halves.

Restore is ``decode(delta) XOR decode(base)``, checked against the piece's recorded hash:
bit-exact. The delta is decoded into a per-thread buffer, the base read straight into the
destination, and ``DeltaApply`` XORs and hashes each block of it as it lands (one pass over
the destination while in the CPU cache). Deltas never refer to another incremental (chain depth 1), so a restore reads at
most two chunks per piece and losing one incremental never breaks another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from ...chunks import ChunkRef, ChunkStore, content_hash
from ...codecs import encode
from ...digests import Hasher, digests, hasher
from ...hostmem import empty_array
from .manifest import ChunkEntry, TensorEntry
from .packs import build_pack
from .ratios import RatioMemo

#: Try the plain codec too when the XOR delta compresses worse than this fraction of raw.
#: (AdamW moments change completely between checkpoints: their XOR deltas compress to ~0.75 of
#: raw while the plain moments compress to ~0.70, so the plain candidate must be sampled.)
TRY_PLAIN_ABOVE = 0.4
_SAMPLE_BYTES = 256 << 10


@dataclass(frozen=True)
class PieceResult:
    entry: ChunkEntry
    written: int  # bytes written to the store by this piece (0: dedup or same as base)
    owned: int  # stored bytes this checkpoint owns for the piece (0: same as base)


_scratch = threading.local()


def scratch(n: int) -> np.ndarray:
    """A per-thread reusable uint8 buffer of at least ``n`` bytes, touched once and 4 KiB
    aligned (``fileio.direct_eligible``): a restore reads a raw delta chunk (written before
    deltas that would be raw were stored plain) into it with ``O_DIRECT``, and a raw delta
    written from it would go out the same way."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.nbytes < n:
        buf = empty_array((max(n, 1),), np.uint8, huge_pages=False)
        buf.fill(0)
        _scratch.buf = buf
    return buf[:n]


def xor_into(a: memoryview | np.ndarray, b: memoryview | np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = a XOR b on raw bytes (8 bytes at a time when the sizes allow)."""
    a8 = np.frombuffer(a, dtype=np.uint8)
    b8 = np.frombuffer(b, dtype=np.uint8)
    n = a8.nbytes
    if n % 8 == 0:
        np.bitwise_xor(a8.view(np.uint64), b8.view(np.uint64), out=out.view(np.uint64)[: n // 8])
    else:
        np.bitwise_xor(a8, b8, out=out[:n])
    return out[:n]


class DeltaApply:
    """``out ^= delta``, then the digest of ``out``, block by block: the ``on_block`` of the
    base chunk's read into ``out`` (``chunkread.get_into``), so each block is XORed and hashed
    right after it lands, while in the CPU cache, with no second full-size buffer. The digest
    is the piece's read check (xxh3-128) when ``check`` (it has one), else BLAKE3. Blocks must
    come in order; ``hexdigest`` starts over on the whole of ``out`` when they did not cover
    it (the base was then filled whole by a decode, a repair or a remote read)."""

    def __init__(self, delta: np.ndarray, out: np.ndarray, check: str | None = None, block: int = 1 << 20) -> None:
        if delta.nbytes != out.nbytes:
            raise ValueError(f"delta of {delta.nbytes} bytes for a piece of {out.nbytes}")
        self.delta, self.out, self.block, self.check = delta, out, block, check
        self.done = 0
        self._hasher: Hasher = hasher(check)

    def __call__(self, lo: int, hi: int) -> None:
        if lo != self.done:
            raise ValueError(f"DeltaApply: block [{lo}, {hi}) after {self.done} bytes (blocks must come in order)")
        seg = self.out[lo:hi]
        xor_into(seg, self.delta[lo:hi], seg)
        self._hasher.update(seg)
        self.done = hi

    def hexdigest(self) -> str:
        """The digest of ``out`` with the whole delta applied."""
        n = self.out.nbytes
        if self.done != n:
            self.done, self._hasher = 0, hasher(self.check)
            for lo in range(0, n, self.block):
                self(lo, min(n, lo + self.block))
        return self._hasher.hexdigest()


#: CPU threads from which marginal compression (a few 10% saved on float data) is free on a
#: local disk: shuffle-lz4 encodes float weights and moments at 0.6-1.1 GB/s per thread
#: (docs/benchmarks.md, "Codecs on training state"), a local disk takes 1-7 GB/s
AUTO_COMPRESS_THREADS = 4
#: ``auto_raw_above`` where the writer is short of CPU for its store: only data that compresses
#: to half or less (zeros, masks, integer ids, sparse tensors) is worth the codec there
SCARCE_CPU_RAW_ABOVE = 0.5
#: ``auto_raw_above`` otherwise: compress where a sample saves 10% or more
AMPLE_CPU_RAW_ABOVE = 0.9


def auto_raw_above(cpu_threads: int, local: bool) -> float:
    """The ``raw_above`` of full saves when none is configured.

    Compressing a piece pays while the codec keeps up with the store: a pipeline of ``n``
    threads compressing at ``c`` each takes ``max(B/(n c), r B/w)`` against ``B/w`` raw. With
    float data (``r`` 0.84-0.94 with shuffle-lz4, ``c`` 0.6-1.1 GB/s) and a local disk (``w``
    1-7 GB/s), ``n c < w`` below ~4 threads: there a 1 GiB bf16 state took 3.15 s to durable
    compressed (12% smaller) against 0.82 s raw on 2 cores (docs/benchmarks.md, "GPU (H200)"),
    so only data that halves is compressed. Writers with more threads, and stores that are not
    a local directory (S3; a tiered store, whose bytes cross the network to its durable tier
    sooner or later: w well under 1 GB/s), keep the 10% threshold. Deterministic for a given
    machine and store, so the codec of unchanged bytes (part of their chunk key) does not flip
    between saves.
    """
    if local and cpu_threads < AUTO_COMPRESS_THREADS:
        return SCARCE_CPU_RAW_ABOVE
    return AMPLE_CPU_RAW_ABOVE


#: ``auto_incompressible_ratio`` with CPU to spare: an incremental is where the bytes are won,
#: so a delta (or plain piece) is compressed unless it saves under 3%
AMPLE_CPU_INCOMPRESSIBLE = 0.97


def auto_incompressible_ratio(cpu_threads: int, local: bool) -> float:
    """The ``incompressible_ratio`` of incremental saves when none is configured.

    The pipeline argument of ``auto_raw_above``, with the slower codec of incrementals
    (bytegroup-zstd at 0.2-0.4 GB/s per thread on float deltas): on 2 cores (one CPU thread
    for the save) a GPT-2 incremental whose deltas compress to 0.74-0.77 took 1.36-1.61 s to
    durable against 0.50-0.56 s with this limit (docs/benchmarks.md, "Issue 30: time to
    durable").
    So a writer short of CPU on a local disk stores a piece compressed only where it halves
    (unchanged pieces still cost nothing, and sparse or slowly moving tensors still halve);
    others compress what saves 3%. Deterministic for a machine and store, like
    ``auto_raw_above``.
    """
    if local and cpu_threads < AUTO_COMPRESS_THREADS:
        return SCARCE_CPU_RAW_ABOVE
    return AMPLE_CPU_INCOMPRESSIBLE


def _sample_window(n: int) -> slice:
    """The bytes of an ``n``-byte piece that ``PieceEncoder._ratio`` samples: 256 KiB from the middle."""
    start = max(0, (n - _SAMPLE_BYTES) // 2) // 64 * 64
    return slice(start, start + _SAMPLE_BYTES)


class PieceEncoder:
    """Stores pieces in a ``ChunkStore`` with the codec choices described above."""

    def __init__(self, chunks: ChunkStore, *, codec: str, delta_codec: str, level: int,
                 threads: int, incompressible_ratio: float | None, cpu_threads: int,
                 raw_above: float | None = None, ratios: RatioMemo | None = None) -> None:
        self.chunks = chunks
        #: sampled ratios kept across saves (``ratios.py``), for pieces a caller names by a key
        self.ratios = ratios
        #: held around hashing, XOR, sampling and encoding (not I/O): at most ``cpu_threads``
        #: of the writer's threads use a core at once
        self.cpu = threading.BoundedSemaphore(cpu_threads)
        self.codec = codec
        self.delta_codec = delta_codec
        self.level = level
        self.threads = threads
        try:
            self._local = chunks.store.local_path(f"{chunks.prefix}/probe") is not None
        except Exception:  # noqa: BLE001 - any doubt: copy
            self._local = False
        #: full pieces sampling above this ratio are stored raw (None: ``auto_raw_above``)
        self.raw_above = auto_raw_above(cpu_threads, self._local) if raw_above is None else raw_above
        #: incremental pieces (deltas, plain fallbacks, packs) above this are stored raw
        #: (None: ``auto_incompressible_ratio``); a delta that would be is stored plain instead
        self.incompressible_ratio = (auto_incompressible_ratio(cpu_threads, self._local)
                                     if incompressible_ratio is None else incompressible_ratio)

    def _ratio(self, data: memoryview, codec: str, itemsize: int, key: tuple | None = None) -> float:
        """Compressed/raw size of a sample (256 KiB from the middle) of ``data``, or the one
        remembered for ``key`` (``ratios``)."""
        if codec == "raw":
            return 1.0
        return self._remembered(key, codec, data.nbytes,
                                lambda: self._sampled(data[_sample_window(data.nbytes)], codec, itemsize))

    def _remembered(self, key: tuple | None, codec: str, n: int, sample: Callable[[], float]) -> float:
        if self.ratios is None or key is None:
            return sample()
        return self.ratios.ratio((*key, codec, n), sample)

    def _sampled(self, sample: memoryview, codec: str, itemsize: int) -> float:
        """Compressed/raw size of ``sample``, encoded under the CPU gate."""
        if sample.nbytes == 0:
            return 1.0
        with self.cpu:
            enc = encode(sample, codec, itemsize, level=self.level, threads=self.threads)
        return memoryview(enc).nbytes / sample.nbytes

    def _digests(self, data: memoryview) -> tuple[str, str]:
        """(BLAKE3, read check) of a piece, under the CPU gate."""
        with self.cpu:
            return digests(data)

    def _put(self, data: memoryview, codec: str, itemsize: int, h: str) -> tuple[ChunkRef, int]:
        # dedup, encode (under the cpu gate), atomic durable put
        res = self.chunks.put(data, codec, itemsize, digest=h, cpu=self.cpu)
        return res.ref, (res.ref.stored if res.written else 0)

    # -- plain pieces ----------------------------------------------------------------------
    def plain(self, data: memoryview, itemsize: int, sums: tuple[str, str] | None = None, *,
              codec: str | None = None, raw_above: float | None = None, key: tuple | None = None) -> PieceResult:
        """Store the piece itself: compressed, or raw when a sample shows it saves too little.
        ``sums``: the piece's ``digests`` when the caller has them; ``key``: names the piece
        across saves (``(tensor, index)``), so its sampled ratio can be reused (``ratios``).

        Defaults are those of full checkpoints (``codec``, ``raw_above``); incrementals pass
        their delta codec and ``incompressible_ratio``.
        """
        codec = codec or self.codec
        limit = self.raw_above if raw_above is None else raw_above
        h, check = sums or self._digests(data)
        if self._ratio(data, codec, itemsize, None if key is None else ("plain", *key)) > limit:
            codec = "raw"
        ref, written = self._put(data, codec, itemsize, h)
        return PieceResult(ChunkEntry(ref, check=check), written, ref.stored)

    # -- incremental pieces ----------------------------------------------------------------
    def against_base(self, data: memoryview, itemsize: int, base: ChunkEntry,
                     base_bytes: Callable[[], memoryview], key: tuple | None = None) -> PieceResult:
        """Same-as-base reference, XOR delta, or plain piece: whichever is smallest.

        Sizes are estimated on a 256 KiB sample of each candidate (or reused from an earlier
        save's sample of the same piece, ``ratios``), so the piece is compressed once; when
        the delta compresses to under ``TRY_PLAIN_ABOVE`` the plain candidate is not even
        sampled (it cannot win by much then). A delta that would be stored raw (above
        ``incompressible_ratio``) loses to the plain piece: as many bytes, and a restore of
        the plain one reads no base.
        """
        n = data.nbytes
        sums = self._digests(data)
        h, check = sums
        if base.base is None and base.logical_hash() == h and base.size == n:  # (the check: the base's may predate them)
            return PieceResult(replace(base, same_as_base=True, check=check), 0, 0)
        if base.base is not None or base.span is not None or base.ref.size != n:
            return self._plain_incremental(data, itemsize, sums, key=key)  # (a packed base piece: no XOR inside packs)
        base_view = base_bytes()  # may read the base chunk from the store: outside the gate
        win = _sample_window(n)

        def delta_ratio() -> float:
            # the delta's sample is the XOR of the pieces' samples: the whole delta is made
            # only when it is kept
            with self.cpu:
                sample = xor_into(data[win], base_view[win], scratch(n))
            return self._sampled(memoryview(sample), self.delta_codec, itemsize)

        r_delta = 1.0 if self.delta_codec == "raw" else self._remembered(
            None if key is None else ("delta", *key), self.delta_codec, n, delta_ratio)
        r_plain = None
        if r_delta > TRY_PLAIN_ABOVE:
            r_plain = min(self._ratio(data, self.delta_codec, itemsize, None if key is None else ("plain", *key)), 1.0)
        use_plain = (r_plain is not None and r_plain < r_delta) or r_delta > self.incompressible_ratio
        if use_plain:
            return self._plain_incremental(data, itemsize, sums, r_plain)
        with self.cpu:
            delta = memoryview(xor_into(data, base_view, scratch(n)))
            delta_hash = content_hash(delta)
        ref, written = self._put(delta, self.delta_codec, itemsize, delta_hash)
        # the check is the piece's (what a restore rebuilds), the delta chunk has none of its own
        return PieceResult(ChunkEntry(ref, base.ref, h, check=check), written, ref.stored)

    # -- packs of small tensors (packs.py) --------------------------------------------------
    def pack(self, members: list[tuple[memoryview, ChunkEntry | None]], itemsize: int,
             incremental: bool, key: tuple | None = None) -> list[PieceResult]:
        """Store small tensors (``(bytes, base piece or None)``) as one pack chunk.

        A member equal to its base piece (hash) becomes a same-as-base reference; the others
        are packed together (full: the full codec; incremental: the delta codec). The pack's
        written and owned bytes are counted on its first member. ``key``: names the pack
        across saves (``plain``)."""
        with self.cpu:
            sums = [digests(v) for v, _ in members]
        results: list[PieceResult | None] = [None] * len(members)
        fresh = []
        for i, ((v, base), (h, check)) in enumerate(zip(members, sums)):
            if base is not None and base.base is None and base.size == v.nbytes and base.logical_hash() == h:
                results[i] = PieceResult(replace(base, same_as_base=True, check=check), 0, 0)
            else:
                fresh.append(i)
        if fresh:
            with self.cpu:
                buf, spans = build_pack([members[i][0] for i in fresh])
            if incremental:
                r = self.plain(memoryview(buf), itemsize, codec=self.delta_codec, raw_above=self.incompressible_ratio,
                               key=key)
            else:
                r = self.plain(memoryview(buf), itemsize, key=key)
            for k, (i, span) in enumerate(zip(fresh, spans)):
                entry = ChunkEntry(r.entry.ref, content_hash=sums[i][0], span=span, check=sums[i][1])
                results[i] = PieceResult(entry, r.written if k == 0 else 0, r.owned if k == 0 else 0)
        return results  # type: ignore[return-value]

    def _plain_incremental(self, data: memoryview, itemsize: int, sums: tuple[str, str],
                           ratio: float | None = None, key: tuple | None = None) -> PieceResult:
        if ratio is not None:  # already sampled
            codec = self.delta_codec if ratio <= self.incompressible_ratio else "raw"
            ref, written = self._put(data, codec, itemsize, sums[0])
            return PieceResult(ChunkEntry(ref, check=sums[1]), written, ref.stored)
        return self.plain(data, itemsize, sums, codec=self.delta_codec, raw_above=self.incompressible_ratio, key=key)


def stored_ratios(tensors: dict[str, TensorEntry]) -> Iterator[tuple[tuple, float]]:
    """(ratio memo key, stored / raw size) of every piece a checkpoint stored compressed, under
    the keys ``PieceEncoder`` asks its ``RatioMemo`` for (the codec's sample of the piece, as
    an XOR delta or plain): what the next save of the same state would sample again."""
    for name, t in tensors.items():
        for idx, c in enumerate(t.chunks):
            if c.same_as_base or c.span is not None or c.ref.codec == "raw" or not c.ref.size:
                continue
            yield ("delta" if c.base is not None else "plain", name, idx, c.ref.codec, c.ref.size), c.ref.stored / c.ref.size


__all__ = ["DeltaApply", "PieceEncoder", "auto_incompressible_ratio", "auto_raw_above", "PieceResult", "xor_into", "scratch", "TRY_PLAIN_ABOVE", "stored_ratios"]
