"""``StorageReader``: torch.distributed.checkpoint loads from a trainstore checkpoint.

    dcp.load(state_dict, storage_reader=StorageReader(store, job="run-1"))      # newest step
    dcp.load(state_dict, storage_reader=StorageReader(store, "run-1"), checkpoint_id=1200)

``read_metadata`` rebuilds DCP's ``Metadata`` from the manifest's JSON (nothing unpickled).
``read_data`` serves each ``ReadItem`` (a box of a saved shard, chosen by DCP's planner, so
loads reshard: saved with 4 ranks, loaded with 2 or 1) from the chunks covering the box's
byte range only: a shard's bytes are cut into chunks in row-major order, so a rank that needs
rows [a, b) of a saved shard reads only the chunks holding those rows. Every chunk is
verified (stored length, BLAKE3; XOR deltas against their recorded hash). When an item is
a whole saved shard and its destination a contiguous CPU tensor of the same dtype, the
chunks are decoded straight into the destination (no intermediate copy). Given the step's
restore-ready copies (``ready``; the manager passes them), delta pieces are read from the
copies this node holds, and through base + delta where it holds none.
"""

from __future__ import annotations

import io
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader as _TorchStorageReader
from torch.futures import Future

from ..checkpoint.format import manifest as mf
from ..checkpoint.format.manifest import Manifest, TensorEntry
from ..checkpoint.format.packs import group_packed
from ..checkpoint.format.ready import ReadyReads
from ..checkpoint.format.state import parse_numpy_dtype, parse_torch_dtype, unflatten
from ..checkpoint.restore.reader import host_tensor, read_piece
from ..chunks import ChunkStore
from ..errors import ManifestError, NoCheckpointError, NotFoundError
from ..store import open_store
from ..store.base import Store
from .coordination import (
    full_checkpoint_id,
    is_dcp_manifest,
    is_valid_checkpoint_id,
    parse_checkpoint_id,
)
from .items import OBJ_PREFIX
from .metadata import index_from_json, metadata_from_json


class StorageReader(_TorchStorageReader):
    """Reads step ``step`` (default: the newest committed) of ``job`` for ``dcp.load``."""

    def __init__(self, store: str | Store, job: str, step: int | None = None, *, workers: int = 4,
                 store_options: dict | None = None, ready: ReadyReads | None = None) -> None:
        super().__init__()
        self.job = mf.check_job(job)
        self._store_options = store_options
        self.store = open_store(store, **(store_options or {})) if isinstance(store, str) else store
        self.chunks = ChunkStore(self.store)
        self.step = None if step is None else mf.check_step(step)
        self.workers = max(1, int(workers))
        self.manifest: Manifest | None = None
        self.is_coordinator = False
        self.bytes_read = 0  # raw bytes of the chunks this reader decoded (tests, benchmarks)
        self.ready = ready  # restore-ready copies of the step's delta pieces (checkpoint.format.ready)
        self._items: dict[MetadataIndex, dict] = {}

    # -- torch protocol -----------------------------------------------------------------------
    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike | int) -> bool:
        return is_valid_checkpoint_id(checkpoint_id)

    @classmethod
    def from_checkpoint_id(cls, checkpoint_id: str, **kwargs: Any) -> StorageReader:
        """A reader of ``"trainstore:<store url>#<job>@<step>"`` (``kwargs``: the constructor's);
        torch's ``dcp.load`` cannot pick it from the id alone (see ``StorageWriter``)."""
        target = full_checkpoint_id(checkpoint_id)
        return cls(target.url, target.job, target.step, **kwargs)  # type: ignore[arg-type]

    def reset(self, checkpoint_id: str | os.PathLike | int | None = None) -> None:
        target = parse_checkpoint_id(checkpoint_id)
        if target.url is not None:
            self.store = open_store(target.url, **(self._store_options or {}))
            self.chunks = ChunkStore(self.store)
        if target.job is not None:
            self.job = mf.check_job(target.job)
        if target.step is not None:
            self.step = target.step
        self.manifest = None
        self._items = {}

    @property
    def checkpoint_id(self) -> str:
        return f"trainstore:{self.store.url}#{self.job}@{self.step}"

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        step = self.step
        if step is None:
            steps = mf.list_steps(self.store, self.job)
            if not steps:
                raise NoCheckpointError(f"job {self.job!r} has no checkpoints in {self.store.url}")
            step = self.step = steps[-1]
        m = mf.load_manifest(self.store, self.job, step)
        if not is_dcp_manifest(m):
            raise ManifestError(f"checkpoint step {step} of job {self.job!r} was not saved through "
                                "torch.distributed.checkpoint; restore it with CheckpointManager.restore")
        if m.kind == "incremental":
            base = mf.load_manifest(self.store, self.job, m.base_step)  # type: ignore[arg-type]
            if base.kind != "full":
                raise ManifestError(f"base step {m.base_step} of step {step} is not a full checkpoint")
        dcp = m.metadata["dcp"]
        md = metadata_from_json(dcp, m.key)
        items = dcp.get("items")
        if not isinstance(items, list):
            raise ManifestError(f"dcp metadata {m.key}: items must be a list")
        storage_data = {}
        for i, it in enumerate(items):
            if not isinstance(it, dict):
                raise ManifestError(f"dcp metadata {m.key}: item {i} must be an object")
            index = index_from_json(it, f"{m.key} item {i}")
            name = it.get("tensor")
            if name is not None and name not in m.tensors:
                raise ManifestError(f"dcp metadata {m.key}: item {index.fqn!r} names tensor {name!r:.80}, "
                                    "which the manifest lacks")
            if name is None and "object" not in it:
                raise ManifestError(f"dcp metadata {m.key}: item {index.fqn!r} has neither tensor nor object")
            storage_data[index] = it
        md.storage_data = storage_data
        self.manifest, self._items = m, storage_data
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = bool(is_coordinator)
        if self.manifest is None or not self._items:
            self._items = dict(metadata.storage_data or {})
            if self.manifest is None and self.step is not None:
                self.manifest = mf.load_manifest(self.store, self.job, self.step)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        m = self.manifest
        if m is None:
            raise ManifestError("read_data called before read_metadata")
        by_shard: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            info = self._item(req.storage_index)
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, self._value_bytes(m, info))
            else:
                by_shard.setdefault(info["tensor"], []).append(req)
        self._read_tensors(m, by_shard, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    # -- work ------------------------------------------------------------------------------------
    def _item(self, index: MetadataIndex) -> dict:
        info = self._items.get(index)
        if info is None:
            raise NotFoundError(f"checkpoint step {self.step} of job {self.job!r} has no saved item {index.fqn!r} "
                                f"at offset {list(index.offset or [])}")
        return info

    def _value_bytes(self, m: Manifest, info: dict) -> io.BytesIO:
        """The value of a non-tensor item, rebuilt from JSON, as the ``torch.save`` bytes DCP's
        planner expects. The pickle is produced here from JSON-decoded primitives and tensors:
        no stored bytes are ever unpickled."""
        leaves: dict[str, Any] = {}

        def tensor(tag: str, name: str) -> Any:
            full = OBJ_PREFIX + name
            if full not in leaves:
                entry = m.tensors.get(full)
                if entry is None:
                    raise ManifestError(f"dcp value {info.get('fqn')!r} names tensor {full!r:.80}, which the manifest lacks")
                leaves[full] = self._load_whole(entry, torch_out=tag == "$tensor")
            return leaves[full]

        value = unflatten(info["object"], tensor)
        buf = io.BytesIO()
        torch.save(value, buf)
        buf.seek(0)
        return buf

    def _load_whole(self, entry: TensorEntry, torch_out: bool) -> Any:
        if entry.dtype.startswith("torch."):
            out = torch.empty(entry.shape, dtype=parse_torch_dtype(entry.dtype))
            raw = out.reshape(-1).view(torch.uint8).numpy() if out.numel() else np.empty(0, np.uint8)
        else:
            out = np.empty(entry.shape, dtype=parse_numpy_dtype(entry.dtype))
            raw = out.reshape(-1).view(np.uint8)
        if raw.nbytes != entry.nbytes:
            raise ManifestError(f"tensor {list(entry.shape)} {entry.dtype} is {raw.nbytes} bytes, manifest says {entry.nbytes}")
        self._run([(p, raw[s:s + p.size]) for p, s in _pieces(entry, 0, entry.nbytes)])
        return out

    def _read_tensors(self, m: Manifest, by_shard: dict[str, list[ReadItem]], planner: LoadPlanner) -> None:
        tasks: list[tuple[Any, np.ndarray]] = []
        copies: list[tuple[ReadItem, torch.Tensor, torch.Tensor]] = []
        direct: list[tuple[ReadItem, torch.Tensor]] = []
        for name, reqs in by_shard.items():
            entry = m.tensors[name]
            dtype = parse_torch_dtype(entry.dtype)
            itemsize = dtype.itemsize
            if math.prod(entry.shape) * itemsize != entry.nbytes:
                raise ManifestError(f"shard {name!r}: shape {list(entry.shape)} {entry.dtype} does not match "
                                    f"{entry.nbytes} bytes")
            shard: torch.Tensor | None = None
            need: list[tuple[int, int]] = []
            for req in reqs:
                if any(o + n > d for o, n, d in zip(req.storage_offsets, req.lengths, entry.shape)):
                    raise ManifestError(f"read of {name!r} at {list(req.storage_offsets)}+{list(req.lengths)} "
                                        f"is outside the saved shape {list(entry.shape)}")
                target = planner.resolve_tensor(req).detach()
                whole = list(req.storage_offsets) == [0] * len(entry.shape) and list(req.lengths) == list(entry.shape)
                if whole and target.dtype == dtype and target.device.type == "cpu" and target.is_contiguous() \
                        and entry.nbytes and tuple(target.shape) == tuple(entry.shape):
                    raw = target.reshape(-1).view(torch.uint8).numpy()
                    tasks += [(p, raw[s:s + p.size]) for p, s in _pieces(entry, 0, entry.nbytes)]
                    direct.append((req, target))
                    continue
                if shard is None:  # the saved tensor on the host (O_DIRECT-ready)
                    shard = host_tensor(entry, dtype, name)
                lo, hi = _byte_range(entry.shape, req.storage_offsets, req.lengths, itemsize)
                if hi > lo:
                    need.append((lo, hi))
                copies.append((req, target, shard))
            if shard is not None and need:
                raw = shard.reshape(-1).view(torch.uint8).numpy()
                wanted: dict[int, tuple[Any, int]] = {}
                for lo, hi in need:
                    for p, s in _pieces(entry, lo, hi):
                        wanted[s] = (p, s)
                tasks += [(p, raw[s:s + p.size]) for p, s in wanted.values()]
        self._run(tasks)
        for req, target in direct:
            planner.commit_tensor(req, target)
        for req, target, shard in copies:
            src = shard
            for dim, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                src = src.narrow(dim, o, n)
            if target.size() != src.size():
                raise ManifestError(f"read of {req.storage_index.fqn!r}: destination is {list(target.size())}, "
                                    f"saved box is {list(src.size())}")
            with torch.no_grad():
                target.copy_(src)
            planner.commit_tensor(req, target)

    def _run(self, tasks: list[tuple[Any, np.ndarray]]) -> None:
        if not tasks:
            return
        self.bytes_read += sum(p.size for p, _ in tasks)
        tasks = group_packed(tasks)  # small tensors of one pack: one read of the pack
        if len(tasks) == 1:
            read_piece(self.chunks, *tasks[0], self.ready)
            return
        with ThreadPoolExecutor(max_workers=min(self.workers, len(tasks)), thread_name_prefix="trainstore-dcp-read") as pool:
            for f in [pool.submit(read_piece, self.chunks, p, d, self.ready) for p, d in tasks]:
                f.result()


def _pieces(entry: TensorEntry, lo: int, hi: int) -> list[tuple[Any, int]]:
    """(chunk entry, start byte) of every piece of ``entry`` overlapping bytes [lo, hi)."""
    out, pos = [], 0
    for p in entry.chunks:
        if pos < hi and pos + p.size > lo:
            out.append((p, pos))
        pos += p.size
        if pos >= hi:
            break
    return out


def _byte_range(shape: tuple[int, ...], offsets: Any, lengths: Any, itemsize: int) -> tuple[int, int]:
    """Bytes [lo, hi) of a row-major tensor of ``shape`` spanning the box offsets+lengths."""
    if not shape:
        return 0, itemsize
    if any(n == 0 for n in lengths):
        return 0, 0
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    strides.reverse()
    first = sum(o * s for o, s in zip(offsets, strides))
    last = sum((o + n - 1) * s for o, n, s in zip(offsets, lengths, strides))
    return first * itemsize, (last + 1) * itemsize


__all__ = ["StorageReader"]
