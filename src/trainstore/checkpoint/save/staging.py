"""Reusable host staging buffers: the only work an async save does on the caller's time.

An ``Arena`` is one contiguous ``hostmem.HostBuffer`` (pinned when CUDA is available, so
device->host copies run at full speed) carved into slots, one per tensor: 4 KiB-aligned for
large tensors (``O_DIRECT``-ready pieces), 64-byte for the rest. A fresh arena is never zeroed,
and every later save with the same or a smaller layout reuses it.

Page faults, not the copy, dominate a first save. ``Stager.reserve`` allocates and touches
arenas ahead of the first save (off the training loop's clock, optionally in a background thread
the first save waits for only if it still runs); only reserved arenas get huge pages, whose
faults can be slow (on a loaded VM 3-10x slower than plain ones, benchmarks/first_touch.py). A
fresh arena met by a save stays in plain pages and is populated with ``MADV_POPULATE_WRITE`` on
``COPY_THREADS`` threads right before the copy (about 2x faster than faulting page by page in
the copy itself).

``stage(leaves)`` copies every tensor of a flattened state into its slot and returns
``StagedTensor`` views (raw bytes) the background writer reads while training continues.
CUDA tensors are copied by ``devicecopy.to_host`` on a side stream into the pinned arena,
ordered by events, never a device-wide sync: ``stage`` returns once the copies are enqueued,
having made the caller's current stream wait on their ``done`` event (``cuda_wait="stream"``:
kernels the training enqueues later, the optimizer step that would modify the tensors
included, run after the copy; the host is not blocked) or waited for it
(``cuda_wait="host"``: for training that modifies the tensors from other streams). The
writer's first read of ``StagedTensor.data`` waits for the copy, and an arena is reused only
after its copy ran.

A fresh arena is pinned when it is made (``cudaHostRegister``: 1.2-2 s for 4 GiB on the H200
machine measured). Pinning it instead on a thread after a first pageable copy was tried and
measured worse there: a 1.5 GiB GPT state's first save blocked 2.3x DCP's (1.0x when pinned
at once), and the training thread's next CUDA call waited 0.4 s for the background
``cudaHostRegister`` (docs/benchmarks.md, "GPU"). ``reserve`` takes the cost off the clock.

One ``Stager`` serves both save backends (single process and DCP); the DCP backend copies
DTensor shards with ``dcp.statedict.StateDictCopy``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...devicecopy import CopyFence, to_host
from ...errors import ConfigError
from ...hostmem import PAGE, HostBuffer, pins
from ..format.state import Leaf

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None  # type: ignore[assignment]

ALIGN = 64
#: Tensors of at least this many bytes get 4 KiB-aligned slots (their pieces can go out with O_DIRECT).
LARGE_SLOT_BYTES = 64 << 10
LARGE_ALIGN = PAGE
#: Tensors larger than this are copied by ``COPY_THREADS`` plain threads in parts.
SPLIT_COPY_BYTES = 32 << 20
COPY_THREADS = max(1, min(2, os.cpu_count() or 1))
#: How a save of CUDA tensors keeps the training from modifying them before their copy ran.
CUDA_WAITS = ("stream", "host")


@dataclass
class StagedTensor:
    """A staged copy of one leaf: its metadata and a uint8 view of its bytes in the arena.
    ``data`` waits for the device-to-host copy of a CUDA leaf (``fence``) on first use."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    itemsize: int
    raw: memoryview  # raw bytes (format "B"), valid until the arena is reused
    fence: CopyFence | None = None

    @property
    def data(self) -> memoryview:
        if self.fence is not None:
            self.fence.wait()
            self.fence = None
        return self.raw


class Arena:
    """One host buffer (pinned with CUDA) reused across saves; untouched until ``touch`` or
    the first save into it (``fresh`` until then). ``huge_pages`` only for arenas touched off
    the clock (``Stager.reserve``)."""

    def __init__(self, nbytes: int, pin: bool | None = None, huge_pages: bool = False) -> None:
        self.capacity = max(int(nbytes), ALIGN)
        self.buffer = HostBuffer(self.capacity, huge_pages=huge_pages, pin=pin)
        self.fresh = True  # no page touched yet: the first stage() populates what it needs
        self.copying: CopyFence | None = None  # device-to-host copies into it still in flight
        self.pinned = self.buffer.pinned
        self.array = self.buffer.array()
        self.tensor = self.buffer.tensor() if torch is not None else None

    def slot(self, offset: int, nbytes: int) -> np.ndarray:
        return self.array[offset:offset + nbytes]

    def touch(self, background: bool = False) -> None:
        """Fault every page in now, or in a background thread (``ready`` waits for it)."""
        self.fresh = False
        if background:
            self.buffer.touch_async()
        else:
            self.buffer.touch()

    def ready(self) -> None:
        """Wait for a background touch or a device copy still running (before anything is
        copied in)."""
        self.buffer.wait_touched()
        if self.copying is not None:
            self.copying.wait()
            self.copying = None


def slot_align(nbytes: int) -> int:
    return LARGE_ALIGN if nbytes >= LARGE_SLOT_BYTES else ALIGN


def plan_sizes(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets for tensors of ``sizes`` bytes and the total: the large (4 KiB-aligned) slots
    first, then the small (64-byte) ones, so the total does not depend on their order."""
    offsets = [0] * len(sizes)
    pos = 0
    for large in (True, False):
        for i, n in enumerate(sizes):
            align = slot_align(n)
            if (align == LARGE_ALIGN) == large:
                offsets[i] = pos
                pos += -(-n // align) * align
    return offsets, pos


def plan(leaves: list[Leaf]) -> tuple[list[int], int]:
    """Aligned offsets for each leaf and the total bytes needed."""
    return plan_sizes([leaf.nbytes for leaf in leaves])


def template_sizes(template: Any) -> list[int]:
    """Byte sizes of the tensors a state will hold, from the state itself or a template:
    ``{name: (shape, dtype)}`` specs (torch or numpy dtypes) or meta tensors, nested in
    dicts, lists and tuples like the state (bytes leaves over 64 KiB count as tensors)."""
    sizes: list[int] = []

    def walk(x: Any) -> None:
        spec = _spec_bytes(x)
        if spec is not None:
            sizes.append(spec)
        elif torch is not None and isinstance(x, torch.Tensor):
            sizes.append(x.numel() * x.element_size())
        elif isinstance(x, np.ndarray):
            sizes.append(x.nbytes)
        elif isinstance(x, (bytes, bytearray)) and len(x) > 64 << 10:
            sizes.append(len(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(template)
    return sizes


def _spec_bytes(x: Any) -> int | None:
    """Bytes of a ``(shape, dtype)`` spec, or None when ``x`` is not one."""
    if type(x) is not tuple or len(x) != 2:
        return None
    shape, dtype = x
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return None
    if torch is not None and isinstance(dtype, torch.dtype):
        itemsize = dtype.itemsize
    elif isinstance(dtype, (np.dtype, type, str)):
        try:
            itemsize = np.dtype(dtype).itemsize
        except TypeError:
            return None
    else:
        return None
    return int(np.prod(shape, dtype=np.int64)) * itemsize


class _ClosedArenas:
    """The largest touched arena of the stagers closed in this process, for the next stager's
    first save: a new manager in a running process (a second job, an evaluation loop that
    checkpoints) then copies into touched memory instead of faulting in fresh pages - what
    ``malloc`` gives DCP's per-call staging copies for free. Costs one arena of memory kept
    after its manager closed (the largest such; ``drop()`` lets it go)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arena: Arena | None = None

    def put(self, arenas: Sequence[Arena]) -> None:
        with self._lock:
            kept = [a for a in (*arenas, self._arena) if a is not None and not a.fresh]
            self._arena = max(kept, key=lambda a: a.capacity, default=None)

    def take(self, total: int, pinned: bool) -> Arena | None:
        with self._lock:
            arena = self._arena
            if arena is None or arena.capacity < total or arena.pinned != pinned:
                return None
            self._arena = None
            return arena

    def drop(self) -> None:
        with self._lock:
            self._arena = None


#: staging memory of closed managers, reused by the next one (``_ClosedArenas``)
CLOSED_ARENAS = _ClosedArenas()


class Stager:
    """Owns the arenas: ``acquire(total)`` gives an arena of at least ``total`` bytes.

    ``spare`` keeps a released arena (the previous base of incrementals) for reuse, so the
    steady state allocates nothing; ``close`` hands the touched ones to ``CLOSED_ARENAS``.
    """

    def __init__(self, pin: bool | None = None, cuda_wait: str = "stream") -> None:
        if cuda_wait not in CUDA_WAITS:
            raise ConfigError(f"cuda_wait must be one of {CUDA_WAITS}, got {cuda_wait!r}")
        self.pin = pin
        self.cuda_wait = cuda_wait
        self._spare: list[Arena] = []
        self._spare_lock = threading.Lock()
        self.allocations = 0  # how many arenas were ever allocated (tests check reuse)
        self._copy_pool: ThreadPoolExecutor | None = None

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
        """A spare arena of at least ``total`` bytes (its background touch finished), else the
        touched arena a closed stager left (``CLOSED_ARENAS``), else a fresh untouched one."""
        with self._spare_lock:
            found = next((i for i, a in enumerate(self._spare) if a.capacity >= total), None)
            if found is not None:
                arena: Arena | None = self._spare.pop(found)
            else:
                self._spare.clear()  # too small: let them go before allocating a bigger one
                arena = CLOSED_ARENAS.take(total, pins(self.pin))
                if arena is None:
                    self.allocations += 1
        if arena is None:
            return Arena(int(total * 1.05) + ALIGN, self.pin)  # headroom for slowly growing states
        arena.ready()
        return arena

    def close(self) -> None:
        """Give the spare arenas to ``CLOSED_ARENAS`` (the next stager of this process)."""
        with self._spare_lock:
            spare, self._spare = self._spare, []
        for arena in spare:
            arena.ready()
        CLOSED_ARENAS.put(spare)

    def release(self, arena: Arena | None) -> None:
        if arena is not None:
            with self._spare_lock:
                self._spare.append(arena)

    def reserve(self, total: int, count: int = 1, background: bool = False) -> None:
        """Have ``count`` touched arenas of at least ``total`` bytes ready (e.g. at start, off
        the training loop's clock). ``background``: allocate now, touch on threads; the save
        that takes one waits only for a touch still running."""
        with self._spare_lock:
            have = sum(a.capacity >= total for a in self._spare)
        for _ in range(count - have):
            with self._spare_lock:
                self.allocations += 1
            arena = Arena(int(total * 1.05) + ALIGN, self.pin, huge_pages=True)
            arena.touch(background)
            self.release(arena)

    def stage(self, leaves: list[Leaf], arena: Arena) -> list[StagedTensor]:
        """Copy every leaf into ``arena``; returns views of the staged bytes."""
        offsets, total = plan(leaves)
        assert total <= arena.capacity
        arena.ready()
        if arena.fresh:  # first save into it: fault the used part in first, in parallel
            arena.buffer.populate(0, total, threads=COPY_THREADS)
            arena.fresh = False
        out: list[StagedTensor] = []
        device_copies: list[tuple[Any, Any]] = []  # (arena slot tensor, CUDA source)
        on_device: list[int] = []  # indices in out of the CUDA leaves
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
                    if src.device.type == "cuda":
                        device_copies.append((dst_t, src))
                        on_device.append(len(out))
                    else:  # a non-contiguous host tensor, or another device: a synchronous copy
                        dst_t.copy_(src)
            elif leaf.nbytes:
                np.copyto(dst.view(obj.dtype).reshape(obj.shape), obj, casting="no")
            out.append(StagedTensor(leaf.name, leaf.dtype, leaf.shape, leaf.itemsize, memoryview(dst)))
        if device_copies:
            fence = arena.copying = to_host(device_copies)
            if self.cuda_wait == "host":
                fence.wait()
            else:
                fence.hold()
            for i in on_device:
                out[i].fence = fence
        return out


__all__ = ["ALIGN", "CUDA_WAITS", "LARGE_ALIGN", "LARGE_SLOT_BYTES", "CLOSED_ARENAS", "Arena", "StagedTensor", "Stager", "plan", "plan_sizes",
           "template_sizes"]
