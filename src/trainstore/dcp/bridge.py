"""``CheckpointManager`` inside a distributed job: save/restore go through DCP underneath.

When ``torch.distributed`` is initialised with more than one rank, ``CheckpointManager.save``
hands over to ``save_distributed``: every rank copies its (sharded: DTensor / FSDP2, or
plain per-rank) state to reusable host buffers - the only part on the training loop's clock -
and the manager's background thread runs ``dcp.save`` with a ``trainstore.dcp.StorageWriter``
over a dedicated gloo process group (so checkpoint collectives never interleave with the
training's own). Async, incremental (decided once by the coordinator), the manager's error
reporting (``BackgroundError`` at the next call, on every rank, naming the failing rank) and
``on_busy`` (agreed by all ranks) are kept. Hooks (retention, GC, tiering) run on the
coordinator only. ``restore``/``restore_into`` of a DCP checkpoint run ``dcp.load`` (with the
process group when distributed, without in a single process), keeping verification fallback.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ..checkpoint import manifest as mf
from ..errors import (
    AlreadyExistsError,
    ConfigError,
    DistributedError,
    StoreUnavailableError,
    TrainstoreError,
)
from .coordination import describe_failure
from .reader import StorageReader
from .writer import BaseCache, StorageWriter, stage_state_dict

if TYPE_CHECKING:
    from ..checkpoint.manager import CheckpointManager, SaveHandle

log = logging.getLogger("trainstore.dcp")


def in_distributed_job() -> bool:
    """True when torch.distributed is initialised with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _group(mgr: CheckpointManager, control: bool = False) -> Any:
    """The manager's gloo groups (created collectively, once): one for the DCP collectives of
    the background save, one for the caller thread's small agreements (``on_busy``), so two
    threads never issue collectives on the same group."""
    groups = getattr(mgr, "_dcp_groups", None)
    if groups is None:
        groups = mgr._dcp_groups = (dist.new_group(backend="gloo"), dist.new_group(backend="gloo"))  # type: ignore[attr-defined]
    return groups[1] if control else groups[0]


def settle(mgr: CheckpointManager) -> None:
    """Wait for this rank's in-flight save (its errors stay queued for the next call)."""
    with mgr._lock:
        busy = mgr._inflight
    if busy is not None:
        try:
            busy[1].result()
        except BaseException:  # noqa: BLE001 - reported by the manager at its next call
            pass


class _Stager:
    """Reusable host copy of the state (``dcp.async_save``'s staging, cached across saves)."""

    cache_staged_state_dict = True

    def __init__(self) -> None:
        self.state_dict_cache: dict | None = None


def save_distributed(mgr: CheckpointManager, step: int, kind: str, state: Any, metadata: dict,
                     blocking: bool, t0: float) -> SaveHandle:
    from ..checkpoint.manager import SaveHandle

    if not isinstance(state, dict):
        raise ConfigError(f"a distributed checkpoint state must be a dict (DCP state_dict), got {type(state).__name__}")
    g = _group(mgr)
    with mgr._lock:
        busy = mgr._inflight
    flag = torch.tensor([1 if busy is not None and not busy[1].done() else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_group(mgr, control=True))  # one decision for all ranks
    if flag.item() and mgr.policy.on_busy == "skip":
        msg = f"checkpoint step {step} skipped: a previous save is still running on some rank (on_busy='skip')"
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        log.warning(msg)
        return SaveHandle(step, kind, None, skipped=True)
    mgr._wait_inflight()
    if mgr.store.exists(mf.manifest_key(mgr.job, step)):
        raise AlreadyExistsError(f"checkpoint step {step} of job {mgr.job!r} already exists in {mgr.store.url}")
    stager = getattr(mgr, "_dcp_stager", None)
    if stager is None:
        stager = mgr._dcp_stager = _Stager()  # type: ignore[attr-defined]
    staged = stage_state_dict(state, stager)
    blocked = time.perf_counter() - t0
    cache = None
    if mgr.policy.keep_base_in_memory and mgr.policy.incremental_every:
        cache = getattr(mgr, "_dcp_base", None)
        if cache is None:
            cache = mgr._dcp_base = BaseCache()  # type: ignore[attr-defined]
    writer = StorageWriter(mgr.store, mgr.job, step, kind=kind, options=mgr.options, metadata=metadata,
                           base_cache=cache)
    fut = mgr._executor.submit(_write, mgr, writer, staged, step, g)
    with mgr._lock:
        mgr._inflight = (step, fut)
    handle = SaveHandle(step, kind, fut, blocked_s=blocked)
    if blocking:
        mgr._wait_inflight()
    return handle


def _write(mgr: CheckpointManager, writer: StorageWriter, staged: dict, step: int, group: Any) -> Any:
    from ..checkpoint.manager import CheckpointInfo

    try:
        dcp.save(staged, storage_writer=writer, checkpoint_id=step, process_group=group)
        m = writer.last_manifest or mf.load_manifest(mgr.store, mgr.job, step)
        info = CheckpointInfo.from_manifest(m)
    except BaseException as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        err = DistributedError(f"distributed checkpoint step {step} of job {mgr.job!r} failed: "
                               f"{writer.failure_report(exc)}")
        with mgr._lock:
            if mgr._error is None:
                mgr._error, mgr._error_step = err, step
        log.error("%s", err)
        raise err from exc
    if writer.is_coordinator:  # retention, GC, tiering: once per job, not once per rank
        for hook in mgr.hooks:
            try:
                hook(info, mgr)
            except Exception as exc:  # committed already; report, do not undo
                # logged, not raised at the next call: an error on the coordinator only would
                # make it leave the next collective save while the other ranks enter it
                log.error("checkpoint hook %r failed on the coordinator after step %d was committed: %s",
                          hook, step, exc)
    return info


def load_dcp(mgr: CheckpointManager, m: mf.Manifest, into: Any) -> Any:
    """Load DCP checkpoint ``m`` into ``into`` (in place) or, without a target, as full tensors."""
    distributed = in_distributed_job()
    group = None
    if distributed:
        settle(mgr)  # the save group must be idle: one thread of collectives at a time
        group = _group(mgr)
        steps = torch.tensor([m.step, -m.step], dtype=torch.int64)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=_group(mgr, control=True))
        if steps[0].item() != -steps[1].item():  # never load different checkpoints on different ranks
            raise ConfigError(f"ranks chose different checkpoints to restore (steps {-steps[1].item()}.."
                              f"{steps[0].item()}); was a save committed by another job while restoring?")
    reader = StorageReader(mgr.store, mgr.job, m.step, workers=mgr.read_workers)
    if into is not None and not isinstance(into, dict):
        raise ConfigError(f"restore_into a distributed checkpoint needs a dict state, got {type(into).__name__}")
    try:
        if into is None:  # no target: every tensor whole (unsharded), as saved
            from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

            return _load_state_dict_from_keys(None, storage_reader=reader, process_group=group)
        dcp.load(into, storage_reader=reader, process_group=group, no_dist=not distributed)
    except BaseException as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        raise _load_error(exc, m.step) from exc
    return into


def _load_error(exc: BaseException, step: int) -> BaseException:
    """Map a DCP load failure to the manager's categories: a target mismatch (ConfigError, no
    fallback), an unreachable store (raised), a bad checkpoint (fallback to an older one)."""
    failures = getattr(exc, "failures", None)
    errs = [p[0] for p in failures.values()] if isinstance(failures, dict) else [exc]
    msg = f"loading distributed checkpoint step {step}: {describe_failure(exc)}"
    for e in errs:
        if isinstance(e, StoreUnavailableError):
            return StoreUnavailableError(msg)
    for e in errs:
        if isinstance(e, TrainstoreError):
            try:
                return type(e)(msg)
            except TypeError:
                return DistributedError(msg)
    if any(isinstance(e, getattr(dist, "DistError", ())) for e in errs):
        return DistributedError(msg)
    if all(isinstance(e, (RuntimeError, ValueError, KeyError, TypeError)) for e in errs):
        return ConfigError(f"the target state does not match the checkpoint: {msg}")
    return DistributedError(msg)


__all__ = ["in_distributed_job", "save_distributed", "load_dcp", "settle"]
