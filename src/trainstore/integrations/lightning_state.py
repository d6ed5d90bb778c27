"""What a Lightning checkpoint dict holds: its content hash, and whether it is sharded.

Two Lightning saves at one ``global_step`` (``last.ckpt`` after the top-k file, an
``ema.ckpt`` of other weights, a ``save_weights_only`` file next to a full one) share one
trainstore checkpoint only when their content is identical: ``content_hash`` is a blake3
over every leaf (tensor bytes with dtype and shape, plain values by type and value) of the
encoded dict, keys in order. Under a sharded strategy each rank hashes its own shards and
the digests of all ranks are combined (``combine``), so equal hashes mean equal content on
every rank.
"""

from __future__ import annotations

import struct
from typing import Any

import blake3
import torch

try:  # torch >= 2.4
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch
    DTensor = ()  # type: ignore[assignment,misc]


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    if isinstance(t, DTensor):
        t = t.to_local()
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def _walk(h: Any, v: Any) -> None:
    if isinstance(v, torch.Tensor):
        h.update(f"T{v.dtype}{tuple(v.shape)}".encode())
        h.update(_tensor_bytes(v))
    elif isinstance(v, dict):
        h.update(b"D%d" % len(v))
        for k, x in v.items():
            h.update(repr(k).encode() + b"\0")
            _walk(h, x)
    elif isinstance(v, (list, tuple)):
        h.update(b"L%d" % len(v) if isinstance(v, list) else b"U%d" % len(v))
        for x in v:
            _walk(h, x)
    elif hasattr(v, "__array__") and hasattr(v, "dtype"):  # numpy arrays and scalars
        h.update(f"N{v.dtype}{getattr(v, 'shape', ())}".encode())
        h.update(memoryview(v.tobytes()))
    elif isinstance(v, float):
        h.update(b"F" + struct.pack("<d", v))
    else:
        h.update(f"{type(v).__name__}:{v!r}\0".encode())


def content_hash(state: Any) -> str:
    """blake3 of ``state``'s content (this rank's shards of a sharded state)."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    _walk(h, state)
    return h.hexdigest()


def combine(digests: list[str]) -> str:
    """One hash of every rank's ``content_hash`` (in rank order)."""
    return blake3.blake3("|".join(digests).encode()).hexdigest()


def is_sharded(state: Any) -> bool:
    """True if any tensor of ``state`` is a DTensor (FSDP2 / ModelParallelStrategy shards)."""
    if isinstance(state, DTensor):
        return True
    if isinstance(state, dict):
        return any(is_sharded(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(is_sharded(v) for v in state)
    return False


__all__ = ["content_hash", "combine", "is_sharded"]
