"""The host copy of a torch.distributed state dict (DTensor / FSDP shards kept as such, for
``dcp.save``), reused across saves while its layout holds.

The buffers come from torch's ``_create_cpu_state_dict`` (pinned when CUDA exists: a DTensor
stays a DTensor whose local shard is a pinned host tensor, which is what ``dcp.save`` plans
from) and are refilled by torch's ``_copy_state_dict`` - the helpers behind DCP's own stager.
When the state's tensors live on one CUDA device, the refill is
enqueued ``non_blocking`` on that device's side stream after what the caller's stream has
queued (``devicecopy.on_side_stream``), like the arena copies of plain tensors
(``checkpoint.save.staging.Stager.stage``): ``copy_async`` returns once the copies are queued, with the
caller's stream made to wait for them on the GPU (``cuda_wait="stream"``: the optimizer step
that would modify the shards runs after the copy, the host is not blocked) or the host waiting
for them (``"host"``), and a fence the writer waits for before it reads a byte. torch's
stager instead copies each shard synchronously (``non_blocking=False``), holding the host for
the whole device-to-host transfer. Anything else (host tensors, several devices) is copied
synchronously, as before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten

from ..devicecopy import CopyFence, on_side_stream


def _layout(leaves: list[Any], spec: Any) -> Any:
    """Structure + tensor shapes/dtypes of a flattened state dict (when equal, cached buffers fit)."""
    return spec, [(type(x), tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x) for x in leaves]


@torch.no_grad()
def _cuda_sources(leaves: list[Any]) -> list[Any]:
    """The CUDA tensors holding the bytes of a state dict's leaves: DTensors' local shards,
    plain tensors (``to_local`` is asked only of DTensors on a CUDA device)."""
    return [x.to_local() if isinstance(x, DTensor) else x for x in leaves
            if isinstance(x, torch.Tensor) and x.device.type == "cuda"]


class StateDictCopy:
    """One reusable host copy of a state dict (see module docstring)."""

    def __init__(self, pin: bool | None, cuda_wait: str) -> None:
        self.pin = pin
        self.cuda_wait = cuda_wait
        self.cache: dict[str, Any] | None = None
        self._layout: Any = None
        self._copying: CopyFence | None = None  # the last refill still in flight

    def copy_async(self, state_dict: dict[str, Any]) -> tuple[dict[str, Any], CopyFence | None]:
        """The host copy of ``state_dict`` and the fence of its device copies (None: done)."""
        if self._copying is not None:  # never refill buffers a copy still writes
            self._copying.wait()
            self._copying = None
        leaves, spec = tree_flatten(state_dict)
        sig = _layout(leaves, spec)
        if self.cache is None or self._layout != sig:
            # first save, or the state changed shape (e.g. optimizer state appeared): new buffers
            pin = torch.cuda.is_available() if self.pin is None else self.pin
            self.cache = _create_cpu_state_dict(state_dict, pin_memory=pin)
            self._layout = sig
        cache = self.cache
        sources = _cuda_sources(leaves)
        devices = {t.device for t in sources}
        if len(devices) != 1:
            return _copy_state_dict(state_dict, cache), None
        # (a target torch left unpinned - a 0-dim or empty shard - is copied synchronously by
        # CUDA even when asked non_blocking: correct, only not overlapped)
        out, fence = on_side_stream(devices.pop(), lambda: _copy_state_dict(state_dict, cache, non_blocking=True),
                                    sources)
        if self.cuda_wait == "host":
            fence.wait()
        else:
            fence.hold()
        self._copying = fence
        return out, fence

    def copy(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``copy_async`` and wait for its device copies (``dcp.async_save``'s stager protocol)."""
        out, fence = self.copy_async(state_dict)
        if fence is not None:
            fence.wait()
        return out


__all__ = ["StateDictCopy"]
