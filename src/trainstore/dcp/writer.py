"""``StorageWriter``: torch.distributed.checkpoint writes into trainstore's chunk store.

    w = StorageWriter("s3://bucket/ckpt", job="run-1", kind="incremental")
    dcp.save(state_dict, storage_writer=w, checkpoint_id=1200)     # or dcp.async_save(...)

Call order (torch 2.x ``StorageWriter`` protocol): ``reset(checkpoint_id)`` ->
``set_up_storage_writer`` -> ``prepare_local_plan`` (all ranks) -> ``prepare_global_plan``
(coordinator: checks the step is free, picks the base full checkpoint for incrementals and
ships the decision to every rank in its plan) -> ``write_data`` (every rank, in parallel:
its items become chunks: dedup, compression, BLAKE3, XOR deltas against the base's same
shard) -> ``finish`` (coordinator, only if every rank's ``write_data`` succeeded: DCP gathers
results/exceptions first) which commits ONE manifest with ``put_if_absent``.

A rank's failure raises ``DistributedError("rank N: ...")`` there; DCP forwards it to every
rank as a ``CheckpointException`` keyed by rank, and ``finish`` is never called: nothing is
committed (chunks already written are unreferenced garbage for GC).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import uuid
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageWriter as _TorchStorageWriter, WriteResult
from torch.futures import Future

from ..checkpoint.format import layout, manifest as mf
from ..checkpoint.format.manifest import ChunkEntry, Manifest, TensorEntry
from ..checkpoint.format.ratios import RatioMemo
from ..checkpoint.format.ready import entry_ready_pieces
from ..checkpoint.restore.chunkread import read_base
from ..checkpoint.save import lease
from ..checkpoint.save.writer import WriteOptions, WriteStats, write_tensors
from ..checkpoint.types import CheckpointInfo
from ..chunks import ChunkStore
from ..codecs import CodecConfig
from ..errors import ConfigError, ManifestError, TrainstoreError
from ..gcpause import gc_paused
from ..store import open_store
from ..store.base import Store
from .basecache import BaseCache
from .coordination import (
    KnownManifests,
    describe_failure,
    find_base,
    full_checkpoint_id,
    is_valid_checkpoint_id,
    mark_written,
    parse_checkpoint_id,
    rank_error,
    unfinished_ranks,
)
from .items import lookup_value, stage_tensor, stage_value
from .metadata import index_to_json, metadata_to_json, shard_name
from .share import check_covered
from .statedict import StateDictCopy

log = logging.getLogger("trainstore.dcp")


#: ``Metadata.storage_data`` key of what ``dcp.save`` returns on every rank: the commit's ``CheckpointInfo``
COMMITTED_KEY = "trainstore.committed"

#: items resolved (and, for device tensors, copied to host) per write_tensors call
GROUP_BYTES = 1 << 30


def _item_groups(items: list, limit: int) -> list[list]:
    """Consecutive groups of write items whose tensors add up to about ``limit`` bytes."""
    groups: list[list] = [[]]
    size = 0
    for item in items:
        td = getattr(item, "tensor_data", None)
        n = 0
        if td is not None:
            n = math.prod(td.chunk.sizes) * td.properties.dtype.itemsize
        if groups[-1] and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += n
    return groups


def _open(store: str | Store, options: dict | None) -> Store:
    return open_store(store, **(options or {})) if isinstance(store, str) else store


class StorageWriter(_TorchStorageWriter, BlockingAsyncStager):
    """Writes a DCP checkpoint as step ``step`` of ``job`` (see module docstring).

    ``kind``: ``"full"`` or ``"incremental"`` (XOR deltas against the newest full distributed
    checkpoint of the job before this step; a full one when there is none). ``metadata``:
    JSON fields stored in the manifest (``config``, ``metrics``, ``extra``...).
    ``cache_staged_state_dict``: reuse the host copy ``dcp.async_save`` stages into.
    ``keep_delta_views``: remember views of this rank's changed pieces a restore would rebuild
    or decode (``delta_views``; ``ready.ready_piece``: XOR deltas, compressed pieces) in the
    staged bytes, for the restore-ready copies the manager writes after the commit
    (``checkpoint.format.ready``); only where the staged bytes outlive the save (the manager's
    host copy), since the views keep them alive.
    ``ratios``: sampled compression ratios kept across the saves of the job
    (``checkpoint.format.ratios``; None: every piece sampled).
    ``pause_gc``: the cyclic collector is off from ``set_up_storage_writer`` to ``write_data``
    and from the end of ``write_data`` until the caller calls ``end_gc_pause`` after
    ``dcp.save`` (``gcpause``): planning and the commit make thousands of short-lived objects
    (plans, metadata, results) that, promoted while a background save runs beside training,
    set off a full collection every few saves (0.2 s holding the GIL in a process with
    transformers loaded). The writes in between keep the collector on.
    """

    def __init__(self, store: str | Store, job: str, step: int | None = None, *, kind: str = "full",
                 options: WriteOptions | None = None, store_options: dict | None = None,
                 metadata: dict | None = None, cache_staged_state_dict: bool = False,
                 base_cache: BaseCache | None = None, known: KnownManifests | None = None,
                 keep_delta_views: bool = False, pause_gc: bool = False, ratios: RatioMemo | None = None) -> None:
        _TorchStorageWriter.__init__(self)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        if kind not in mf.KINDS:
            raise ConfigError(f"kind must be one of {mf.KINDS}, got {kind!r}")
        self.job = mf.check_job(job)
        self.kind = kind
        self.options = options or WriteOptions(nice=0)  # dcp.save waits for it: no reason to yield the CPU
        self._store_options = store_options
        self.store = _open(store, store_options)
        self.step = None if step is None else mf.check_step(step)
        self.metadata = dict(metadata or {})
        self.base_cache = base_cache
        self.known = known if known is not None else KnownManifests()
        self.ratios = ratios
        self._host_copy = StateDictCopy(None, "host")  # stage()'s reusable host copy (cache_staged_state_dict)
        self.keep_delta_views = keep_delta_views
        self.pause_gc = pause_gc
        self._gc_held = False
        self.delta_views: list[tuple[str, memoryview]] = []  # (piece hash, raw bytes) of this rank's changed pieces
        self.is_coordinator = False
        self.rank = 0
        self.last_manifest: Manifest | None = None
        self.written_tensors: frozenset[str] = frozenset()  # fqns of the tensors this rank wrote (share.py)
        self._decision: dict | None = None
        self._chunks: ChunkStore | None = None
        self._started = time.time()

    # -- torch protocol -----------------------------------------------------------------------
    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike | int) -> bool:
        return is_valid_checkpoint_id(checkpoint_id)

    @classmethod
    def from_checkpoint_id(cls, checkpoint_id: str, **kwargs: Any) -> StorageWriter:
        """A writer for ``"trainstore:<store url>#<job>@<step>"`` (``kwargs``: the constructor's).

        torch's ``dcp.save(sd, checkpoint_id=...)`` without a ``storage_writer`` tries only its
        file-system writers (which take such an id for a folder name), so pass
        ``storage_writer=StorageWriter.from_checkpoint_id(id)``."""
        target = full_checkpoint_id(checkpoint_id)
        return cls(target.url, target.job, target.step, **kwargs)  # type: ignore[arg-type]

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``dcp.async_save``'s host copy; with ``cache_staged_state_dict`` the copy is reused
        across saves and pinned only when CUDA exists (torch's stager always pins)."""
        if not self.cache_staged_state_dict:
            return BlockingAsyncStager.stage(self, state_dict)
        return self._host_copy.copy(state_dict)

    def reset(self, checkpoint_id: str | os.PathLike | int | None = None) -> None:
        target = parse_checkpoint_id(checkpoint_id)
        if target.url is not None:
            self.store = _open(target.url, self._store_options)
        if target.job is not None:
            self.job = mf.check_job(target.job)
        if target.step is not None:
            self.step = target.step
        self.last_manifest = None
        self._decision = None
        self.delta_views = []
        self.written_tensors = frozenset()

    @property
    def checkpoint_id(self) -> str:
        return f"trainstore:{self.store.url}#{self.job}@{self.step}"

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=uuid.uuid4().hex)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._hold_gc(True)  # planning
        self.is_coordinator = bool(is_coordinator)
        self._started = time.time()
        rank = kwargs.get("rank")
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = int(rank)
        if kwargs.get("use_collectives", True) is False and dist.is_available() and dist.is_initialized() \
                and dist.get_world_size() > 1:
            raise ConfigError("trainstore.dcp.StorageWriter commits one manifest for all ranks and needs "
                              "use_collectives=True")
        if self.step is None:
            raise ConfigError("no checkpoint step: pass step= to StorageWriter or checkpoint_id=<step> to dcp.save")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        check_covered(plans)  # tensors a rank did not stage (share.py) are written by another
        step = self.step
        if self.store.write_view().exists(mf.manifest_key(self.job, step)):  # type: ignore[union-attr]
            raise layout.step_exists(self.job, step, self.store.url)
        kind, base = self.kind, None
        if kind == "incremental":
            base = find_base(self.store.write_view(), self.job, step, self.known)  # type: ignore[union-attr]
            if base is None:
                log.info("step %s: no full distributed checkpoint to diff against, saving a full one", step)
                kind = "full"
        decision = {"step": step, "kind": kind, "base_step": None if base is None else base.step,
                    "world_size": len(plans), "save_id": uuid.uuid4().hex}
        return [dataclasses.replace(p, storage_data={**decision, "rank": i}) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        fut: Future[list[WriteResult]] = Future()
        self._hold_gc(False)  # the writes: seconds on a large state, the collector stays on
        try:
            fut.set_result(self._write(plan, planner))
        except Exception as exc:  # noqa: BLE001 - name the rank whatever failed
            raise rank_error(self.rank, self.step, self.job, "write", exc) from exc
        finally:
            self._hold_gc(True)  # DCP gathers the results, the coordinator commits
        return fut

    def end_gc_pause(self) -> None:
        """The caller, once ``dcp.save`` returned or raised (``pause_gc``)."""
        self._hold_gc(False)

    def _hold_gc(self, on: bool) -> None:
        if not self.pause_gc or on == self._gc_held:
            return
        if on:
            gc_paused().__enter__()
        else:
            gc_paused().__exit__(None, None, None)
        self._gc_held = on

    def failure_report(self, exc: BaseException) -> str:
        """Describe a failed save, naming the ranks that never finished writing when a
        collective broke (a rank that died or hung cannot report its own error)."""
        msg = describe_failure(exc)
        d = self._decision or {}
        if getattr(exc, "failures", None) or not d:
            return msg
        missing = unfinished_ranks(d.get("save_id"), int(d.get("world_size") or 0))
        if missing:
            msg = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not finish writing " \
                  f"checkpoint step {self.step} (died or stopped responding); {msg}"
        return msg

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        try:
            self._commit(metadata, results)
        except TrainstoreError as exc:
            raise rank_error(self.rank, self.step, self.job, "commit", exc) from exc

    # -- work ------------------------------------------------------------------------------------
    def _write(self, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        decision = plan.storage_data if isinstance(plan.storage_data, dict) else {}
        self._decision = decision
        self.written_tensors = frozenset(i.index.fqn for i in plan.items if i.type != WriteItemType.BYTE_IO)
        if decision.get("step", self.step) != self.step:
            raise ConfigError(f"this rank saves step {self.step}, the coordinator step {decision.get('step')}: "
                              "every rank must pass the same checkpoint_id")
        base_step = decision.get("base_step")
        base = self.known.load_full(self.store, self.job, base_step) if base_step is not None else None
        chunks = self._chunk_store()
        lookup = self._lookup(chunks, base) if base is not None else None
        caching = self.base_cache is not None and decision.get("kind") == "full"
        if caching:
            self.base_cache.start(self.job, decision.get("step"))  # type: ignore[union-attr]
        entries: dict[str, TensorEntry] = {}
        stats = WriteStats()
        pending = []
        for group in _item_groups(plan.items, GROUP_BYTES):
            # items are resolved group by group: device tensors are copied to host lazily,
            # at most ~GROUP_BYTES at a time (DCP: "call resolve_data lazily")
            keep: list[Any] = []
            staged = []
            for item in group:
                if item.type == WriteItemType.BYTE_IO:
                    skeleton, leaves = stage_value(item.index, lookup_value(planner, item), keep)
                    staged.extend(leaves)
                    pending.append((item, {"object": skeleton, "names": [s.name for s in leaves]}))
                else:
                    name = shard_name(item.index)
                    st = stage_tensor(name, planner.resolve_data(item), keep)  # type: ignore[arg-type]
                    staged.append(st)
                    pending.append((item, {"tensor": name, "names": [name]}))
            group_entries, group_stats = write_tensors(chunks, staged, self.options, lookup, ratios=self.ratios)
            entries.update(group_entries)
            for f in dataclasses.fields(WriteStats):
                setattr(stats, f.name, getattr(stats, f.name) + getattr(group_stats, f.name))
            if caching:
                self.base_cache.add(staged)  # type: ignore[union-attr]
            if self.keep_delta_views and lookup is not None:
                self.delta_views += [(h, st.data[start:start + size]) for st in staged
                                     for h, start, size in entry_ready_pieces(group_entries[st.name])]
            del keep, staged
        results = []
        for i, (item, info) in enumerate(pending):
            names = info.pop("names")
            sd = {**info, "rank": self.rank, "entries": {n: entries[n].to_json() for n in names}}
            if i == 0:
                sd["stats"] = dataclasses.asdict(stats)
            size = sum(entries[n].nbytes for n in names)
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=sd))
        mark_written(decision.get("save_id"), self.rank)
        return results

    def _chunk_store(self) -> ChunkStore:
        if self._chunks is None or self._chunks.store is not self.store:
            o = self.options
            self._chunks = ChunkStore(self.store, codec=CodecConfig(o.codec, o.level, o.codec_threads))
        return self._chunks

    def _lookup(self, chunks: ChunkStore, base: Manifest):  # noqa: ANN202 - see checkpoint.writer.BaseLookup
        if base.chunk_bytes != self.options.chunk_bytes:
            return None

        cached = self.base_cache.views(self.job, base.step) if self.base_cache is not None else {}
        cb = base.chunk_bytes

        def lookup(name: str, dtype: str, idx: int, size: int):  # noqa: ANN202
            t = base.tensors.get(name)
            if t is None or t.dtype != dtype or idx >= len(t.chunks) or t.chunks[idx].size != size:
                return None
            entry: ChunkEntry = t.chunks[idx]
            view = cached.get(name)
            if view is not None and view.nbytes == t.nbytes:
                return entry, lambda: view[idx * cb: idx * cb + size]
            return entry, lambda: read_base(chunks, entry.ref, entry.check)

        return lookup

    def _commit(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        decision = self._decision or {}
        kind, base_step = decision.get("kind", self.kind), decision.get("base_step")
        tensors: dict[str, TensorEntry] = {}
        items = []
        totals = {"logical_bytes": 0, "stored_bytes": 0, "written_bytes": 0}
        for rank, rank_results in enumerate(results):
            for wr in rank_results:
                sd = wr.storage_data
                if not isinstance(sd, dict) or not isinstance(sd.get("entries"), dict):
                    raise ManifestError(f"rank {rank} returned a write result without trainstore storage data "
                                        f"(a different StorageWriter on that rank?)")
                for name, ej in sd["entries"].items():
                    if name in tensors:
                        raise ManifestError(f"two ranks wrote the same shard {name!r} (rank {rank} and an earlier one)")
                    tensors[name] = TensorEntry.from_json(name, ej)
                for k in totals:
                    totals[k] += int((sd.get("stats") or {}).get(k, 0))
                item = {**index_to_json(wr.index), "rank": sd.get("rank", rank), "size": wr.size_in_bytes}
                if "tensor" in sd:
                    item["tensor"] = sd["tensor"]
                else:
                    item["object"] = sd["object"]
                items.append(item)
        dcp_json = metadata_to_json(metadata)
        dcp_json["world_size"] = len(results)
        dcp_json["items"] = items
        meta = {**self.metadata, "dcp": dcp_json}
        meta.setdefault("created", time.time())
        m = Manifest(job=self.job, step=self.step, kind=kind, tensors=tensors,  # type: ignore[arg-type]
                     skeleton={"$dict": [[n, {"$tensor": n}] for n in tensors]}, base_step=base_step,
                     chunk_bytes=self.options.chunk_bytes, metadata=meta, **totals)
        # gc-safe: a lease on m's chunks while committing
        with lease.commit_lease(self.store, self._chunk_store(), m, None, self._started):
            mf.commit_manifest(self.store, m)  # last: the checkpoint exists from here on
        # what every rank gets back from dcp.save (broadcast): the commit, not the item list
        metadata.storage_data = {COMMITTED_KEY: CheckpointInfo.from_manifest(m)}
        self.known.add(m)
        self.last_manifest = m
        log.info("distributed checkpoint %s step %d (%s) committed: %d ranks, %d shards, %.1f MB logical, "
                 "%.1f MB written", self.job, m.step, kind, len(results), len(tensors), m.logical_bytes / 1e6,
                 m.written_bytes / 1e6)


__all__ = ["StorageWriter", "COMMITTED_KEY"]
