"""Plain-value encoding of the Python objects frameworks keep in checkpoint dicts. No pickle.

A framework's checkpoint dict (Lightning's above all) holds, besides tensors and plain
values, a few Python objects: ``argparse.Namespace`` and dataclass hyper-parameters, enums,
``AttributeDict`` and other dict subclasses, paths, sets. The checkpoint format stores none
of them (restoring them would need pickle), so ``encode`` turns each into a tagged plain dict
before ``CheckpointManager.save`` and ``decode`` turns it back after ``restore``:

=====================  ======================================================================
value                  encoded as ``{"$pyvalue": kind, ...}``
=====================  ======================================================================
``argparse.Namespace``  ``namespace``: ``attrs`` (its ``vars()``)
``enum.Enum`` member    ``enum``: ``class`` (``module:qualname``) and member ``name``
dataclass instance      ``dataclass``: ``class`` and ``attrs`` (instance ``__dict__``/fields)
dict subclass           ``mapping``: ``class`` and ``items`` (e.g. Lightning's ``AttributeDict``)
namedtuple              ``namedtuple``: ``class`` and ``items``
set / frozenset         ``set`` / ``frozenset``: ``items``
``pathlib`` path        ``path``: ``flavour`` (``PosixPath``, ``PureWindowsPath``, ...) and ``path``
dict with a ``$pyvalue`` key   ``dict``: ``items`` (so user data is never mistaken for a tag)
=====================  ======================================================================

Tensors, numpy values, str/int/float/bool/None, bytes, ``torch.dtype``/``device``/``Size``,
dicts, lists and tuples pass through unchanged (the checkpoint format stores them).

Decoding imports nothing and runs no constructor: a class named by a checkpoint must already
be loaded (``sys.modules``) and be of the expected kind (an ``Enum``, a dataclass, a ``dict``
or namedtuple subclass); instances are rebuilt as pickle does (``object.__new__`` plus
attribute assignment), so a hostile checkpoint cannot make the loader call arbitrary code.

Anything else raises ``UnsupportedTypeError`` naming its path (``hyper_parameters/model``).
A user who accepts pickle for some leaves opts in with ``allow_pickle_paths`` (``fnmatch``
patterns over ``/``-joined paths, ``*`` also matches ``/``): at save time such a leaf is
stored as pickled bytes (``pickle`` kind), and it is unpickled at load time only if the
loader opts in for that path too; otherwise loading it raises ``UnsupportedTypeError``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import fnmatch
import math
import pathlib
import pickle
import sys
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import UnsupportedTypeError

TAG = "$pyvalue"
_PLAIN = (str, int, float, bool, type(None), bytes, bytearray)
_TORCH_VALUES = (torch.Tensor, torch.dtype, torch.device, torch.Size)
_PATH_FLAVOURS = {"PosixPath": pathlib.PurePosixPath, "WindowsPath": pathlib.PureWindowsPath,
                  "PurePosixPath": pathlib.PurePosixPath, "PureWindowsPath": pathlib.PureWindowsPath}


def _allowed(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _key_ok(k: Any) -> bool:
    return k is None or type(k) in (str, int, bool) or (type(k) is float and math.isfinite(k))


def encode(obj: Any, allow_pickle_paths: Sequence[str] = ()) -> Any:
    """``obj`` with every supported Python object replaced by its tagged plain form."""
    patterns = tuple(allow_pickle_paths)

    def items(pairs: Any, path: str) -> list[list[Any]]:
        out = []
        for k, v in pairs:
            if not _key_ok(k):
                raise UnsupportedTypeError(f"{path or '<root>'}: dict key {k!r:.60} of type {type(k).__name__} "
                                           "is not supported (use str/int/float/bool/None keys)")
            out.append([k, enc(v, f"{path}/{k}" if path else str(k))])
        return out

    def enc(x: Any, path: str) -> Any:
        if isinstance(x, _PLAIN) and type(x) in _PLAIN:
            return x
        if isinstance(x, _TORCH_VALUES) or isinstance(x, (np.ndarray, np.generic)):
            return x  # stored by the checkpoint format itself
        if type(x) in (dict, OrderedDict):
            pairs = items(x.items(), path)
            if TAG in x:
                return {TAG: "dict", "ordered": type(x) is OrderedDict, "items": pairs}
            return type(x)((k, v) for k, v in pairs)
        if type(x) is list:
            return [enc(v, f"{path}/{i}") for i, v in enumerate(x)]
        if type(x) is tuple:
            return tuple(enc(v, f"{path}/{i}") for i, v in enumerate(x))
        if isinstance(x, argparse.Namespace) and type(x) is argparse.Namespace:
            return {TAG: "namespace", "attrs": items(vars(x).items(), path)}
        if isinstance(x, enum.Enum):
            return {TAG: "enum", "class": _class_path(type(x)), "name": x.name}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            attrs = vars(x) if hasattr(x, "__dict__") else {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
            return {TAG: "dataclass", "class": _class_path(type(x)), "attrs": items(attrs.items(), path)}
        if isinstance(x, dict) and not hasattr(x, "default_factory"):
            return {TAG: "mapping", "class": _class_path(type(x)), "items": items(x.items(), path)}
        if isinstance(x, tuple) and hasattr(type(x), "_fields"):
            return {TAG: "namedtuple", "class": _class_path(type(x)),
                    "items": [enc(v, f"{path}/{f}") for f, v in zip(type(x)._fields, x)]}
        if type(x) in (set, frozenset):
            return {TAG: type(x).__name__, "items": [enc(v, f"{path}/{i}") for i, v in enumerate(x)]}
        if isinstance(x, pathlib.PurePath) and type(x).__name__ in _PATH_FLAVOURS:
            return {TAG: "path", "flavour": type(x).__name__, "path": str(x)}
        if _allowed(path, patterns):
            return {TAG: "pickle", "class": _class_path(type(x)), "data": pickle.dumps(x, protocol=5)}
        raise UnsupportedTypeError(
            f"{path or '<root>'}: {_class_path(type(x))} cannot be checkpointed without pickle; store plain "
            "values, or accept pickle for this leaf with allow_pickle_paths=(" + repr(path) + ",)")

    return enc(obj, "")


def decode(obj: Any, allow_pickle_paths: Sequence[str] = ()) -> Any:
    """Inverse of ``encode``; imports nothing and calls no constructor (see module docstring)."""
    patterns = tuple(allow_pickle_paths)

    def pairs(raw: Any, path: str) -> list[tuple[Any, Any]]:
        return [(k, dec(v, f"{path}/{k}" if path else str(k))) for k, v in raw]

    def dec(x: Any, path: str) -> Any:
        if type(x) in (dict, OrderedDict):
            if TAG in x:
                return tagged(x, path)
            return type(x)((k, dec(v, f"{path}/{k}" if path else str(k))) for k, v in x.items())
        if type(x) is list:
            return [dec(v, f"{path}/{i}") for i, v in enumerate(x)]
        if type(x) is tuple:
            return tuple(dec(v, f"{path}/{i}") for i, v in enumerate(x))
        return x

    def tagged(x: dict, path: str) -> Any:
        kind = x[TAG]
        where = path or "<root>"
        try:
            if kind == "dict":
                return (OrderedDict if x.get("ordered") else dict)(pairs(x["items"], path))
            if kind == "namespace":
                return argparse.Namespace(**{str(k): v for k, v in pairs(x["attrs"], path)})
            if kind == "enum":
                cls = _loaded_class(x["class"], where, lambda c: issubclass(c, enum.Enum), "an Enum")
                return cls[x["name"]]
            if kind == "dataclass":
                cls = _loaded_class(x["class"], where, dataclasses.is_dataclass, "a dataclass")
                inst = object.__new__(cls)
                for k, v in pairs(x["attrs"], path):
                    object.__setattr__(inst, str(k), v)
                return inst
            if kind == "mapping":
                cls = _loaded_class(x["class"], where, lambda c: issubclass(c, dict), "a dict subclass")
                inst = cls.__new__(cls)
                dict.update(inst, pairs(x["items"], path))
                return inst
            if kind == "namedtuple":
                cls = _loaded_class(x["class"], where, lambda c: issubclass(c, tuple) and hasattr(c, "_fields"),
                                    "a namedtuple")
                return tuple.__new__(cls, [dec(v, f"{path}/{f}") for f, v in zip(cls._fields, x["items"])])
            if kind in ("set", "frozenset"):
                values = [dec(v, f"{path}/{i}") for i, v in enumerate(x["items"])]
                return set(values) if kind == "set" else frozenset(values)
            if kind == "path":
                if x["flavour"] == type(pathlib.Path()).__name__:  # a concrete path of this OS
                    return pathlib.Path(x["path"])
                return _PATH_FLAVOURS[x["flavour"]](x["path"])
            if kind == "pickle":
                if not _allowed(path, patterns):
                    raise UnsupportedTypeError(
                        f"{where}: a {x.get('class')} stored with pickle (allowed when it was saved); pass "
                        f"allow_pickle_paths=({path!r},) when loading to unpickle it")
                return pickle.loads(x["data"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, UnsupportedTypeError):
                raise
            raise UnsupportedTypeError(f"{where}: malformed {kind!r} value in the checkpoint: {exc!r:.120}") from None
        raise UnsupportedTypeError(f"{where}: unknown value kind {kind!r:.40} in the checkpoint "
                                   "(written by a newer trainstore?)")

    return dec(obj, "")


def _loaded_class(name: Any, where: str, check: Any, what: str) -> type:
    """The already-imported class ``module:qualname`` (never imports), checked to be ``what``."""
    if not isinstance(name, str) or ":" not in name:
        raise UnsupportedTypeError(f"{where}: malformed class name {name!r:.80} in the checkpoint")
    module_name, qualname = name.split(":", 1)
    obj: Any = sys.modules.get(module_name)
    if obj is None:
        raise UnsupportedTypeError(f"{where}: the checkpoint holds a {qualname} from module {module_name!r}, "
                                   "which is not imported; import it before loading (trainstore never imports "
                                   "modules a checkpoint names)")
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type) or not check(obj):
        raise UnsupportedTypeError(f"{where}: {name} is not {what} in this process")
    return obj


__all__ = ["encode", "decode", "TAG"]
