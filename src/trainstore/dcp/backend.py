"""The DCP save backend: ``CheckpointManager`` inside a torch.distributed job.

Registered as the ``dcp`` entry point of ``trainstore.save_backends``; the manager picks it
(``checkpoint.backend.backend_name``) when torch.distributed runs more than one rank, and
loads every manifest a DCP save wrote through it (also in a single process). Every rank
copies its (sharded: DTensor / FSDP2, or plain per-rank) state to reusable host buffers -
the only part on the training loop's clock - and the manager's save thread runs
``dcp.save`` with a ``trainstore.dcp.StorageWriter`` over a dedicated gloo process group (so
checkpoint collectives never interleave with the training's own). Incremental or full is
decided once, by the coordinator; ``on_busy`` is agreed by all ranks; a failure is raised on
every rank, naming the failing rank; a rank that stops answering fails the others after the
groups' timeout (``TRAINSTORE_CKPT_TIMEOUT_S``, ``coordination.group_timeout_s``), which their
error names. Hooks (retention, GC, tiering) run on the coordinator
only. Loading runs ``dcp.load`` (with the process group when distributed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from ..checkpoint.backend import SaveBackend, SaveContext, distributed_job
from ..checkpoint.format import manifest as mf
from ..checkpoint.format.delta import stored_ratios
from ..checkpoint.format.ratios import RatioMemo
from ..checkpoint.format.ready import ReadyCopies
from ..checkpoint.save.staging import Stager, plan_sizes
from ..checkpoint.types import CheckpointInfo
from ..errors import (
    AlreadyExistsError,
    ConfigError,
    DistributedError,
    StoreUnavailableError,
    TrainstoreError,
)
from .basecache import BaseCache
from .coordination import (
    RANK_COMMITTED,
    KnownManifests,
    describe_failure,
    group_timeout,
    is_peer_failure,
    timeout_note,
)
from .reader import StorageReader
from .share import ReplicaShare, SharePlanner
from .staging import DcpStaged, plain_sizes, stage as stage_dcp
from .statedict import StateDictCopy
from .writer import COMMITTED_KEY, StorageWriter

log = logging.getLogger("trainstore.dcp")


class DcpBackend(SaveBackend):
    """Saves through ``dcp.save`` on every rank; one manifest per step (see module docstring)."""

    collective = True

    def __init__(self, ctx: SaveContext) -> None:
        super().__init__(ctx)
        self.stager = Stager(ctx.pin_memory)  # the host copy reused across saves (dcp/staging.py)
        self.shards = StateDictCopy(ctx.pin_memory, self.stager.cuda_wait)  # ... of the DTensor shards
        self.base_cache = BaseCache() if ctx.policy.keep_base_in_memory and ctx.policy.incremental_every else None
        self.known = KnownManifests()  # manifests committed or read by this job's saves (not re-read)
        self.ready = ReadyCopies(ctx.store, ctx.job)  # this node's copies of its ranks' delta pieces
        self.share = ReplicaShare()  # the replicated tensors this rank writes (share.py)
        self.ratios = RatioMemo(ctx.options.resample_every)  # sampled codec ratios, across saves
        self._groups: tuple[Any, Any] | None = None
        self._coordinator = True  # until a save says otherwise (set_up_storage_writer)

    @property
    def runs_hooks(self) -> bool:
        return self._coordinator

    def _group(self, control: bool = False) -> Any:
        """Gloo groups (created collectively, once): one for the DCP collectives of the save
        thread, one for the caller thread's small agreements (``on_busy``, restore), so two
        threads never issue collectives on the same group. Their timeout: ``group_timeout``."""
        if self._groups is None:
            timeout = group_timeout()
            self._groups = (dist.new_group(backend="gloo", timeout=timeout),
                            dist.new_group(backend="gloo", timeout=timeout))
        return self._groups[1] if control else self._groups[0]

    def _agree(self, values: torch.Tensor, what: str) -> None:
        """``all_reduce(MAX)`` on the control group; a lost peer -> ``DistributedError`` naming the bound."""
        try:
            dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self._group(control=True))
        except Exception as exc:
            if not is_peer_failure(exc):
                raise
            raise DistributedError(f"{what}: another rank did not take part (died, failed before this call, or "
                                   f"stopped responding; {timeout_note()}): {type(exc).__name__}: {exc}") from exc

    def check_state(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise ConfigError(f"a distributed checkpoint state must be a dict (DCP state_dict), "
                              f"got {type(state).__name__}")

    def agree_busy(self, busy_here: bool) -> bool:
        flag = torch.tensor([1 if busy_here else 0])
        self._agree(flag, "starting a distributed checkpoint save")  # one on_busy decision for all ranks
        return bool(flag.item())

    def check_free(self, step: int) -> None:
        store, job = self.ctx.store, self.ctx.job
        if store.write_view().exists(mf.manifest_key(job, step)):  # the commit re-checks lower tiers
            raise AlreadyExistsError(f"checkpoint step {step} of job {job!r} already exists in {store.url}")

    def reserve(self, template: Any, background: bool) -> None:
        """The arena of the first save's plain tensors (it stages all of them: which ones this
        rank writes is learned from it)."""
        sizes = plain_sizes(template)
        if sizes:
            self.stager.reserve(plan_sizes(sizes)[1], 1, background)

    def stage(self, state: Any) -> DcpStaged:
        """The host copy (``dcp/staging.py``): every DTensor shard, and the replicated tensors
        this rank writes (``share.py``; all of them on a first save). The process groups are
        made here, on the caller's thread, if not yet: ``new_group`` must run in the same order
        on every rank, and save threads (one per manager: a job and its variants) reach their
        first write in whatever order their timing gives each rank."""
        if dist.is_initialized():
            self._group()
        staged = stage_dcp(self.stager, state, self.share, dist.get_world_size() if distributed_job() else 1,
                           self.shards)
        if staged.skipped_bytes:
            self.ctx.notify("dcp_staged_share", skipped_bytes=staged.skipped_bytes)
        return staged

    def write(self, step: int, kind: str, staged: DcpStaged, metadata: dict,
              committed: Callable[[CheckpointInfo], None]) -> CheckpointInfo:
        try:
            staged.wait()  # device-to-host copies still running
            return self._write(step, kind, staged, metadata, committed)
        finally:
            self.stager.release(staged.arena)  # after the restore-ready copies read it too

    def _write(self, step: int, kind: str, staged: DcpStaged, metadata: dict,
               committed: Callable[[CheckpointInfo], None]) -> CheckpointInfo:
        ctx = self.ctx
        group = self._group()
        writer = StorageWriter(ctx.store, ctx.job, step, kind=kind, options=ctx.options, metadata=metadata,
                               base_cache=self.base_cache, known=self.known, ratios=self.ratios,
                               keep_delta_views=ctx.policy.ready_copies and self.ready.writable, pause_gc=True)
        try:
            try:
                md = dcp.save(staged.state_dict, storage_writer=writer, checkpoint_id=step, process_group=group,
                              planner=SharePlanner())
            finally:
                writer.end_gc_pause()
            info = (md.storage_data or {}).get(COMMITTED_KEY) if isinstance(md.storage_data, dict) else None
            if writer.last_manifest is not None:
                info = CheckpointInfo.from_manifest(writer.last_manifest)
            elif not isinstance(info, CheckpointInfo):  # not broadcast by the coordinator: read what it committed
                info = CheckpointInfo.from_manifest(mf.load_manifest(ctx.store, ctx.job, step))
        except BaseException as exc:  # noqa: BLE001 - CheckpointException is a BaseException
            self.share.forget()  # the next save stages every tensor
            raise DistributedError(f"distributed checkpoint step {step} of job {ctx.job!r} failed: "
                                   f"{writer.failure_report(exc)}") from exc
        self.share.learn(staged.layout, writer.written_tensors)
        self._coordinator = writer.is_coordinator
        if writer.last_manifest is None:
            self.known.committed(info.step, info.kind)
        committed(info)  # durable on every rank once dcp.save returned (the coordinator's commit)
        # every rank: restore-ready copies of its own delta pieces on its node's local tier
        views, writer.delta_views = writer.delta_views, []
        self.ready.after_commit(step, info.kind, lambda: views, ctx.policy.ready_copies, ctx.notify)
        # every rank, after the commit (hooks run on the coordinator only): the peer tier's cue
        ctx.notify(RANK_COMMITTED, step=step, kind=kind, rank=dist.get_rank() if dist.is_initialized() else 0)
        return info

    def close(self) -> None:
        self.ready.close()
        self.stager.close()  # touched staging memory for the next manager of this process

    def load(self, manifest: mf.Manifest, into: Any, scratch_bytes: int) -> Any:
        """Load ``manifest`` into ``into`` (in place) or, without a target, as full tensors."""
        distributed = distributed_job()
        group = None
        if distributed:  # the manager has settled its in-flight save: the save group is idle
            group = self._group()
            steps = torch.tensor([manifest.step, -manifest.step], dtype=torch.int64)
            self._agree(steps, f"restoring distributed checkpoint step {manifest.step}")
            if steps[0].item() != -steps[1].item():  # never load different checkpoints on different ranks
                raise ConfigError(f"ranks chose different checkpoints to restore (steps {-steps[1].item()}.."
                                  f"{steps[0].item()}); was a save committed by another job while restoring?")
        ready = self.ready.reads(manifest.step) if manifest.kind == "incremental" else None
        reader = StorageReader(self.ctx.store, self.ctx.job, manifest.step, workers=self.ctx.read_workers,
                               ready=ready)
        if into is not None and not isinstance(into, dict):
            raise ConfigError(f"restore_into a distributed checkpoint needs a dict state, got {type(into).__name__}")
        try:
            if into is None:  # no target: every tensor whole (unsharded), as saved
                return _load_state_dict_from_keys(None, storage_reader=reader, process_group=group)
            dcp.load(into, storage_reader=reader, process_group=group, no_dist=not distributed)
        except BaseException as exc:  # noqa: BLE001 - CheckpointException is a BaseException
            raise _load_error(exc, manifest.step) from exc
        finally:
            self.ready.report(ready, manifest.step, self.ctx.notify)
        self.ratios.seed(stored_ratios(manifest.tensors))  # the next save's codec choices, unsampled
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


__all__ = ["DcpBackend"]
