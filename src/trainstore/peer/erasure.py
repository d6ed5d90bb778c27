"""Reed-Solomon stripes across a group of nodes (zfec; ``docs/design-choices.md`` says why).

A group has ``g = k + m`` nodes (``k`` = ``PeerPolicy.data``, ``m`` = ``parity``), at
positions 0..g-1. Each node's *bundle* (its new chunks of one step, concatenated) is cut into
``k`` slices. Stripe ``s`` (0..g-1) holds slice ``t`` of the node at position ``(s + t) % g``
for ``t < k`` and parity blocks ``k..g-1`` on the nodes at ``(s + j) % g`` for ``j >= k``: every
stripe spans all ``g`` nodes, so losing any ``m`` of them loses at most ``m`` blocks of each
stripe, and ``k`` survivors decode it. Each node holds ``m`` parity blocks per step (one per
stripe it is a parity position of), each about ``1/k`` of a bundle: ``m/k`` overhead.
"""

from __future__ import annotations

import zfec

from ..errors import IntegrityError


def slice_span(length: int, k: int, t: int) -> tuple[int, int]:
    """``(start, length)`` of slice ``t`` of a ``length``-byte bundle cut into ``k`` slices."""
    per = -(-length // k) if length else 0
    start = min(t * per, length)
    return start, max(0, min(per, length - start))


def stripe_of(position: int, t: int, g: int) -> int:
    """The stripe that holds slice ``t`` of the node at ``position``."""
    return (position - t) % g


def stripe_node(stripe: int, j: int, g: int) -> int:
    """Position of the node holding block ``j`` of ``stripe`` (data slice for j < k, parity else)."""
    return (stripe + j) % g


def block_len(slice_lens: list[int]) -> int:
    """Length every block of a stripe is padded to (zfec needs equal blocks; at least 1)."""
    return max([1, *slice_lens])


#: bytes of each block zfec codes per call: zfec holds the GIL while it runs, so a stripe is
#: coded in column segments (Reed-Solomon works byte position by byte position: the result is
#: the same) and the save path's threads get the GIL between them
SEGMENT = 256 << 10


def _segment(data: bytes | bytearray | memoryview, start: int, n: int) -> bytes | memoryview:
    """Bytes ``start..start+n`` of ``data``, zero-padded past its end (a view when no padding)."""
    mv = memoryview(data).cast("B")
    part = mv[start:start + n]
    if part.nbytes == n:
        return part
    return bytes(part) + b"\0" * (n - part.nbytes)


def encode_parity(slices: list, k: int, g: int, blocknums: list[int]) -> list[bytearray]:
    """Parity blocks ``blocknums`` (each >= k) of a stripe whose ``k`` data slices are given."""
    n = block_len([memoryview(s).nbytes for s in slices])
    out = [bytearray(n) for _ in blocknums]
    enc = zfec.Encoder(k, g)
    for a in range(0, n, SEGMENT):
        w = min(SEGMENT, n - a)
        for o, b in zip(out, enc.encode(tuple(_segment(s, a, w) for s in slices), tuple(blocknums)), strict=True):
            o[a:a + w] = b
    return out


def decode_stripe(blocks: dict[int, bytes], k: int, g: int, slice_lens: list[int],
                  want: list[int] | None = None) -> list[bytes]:
    """The data slices ``want`` (default: all ``k``) of a stripe from any ``k`` of its blocks
    (``{blocknum: bytes}``), in ``want`` order."""
    if len(blocks) < k:
        raise IntegrityError(f"a stripe needs {k} of its {g} blocks to decode, {len(blocks)} are left")
    n = block_len(slice_lens)
    nums = sorted(blocks)[:k]
    for j in nums:
        if memoryview(blocks[j]).nbytes != n:
            raise IntegrityError(f"block {j} of a stripe has {memoryview(blocks[j]).nbytes} bytes, the stripe's "
                                 f"blocks {n}")
    want = list(range(k)) if want is None else want
    views = {j: memoryview(blocks[j]).cast("B") for j in nums}
    out: list[bytes] = []
    missing = [t for t in want if t not in views]
    decoded = {t: bytearray(slice_lens[t]) for t in missing}
    if missing:
        dec = zfec.Decoder(k, g)
        for a in range(0, n, SEGMENT):
            w = min(SEGMENT, n - a)
            got = dec.decode(tuple(views[j][a:a + w] for j in nums), tuple(nums))
            for t in missing:
                hi = min(w, slice_lens[t] - a)
                if hi > 0:
                    decoded[t][a:a + hi] = got[t][:hi]
    for t in want:
        out.append(decoded[t] if t in decoded else views[t][:slice_lens[t]])
    return out


__all__ = ["block_len", "decode_stripe", "encode_parity", "slice_span", "stripe_node", "stripe_of"]
