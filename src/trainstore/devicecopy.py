"""Copies between CUDA memory and host memory on a side stream, ordered by CUDA events.

Why not ``torch.cuda.synchronize()``: it waits for every queued kernel of every stream, the
training's next steps included, so a checkpoint save or a batch transfer would stall the
training loop for work that is none of its business. Here each copy is ordered by events:

- ``to_host(pairs)`` (checkpoint staging): a ``ready`` event recorded on the caller's current
  stream marks the tensors as of now in the training's own order; a side stream waits on it
  (on the GPU, the host does not wait), copies each source ``non_blocking`` into its (pinned)
  host destination and records ``done``. Each source is ``record_stream``-ed on the side
  stream, so the caching allocator never hands a source the caller frees to a new tensor
  before its copy ran.
- ``on_side_stream(device, enqueue, sources)``: the same for copies someone else enqueues
  (torch's state-dict copy of DTensor shards, ``dcp.statedict.StateDictCopy``).
- ``to_device(tensors, device)`` (the loader): host tensors are pinned (torch's caching host
  allocator: reused blocks, kept until their copy ran) and copied ``non_blocking`` on the
  side stream, then ``done`` is recorded. The loader gathers its batches into such memory to
  begin with (``pinned_empty``), so nothing is copied to pin them.

The returned ``CopyFence`` orders what comes after: ``wait()`` blocks the calling host thread
until ``done`` (the background writer, before it reads the staged bytes); ``hold()`` makes
the caller's current stream wait on ``done`` on the GPU, without blocking the host (the
training stream: kernels it enqueues later - the optimizer step that would modify the saved
tensors, the forward pass that reads a batch - run after the copy).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .errors import ConfigError

try:
    import torch
except ImportError:  # pragma: no cover - torch is an optional extra
    torch = None  # type: ignore[assignment]

_streams: dict[int, Any] = {}
_streams_lock = threading.Lock()


def cuda_available() -> bool:
    return torch is not None and torch.cuda.is_available()


def side_stream(device: Any) -> Any:
    """This process's copy stream of a CUDA ``device`` (one per device, made once)."""
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    with _streams_lock:
        s = _streams.get(index)
        if s is None:
            s = _streams[index] = torch.cuda.Stream(device=index)
        return s


class CopyFence:
    """The ``done`` events of copies enqueued on side streams (see module docstring).

    ``produced``: device tensors made on a side stream (``to_device``); ``hold`` marks them in
    use by the holding stream, so the allocator keeps them until that stream's work is done.
    """

    def __init__(self, events: Sequence[tuple[Any, Any]], produced: Sequence[Any] = ()) -> None:
        self.events = list(events)  # (device, event)
        self.produced = list(produced)

    def done(self) -> bool:
        """True once every copy ran (never blocks)."""
        return all(e.query() for _, e in self.events)

    def wait(self) -> None:
        """Block this host thread until every copy ran (not a device-wide sync)."""
        for _, e in self.events:
            e.synchronize()

    def hold(self) -> None:
        """Make this thread's current stream of each device wait on the copies, on the GPU: the
        host goes on at once, later kernels of that stream run after the copies."""
        for device, e in self.events:
            torch.cuda.current_stream(device).wait_event(e)
        for t in self.produced:
            t.record_stream(torch.cuda.current_stream(t.device))


def _by_device(items: Iterable[tuple[Any, Any]], device_of: Any) -> dict[Any, list[tuple[Any, Any]]]:
    groups: dict[Any, list[tuple[Any, Any]]] = {}
    for item in items:
        groups.setdefault(device_of(item), []).append(item)
    return groups


def on_side_stream(device: Any, enqueue: Callable[[], Any], sources: Iterable[Any]) -> tuple[Any, CopyFence]:
    """``enqueue()`` (``non_blocking`` copies out of the CUDA tensors ``sources``) run on the side
    stream of ``device``, after what the caller's current stream has queued so far; each
    source is ``record_stream``-ed there. Returns what ``enqueue`` returned and the fence of
    its copies."""
    if torch.device(device).type != "cuda":
        raise ConfigError(f"devicecopy copies from CUDA tensors, got one on {device}")
    side = side_stream(device)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(device))
    side.wait_event(ready)
    with torch.cuda.stream(side):
        result = enqueue()
        for src in sources:
            src.record_stream(side)
        done = torch.cuda.Event()
        done.record(side)
    return result, CopyFence([(device, done)])


def to_host(pairs: Iterable[tuple[Any, Any]]) -> CopyFence:
    """Enqueue ``dst.copy_(src, non_blocking=True)`` for each ``(host dst, cuda src)`` pair on the
    side stream of ``src``'s device (``on_side_stream``). ``dst`` should be pinned (pageable
    memory makes the copy synchronous)."""
    events = []
    for device, items in _by_device(pairs, lambda p: p[1].device).items():
        def copy(items: list[tuple[Any, Any]] = items) -> None:
            for dst, src in items:
                dst.copy_(src, non_blocking=True)

        events += on_side_stream(device, copy, [src for _, src in items])[1].events
    return CopyFence(events)


def pinned_empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """A numpy array over pinned host memory from torch's caching host allocator (a block is
    reused once the array is gone and the copies made from it ran), for a loader to gather a
    batch straight into what ``to_device`` copies from; a plain array for a dtype torch lacks."""
    try:
        torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        return np.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=torch_dtype, pin_memory=True).numpy()


def to_device(tensors: dict[str, Any], device: Any) -> tuple[dict[str, Any], CopyFence]:
    """Pinned, ``non_blocking`` copies of the host tensors of ``tensors`` to the CUDA ``device``
    on its side stream (other values pass through); the caller ``hold``s the fence before use."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ConfigError(f"devicecopy.to_device copies to a CUDA device, got {dev}")
    if not cuda_available():
        raise ConfigError(f"device {dev} asked for, but torch sees no CUDA device")
    side = side_stream(dev)
    out: dict[str, Any] = {}
    produced = []
    with torch.cuda.stream(side):
        for k, v in tensors.items():
            if isinstance(v, torch.Tensor) and v.device.type == "cpu":
                src = v if v.is_pinned() else v.pin_memory()
                out[k] = src.to(dev, non_blocking=True)
                produced.append(out[k])
            else:
                out[k] = v
        done = torch.cuda.Event()
        done.record(side)
    return out, CopyFence([(dev, done)], produced)


__all__ = ["CopyFence", "cuda_available", "on_side_stream", "pinned_empty", "side_stream", "to_device", "to_host"]
