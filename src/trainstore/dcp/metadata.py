"""DCP ``Metadata`` as JSON (no pickle) and the ``"dcp"`` section of a trainstore manifest.

torch's own ``FileSystemWriter`` pickles ``Metadata`` into ``.metadata``; we store it as plain
JSON inside the checkpoint manifest, so reading a checkpoint never unpickles stored bytes:

    manifest.metadata["dcp"] = {
      "format": "trainstore.dcp/1", "world_size": N,
      "state_dict_metadata": {fqn: {"type": "tensor", "dtype": "torch.float32", "layout": "torch.strided",
                                    "requires_grad": false, "memory_format": "torch.contiguous_format",
                                    "pin_memory": false, "size": [..], "chunks": [[offsets, sizes], ..]}
                              | {"type": "bytes"}},
      "planner_data": <trainstore state skeleton (DefaultSavePlanner: fqn -> key path tuple)>,
      "storage_meta": {"checkpoint_id": .., "save_id": .., "load_id": .., "modules": [..]} | null,
      "version": "1.0.0" | null,
      "items": [ITEM, ..]   # every rank's WriteResults
    }

    ITEM = {"fqn": str, "offset": [..] | null, "index": int | null, "rank": r, "size": bytes,
            "tensor": <manifest tensor name>}                       # a tensor (shard)
         | {..., "object": <state skeleton of the value>}            # a non-tensor value

Non-tensor values (DCP's BYTE_IO items, which DCP would ``torch.save``) are stored as the
same JSON skeleton single-process checkpoints use; tensors inside them become chunked
tensors of the manifest. Every field is validated on load (``ManifestError`` naming it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ..checkpoint.format.state import flatten, parse_torch_dtype, unflatten
from ..errors import ManifestError, UnsupportedTypeError

DCP_FORMAT = "trainstore.dcp/1"


def _int_list(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise ManifestError(f"dcp metadata: {what} must be a list of non-negative ints, got {v!r:.80}")
    return v


def _torch_attr(name: Any, kind: type, what: str) -> Any:
    obj = getattr(torch, name[len("torch."):], None) if isinstance(name, str) and name.startswith("torch.") else None
    if not isinstance(obj, kind):
        raise ManifestError(f"dcp metadata: unknown {what} {name!r:.60}")
    return obj


# -- JSON-safe generic values (planner_data) --------------------------------------------------
def encode_value(value: Any, what: str) -> Any:
    """A JSON skeleton of ``value`` (dicts, lists, tuples, scalars, str); no tensors allowed."""
    skeleton, leaves = flatten(value)
    if leaves:
        raise UnsupportedTypeError(f"{what}: holds tensors/arrays ({leaves[0].path}), which cannot be stored as JSON")
    return skeleton


def decode_value(skeleton: Any, what: str) -> Any:
    def no_tensor(tag: str, name: str) -> Any:
        raise ManifestError(f"dcp metadata: {what} references a tensor {name!r:.60}")

    try:
        return unflatten(skeleton, no_tensor)
    except ManifestError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, RecursionError) as exc:
        raise ManifestError(f"dcp metadata: malformed {what}: {exc}") from None


# -- Metadata ---------------------------------------------------------------------------------
def _tensor_md_to_json(md: TensorStorageMetadata) -> dict:
    p = md.properties
    return {"type": "tensor", "dtype": str(p.dtype), "layout": str(p.layout), "requires_grad": bool(p.requires_grad),
            "memory_format": str(p.memory_format), "pin_memory": bool(p.pin_memory), "size": list(md.size),
            "chunks": [[list(c.offsets), list(c.sizes)] for c in md.chunks]}


def _tensor_md_from_json(fqn: str, obj: dict) -> TensorStorageMetadata:
    try:
        dtype = parse_torch_dtype(obj.get("dtype"))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - any bad dtype string
        raise ManifestError(f"dcp metadata: {fqn!r}: bad dtype {obj.get('dtype')!r:.40}") from None
    props = TensorProperties(
        dtype=dtype,
        layout=_torch_attr(obj.get("layout", "torch.strided"), torch.layout, "layout"),
        requires_grad=bool(obj.get("requires_grad", False)),
        memory_format=_torch_attr(obj.get("memory_format", "torch.contiguous_format"), torch.memory_format,
                                  "memory format"),
        pin_memory=bool(obj.get("pin_memory", False)),
    )
    size = _int_list(obj.get("size"), f"{fqn!r} size")
    chunks_obj = obj.get("chunks")
    if not isinstance(chunks_obj, list):
        raise ManifestError(f"dcp metadata: {fqn!r}: chunks must be a list")
    chunks = []
    for c in chunks_obj:
        if not isinstance(c, list) or len(c) != 2:
            raise ManifestError(f"dcp metadata: {fqn!r}: a chunk must be [offsets, sizes]")
        off, sz = _int_list(c[0], f"{fqn!r} chunk offsets"), _int_list(c[1], f"{fqn!r} chunk sizes")
        if len(off) != len(size) or len(sz) != len(size) or any(o + s > d for o, s, d in zip(off, sz, size)):
            raise ManifestError(f"dcp metadata: {fqn!r}: chunk {off}+{sz} does not fit size {size}")
        chunks.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(sz)))
    return TensorStorageMetadata(properties=props, size=torch.Size(size), chunks=chunks)


def metadata_to_json(md: Metadata) -> dict:
    """Everything of ``md`` but ``storage_data`` (rebuilt from the items on load)."""
    sdm = {}
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            sdm[fqn] = _tensor_md_to_json(entry)
        elif isinstance(entry, BytesStorageMetadata):
            sdm[fqn] = {"type": "bytes"}
        else:
            raise UnsupportedTypeError(f"dcp metadata: {fqn!r} has storage type {type(entry).__name__}")
    sm = md.storage_meta
    return {
        "format": DCP_FORMAT,
        "state_dict_metadata": sdm,
        "planner_data": encode_value(md.planner_data, "DCP planner_data"),
        "storage_meta": None if sm is None else {
            "checkpoint_id": None if sm.checkpoint_id is None else str(sm.checkpoint_id),
            "save_id": sm.save_id, "load_id": sm.load_id, "modules": [str(m) for m in (sm.modules or [])]},
        "version": md.version,
    }


def metadata_from_json(obj: Any, where: str = "") -> Metadata:
    if not isinstance(obj, dict) or obj.get("format") != DCP_FORMAT:
        raise ManifestError(f"checkpoint {where} is not a distributed (DCP) checkpoint "
                            f"(no metadata.dcp of format {DCP_FORMAT})")
    sdm_obj = obj.get("state_dict_metadata")
    if not isinstance(sdm_obj, dict):
        raise ManifestError(f"dcp metadata {where}: state_dict_metadata must be an object")
    sdm: dict[str, Any] = {}
    for fqn, e in sdm_obj.items():
        if not isinstance(e, dict) or e.get("type") not in ("tensor", "bytes"):
            raise ManifestError(f"dcp metadata {where}: entry {fqn!r:.80} must have type tensor|bytes")
        sdm[fqn] = BytesStorageMetadata() if e["type"] == "bytes" else _tensor_md_from_json(fqn, e)
    sm_obj = obj.get("storage_meta")
    sm = None
    if isinstance(sm_obj, dict):
        sm = StorageMeta(checkpoint_id=sm_obj.get("checkpoint_id"), save_id=sm_obj.get("save_id"),
                         load_id=sm_obj.get("load_id"), modules=list(sm_obj.get("modules") or []))
    version = obj.get("version")
    return Metadata(state_dict_metadata=sdm, planner_data=decode_value(obj.get("planner_data"), "planner_data"),
                    storage_meta=sm, version=version if isinstance(version, str) else None)


# -- items ------------------------------------------------------------------------------------
def index_to_json(index: MetadataIndex) -> dict:
    return {"fqn": index.fqn, "offset": None if index.offset is None else list(index.offset), "index": index.index}


def index_from_json(obj: dict, where: str) -> MetadataIndex:
    fqn, off, idx = obj.get("fqn"), obj.get("offset"), obj.get("index")
    if not isinstance(fqn, str):
        raise ManifestError(f"dcp item {where}: fqn must be a string")
    if off is not None:
        off = _int_list(off, f"item {fqn!r} offset")
    if idx is not None and (not isinstance(idx, int) or isinstance(idx, bool)):
        raise ManifestError(f"dcp item {where}: index must be an int or null")
    return MetadataIndex(fqn=fqn, offset=off, index=idx)


def shard_name(index: MetadataIndex) -> str:
    """Manifest tensor name of a saved tensor (shard): ``fqn@o0,o1,..`` (offsets in the global tensor)."""
    off = "" if index.offset is None else ",".join(str(int(o)) for o in index.offset)
    return f"{index.fqn}@{off}"


__all__ = ["DCP_FORMAT", "metadata_to_json", "metadata_from_json", "index_to_json", "index_from_json",
           "shard_name", "encode_value", "decode_value"]
