"""Lossless chunk codecs: raw, zstd, and byte-shuffle + zstd for numeric data.

All compressed codecs go through python-blosc2: it ships the byte-shuffle filter (groups
byte k of every element together, so the slowly varying sign/exponent bytes of floats
compress), zstd and lz4, block-parallel threads that release the GIL, decompression into a
caller's buffer, and a self-describing header (we cross-check its sizes before decoding, so
a hostile chunk cannot make us allocate more than its reference promises).

Codec names are stable strings recorded in every chunk reference:

* ``raw``: bytes as given.
* ``zstd``: zstd (blosc2 container, no filter).
* ``shuffle-zstd``: byte shuffle with the element size recorded in the reference, then zstd.
* ``shuffle-lz4``: byte shuffle then lz4: faster, compresses less.
"""

from __future__ import annotations

from dataclasses import dataclass

import blosc2

from .errors import ChunkCorruptError, ConfigError

CODECS = ("raw", "zstd", "shuffle-zstd", "shuffle-lz4")

#: The largest chunk we will ever decode (guards against hostile references).
MAX_CHUNK_BYTES = 1 << 30
_BLOSC_MAX = blosc2.MAX_BUFFERSIZE


@dataclass(frozen=True)
class CodecConfig:
    """How chunks are compressed. ``level`` 1 is the right trade-off on 2-core machines."""

    codec: str = "shuffle-zstd"
    level: int = 1
    threads: int = 2

    def __post_init__(self) -> None:
        check_codec(self.codec)
        if not 0 <= self.level <= 9:
            raise ConfigError(f"codec level must be in 0..9, got {self.level}")
        if self.threads < 1:
            raise ConfigError(f"codec threads must be >= 1, got {self.threads}")


def check_codec(codec: str) -> str:
    if codec not in CODECS:
        raise ConfigError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    return codec


def _params(codec: str, itemsize: int) -> dict:
    if codec == "zstd":
        return {"codec": blosc2.Codec.ZSTD, "filters": [blosc2.Filter.NOFILTER], "typesize": 1}
    if codec == "shuffle-zstd":
        return {"codec": blosc2.Codec.ZSTD, "filters": [blosc2.Filter.SHUFFLE], "typesize": itemsize}
    if codec == "shuffle-lz4":
        return {"codec": blosc2.Codec.LZ4, "filters": [blosc2.Filter.SHUFFLE], "typesize": itemsize}
    raise ConfigError(f"codec {codec!r} has no compression parameters")


def encode(data: memoryview | bytes, codec: str, itemsize: int = 1, *, level: int = 1,
           threads: int = 2) -> memoryview | bytes:
    """Compress ``data`` with ``codec``. Returns ``data`` itself for ``raw``."""
    check_codec(codec)
    if codec == "raw":
        return data
    n = memoryview(data).nbytes
    if n > _BLOSC_MAX:
        raise ConfigError(f"chunk of {n} bytes is larger than the codec limit {_BLOSC_MAX}")
    if itemsize < 1 or itemsize > 255:
        raise ConfigError(f"element size must be 1..255 bytes, got {itemsize}")
    if n % itemsize:
        itemsize = 1  # shuffle needs whole elements; fall back to bytes
    return blosc2.compress2(data, clevel=level, nthreads=threads, **_params(codec, itemsize))


def decode(stored: memoryview | bytes, codec: str, raw_size: int, *, key: str = "",
           out: memoryview | None = None, threads: int = 2) -> memoryview | bytes:
    """Decompress into ``out`` (if given) or a new buffer; checks every size first."""
    check_codec(codec)
    if raw_size < 0 or raw_size > MAX_CHUNK_BYTES:
        raise ChunkCorruptError(f"chunk {key}: claimed size {raw_size} is out of bounds")
    if codec == "raw":
        if memoryview(stored).nbytes != raw_size:
            raise ChunkCorruptError(f"chunk {key}: {memoryview(stored).nbytes} bytes stored, {raw_size} expected")
        if out is not None:
            memoryview(out).cast("B")[:] = memoryview(stored).cast("B")
            return out
        return stored
    try:
        nbytes, cbytes, _blocksize = blosc2.get_cbuffer_sizes(stored)
    except Exception:
        raise ChunkCorruptError(f"chunk {key}: not a valid {codec} stream (bad header)") from None
    if nbytes != raw_size or cbytes != memoryview(stored).nbytes:
        raise ChunkCorruptError(
            f"chunk {key}: header says {nbytes} raw / {cbytes} stored bytes, reference says "
            f"{raw_size} raw / {memoryview(stored).nbytes} stored"
        )
    try:
        if out is not None:
            blosc2.decompress2(stored, dst=out, nthreads=threads)
            return out
        result = blosc2.decompress2(stored, nthreads=threads)
    except Exception as exc:
        raise ChunkCorruptError(f"chunk {key}: {codec} stream failed to decode: {exc}") from None
    return result
