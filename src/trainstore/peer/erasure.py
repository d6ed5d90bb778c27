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


def _padded(data: bytes, n: int) -> bytes:
    return bytes(data) + b"\0" * (n - len(data))


def encode_parity(slices: list[bytes], k: int, g: int, blocknums: list[int]) -> list[bytes]:
    """Parity blocks ``blocknums`` (each >= k) of a stripe whose ``k`` data slices are given."""
    n = block_len([len(s) for s in slices])
    blocks = tuple(_padded(s, n) for s in slices)
    return [bytes(b) for b in zfec.Encoder(k, g).encode(blocks, tuple(blocknums))]


def decode_stripe(blocks: dict[int, bytes], k: int, g: int, slice_lens: list[int]) -> list[bytes]:
    """The ``k`` data slices of a stripe from any ``k`` of its blocks (``{blocknum: bytes}``)."""
    if len(blocks) < k:
        raise IntegrityError(f"a stripe needs {k} of its {g} blocks to decode, {len(blocks)} are left")
    n = block_len(slice_lens)
    nums = sorted(blocks)[:k]
    for j in nums:
        if len(blocks[j]) != n:
            raise IntegrityError(f"block {j} of a stripe has {len(blocks[j])} bytes, the stripe's blocks {n}")
    out = zfec.Decoder(k, g).decode(tuple(blocks[j] for j in nums), tuple(nums))
    return [bytes(b)[:ln] for b, ln in zip(out, slice_lens, strict=True)]


__all__ = ["block_len", "decode_stripe", "encode_parity", "slice_span", "stripe_node", "stripe_of"]
