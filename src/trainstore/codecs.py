"""Lossless chunk codecs: raw, zstd, and byte-shuffle + zstd / lz4 for numeric data.

Codec names are stable strings recorded in every chunk reference:

* ``raw``: bytes as given.
* ``zstd``: zstd.
* ``shuffle-zstd``: byte shuffle (byte k of every element together, so the slowly varying
  sign/exponent bytes of floats compress), then zstd.
* ``shuffle-lz4``: byte shuffle then lz4: faster, compresses less (python-blosc2).
* ``bytegroup-zstd``: the ZipNN idea (codecs_bytegroup.py): byte planes with a float's
  whole exponent in one plane, each plane zstd-coded on its own (tuned to prefer literals)
  or kept raw when it is noise (low mantissa bytes). The incremental (delta) default.
* ``lossy-q8``, ``lossy-q8-sqrt``, ``lossy-bf16``: LOSSY, for float32 optimizer moments only
  and only when a policy asks for it (codecs_lossy.py). The chunk's hash is that of the
  decoded bytes, so every integrity check treats them like any other chunk.

``zstd`` and ``shuffle-zstd`` are written as a 24-byte header (``TSZ``, version, element
size, raw size, frame size) + one zstd frame of the shuffled bytes: the shuffle is numpy, the coder the
``zstandard`` package, and both release the GIL, so a background save's codec threads do not
stall the training loop's Python (python-blosc2 holds the GIL for the whole call; measured:
pure-Python work next to a blosc2 thread ran at 0.26x, next to this path at ~1.0x). Chunks
written by earlier versions in the blosc2 container decode as before (told apart by the
header). Both decoders cross-check every size against the chunk reference before writing,
so a hostile chunk cannot make us allocate more than its reference promises.
"""

from __future__ import annotations

import functools
import importlib
import struct
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from . import codecs_bytegroup, codecs_lossy
from .errors import ChunkCorruptError, ConfigError
from .zstd_frames import compressor, decode_frame_into, scratch

#: the lossless codecs: what configs may choose
CODECS = ("raw", "zstd", "shuffle-zstd", "shuffle-lz4", "bytegroup-zstd")
#: lossy codecs: chosen only per tensor by a lossy checkpoint policy (chunks may record them)
LOSSY_CODECS = codecs_lossy.LOSSY_CODECS


@functools.cache
def _blosc() -> ModuleType:
    """python-blosc2, imported on first use: its import takes 0.15-0.25 s (it pulls in httpx
    and rich), most of the CLI's start-up and of a data loader worker's imports, and only
    shuffle-lz4 chunks and chunks in its container need it. The checkpoint manager imports it
    with its module (``checkpoint.manager``): full saves use shuffle-lz4 by default, and a
    first save or a restore should not pay the import on its clock.

    blosc2 holds the GIL while it (de)compresses unless told otherwise: a full checkpoint's
    shuffle-lz4 pieces on the save threads then stall the training loop's Python (measured: a
    pure-Python loop ran 5.2x slower next to one encoding thread; 1.9x with this, on 2 busy
    cores). Chunks are 1-8 MiB, where releasing it costs nothing measurable. Process-wide.
    (Two threads arriving first both import it, under Python's import lock, and both set it.)
    """
    module = importlib.import_module("blosc2")
    module.set_releasegil(True)
    return module


#: The largest chunk we will ever decode (guards against hostile references).
MAX_CHUNK_BYTES = 1 << 30
#: Header of the GIL-free zstd container: magic, version, element size, 3 spare, raw size,
#: size of the zstd frame that follows (so truncation and trailing bytes are both caught).
_TSZ = struct.Struct("<3sBBxxxQQ")
_TSZ_MAGIC = b"TSZ"
_TSZ_VERSION = 1
_ZSTD_CODECS = ("zstd", "shuffle-zstd")


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


def check_codec(codec: str, lossy: bool = False) -> str:
    """``codec`` if it is a lossless codec (or, with ``lossy``, a lossy one), else ``ConfigError``."""
    if codec not in CODECS and not (lossy and codec in LOSSY_CODECS):
        raise ConfigError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}"
                          + (" (lossy codecs are chosen by CheckpointPolicy.optimizer_moments)"
                             if codec in LOSSY_CODECS else ""))
    return codec


def _params(codec: str, itemsize: int) -> dict:
    blosc2 = _blosc()
    if codec == "zstd":
        return {"codec": blosc2.Codec.ZSTD, "filters": [blosc2.Filter.NOFILTER], "typesize": 1}
    if codec == "shuffle-zstd":
        return {"codec": blosc2.Codec.ZSTD, "filters": [blosc2.Filter.SHUFFLE], "typesize": itemsize}
    if codec == "shuffle-lz4":
        return {"codec": blosc2.Codec.LZ4, "filters": [blosc2.Filter.SHUFFLE], "typesize": itemsize}
    raise ConfigError(f"codec {codec!r} has no compression parameters")


def encode(data: memoryview | bytes, codec: str, itemsize: int = 1, *, level: int = 1,
           threads: int = 2) -> memoryview | bytes:
    """Compress ``data`` with ``codec``. Returns ``data`` itself for ``raw``.

    ``threads`` applies to ``shuffle-lz4`` (blosc2's block threads); the zstd codecs code
    one chunk per call on the calling thread, without the GIL: run chunks on a thread pool.
    """
    check_codec(codec, lossy=True)
    if codec == "raw":
        return data
    n = memoryview(data).nbytes
    if itemsize < 1 or itemsize > 255:
        raise ConfigError(f"element size must be 1..255 bytes, got {itemsize}")
    if n % itemsize or codec == "zstd":
        itemsize = 1  # shuffle needs whole elements; fall back to bytes
    if codec in _ZSTD_CODECS or codec == "bytegroup-zstd":
        if n > MAX_CHUNK_BYTES:
            raise ConfigError(f"chunk of {n} bytes is larger than the codec limit {MAX_CHUNK_BYTES}")
    if codec == "bytegroup-zstd":
        return codecs_bytegroup.encode(data, itemsize, level)
    if codec in LOSSY_CODECS:
        return codecs_lossy.encode(data, codec, level)
    if codec in _ZSTD_CODECS:
        src = np.frombuffer(data, dtype=np.uint8)
        planes = src if itemsize == 1 else _shuffle(src, itemsize)
        frame = compressor(level).compress(planes)
        return _TSZ.pack(_TSZ_MAGIC, _TSZ_VERSION, itemsize, n, len(frame)) + frame
    blosc2 = _blosc()
    if n > blosc2.MAX_BUFFERSIZE:
        raise ConfigError(f"chunk of {n} bytes is larger than the codec limit {blosc2.MAX_BUFFERSIZE}")
    return blosc2.compress2(data, clevel=level, nthreads=threads, **_params(codec, itemsize))


def _shuffle(src: np.ndarray, itemsize: int) -> np.ndarray:
    """Byte planes of ``src`` (plane k = byte k of every element), in a per-thread buffer."""
    out = scratch(src.nbytes)
    planes, elems = out.reshape(itemsize, -1), src.reshape(-1, itemsize)
    for k in range(itemsize):  # one strided pass per plane: numpy copies without the GIL
        planes[k] = elems[:, k]
    return out


def _unshuffle(planes: np.ndarray, itemsize: int, out: np.ndarray) -> None:
    elems, src = out.reshape(-1, itemsize), planes.reshape(itemsize, -1)
    for k in range(itemsize):
        elems[:, k] = src[k]


def _decode_tsz(stored: memoryview | bytes, raw_size: int, key: str,
                out: memoryview | None) -> memoryview | bytes | bytearray:
    view = memoryview(stored).cast("B")
    if view.nbytes < _TSZ.size:
        raise ChunkCorruptError(f"chunk {key}: truncated zstd container ({view.nbytes} bytes)")
    _magic, version, itemsize, size, frame_size = _TSZ.unpack_from(view)
    if version != _TSZ_VERSION or itemsize < 1:
        raise ChunkCorruptError(f"chunk {key}: unknown zstd container version {version} / element size {itemsize}")
    if size != raw_size or raw_size % itemsize:
        raise ChunkCorruptError(f"chunk {key}: header says {size} raw bytes, reference says {raw_size}")
    frame = view[_TSZ.size:]
    if frame.nbytes != frame_size:
        raise ChunkCorruptError(f"chunk {key}: zstd frame of {frame.nbytes} bytes, header says {frame_size}")
    result: memoryview | bytearray = memoryview(out).cast("B") if out is not None else bytearray(raw_size)
    dst = np.frombuffer(result, dtype=np.uint8)
    if dst.nbytes != raw_size:
        raise ChunkCorruptError(f"chunk {key}: destination holds {dst.nbytes} bytes, reference says {raw_size}")
    target = dst if itemsize == 1 else scratch(raw_size)
    decode_frame_into(frame, memoryview(target), key)
    if itemsize > 1:
        _unshuffle(target, itemsize, dst)
    return out if out is not None else result


def decode(stored: memoryview | bytes, codec: str, raw_size: int, *, key: str = "",
           out: memoryview | None = None, threads: int = 2) -> memoryview | bytes:
    """Decompress into ``out`` (if given) or a new buffer; checks every size first."""
    check_codec(codec, lossy=True)
    if raw_size < 0 or raw_size > MAX_CHUNK_BYTES:
        raise ChunkCorruptError(f"chunk {key}: claimed size {raw_size} is out of bounds")
    if codec == "raw":
        if memoryview(stored).nbytes != raw_size:
            raise ChunkCorruptError(f"chunk {key}: {memoryview(stored).nbytes} bytes stored, {raw_size} expected")
        if out is not None:
            memoryview(out).cast("B")[:] = memoryview(stored).cast("B")
            return out
        return stored
    if codec == "bytegroup-zstd":
        return codecs_bytegroup.decode(stored, raw_size, key, out)
    if codec in LOSSY_CODECS:
        return codecs_lossy.decode(stored, raw_size, key, out)
    if codec in _ZSTD_CODECS and bytes(memoryview(stored).cast("B")[:3]) == _TSZ_MAGIC:
        return _decode_tsz(stored, raw_size, key, out)
    blosc2 = _blosc()
    try:
        nbytes, cbytes, _blocksize = blosc2.get_cbuffer_sizes(stored)
    except MemoryError:
        raise  # out of memory says nothing about the chunk: not ChunkCorruptError
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
    except MemoryError:
        raise  # out of memory says nothing about the chunk: not ChunkCorruptError
    except Exception as exc:
        raise ChunkCorruptError(f"chunk {key}: {codec} stream failed to decode: {exc}") from None
    return result
