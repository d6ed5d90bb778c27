"""The host copy a DCP save writes from: plain tensors in the manager's arenas.

``stage`` flattens the state as ``dcp.save`` will (DCP's own ``flatten_state_dict``), then:

* plain tensors (DDP's whole state; FSDP's step counters) go through ``Stager.stage`` like a
  single-process save: one reusable arena, 4 KiB-aligned slots (written with ``O_DIRECT``
  straight from the slot, no bounce copy), populated before the first copy, CUDA tensors
  copied on a side stream into the pinned arena, ordered by events (``DcpStaged.wait``, on
  the save thread, waits for them before ``dcp.save`` reads a byte);
* those another rank writes (``share.ReplicaShare``) are meta tensors, not copied;
* DTensor shards and non-tensor values go through ``statedict.StateDictCopy`` (torch's host
  copy, kept across saves while their layout holds; shards on a CUDA device copied on the
  side stream too, their fence waited for by ``DcpStaged.wait``).

The staged dict is unflattened again, so ``dcp.save`` plans exactly what it would have
planned from the live state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict

from ..checkpoint.format.state import Leaf, torch_dtype_name
from ..checkpoint.save.staging import Arena, StagedTensor, Stager, plan, template_sizes
from ..devicecopy import CopyFence
from .share import ReplicaShare, is_plain, layout_of
from .statedict import StateDictCopy


@dataclass
class DcpStaged:
    """What ``stage`` made: the dict ``dcp.save`` writes, the layout of the live state it came
    from (``ReplicaShare.learn``; not the state, whose live tensors it would keep alive), bytes
    left to other ranks, and the arena of the plain tensors (given back after the write)."""

    state_dict: dict[str, Any]
    layout: tuple
    skipped_bytes: int
    arena: Arena | None = None
    tensors: list[StagedTensor] = field(default_factory=list)
    fence: CopyFence | None = None  # the device copies of the DTensor shards, if any

    def wait(self) -> None:
        """Until every device-to-host copy ran (save thread, before reading)."""
        for t in self.tensors:
            t.data  # noqa: B018 - waits for the tensor's copy fence once
        if self.fence is not None:
            self.fence.wait()
            self.fence = None


def _leaf(name: str, t: torch.Tensor) -> Leaf:
    n = t.numel() * t.element_size()
    return Leaf(name, name, t, torch_dtype_name(t.dtype), tuple(t.shape), n, t.element_size())


def plain_sizes(template: Any) -> list[int]:
    """Bytes of the plain tensors ``stage`` copies into an arena for states like ``template``
    (the state, meta tensors or ``(shape, dtype)`` specs; DTensor shards are not in it):
    what ``reserve`` allocates ahead of a first save, which stages every one of them."""
    flat = flatten_state_dict(template)[0] if isinstance(template, dict) else {}
    return template_sizes({k: v for k, v in flat.items() if is_plain(v) or not isinstance(v, torch.Tensor)})


def stage(stager: Stager, state_dict: dict[str, Any], share: ReplicaShare, world: int,
          shards: StateDictCopy | None = None) -> DcpStaged:
    """Copy ``state_dict`` to host memory for ``dcp.save`` (see the module docstring);
    ``shards``: the reusable copy of the DTensor shards (None: a new one)."""
    flat, mapping = flatten_state_dict(state_dict)
    layout = layout_of(flat, world)
    skip = share.skipped(layout, flat)
    plain = [_leaf(k, v) for k, v in flat.items() if k not in skip and is_plain(v)]
    rest = {k: v for k, v in flat.items() if k not in skip and not is_plain(v)}
    if shards is None:
        shards = StateDictCopy(stager.pin, stager.cuda_wait)
    host, fence = shards.copy_async(rest) if rest else ({}, None)  # (reused across saves: not modified)
    arena, tensors = None, []
    if plain:
        offsets, total = plan(plain)
        arena = stager.acquire(total)
        try:
            tensors = stager.stage(plain, arena)
        except BaseException:
            stager.release(arena)
            raise
        views = {leaf.name: arena.tensor[off:off + leaf.nbytes].view(leaf.obj.dtype).view(leaf.shape)
                 for leaf, off in zip(plain, offsets)}
        host = {**host, **views}
    # the source's order, so every rank plans its items in the same order
    out = {k: torch.empty_like(v, device="meta") if k in skip else host[k] for k, v in flat.items()}
    skipped = sum(flat[k].numel() * flat[k].element_size() for k in skip)
    return DcpStaged(unflatten_state_dict(out, mapping), layout, skipped, arena, tensors, fence)


__all__ = ["DcpStaged", "plain_sizes", "stage"]
