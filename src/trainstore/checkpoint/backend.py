"""The save backend protocol: how ``CheckpointManager`` hands a save to a writer.

The manager owns what every save shares - the lock, the one in-flight save, background
errors (raised at the next call), hooks and observers - and picks the backend in ONE place
(``backend_name``): ``"single"`` (``checkpoint.single``: this process writes every tensor)
outside a torch.distributed job, ``"dcp"`` (``trainstore.dcp.backend``: every rank writes
its shards through ``dcp.save``, the coordinator commits one manifest) inside one with
more than one rank. Manifests are loaded by the backend that wrote them
(``loader_name``). Backends are found by name through the ``trainstore.save_backends``
entry points, so this layer imports nothing from ``dcp``.

Call order of one ``save(step, state)`` (every rank runs the same calls, in this order):

====  ====================================  ===============  ========================================
 #    call                                  thread           what it does
====  ====================================  ===============  ========================================
 1    ``check_state(state)``                caller           reject a state this backend cannot save
 2    ``agree_busy(busy_here)``             caller           is a save still running (on any rank)?
                                                             collective when ``collective``; only
                                                             with ``on_busy="skip"``
 3    ``check_free(step)``                  caller           ``AlreadyExistsError`` if step exists
                                                             (after the previous save finished)
 4    ``stage(state)`` -> staged            caller           host copy: the only part on the
                                                             training loop's clock
 5    ``write(step, kind, staged, meta,     save thread      chunks, lease, manifest committed
      committed)`` -> ``CheckpointInfo``    (one at a time)  last; then ``committed(info)`` (the
                                                             save's handle resolves: durable),
                                                             then work after the commit that
                                                             reads ``staged`` (restore-ready
                                                             copies); releases ``staged``; raises
                                                             on failure (the manager records it)
 6    hooks(info, manager)                  save thread      by the manager, where ``runs_hooks``
====  ====================================  ===============  ========================================

The next save stages after 5 and 6 are done (it may reuse ``staged``'s buffers); the caller
waiting for the checkpoint to be durable waits only for the commit.

``load(manifest, into)`` runs on the caller thread of ``restore``/``restore_into`` (every
rank, collectively when ``collective``; the manager first waits for its in-flight save, so
one thread issues collectives at a time). ``close()`` releases buffers at ``mgr.close()``.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from typing import Any

from ..chunks import ChunkStore
from ..errors import ConfigError
from ..store.base import Store
from .format.manifest import Manifest
from .save.writer import WriteOptions
from .types import CheckpointInfo, CheckpointPolicy

#: entry point group of save backends (``name = "module:Class"``; see pyproject.toml)
ENTRY_POINT_GROUP = "trainstore.save_backends"


@dataclass(frozen=True)
class SaveContext:
    """What a backend gets from its manager (public values only, never the manager)."""

    store: Store
    job: str
    policy: CheckpointPolicy
    options: WriteOptions
    chunks: ChunkStore
    read_workers: int
    pin_memory: bool | None
    notify: Callable[..., None]  # notify(event, **fields): the manager's observers


class SaveBackend(abc.ABC):
    """One way of writing and loading checkpoints (see the module docstring for the order)."""

    #: its calls are collectives: every rank makes them, in the same order
    collective: bool = False

    def __init__(self, ctx: SaveContext) -> None:
        self.ctx = ctx

    @property
    def runs_hooks(self) -> bool:
        """Whether hooks run in this process after a commit (DCP: on the coordinator only)."""
        return True

    def check_state(self, state: Any) -> None:
        """Caller thread, before anything: raise ``ConfigError`` for a state it cannot save."""

    def agree_busy(self, busy_here: bool) -> bool:
        """Caller thread: whether a previous save is still running here (or on any rank)."""
        return busy_here

    @abc.abstractmethod
    def check_free(self, step: int) -> None:
        """Caller thread: raise ``AlreadyExistsError`` when ``step`` is committed already."""

    def reserve(self, template: Any, background: bool) -> None:
        """Caller thread: allocate and touch the host buffers ``stage`` will need for states
        like ``template`` (``CheckpointManager.reserve``); a backend without reusable buffers
        does nothing."""

    @abc.abstractmethod
    def stage(self, state: Any) -> Any:
        """Caller thread: copy ``state`` to host buffers the save thread then reads."""

    @abc.abstractmethod
    def write(self, step: int, kind: str, staged: Any, metadata: dict,
              committed: Callable[[CheckpointInfo], None]) -> CheckpointInfo:
        """Save thread: write ``staged`` as ``step``, commit its manifest last, call
        ``committed`` with the checkpoint at once, then do the work after the commit."""

    @abc.abstractmethod
    def load(self, manifest: Manifest, into: Any, scratch_bytes: int) -> Any:
        """Caller thread: the state of ``manifest`` (or loaded into ``into``, in place)."""

    def lineage_changed(self) -> None:
        """Caller thread: steps were moved out of the lineage (``lineage.abandon``); forget
        any remembered base checkpoint, which may be one of them."""

    def close(self) -> None:
        """Release buffers (the manager's ``close``)."""


def distributed_job() -> bool:
    """True inside a multi-rank torch.distributed job (saves then go through DCP)."""
    try:
        import torch.distributed as dist  # optional: torch is not a base dependency
    except ImportError:  # pragma: no cover
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def backend_name() -> str:
    """The backend of a save made now: the one place single process vs DCP is decided."""
    return "dcp" if distributed_job() else "single"


def loader_name(manifest: Manifest) -> str:
    """The backend that reads ``manifest`` back: the one that wrote it."""
    return "dcp" if manifest.metadata.get("dcp") else "single"


@functools.cache
def backend_class(name: str) -> type[SaveBackend]:
    """The backend registered as ``name`` (entry point group ``trainstore.save_backends``).
    trainstore's own entry points are looked up first (one distribution's metadata): scanning
    every installed distribution costs a fresh process's first save or restore ~400 metadata
    file reads; other packages' backends are found by that scan. Looked up once per process
    (the manager's constructor asks for the current one, so a first save does not)."""
    try:
        found = distribution("trainstore").entry_points.select(group=ENTRY_POINT_GROUP, name=name)
    except PackageNotFoundError:  # pragma: no cover - running from a tree without metadata
        found = ()
    if not found:
        found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not found:
        raise ConfigError(f"no checkpoint save backend {name!r} is installed (entry point group "
                          f"{ENTRY_POINT_GROUP!r}; the 'dcp' one needs trainstore[torch])")
    cls = next(iter(found)).load()
    if not (isinstance(cls, type) and issubclass(cls, SaveBackend)):
        raise ConfigError(f"save backend {name!r} ({cls!r}) is not a SaveBackend")
    return cls


__all__ = ["ENTRY_POINT_GROUP", "SaveBackend", "SaveContext", "backend_class", "backend_name", "distributed_job",
           "loader_name"]
