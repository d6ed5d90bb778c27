"""Shared pieces of the GIL-free zstd codecs: per-thread compressors and scratch buffers, and
a bounded decode of one zstd frame into a given buffer.

numpy copies and the ``zstandard`` package both release the GIL, so chunk codecs built from
these run on a thread pool next to a training loop without stalling its Python.
"""

from __future__ import annotations

import threading

import numpy as np
import zstandard

from .errors import ChunkCorruptError

_tls = threading.local()


def compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's compressor for ``level`` (blosc2's mapping of levels 0-9 to zstd's)."""
    cache = getattr(_tls, "compressors", None)
    if cache is None:
        cache = _tls.compressors = {}
    c = cache.get(level)
    if c is None:
        zlevel = 19 if level >= 9 else max(1, 2 * level - 1)
        c = cache[level] = zstandard.ZstdCompressor(level=zlevel, write_content_size=True, write_checksum=False)
    return c


#: For byte planes at level 1: zstd's fast strategy with the smallest hash table and the
#: longest minimum match. On the low-entropy exponent plane of float weights level 1's many
#: short matches cost more than Huffman-coding the bytes as literals: measured on GPT +
#: AdamW state, exponent planes 12% smaller (0.300 vs 0.343 of raw), moments 3-8%, and faster.
_PLANE_PARAMS = dict(strategy=zstandard.STRATEGY_FAST, window_log=17, hash_log=6, min_match=7,
                     search_log=1, target_length=0)


def plane_compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's compressor for one byte plane: the tuned fast mode at level 1 (and 0),
    else ``compressor(level)``."""
    if level > 1:
        return compressor(level)
    c = getattr(_tls, "plane_compressor", None)
    if c is None:
        params = zstandard.ZstdCompressionParameters(write_content_size=True, **_PLANE_PARAMS)
        c = _tls.plane_compressor = zstandard.ZstdCompressor(compression_params=params)
    return c


def scratch(n: int, slot: int = 0) -> np.ndarray:
    """A per-thread reusable uint8 buffer of at least ``n`` bytes (touched once, then reused);
    ``slot`` tells apart buffers that one call needs at the same time."""
    bufs = getattr(_tls, "scratch", None)
    if bufs is None:
        bufs = _tls.scratch = {}
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < n:
        buf = bufs[slot] = np.zeros(n, dtype=np.uint8)
    return buf[:n]


def decode_frame_into(frame: memoryview, target: memoryview, key: str) -> None:
    """Decode one zstd ``frame`` that must hold exactly ``target.nbytes`` bytes into ``target``.

    The frame's own content size is checked first and the decoder never writes past
    ``target``, so a hostile frame cannot make us allocate or write more than promised.
    """
    want = target.nbytes
    try:
        content = zstandard.frame_content_size(frame)
    except zstandard.ZstdError:
        raise ChunkCorruptError(f"chunk {key}: not a valid zstd frame (bad header)") from None
    if content not in (want, -1):
        raise ChunkCorruptError(f"chunk {key}: zstd frame holds {content} bytes, expected {want}")
    try:
        got = 0
        with zstandard.ZstdDecompressor().stream_reader(frame, read_across_frames=False) as reader:
            while got < want:
                k = reader.readinto(target[got:])
                if k == 0:
                    break
                got += k
            extra = reader.read(1)
    except zstandard.ZstdError as exc:
        raise ChunkCorruptError(f"chunk {key}: zstd stream failed to decode: {exc}") from None
    if got != want or extra:
        raise ChunkCorruptError(f"chunk {key}: zstd stream decodes to {'more than ' if extra else ''}"
                                f"{got} bytes, expected {want}")


__all__ = ["compressor", "decode_frame_into", "plane_compressor", "scratch"]
