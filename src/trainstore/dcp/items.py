"""Turn DCP write items into staged byte views, and non-tensor values into JSON skeletons.

Tensors (whole tensors or the local shard of a DTensor/ShardedTensor) become ``StagedTensor``
views of contiguous host memory, cut into chunks by the single-process writer. Non-tensor
values (DCP's BYTE_IO items) are NOT stored as DCP's ``torch.save`` bytes: the original
object is taken from the planner (``lookup_object``) and stored as a trainstore JSON
skeleton; tensors/arrays inside it become chunked tensors named ``obj:<path>``. A value that
would need pickle (a custom class) is rejected with ``UnsupportedTypeError`` naming its key.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import MetadataIndex

from ..checkpoint.format.state import flatten
from ..checkpoint.save.staging import StagedTensor
from ..errors import UnsupportedTypeError

OBJ_PREFIX = "obj:"


def tensor_bytes(t: torch.Tensor) -> tuple[torch.Tensor, memoryview]:
    """A contiguous CPU version of ``t`` (kept alive by the caller) and a uint8 view of its bytes."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    if t.numel() == 0:
        return t, memoryview(np.empty(0, dtype=np.uint8))
    return t, memoryview(t.reshape(-1).view(torch.uint8).numpy())


def stage_tensor(name: str, t: torch.Tensor, keep: list[Any]) -> StagedTensor:
    host, raw = tensor_bytes(t)
    keep.append(host)
    return StagedTensor(name, str(host.dtype), tuple(host.shape), host.element_size(), raw)


def lookup_value(planner: Any, item: Any) -> Any:
    """The original non-tensor value of a BYTE_IO item, without unpickling anything stored.

    ``DefaultSavePlanner`` (and subclasses) expose ``lookup_object``; for other planners the
    ``torch.save`` bytes they produce in memory are read back with ``weights_only=True``
    (torch's restricted unpickler: tensors and primitive containers only)."""
    if hasattr(planner, "lookup_object"):
        return planner.lookup_object(item.index)
    data = planner.resolve_data(item)
    if isinstance(data, io.BytesIO):
        data.seek(0)
    try:
        return torch.load(data, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the restricted unpickler refused it
        raise UnsupportedTypeError(f"state value {item.index.fqn!r} cannot be stored without pickle: {exc}") from None


def stage_value(index: MetadataIndex, value: Any, keep: list[Any]) -> tuple[Any, list[StagedTensor]]:
    """JSON skeleton of ``value`` and the staged tensors/arrays inside it (named ``obj:<path>``)."""
    try:
        skeleton, leaves = flatten({index.fqn: value})
    except UnsupportedTypeError as exc:
        raise UnsupportedTypeError(f"state value {index.fqn!r}: {exc}") from None
    staged = []
    for leaf in leaves:
        name = OBJ_PREFIX + leaf.name
        if leaf.is_torch:
            host, raw = tensor_bytes(leaf.obj)
            keep.append(host)
        else:
            arr = np.ascontiguousarray(leaf.obj)
            keep.append(arr)
            raw = memoryview(arr.reshape(-1).view(np.uint8))
        staged.append(StagedTensor(name, leaf.dtype, leaf.shape, leaf.itemsize, raw))
    return skeleton["$dict"][0][1], staged


__all__ = ["OBJ_PREFIX", "tensor_bytes", "stage_tensor", "lookup_value", "stage_value"]
