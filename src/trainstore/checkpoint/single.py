"""The single-process save backend: this process writes every tensor of the checkpoint.

``stage`` flattens the state (rejecting what would need pickle) and copies it into a
reusable host arena (``staging``); ``write`` (the manager's save thread) writes the chunks
(``writer``: shared byte budget, dedup, XOR deltas against the base full checkpoint),
takes the GC lease (``lease``) and commits the manifest last. The arena of the latest full
checkpoint is kept as the base for the following incrementals' deltas, so an incremental
never reads the store. See ``backend`` for the call order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from ..errors import TrainstoreError
from .backend import SaveBackend, SaveContext
from .format import layout, manifest as mf
from .format.delta import stored_ratios
from .format.manifest import ChunkEntry, Manifest, TensorEntry
from .format.ratios import RatioMemo
from .format.ready import ReadyCopies, ready_pieces
from .format.state import flatten
from .restore.chunkread import read_base
from .restore.reader import load_into, load_state
from .save import lease, lossy
from .save.staging import Arena, StagedTensor, Stager, plan, plan_sizes, template_sizes
from .save.writer import WriteStats, write_tensors
from .types import CheckpointInfo

log = logging.getLogger("trainstore.checkpoint")


class SingleProcessBackend(SaveBackend):
    """Saves and loads whole checkpoints in this process (see module docstring)."""

    def __init__(self, ctx: SaveContext) -> None:
        super().__init__(ctx)
        self.stager = Stager(ctx.pin_memory)
        self.ratios = RatioMemo(ctx.options.resample_every)  # sampled codec ratios, across saves
        self._base: Manifest | None = None  # last full checkpoint committed through this backend
        self._base_views: dict[str, memoryview] | None = None
        self._base_arena: Arena | None = None
        self.ready = ReadyCopies(ctx.store, ctx.job)

    def check_free(self, step: int) -> None:
        fast = self.ctx.store.tiers()[0]  # remote tiers are asked on the save thread (write)
        if fast.capabilities.local and fast.exists(mf.manifest_key(self.ctx.job, step)):
            raise layout.step_exists(self.ctx.job, step, fast.url)

    def reserve(self, template: Any, background: bool) -> None:
        _offsets, total = plan_sizes(template_sizes(template))
        keeps_base = self.ctx.policy.keep_base_in_memory and bool(self.ctx.policy.incremental_every)
        self.stager.reserve(total, 2 if keeps_base else 1, background)  # base + next save's arena

    def stage(self, state: Any) -> tuple[Any, list[StagedTensor], Arena]:
        skeleton, leaves = flatten(state)
        _offsets, total = plan(leaves)
        arena = self.stager.acquire(total)
        try:
            staged = self.stager.stage(leaves, arena)
        except BaseException:
            self.stager.release(arena)
            raise
        return skeleton, staged, arena  # the live tensors may change from here on

    def write(self, step: int, kind: str, staged: tuple[Any, list[StagedTensor], Arena],
              metadata: dict, committed: Callable[[CheckpointInfo], None]) -> CheckpointInfo:
        ctx = self.ctx
        skeleton, tensors, arena = staged
        keep_arena = False
        started = time.time()
        try:
            if ctx.store.write_view().exists(mf.manifest_key(ctx.job, step)):  # the commit re-checks lower tiers
                raise layout.step_exists(ctx.job, step, ctx.store.url)
            base = self._base_for(kind, step)
            if kind == "incremental" and base is None:
                log.info("step %d: no full checkpoint to diff against, saving a full checkpoint", step)
                kind = "full"
            lookup = self._lookup(base) if base is not None else None
            mode = lossy.policy_mode(ctx.policy)
            codecs = lossy.lossy_codecs([(t.name, t.dtype) for t in tensors], mode)
            entries, stats = write_tensors(ctx.chunks, [t for t in tensors if t.name not in codecs], ctx.options, lookup,
                                          ratios=self.ratios)
            if codecs:  # opt-in lossy optimizer moments: always whole pieces, never deltas
                entries, stats = _merge(tensors, (entries, stats), lossy.write_lossy(
                    ctx.chunks, [t for t in tensors if t.name in codecs], codecs, ctx.options))
                metadata = {**metadata, "lossy": lossy.summary(entries, mode)}
            m = Manifest(job=ctx.job, step=step, kind=kind, tensors=entries, skeleton=skeleton,
                         base_step=base.step if base is not None else None, chunk_bytes=ctx.options.chunk_bytes,
                         metadata=metadata, logical_bytes=stats.logical_bytes, stored_bytes=stats.stored_bytes,
                         written_bytes=stats.written_bytes)
            # gc-safe commit: a lease on m's chunks, re-checked against concurrent gc sweeps
            with lease.commit_lease(ctx.store, ctx.chunks, m, {t.name: t.data for t in tensors}, started):
                mf.commit_manifest(ctx.store, m)  # last: the checkpoint exists from here on
            _log_saved(m, stats)
            ctx.notify("save_committed", step=step, kind=kind, seconds=time.time() - started,
                       since_created=time.time() - float(metadata["created"]), logical_bytes=stats.logical_bytes,
                       stored_bytes=stats.stored_bytes, written_bytes=stats.written_bytes, pieces=stats.pieces,
                       same_as_base=stats.same_as_base, deltas=stats.deltas)
            info = CheckpointInfo.from_manifest(m, durable=len(ctx.store.tiers()) == 1)  # tiered: copy pending
            committed(info)
            self._after_commit(m, {t.name: t.data for t in tensors})
            if kind == "full":
                if ctx.policy.keep_base_in_memory and ctx.policy.incremental_every:
                    self._set_base(m, {t.name: t.data for t in tensors}, arena)
                    keep_arena = True
                else:
                    self._set_base(m, None, None)
            return info
        finally:
            if not keep_arena:
                self.stager.release(arena)

    def load(self, manifest: Manifest, into: Any, scratch_bytes: int) -> Any:
        ready = self.ready.reads(manifest.step) if manifest.kind == "incremental" else None
        if into is None:
            state = load_state(self.ctx.chunks, manifest, self.ctx.read_workers, ready)
        else:
            state = load_into(self.ctx.chunks, manifest, into, self.ctx.read_workers, scratch_bytes, ready)
        self.ready.report(ready, manifest.step, self.ctx.notify)
        self.ratios.seed(stored_ratios(manifest.tensors))  # the next save's codec choices, unsampled
        return state

    def _after_commit(self, m: Manifest, data: dict[str, memoryview]) -> None:
        """Restore-ready copies of an incremental's changed pieces (``checkpoint.format.ready``)."""
        self.ready.after_commit(m.step, m.kind, lambda: ((h, data[name][start:start + size])
                                                         for name, h, start, size in ready_pieces(m)),
                                self.ctx.policy.ready_copies, self.ctx.notify)

    def lineage_changed(self) -> None:
        old, self._base, self._base_views, self._base_arena = self._base_arena, None, None, None
        if old is not None:
            self.stager.release(old)

    def close(self) -> None:
        self.ready.close()
        base, self._base_views, self._base_arena = self._base_arena, None, None
        self.stager.release(base)
        self.stager.close()  # touched staging memory for the next manager of this process

    # -- incrementals ------------------------------------------------------------------------
    def _base_for(self, kind: str, step: int) -> Manifest | None:
        """The full checkpoint an incremental ``step`` diffs against (save thread: it may ask
        remote tiers). Only a base in the store's write view counts (not one only in an
        archive), so the incremental never needs the archive to become durable."""
        if kind != "incremental":
            return None
        live = self.ctx.store.write_view()
        if self._base is not None and self._base.step < step and live.exists(self._base.key):
            return self._base
        # a fresh process (or the base was deleted): the newest full checkpoint before step
        for s in reversed(mf.list_steps(live, self.ctx.job)):
            if s >= step:
                continue
            try:
                m = mf.load_manifest(live, self.ctx.job, s)
            except TrainstoreError:
                continue
            if m.kind == "full":
                self._set_base(m, None, None)
                return m
        return None

    def _set_base(self, m: Manifest, views: dict[str, memoryview] | None, arena: Arena | None) -> None:
        old = self._base_arena
        self._base, self._base_views, self._base_arena = m, views, arena
        if old is not None and old is not arena:
            self.stager.release(old)

    def _lookup(self, base: Manifest):  # noqa: ANN202 - see writer.BaseLookup
        views = self._base_views if (self._base is base and self._base_views is not None) else None
        chunk_bytes = base.chunk_bytes
        if chunk_bytes != self.ctx.options.chunk_bytes:
            return None
        chunks = self.ctx.chunks

        def lookup(name: str, dtype: str, idx: int, size: int) -> tuple[ChunkEntry, Callable[[], memoryview]] | None:
            t = base.tensors.get(name)
            if t is None or t.dtype != dtype or idx >= len(t.chunks) or t.chunks[idx].size != size:
                return None
            entry = t.chunks[idx]
            if not lossy.usable_as_base(entry):  # its bytes are not what was staged then
                return None
            if views is not None and name in views:
                start = idx * chunk_bytes
                return entry, lambda: views[name][start:start + size]
            return entry, lambda: read_base(chunks, entry.ref, entry.check)

        return lookup


def _merge(staged: list[StagedTensor], *parts: tuple[dict[str, TensorEntry], WriteStats]
           ) -> tuple[dict[str, TensorEntry], WriteStats]:
    """Entries (in the staged order) and summed stats of several ``write_tensors``-like calls."""
    found = {n: e for entries, _ in parts for n, e in entries.items()}
    total = WriteStats()
    for _, st in parts:
        for f in fields(WriteStats):
            setattr(total, f.name, getattr(total, f.name) + getattr(st, f.name))
    return {t.name: found[t.name] for t in staged}, total


def _log_saved(m: Manifest, stats: WriteStats) -> None:
    log.info("checkpoint %s step %d (%s): %d tensors, %.1f MB logical, %.1f MB stored, %.1f MB written, "
             "%d/%d pieces same as base, %d deltas", m.job, m.step, m.kind, len(m.tensors), stats.logical_bytes / 1e6,
             stats.stored_bytes / 1e6, stats.written_bytes / 1e6, stats.same_as_base, stats.pieces, stats.deltas)


__all__ = ["SingleProcessBackend"]
