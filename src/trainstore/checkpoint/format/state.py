"""Flatten a training state into named tensors + a JSON skeleton, and back. No pickle.

A state is nested dicts (str/int/float/bool/None keys), lists and tuples whose leaves are
torch tensors (every dense dtype; any device: CUDA is copied to host at staging), numpy
arrays (numeric/bool), Python scalars, strings, bytes and None; also ``torch.dtype``,
``torch.device`` and ``torch.Size``. Anything else (a custom object, a lambda, an object
array) is rejected at save time with ``UnsupportedTypeError`` naming its path, e.g.
``state['optim']['param_groups'][0]['foo']`` - because restoring it would need pickle.

Skeleton encoding (JSON): str, int, bool, None and finite floats are themselves; lists are
JSON arrays; everything else is a one-key object tagged with ``$``:
``{"$dict": [[k, v], ...]}`` (keys keep their type), ``{"$odict": ...}`` (OrderedDict),
``{"$tuple": [...]}``, ``{"$size": [...]}``, ``{"$float": "nan"|"inf"|"-inf"}``,
``{"$bytes": "<base64>"}``, ``{"$tensor": name}`` (torch), ``{"$ndarray": name}``,
``{"$npscalar": [dtype, "<base64>"]}``, ``{"$dtype": "float32"}``, ``{"$device": "cuda:0"}``.

Tensor names are the ``/``-joined path (``model/layer.weight``, ``optim/state/0/exp_avg``),
so the same structure gives the same names across saves: incrementals match chunks of the
base by name, and ``restore_into`` matches a target state by name.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError, ManifestError, UnsupportedTypeError

try:  # torch is an optional extra; numpy-only states work without it
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]

_NP_KINDS = "biufc"
_MAX_INLINE_BYTES = 64 << 10  # larger bytes leaves are stored as uint8 tensors


@dataclass
class Leaf:
    """One tensor-like leaf of the state: where it is, what it is, the live object."""

    name: str
    path: str  # human path: state['a'][0]
    obj: Any  # torch.Tensor or np.ndarray (or bytes, stored as uint8)
    dtype: str  # "torch.float32" / "numpy:<f4"
    shape: tuple[int, ...]
    nbytes: int
    itemsize: int

    @property
    def is_torch(self) -> bool:
        return self.dtype.startswith("torch.")


def pretty_path(parts: tuple[Any, ...]) -> str:
    return "state" + "".join(f"[{p!r}]" for p in parts)


def _name(parts: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in parts) or "<root>"


def torch_dtype_name(dtype: Any) -> str:
    return str(dtype)  # "torch.bfloat16"


def parse_torch_dtype(name: str) -> Any:
    if torch is None:
        raise UnsupportedTypeError(f"checkpoint holds torch tensors ({name}) but torch is not installed")
    dt = getattr(torch, name[len("torch."):], None) if name.startswith("torch.") else None
    if not isinstance(dt, torch.dtype):
        raise ManifestError(f"unknown torch dtype {name!r:.60}")
    return dt


def parse_numpy_dtype(name: str) -> np.dtype:
    try:
        dt = np.dtype(name[len("numpy:"):])
    except TypeError:
        raise ManifestError(f"unknown numpy dtype {name!r:.60}") from None
    if dt.kind not in _NP_KINDS or dt.hasobject:
        raise ManifestError(f"numpy dtype {name!r:.60} is not a plain numeric type")
    return dt


def dtype_itemsize(name: str) -> int:
    if name.startswith("torch."):
        return parse_torch_dtype(name).itemsize
    return parse_numpy_dtype(name).itemsize


def _is_tensor(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _check_tensor(t: Any, where: str) -> None:
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise UnsupportedTypeError(f"{where}: tensor subclass {type(t).__name__} is not supported (convert to a plain tensor)")
    if t.layout != torch.strided:
        raise UnsupportedTypeError(f"{where}: {t.layout} tensors are not supported (use .to_dense())")
    if t.is_quantized:
        raise UnsupportedTypeError(f"{where}: quantized tensors are not supported (use .dequantize())")
    if t.device.type == "meta":
        raise UnsupportedTypeError(f"{where}: meta tensors have no data")
    if t.is_complex() and t.is_conj():
        pass  # resolved at staging (resolve_conj)


def flatten(state: Any) -> tuple[Any, list[Leaf]]:
    """Return (skeleton, leaves). Raises ``UnsupportedTypeError`` naming the bad leaf's path."""
    leaves: list[Leaf] = []
    names: set[str] = set()

    def add(parts: tuple[Any, ...], obj: Any, dtype: str, shape: tuple[int, ...], nbytes: int, itemsize: int) -> str:
        name = _name(parts)
        base, n = name, 1
        while name in names:
            n += 1
            name = f"{base}#{n}"
        names.add(name)
        leaves.append(Leaf(name, pretty_path(parts), obj, dtype, shape, nbytes, itemsize))
        return name

    def enc(x: Any, parts: tuple[Any, ...]) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int) and type(x) in (int, bool):
            return x
        if type(x) is float:
            return x if math.isfinite(x) else {"$float": repr(x)}
        if _is_tensor(x):
            where = pretty_path(parts)
            _check_tensor(x, where)
            return {"$tensor": add(parts, x, torch_dtype_name(x.dtype), tuple(x.shape),
                                   x.numel() * x.element_size(), x.element_size())}
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in _NP_KINDS or x.dtype.hasobject or type(x) is not np.ndarray:
                raise UnsupportedTypeError(f"{pretty_path(parts)}: numpy array of dtype {x.dtype} "
                                           f"({type(x).__name__}) cannot be stored without pickle")
            return {"$ndarray": add(parts, x, "numpy:" + x.dtype.str, tuple(x.shape), x.nbytes, x.dtype.itemsize)}
        if isinstance(x, np.generic):
            if x.dtype.kind not in _NP_KINDS:
                raise UnsupportedTypeError(f"{pretty_path(parts)}: numpy scalar of dtype {x.dtype} is not supported")
            return {"$npscalar": [x.dtype.str, base64.b64encode(x.tobytes()).decode()]}
        if isinstance(x, (bytes, bytearray)):
            if len(x) > _MAX_INLINE_BYTES:
                arr = np.frombuffer(bytes(x), dtype=np.uint8)
                return {"$bytesarr": add(parts, arr, "numpy:|u1", (len(x),), len(x), 1)}
            return {"$bytes": base64.b64encode(bytes(x)).decode()}
        if type(x) in (dict, OrderedDict):
            items = []
            for k, v in x.items():
                if not (k is None or type(k) in (str, int, bool) or (type(k) is float and math.isfinite(k))):
                    raise UnsupportedTypeError(f"{pretty_path(parts)}: dict key {k!r:.60} of type "
                                               f"{type(k).__name__} is not supported (use str/int/float/bool/None)")
                items.append([k, enc(v, parts + (k,))])
            return {("$odict" if type(x) is OrderedDict else "$dict"): items}
        if type(x) is list:
            return [enc(v, parts + (i,)) for i, v in enumerate(x)]
        if torch is not None and type(x) is torch.Size:
            return {"$size": list(x)}
        if type(x) is tuple:
            return {"$tuple": [enc(v, parts + (i,)) for i, v in enumerate(x)]}
        if torch is not None and isinstance(x, torch.dtype):
            return {"$dtype": str(x)[len("torch."):]}
        if torch is not None and isinstance(x, torch.device):
            return {"$device": str(x)}
        raise UnsupportedTypeError(
            f"{pretty_path(parts)}: {type(x).__module__}.{type(x).__qualname__} cannot be checkpointed "
            "without pickle; store tensors, numpy arrays, scalars, str, bytes, None, or dicts/lists/tuples of them"
        )

    skeleton = enc(state, ())
    return skeleton, leaves


class _NotLoaded:
    """A list/tuple item a partial restore left out (``checkpoint.restore.select``): ``merge_into``
    leaves the target's item as it is."""

    def __repr__(self) -> str:
        return "NOT_LOADED"


NOT_LOADED = _NotLoaded()
#: skeleton node of an item a partial restore left out (only in pruned skeletons, never stored)
NOT_LOADED_NODE = {"$not_loaded": None}
#: metadata key marking a manifest pruned in memory by a partial restore (its skeleton may hold NOT_LOADED_NODE)
PARTIAL_KEY = "$partial_restore"


def unflatten(skeleton: Any, tensor: Callable[[str, str], Any], partial: bool = False) -> Any:
    """Rebuild a state from its skeleton; ``tensor(tag, name)`` returns the loaded leaf.
    ``partial``: accept ``NOT_LOADED_NODE`` (a pruned skeleton) and decode it as ``NOT_LOADED``."""

    def dec(x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict) or len(x) != 1:
            raise ManifestError(f"checkpoint skeleton has a malformed node {x!r:.80}")
        (tag, v), = x.items()
        if partial and tag == "$not_loaded":
            return NOT_LOADED
        if tag in ("$dict", "$odict"):
            if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 for p in v):
                raise ManifestError("checkpoint skeleton: malformed dict node")
            pairs = [(k, dec(val)) for k, val in v]
            for k, _ in pairs:
                if isinstance(k, (list, dict)):
                    raise ManifestError("checkpoint skeleton: unhashable dict key")
            return OrderedDict(pairs) if tag == "$odict" else dict(pairs)
        if tag == "$tuple" and isinstance(v, list):
            return tuple(dec(e) for e in v)
        if tag == "$size" and isinstance(v, list):
            if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 62 for d in v):
                raise ManifestError(f"checkpoint skeleton: malformed torch.Size {v!r:.80}")
            return torch.Size(v) if torch is not None else tuple(v)
        if tag == "$float" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag == "$bytes" and isinstance(v, str):
            return _b64(v)
        if tag in ("$tensor", "$ndarray") and isinstance(v, str):
            return tensor(tag, v)
        if tag == "$bytesarr" and isinstance(v, str):
            return bytes(memoryview(np.ascontiguousarray(tensor(tag, v))).cast("B"))
        if tag == "$npscalar" and isinstance(v, list) and len(v) == 2:
            dt = parse_numpy_dtype("numpy:" + str(v[0]))
            raw = _b64(v[1])
            if len(raw) != dt.itemsize:
                raise ManifestError("checkpoint skeleton: numpy scalar of the wrong size")
            return np.frombuffer(raw, dtype=dt)[0]
        if tag == "$dtype" and isinstance(v, str):
            return parse_torch_dtype("torch." + v)
        if tag == "$device" and isinstance(v, str):
            try:
                return torch.device(v)
            except (RuntimeError, TypeError):
                raise ManifestError(f"checkpoint skeleton: bad device {v!r:.40}") from None
        raise ManifestError(f"checkpoint skeleton has an unknown node {tag!r:.40}")

    try:
        return dec(skeleton)
    except RecursionError:
        raise ManifestError("checkpoint skeleton is nested too deeply") from None


def _b64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ManifestError("checkpoint skeleton: base64 payload must be a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ManifestError(f"checkpoint skeleton: malformed base64 {text[:40]!r}") from None


def iter_tensor_names(skeleton: Any) -> Iterator[str]:
    """Names of every tensor leaf the skeleton refers to."""
    if isinstance(skeleton, list):
        for v in skeleton:
            yield from iter_tensor_names(v)
    elif isinstance(skeleton, dict) and len(skeleton) == 1:
        (tag, v), = skeleton.items()
        if tag in ("$tensor", "$ndarray", "$bytesarr"):
            yield v
        elif tag in ("$dict", "$odict") and isinstance(v, list):
            for pair in v:
                if isinstance(pair, list) and len(pair) == 2:
                    yield from iter_tensor_names(pair[1])
        elif tag == "$tuple" and isinstance(v, list):
            for e in v:
                yield from iter_tensor_names(e)


def merge_into(target: Any, restored: Any) -> Any:
    """Copy non-tensor values of ``restored`` into the mutable containers of ``target``.

    Tensors were already filled in place; dict entries and list items that are not the same
    object are replaced, so e.g. ``param_groups[0]['lr']`` is restored too; ``NOT_LOADED``
    items (a partial restore) and dict keys ``restored`` lacks are left alone. Returns target.
    """
    if isinstance(target, dict) and isinstance(restored, dict):
        for k, v in restored.items():
            if k in target and _is_container(target[k]) and _is_container(v):
                merged = merge_into(target[k], v)
                if merged is not target[k]:
                    target[k] = merged
            elif k not in target or target[k] is not v:
                target[k] = v
        return target
    if isinstance(target, list) and isinstance(restored, list) and len(target) == len(restored):
        for i, v in enumerate(restored):
            if v is NOT_LOADED:
                continue
            if _is_container(target[i]) and _is_container(v):
                merged = merge_into(target[i], v)
                if merged is not target[i]:
                    target[i] = merged
            elif target[i] is not v:
                target[i] = v
        return target
    if isinstance(target, tuple) and isinstance(restored, tuple) and len(target) == len(restored):
        for t, r in zip(target, restored):
            if _is_container(t) and _is_container(r):
                merge_into(t, r)
        if any(r is NOT_LOADED for r in restored):  # a partial restore: keep the target's items
            return tuple(t if r is NOT_LOADED else r for t, r in zip(target, restored))
        return restored
    return restored


def _is_container(x: Any) -> bool:
    return isinstance(x, (dict, list, tuple)) and not (torch is not None and isinstance(x, torch.Size))


def jsonable(obj: Any, what: str) -> Any:
    """``obj`` as plain JSON values (numpy / 0-d torch scalars become numbers); ``ConfigError`` if it cannot be."""
    try:
        return json.loads(json.dumps(obj, allow_nan=False, default=_json_default))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"checkpoint {what} must be JSON-serialisable: {exc}") from None


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if hasattr(x, "item") and callable(x.item) and getattr(x, "numel", lambda: 0)() == 1:
        return x.item()  # a 0-d torch tensor (loss.detach())
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")


__all__ = ["Leaf", "flatten", "jsonable", "unflatten", "iter_tensor_names", "merge_into", "pretty_path",
           "parse_torch_dtype", "parse_numpy_dtype", "dtype_itemsize"]
