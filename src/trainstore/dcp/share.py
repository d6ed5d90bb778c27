"""Replicated tensors staged only on the rank that writes them.

Under DDP every rank holds the whole state and ``dcp.save``'s planner dedups it: each
replicated tensor is written by one rank. Staging still copied the whole state on every
rank: N times the host memory and device-to-host copies that the save writes, on the
training loop's clock. Call order per save:

1. ``ReplicaShare.skipped(layout_of(flat, world), flat)``: the plain tensors this rank did
   not write in the last save of the same layout (none on a first save, after a failure, or
   when the layout or world changed).
2. ``staging.stage``: stages the rest; a meta tensor stands for each skipped one.
3. ``SharePlanner.create_local_plan`` leaves the meta tensors out of this rank's plan (and
   lists them in its ``storage_data``), so the dedup can give each tensor only to a rank
   that staged it.
4. ``check_covered`` (``StorageWriter.prepare_global_plan``, on the coordinator): every
   tensor left out is written by some rank, else the save fails naming them before anything
   is written (``DistributedError``) and the next save stages everything.
5. ``ReplicaShare.learn``: after the commit, what this rank wrote, for the layout of step 1
   (kept instead of the flattened state, which holds the live tensors).

DTensors (FSDP, TP shards) are always staged: each rank writes its own shards anyway.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType
from torch.distributed.tensor import DTensor

from ..errors import DistributedError

#: ``SavePlan.storage_data`` key of the indices a rank left out of its local plan
OMITTED_KEY = "trainstore.omitted"


def is_plain(value: Any) -> bool:
    """A tensor DCP treats as replicated on every rank (not a DTensor shard)."""
    return isinstance(value, torch.Tensor) and not isinstance(value, DTensor)


def layout_of(flat: dict[str, Any], world: int) -> tuple:
    """What must not change for a learned share to hold: the world size and every entry's
    name, type, shape and dtype."""
    return world, tuple((k, type(v), tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (k, type(v))
                        for k, v in flat.items())


class ReplicaShare:
    """The plain tensors (flattened DCP names) this rank wrote in the last committed save,
    and the layout they were learned for."""

    def __init__(self) -> None:
        self._layout: tuple | None = None
        self._written: frozenset[str] = frozenset()

    def skipped(self, layout: tuple, flat: dict[str, Any]) -> frozenset[str]:
        """Plain tensors of ``flat`` (whose ``layout_of`` is ``layout``) another rank wrote
        last time: none unless learned for this layout, with 2+ ranks."""
        if layout[0] < 2 or self._layout != layout:
            return frozenset()
        return frozenset(k for k, v in flat.items() if is_plain(v) and k not in self._written)

    def learn(self, layout: tuple, written: frozenset[str]) -> None:
        self._layout, self._written = layout, written

    def forget(self) -> None:
        self._layout, self._written = None, frozenset()


class SharePlanner(DefaultSavePlanner):
    """``DefaultSavePlanner`` that leaves tensors this rank did not stage (meta) out of its
    local plan and names them in the plan's ``storage_data`` (``OMITTED_KEY``)."""

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        keep, omitted = [], []
        for item in plan.items:
            value = self.state_dict.get(item.index.fqn) if item.type != WriteItemType.BYTE_IO else None
            if isinstance(value, torch.Tensor) and value.is_meta:
                omitted.append(item.index)
            else:
                keep.append(item)
        if omitted:
            plan = dataclasses.replace(plan, items=keep, storage_data={OMITTED_KEY: omitted})
            self.plan = plan
        return plan


def check_covered(plans: list[SavePlan]) -> None:
    """``DistributedError`` naming the tensors some rank left out and no rank writes."""
    omitted = {i for p in plans if isinstance(p.storage_data, dict) for i in p.storage_data.get(OMITTED_KEY, ())}
    if not omitted:
        return
    written = {item.index for p in plans for item in p.items}
    missing = sorted(i.fqn for i in omitted - written)
    if missing:
        raise DistributedError(f"no rank staged {len(missing)} replicated tensor(s) of this save "
                               f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): the ranks' "
                               "states differ from the last save's; nothing was written, the next save "
                               "stages every tensor")


__all__ = ["OMITTED_KEY", "ReplicaShare", "SharePlanner", "check_covered", "is_plain", "layout_of"]
