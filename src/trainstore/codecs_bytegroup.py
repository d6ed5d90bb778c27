"""The ``bytegroup-zstd`` chunk container: the ZipNN idea with numpy + zstandard.

A float's sign bit sits above its exponent, so byte-shuffled float32/bf16 data puts the sign
and 7 exponent bits in one plane and the last exponent bit among mantissa bits. Here the
elements' bytes are grouped into planes (plane k = byte k of every element) and, for
elements of 2 bytes or more, the top bits of the two highest planes are swapped: the
highest plane then holds exactly the 8 exponent bits of a float32 or bfloat16 (ZipNN moves
the sign bit for the same reason), the sign joins the noisy mantissa bits. Each plane is
stored on its own: as a zstd frame, or raw when a sample shows zstd would not shrink it (the
noisy low mantissa bytes), which skips their compression on save and their decompression on
restore. Planes are coded with zstd's fast mode tuned to prefer literals
(zstd_frames.plane_compressor): the exponent plane is low-entropy noise, where level 1's
short matches cost more than Huffman-coded bytes (what ZipNN's own Huffman coder exploits).

The swap is its own inverse on any bytes, so the codec is lossless for every dtype; it only
pays off on floats. Layout (little endian)::

    "TSG" version:u8 itemsize:u8 swap:u8 planes:u8 pad:u8 raw_size:u64
    planes x (mode:u8 stored_size:u64)        mode 0 = raw, 1 = zstd frame
    the planes' stored bytes, in order

The decoder checks every size against the reference's raw size before writing anything.
"""

from __future__ import annotations

import struct

import numpy as np

from .errors import ChunkCorruptError
from .zstd_frames import decode_frame_into, plane_compressor, scratch

MAGIC = b"TSG"
_VERSION = 1
_HEADER = struct.Struct("<3sBBBBxQ")
_PLANE = struct.Struct("<BQ")
_RAW, _ZSTD = 0, 1
#: A plane is kept raw when zstd shrinks a sample of it to more than this fraction.
RAW_PLANE_ABOVE = 0.97
_SAMPLE = 64 << 10


def _swap_top_bits(high: np.ndarray, next_high: np.ndarray) -> None:
    """Exchange bit 7 of the contiguous planes ``high`` and ``next_high``, in place
    (self-inverse)."""
    diff = scratch(high.nbytes, 1)
    np.bitwise_xor(high, next_high, out=diff)
    np.bitwise_and(diff, 0x80, out=diff)
    np.bitwise_xor(high, diff, out=high)
    np.bitwise_xor(next_high, diff, out=next_high)


def _encode_plane(plane: np.ndarray, level: int) -> tuple[int, memoryview | bytes]:
    c = plane_compressor(level)
    sample = plane[:_SAMPLE]
    if sample.nbytes and len(c.compress(sample)) > RAW_PLANE_ABOVE * sample.nbytes:
        return _RAW, memoryview(plane)
    frame = c.compress(plane)
    return (_ZSTD, frame) if len(frame) < plane.nbytes else (_RAW, memoryview(plane))


def encode(data: memoryview | bytes, itemsize: int, level: int) -> bytes:
    """Encode ``data`` (whole elements of ``itemsize`` bytes; the caller checks) as TSG."""
    src = np.frombuffer(data, dtype=np.uint8)
    n = src.nbytes
    swap = int(itemsize > 1)
    if itemsize == 1:
        planes = [src]
    else:
        grouped = scratch(n, 0).reshape(itemsize, -1)
        by_elem = src.reshape(-1, itemsize)
        for k in range(itemsize):  # strided numpy copies release the GIL
            grouped[k] = by_elem[:, k]
        _swap_top_bits(grouped[-1], grouped[-2])
        planes = list(grouped)
    coded = [_encode_plane(p, level) for p in planes]
    table = b"".join(_PLANE.pack(mode, memoryview(body).nbytes) for mode, body in coded)
    return b"".join([_HEADER.pack(MAGIC, _VERSION, itemsize, swap, len(planes), n), table,
                     *(body for _, body in coded)])


def decode(stored: memoryview | bytes, raw_size: int, key: str,
           out: memoryview | None) -> memoryview | bytearray:
    """Decode a TSG chunk into ``out`` (or a new buffer) after checking every size."""
    view = memoryview(stored).cast("B")
    if view.nbytes < _HEADER.size:
        raise ChunkCorruptError(f"chunk {key}: truncated bytegroup container ({view.nbytes} bytes)")
    magic, version, itemsize, swap, nplanes, size = _HEADER.unpack_from(view)
    if magic != MAGIC or version != _VERSION:
        raise ChunkCorruptError(f"chunk {key}: not a bytegroup container (magic {magic!r}, version {version})")
    if itemsize < 1 or nplanes != itemsize or swap not in (0, int(itemsize > 1)):
        raise ChunkCorruptError(f"chunk {key}: bad bytegroup header (element size {itemsize}, "
                                f"{nplanes} planes, swap {swap})")
    if size != raw_size or raw_size % itemsize:
        raise ChunkCorruptError(f"chunk {key}: header says {size} raw bytes, reference says {raw_size}")
    plane_size = raw_size // itemsize
    offset = _HEADER.size + nplanes * _PLANE.size
    if view.nbytes < offset:
        raise ChunkCorruptError(f"chunk {key}: truncated bytegroup plane table ({view.nbytes} bytes)")
    table = [_PLANE.unpack_from(view, _HEADER.size + k * _PLANE.size) for k in range(nplanes)]
    if any(mode not in (_RAW, _ZSTD) for mode, _ in table):
        raise ChunkCorruptError(f"chunk {key}: unknown plane mode in {[m for m, _ in table]}")
    if any(mode == _RAW and length != plane_size for mode, length in table):
        raise ChunkCorruptError(f"chunk {key}: a raw plane is not {plane_size} bytes")
    if offset + sum(length for _, length in table) != view.nbytes:
        raise ChunkCorruptError(f"chunk {key}: planes take {sum(ln for _, ln in table)} bytes, "
                                f"container has {view.nbytes - offset} after its header")
    result: memoryview | bytearray = memoryview(out).cast("B") if out is not None else bytearray(raw_size)
    dst = np.frombuffer(result, dtype=np.uint8)
    if dst.nbytes != raw_size:
        raise ChunkCorruptError(f"chunk {key}: destination holds {dst.nbytes} bytes, reference says {raw_size}")
    if itemsize == 1:
        mode, length = table[0]
        if mode == _RAW:
            dst[:] = np.frombuffer(view[offset:offset + length], dtype=np.uint8)
        else:
            decode_frame_into(view[offset:offset + length], memoryview(dst), key)
        return result
    decoded = scratch(raw_size, 0).reshape(itemsize, -1)
    sources: list[np.ndarray] = []
    for k, (mode, length) in enumerate(table):
        body = view[offset:offset + length]
        offset += length
        if mode == _RAW:
            sources.append(np.frombuffer(body, dtype=np.uint8))
        else:
            decode_frame_into(body, memoryview(decoded[k]), key)
            sources.append(decoded[k])
    if swap:  # on contiguous planes (fast); a raw plane is copied out of the stored bytes first
        for k in (itemsize - 1, itemsize - 2):
            if table[k][0] == _RAW:
                decoded[k] = sources[k]
                sources[k] = decoded[k]
        _swap_top_bits(decoded[-1], decoded[-2])
    by_elem = dst.reshape(-1, itemsize)
    for k, plane in enumerate(sources):  # strided numpy copies release the GIL
        by_elem[:, k] = plane
    return result


__all__ = ["MAGIC", "RAW_PLANE_ABOVE", "decode", "encode"]
