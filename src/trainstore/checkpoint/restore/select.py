"""Partial restore: load part of a checkpoint, leave the rest to the caller to re-initialise.

``Selection(only=("model",), reset=("optim/state", "scheduler"))`` picks the nodes of a
state by their ``/``-joined names (the names of ``state``: ``model/layer.weight``,
``optim/param_groups/0/lr``), by prefix on whole path parts (``"optim/state"`` matches
``optim/state/0/exp_avg``, not ``optim/statex``). A node is loaded when ``only`` is None or
one of its prefixes matches it, and none of ``reset`` does.

``prune`` turns a manifest into an in-memory manifest of just the loaded nodes: its
``tensors`` hold only the selected tensors - the reader never reads, let alone decodes, a
chunk of the others - and its skeleton only the selected values (list and tuple items left
out become ``state.NOT_LOADED``, which ``restore_into`` leaves as they are in the target).
Every piece that is read is verified exactly as in a full restore.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...errors import ConfigError
from ..format.manifest import Manifest
from ..format.state import NOT_LOADED_NODE, PARTIAL_KEY

_DROP = object()


def _paths(value: str | Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = (value,) if isinstance(value, str) else tuple(value)
    for p in items:
        if not isinstance(p, str) or not p.strip("/"):
            raise ConfigError(f"restore {what}= takes '/'-joined state names like 'model' or 'optim/state', "
                              f"got {p!r}")
    return tuple(p.strip("/") for p in items)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + "/")


@dataclass(frozen=True)
class Selection:
    """Which nodes of a saved state a restore loads (see module docstring)."""

    only: tuple[str, ...] | None = None
    reset: tuple[str, ...] = ()

    @classmethod
    def of(cls, only: str | Sequence[str] | None, reset: str | Sequence[str] | None) -> Selection | None:
        """The selection, or None for a whole restore."""
        o, r = _paths(only, "only"), _paths(reset, "reset") or ()
        return None if o is None and not r else cls(o, r)

    def loads(self, name: str) -> bool:
        return (self.only is None or any(_under(name, p) for p in self.only)) \
            and not any(_under(name, p) for p in self.reset)

    def whole(self, name: str) -> bool:
        """Whether the node ``name`` is loaded with everything under it."""
        return self.loads(name) and not any(_under(p, name) for p in self.reset)

    def may_hold(self, name: str) -> bool:
        """Whether the node ``name`` may have a loaded descendant (it is then kept as a container)."""
        if any(_under(name, p) for p in self.reset):
            return False
        return self.only is None or any(_under(name, p) or _under(p, name) or name == "" for p in self.only)


@dataclass(frozen=True)
class PartialReport:
    """What a partial restore loaded and left out (``RestoreResult.partial``)."""

    only: tuple[str, ...] | None
    reset: tuple[str, ...]
    loaded: tuple[str, ...]  # tensor names read and verified
    not_loaded: tuple[str, ...]  # tensor names whose chunks were not read
    read_stored_bytes: int  # stored bytes of the chunks read (deltas and their bases)
    skipped_stored_bytes: int  # stored bytes of the chunks left unread

    def __str__(self) -> str:
        return (f"partial restore: loaded {len(self.loaded)} tensors ({self.read_stored_bytes} stored bytes), "
                f"left {len(self.not_loaded)} for re-initialisation ({self.skipped_stored_bytes} stored bytes unread)")


def prune(m: Manifest, sel: Selection) -> tuple[Manifest, PartialReport]:
    """``m`` reduced to the nodes ``sel`` loads, and the report; ``ConfigError`` when a
    selector matches nothing in ``m`` (a typo would otherwise load nothing, or everything)."""
    names = list(m.tensors)
    used = set()

    def walk(node: Any, path: str) -> Any:
        if path and sel.whole(path):
            used.add(path)
            return node
        if not sel.may_hold(path):
            if path:
                used.add(path)
            return _DROP
        if isinstance(node, list):
            items = [walk(v, _join(path, i)) for i, v in enumerate(node)]
            return _DROP if path and all(i is _DROP for i in items) else [NOT_LOADED_NODE if i is _DROP else i for i in items]
        if isinstance(node, dict) and len(node) == 1:
            (tag, v), = node.items()
            if tag in ("$dict", "$odict") and isinstance(v, list):
                kept = [[pair[0], walk(pair[1], _join(path, pair[0]))] for pair in v
                        if isinstance(pair, list) and len(pair) == 2]
                kept = [p for p in kept if p[1] is not _DROP]
                return _DROP if path and not kept else {tag: kept}
            if tag == "$tuple" and isinstance(v, list):
                items = [walk(e, _join(path, i)) for i, e in enumerate(v)]
                return _DROP if path and all(i is _DROP for i in items) \
                    else {tag: [NOT_LOADED_NODE if i is _DROP else i for i in items]}
        return _DROP  # a leaf neither selected nor reset (only= names something else)

    skeleton = walk(m.skeleton, "")
    if skeleton is _DROP:
        skeleton = {"$dict": []}
    loaded = [n for n in names if sel.loads(n.split("#", 1)[0])]
    for p in (sel.only or ()) + sel.reset:
        if not any(_under(u, p) for u in used) and not any(_under(n, p) for n in names):
            tops = sorted({n.split("/", 1)[0] for n in names})[:10]
            raise ConfigError(f"restore selector {p!r} names nothing in checkpoint step {m.step} of job {m.job!r} "
                              f"(its top-level names include {tops})")
    keep = set(loaded)
    tensors = {n: e for n, e in m.tensors.items() if n in keep}
    report = PartialReport(sel.only, sel.reset, tuple(loaded), tuple(n for n in names if n not in keep),
                           _stored(tensors.values()), _stored(e for n, e in m.tensors.items() if n not in keep))
    pruned = replace(m, tensors=tensors, skeleton=skeleton, metadata={**m.metadata, PARTIAL_KEY: True},
                     logical_bytes=sum(e.nbytes for e in tensors.values()))
    return pruned, report


def _join(path: str, part: Any) -> str:
    return f"{path}/{part}" if path else str(part)


def _stored(entries: Any) -> int:
    return sum(r.stored for r in {r for e in entries for piece in e.chunks for r in piece.refs()})  # a pack once


__all__ = ["PartialReport", "Selection", "prune"]
