"""Opt-in LOSSY chunk codecs for float32 optimizer moments (never for parameters).

Codec names (recorded per chunk like every codec; ``codecs.LOSSY_CODECS``):

* ``lossy-bf16``: float32 rounded to bfloat16 (round to nearest even; NaN stays NaN), the
  bf16 bytes then stored as a ``bytegroup-zstd`` container. Relative error <= 2^-8.
* ``lossy-q8``: blockwise 8-bit with a per-block scale, as 8-bit optimizers store Adam's
  first moment (``exp_avg``, signed). Each block of ``BLOCK`` elements is divided by its
  absolute maximum; a value's code is a sign bit and a 7-bit index into a LOGARITHMIC map:
  127 magnitudes spaced evenly in log2 over ``Q8_OCTAVES`` octaves below the block maximum,
  plus zero. A linear map (the absmax scheme) zeroes every value under 1/254 of its block's
  maximum; a log map keeps each value within a fixed relative error instead
  (2^(step/2) - 1 = 4.5% at 16 octaves), and only values under 2^-16 of the block
  maximum become 0.
* ``lossy-q8-sqrt``: the same for Adam's second moment (``exp_avg_sq``, non-negative with a
  huge range): the square root is coded with an unsigned 8-bit log map (255 magnitudes over
  ``SQRT_OCTAVES`` octaves: 2.8% relative error on sqrt(v), the quantity Adam divides by;
  values under 2^-40 of the block maximum become 0). Decoded as the square of the value.

The codes are zstd-compressed (kept raw when that does not pay); the per-block scales and
the 256-entry map are stored as float32, so decoding is a table lookup and float32
multiplies: bit-identical on every machine, which the chunk's BLAKE3 (taken of the DECODED
bytes, like any chunk) relies on. Encoding is deterministic too, so encoding the same input
again gives the same stored bytes (a GC-lease rewrite of the chunk relies on that).

Layout (little endian)::

    "TSQ" version:u8 mode:u8 pad:3 block:u32 raw_size:u64
    mode 0/1 (q8, q8-sqrt): table 256 x f32 | scales nblocks x f32 | codes_mode:u8 codes_len:u64 | codes
    mode 2 (bf16):          a bytegroup-zstd container of raw_size / 2 bytes

Inputs must be whole float32 elements and finite (``encodable`` says so; the writer keeps
anything else lossless). Every size is checked against the reference before decoding.
"""

from __future__ import annotations

import struct

import numpy as np

from . import codecs_bytegroup
from .errors import ChunkCorruptError, ConfigError
from .zstd_frames import decode_frame_into, plane_compressor

#: codec name -> container mode
MODES = {"lossy-q8": 0, "lossy-q8-sqrt": 1, "lossy-bf16": 2}
LOSSY_CODECS = tuple(MODES)
BLOCK = 256
Q8_OCTAVES = 16.0
SQRT_OCTAVES = 20.0
_MAGIC = b"TSQ"
_VERSION = 1
_HEADER = struct.Struct("<3sBBxxxIQ")
_CODES = struct.Struct("<BQ")
_RAW, _ZSTD = 0, 1
_F32 = np.dtype("<f4")


def _tables() -> tuple[np.ndarray, np.ndarray]:
    """The 256-entry float32 maps: signed (code = sign<<7 | index) and unsigned sqrt."""
    signed = np.zeros(256, dtype=np.float64)
    idx = np.arange(1, 128)
    signed[1:128] = np.exp2(-(127 - idx) * Q8_OCTAVES / 126)
    signed[129:256] = -signed[1:128]
    unsigned = np.zeros(256, dtype=np.float64)
    idx = np.arange(1, 256)
    unsigned[1:] = np.exp2(-(255 - idx) * SQRT_OCTAVES / 254)
    return signed.astype(_F32), unsigned.astype(_F32)


SIGNED_MAP, SQRT_MAP = _tables()


def relative_error_bound(codec: str) -> float:
    """The largest relative error of a value above the map's floor (half a log step; for
    ``lossy-q8-sqrt`` of the square root, the decoded value's is about twice that)."""
    if codec == "lossy-bf16":
        return 2.0 ** -8
    octaves, steps = (Q8_OCTAVES, 126) if codec == "lossy-q8" else (SQRT_OCTAVES, 254)
    return float(2.0 ** (octaves / steps / 2) - 1)


def encodable(data: memoryview | bytes | np.ndarray, codec: str) -> bool:
    """Whether ``codec`` may store ``data`` (raw float32 bytes): whole elements, all finite
    (a block's scale would be NaN), and for ``lossy-q8-sqrt`` none negative."""
    view = memoryview(data).cast("B")
    if view.nbytes % 4:
        return False
    x = np.frombuffer(view, dtype=_F32)
    if not np.isfinite(x).all():
        return False
    return codec != "lossy-q8-sqrt" or not (x < 0).any()


def _blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|x| padded to whole blocks as [nblocks, BLOCK], per-block absmax float32)."""
    nblocks = -(-x.size // BLOCK)
    mag = np.zeros(nblocks * BLOCK, dtype=_F32)
    np.abs(x, out=mag[:x.size])
    mag = mag.reshape(nblocks, BLOCK)
    return mag, mag.max(axis=1)


def _log_codes(mag: np.ndarray, scales: np.ndarray, octaves: float, steps: int) -> np.ndarray:
    """Index 1..steps+1 of each magnitude in the log map (0: zero), per block."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = mag / np.where(scales > 0, scales, 1)[:, None]
        level = np.rint(-np.log2(rel) * (steps / octaves))  # 0 = the block maximum
    idx = np.where(level <= steps, steps + 1 - level, 0)
    return np.nan_to_num(idx, nan=0, posinf=0, neginf=0).astype(np.uint8)


def encode(data: memoryview | bytes, codec: str, level: int = 1) -> bytes:
    """Encode raw float32 bytes with a lossy codec (``ConfigError`` if not ``encodable``)."""
    mode = MODES.get(codec)
    if mode is None:
        raise ConfigError(f"{codec!r} is not a lossy codec ({', '.join(LOSSY_CODECS)})")
    if not encodable(data, codec):
        raise ConfigError(f"codec {codec} stores whole, finite float32 values"
                          + (", none negative" if codec == "lossy-q8-sqrt" else ""))
    x = np.frombuffer(memoryview(data).cast("B"), dtype=_F32)
    header = _HEADER.pack(_MAGIC, _VERSION, mode, BLOCK, x.nbytes)
    if codec == "lossy-bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # nearest even
        return header + codecs_bytegroup.encode(rounded.view(np.uint8), 2, level)
    if codec == "lossy-q8":
        mag, scales = _blocks(x)
        codes = _log_codes(mag, scales, Q8_OCTAVES, 126).reshape(-1)[:x.size]
        codes |= (x < 0).view(np.uint8) << 7
        table = SIGNED_MAP
    else:
        root = np.sqrt(x)
        mag, scales = _blocks(root)
        codes = _log_codes(mag, scales, SQRT_OCTAVES, 254).reshape(-1)[:x.size]
        table = SQRT_MAP
    frame = plane_compressor(level).compress(codes)
    body = (_ZSTD, frame) if len(frame) < codes.nbytes else (_RAW, codes.tobytes())
    return b"".join([header, table.tobytes(), scales.astype(_F32).tobytes(), _CODES.pack(body[0], len(body[1])),
                     body[1]])


def decode(stored: memoryview | bytes, raw_size: int, key: str,
           out: memoryview | None) -> memoryview | bytearray:
    """Decode a TSQ chunk into ``out`` (or a new buffer) after checking every size."""
    view = memoryview(stored).cast("B")
    if view.nbytes < _HEADER.size:
        raise ChunkCorruptError(f"chunk {key}: truncated lossy container ({view.nbytes} bytes)")
    magic, version, mode, block, size = _HEADER.unpack_from(view)
    if magic != _MAGIC or version != _VERSION or mode not in MODES.values():
        raise ChunkCorruptError(f"chunk {key}: not a lossy container (magic {magic!r}, version {version}, mode {mode})")
    if size != raw_size or raw_size % 4:
        raise ChunkCorruptError(f"chunk {key}: header says {size} raw bytes, reference says {raw_size}")
    result: memoryview | bytearray = memoryview(out).cast("B") if out is not None else bytearray(raw_size)
    if memoryview(result).nbytes != raw_size:
        raise ChunkCorruptError(f"chunk {key}: destination holds {memoryview(result).nbytes} bytes, "
                                f"reference says {raw_size}")
    dst = np.frombuffer(result, dtype=_F32)
    n = raw_size // 4
    if mode == MODES["lossy-bf16"]:
        half = codecs_bytegroup.decode(view[_HEADER.size:], raw_size // 2, key, None)
        np.left_shift(np.frombuffer(half, dtype=np.uint16).astype(np.uint32), 16, out=dst.view(np.uint32))
        return result
    if not 16 <= block <= 1 << 20:
        raise ChunkCorruptError(f"chunk {key}: lossy block size {block} out of range")
    nblocks = -(-n // block)
    offset = _HEADER.size
    need = offset + 1024 + 4 * nblocks + _CODES.size
    if view.nbytes < need:
        raise ChunkCorruptError(f"chunk {key}: lossy container of {view.nbytes} bytes, its tables need {need}")
    table = np.frombuffer(view[offset:offset + 1024], dtype=_F32)
    scales = np.frombuffer(view[offset + 1024:offset + 1024 + 4 * nblocks], dtype=_F32)
    codes_mode, codes_len = _CODES.unpack_from(view, need - _CODES.size)
    if codes_mode not in (_RAW, _ZSTD) or need + codes_len != view.nbytes or (codes_mode == _RAW and codes_len != n):
        raise ChunkCorruptError(f"chunk {key}: lossy codes section (mode {codes_mode}, {codes_len} bytes) does not "
                                f"fit a {view.nbytes}-byte container of {n} values")
    body = view[need:]
    if codes_mode == _RAW:
        codes = np.frombuffer(body, dtype=np.uint8)
    else:
        codes = np.empty(n, dtype=np.uint8)
        decode_frame_into(body, memoryview(codes), key)
    per_elem = np.repeat(scales, block)[:n] if n else scales[:0]
    np.multiply(table[codes], per_elem, out=dst)
    if mode == MODES["lossy-q8-sqrt"]:
        np.multiply(dst, dst, out=dst)
    return result


__all__ = ["BLOCK", "LOSSY_CODECS", "MODES", "Q8_OCTAVES", "SIGNED_MAP", "SQRT_MAP", "SQRT_OCTAVES", "decode",
           "encodable", "encode", "relative_error_bound"]
