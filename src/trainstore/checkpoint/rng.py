"""Capture and restore random number generator state (python, numpy, torch CPU and CUDA).

``capture_rng()`` returns a plain dict of tensors, ints, strings and tuples that checkpoints
without pickle; put it in your state (``state["rng"] = capture_rng()``) and call
``restore_rng(state["rng"])`` after restoring. Resuming then draws the same random numbers
(dropout masks, data shuffles) as an uninterrupted run would have.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from ..errors import ConfigError

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None  # type: ignore[assignment]


def capture_rng() -> dict[str, Any]:
    """Snapshot every RNG we know about as checkpointable values."""
    version, internal, gauss = random.getstate()
    out: dict[str, Any] = {"python": {"version": version, "state": np.asarray(internal, dtype=np.uint64),
                                      "gauss": gauss}}
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out["numpy"] = {"kind": kind, "keys": np.asarray(keys, dtype=np.uint32), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    if torch is not None:
        out["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda"] = [s for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(snapshot: dict[str, Any]) -> None:
    """Put every RNG back to ``snapshot`` (from ``capture_rng``); missing parts are left alone."""
    if not isinstance(snapshot, dict):
        raise ConfigError(f"RNG snapshot must be a dict from capture_rng(), got {type(snapshot).__name__}")
    py = snapshot.get("python")
    if py is not None:
        internal = tuple(int(v) for v in np.asarray(py["state"]).tolist())
        random.setstate((int(py["version"]), internal, py["gauss"]))
    npst = snapshot.get("numpy")
    if npst is not None:
        np.random.set_state((str(npst["kind"]), np.asarray(npst["keys"], dtype=np.uint32), int(npst["pos"]),
                             int(npst["has_gauss"]), float(npst["cached_gaussian"])))
    if torch is not None:
        if snapshot.get("torch") is not None:
            torch.set_rng_state(_as_byte_tensor(snapshot["torch"]))
        cuda = snapshot.get("cuda")
        if cuda is not None and torch.cuda.is_available():
            states = [_as_byte_tensor(s) for s in cuda]
            if len(states) != torch.cuda.device_count():
                raise ConfigError(f"RNG snapshot has {len(states)} CUDA generators, this process sees "
                                  f"{torch.cuda.device_count()} devices")
            torch.cuda.set_rng_state_all(states)


def _as_byte_tensor(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.uint8))
    return x.to(dtype=torch.uint8, device="cpu").contiguous()


__all__ = ["capture_rng", "restore_rng"]
