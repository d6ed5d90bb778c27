"""Reusable host staging buffers: the only work an async save does on the caller's time.

An ``Arena`` is one contiguous host buffer (pinned when CUDA is available, so device->host
copies run at full speed) carved into 64-byte aligned slots, one per tensor. It is
allocated and touched once (first touch of fresh memory is several times slower than a copy
into touched memory) and reused by every later save with the same or a smaller layout.

``stage(leaves)`` copies every tensor of a flattened state into its slot and returns
``StagedTensor`` views (raw bytes) the background writer reads while training continues.
``stage_state_dict(state_dict)`` is the same job for a torch.distributed state dict (DTensor
/ FSDP shards kept as such, for ``dcp.save``): a host copy reused while the layout holds.
One ``Stager`` serves both save backends (single process and DCP).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .state import Leaf

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None  # type: ignore[assignment]

ALIGN = 64
#: Tensors larger than this are copied by ``COPY_THREADS`` plain threads in parts.
SPLIT_COPY_BYTES = 32 << 20
COPY_THREADS = max(1, min(2, os.cpu_count() or 1))


@dataclass
class StagedTensor:
    """A staged copy of one leaf: its metadata and a uint8 view of its bytes in the arena."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    itemsize: int
    data: memoryview  # raw bytes (format "B"), valid until the arena is reused


class Arena:
    """One touched (and, with CUDA, pinned) host buffer reused across saves."""

    def __init__(self, nbytes: int, pin: bool | None = None) -> None:
        self.capacity = max(int(nbytes), ALIGN)
        if pin is None:
            pin = torch is not None and torch.cuda.is_available()
        self.pinned = bool(pin)
        if torch is not None:
            buf = torch.empty(self.capacity, dtype=torch.uint8, pin_memory=self.pinned)
            buf.zero_()  # touch every page now, not during the first save
            self.tensor = buf
            self.array = buf.numpy()
        else:  # pragma: no cover
            self.tensor = None
            self.array = np.zeros(self.capacity, dtype=np.uint8)

    def slot(self, offset: int, nbytes: int) -> np.ndarray:
        return self.array[offset:offset + nbytes]


def plan(leaves: list[Leaf]) -> tuple[list[int], int]:
    """Aligned offsets for each leaf and the total bytes needed."""
    offsets, pos = [], 0
    for leaf in leaves:
        offsets.append(pos)
        pos += (leaf.nbytes + ALIGN - 1) // ALIGN * ALIGN
    return offsets, pos


class Stager:
    """Owns the arenas: ``acquire(total)`` gives an arena of at least ``total`` bytes.

    ``spare`` keeps a released arena (the previous base of incrementals) for reuse, so the
    steady state allocates nothing.
    """

    def __init__(self, pin: bool | None = None) -> None:
        self.pin = pin
        self._spare: list[Arena] = []
        self.allocations = 0  # how many arenas were ever allocated (tests check reuse)
        self._copy_pool: ThreadPoolExecutor | None = None
        self.state_dict_cache: dict | None = None  # stage_state_dict's reusable host copy
        self._state_dict_layout: Any = None

    def _memcpy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[:] = src (uint8 views): one ``np.copyto`` (GIL released), split over
        ``COPY_THREADS`` threads for large tensors."""
        n = dst.nbytes
        if n < SPLIT_COPY_BYTES or COPY_THREADS < 2:
            np.copyto(dst, src)
            return
        if self._copy_pool is None:
            self._copy_pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="trainstore-stage")
        step = -(-n // COPY_THREADS) // ALIGN * ALIGN or n
        parts = [(dst[i:i + step], src[i:i + step]) for i in range(0, n, step)]
        futs = [self._copy_pool.submit(np.copyto, d, s) for d, s in parts[1:]]
        np.copyto(*parts[0])
        for f in futs:
            f.result()

    def acquire(self, total: int) -> Arena:
        for i, arena in enumerate(self._spare):
            if arena.capacity >= total:
                return self._spare.pop(i)
        self._spare.clear()  # too small: let them go before allocating a bigger one
        self.allocations += 1
        return Arena(int(total * 1.05) + ALIGN, self.pin)  # headroom for slowly growing states

    def release(self, arena: Arena | None) -> None:
        if arena is not None:
            self._spare.append(arena)

    def reserve(self, total: int, count: int = 1) -> None:
        """Allocate and touch ``count`` arenas now (e.g. at start, off the training loop's clock)."""
        for _ in range(count):
            self.release(self.acquire(total))

    def stage(self, leaves: list[Leaf], arena: Arena) -> list[StagedTensor]:
        """Copy every leaf into ``arena``; returns views of the staged bytes."""
        offsets, total = plan(leaves)
        assert total <= arena.capacity
        out: list[StagedTensor] = []
        cuda_used = False
        for leaf, off in zip(leaves, offsets):
            dst = arena.slot(off, leaf.nbytes)
            obj = leaf.obj
            if leaf.is_torch:
                src = obj.detach()
                if src.is_conj():
                    src = src.resolve_conj()
                if src.is_neg():
                    src = src.resolve_neg()
                if leaf.nbytes and src.device.type == "cpu" and src.is_contiguous():
                    # plain memcpy (numpy, GIL released; 2 threads for large tensors): torch's copy_
                    # uses OpenMP threads that spin against each other and against the training loop
                    # on a busy machine (measured 3-10x slower than one thread there)
                    self._memcpy(dst, src.reshape(-1).view(torch.uint8).numpy())
                elif leaf.nbytes:
                    dst_t = arena.tensor[off:off + leaf.nbytes].view(src.dtype).view(src.shape)
                    if src.device.type != "cpu":
                        dst_t.copy_(src, non_blocking=arena.pinned)
                        cuda_used = cuda_used or src.device.type == "cuda"
                    else:
                        dst_t.copy_(src)
            elif leaf.nbytes:
                np.copyto(dst.view(obj.dtype).reshape(obj.shape), obj, casting="no")
            out.append(StagedTensor(leaf.name, leaf.dtype, leaf.shape, leaf.itemsize, memoryview(dst)))
        if cuda_used:
            torch.cuda.synchronize()
        return out

    def stage_state_dict(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Copy a (possibly sharded) torch state dict to host memory, reusing the previous
        copy's buffers while the structure and tensor shapes/dtypes stay the same (pinned
        only when CUDA exists). DTensors stay DTensors with host local shards (``dcp.save``
        plans from them)."""
        # torch's private helpers (also behind dcp.async_save's own stager): lazy, torch is optional
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        sig = _layout(state_dict)
        if self.state_dict_cache is None or self._state_dict_layout != sig:
            # first save, or the state changed shape (e.g. optimizer state appeared): new buffers
            pin = torch.cuda.is_available() if self.pin is None else self.pin
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=pin)
            self._state_dict_layout = sig
        return _copy_state_dict(state_dict, self.state_dict_cache)


def _layout(state_dict: dict[str, Any]) -> Any:
    """Structure + tensor shapes/dtypes of a state dict (when equal, cached buffers fit)."""
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(state_dict)
    return spec, [(type(x), tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x) for x in leaves]


__all__ = ["Arena", "Stager", "StagedTensor", "plan", "ALIGN"]
