"""One transform task: stream one input shard through ``fn`` into one Arrow IPC file shard.

Runs inside a worker (the caller's process, a pool process or a Ray task) and returns a
plain dict, so every engine reports results and failures the same way. The output is an
uncompressed Arrow IPC *file* (random access, memory-mappable), uploaded under a key that
is a function of the transform's config hash and the input shard, followed by a small
marker object; a re-run treats a shard whose marker and bytes verify as done.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from ...errors import ConfigError, NotFoundError, TrainstoreError
from ...fileio import create_temp
from ...store import LocalStore, Store, open_store
from ..layouts import PARQUET, get_layout
from ..shardio import default_cache_dir, file_checksum, local_shard
from ..versions import ShardInfo, schema_from_b64, schema_to_b64, shards_prefix
from .fn_identity import load_shipped


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs; picklable (a local store travels as its URL, an object
    store by value)."""

    store: Store | str
    index: int
    source: ShardInfo
    out_key: str
    marker_key: str
    fn_name: str
    fn_ref: str | None = None
    fn_blob: bytes | None = None
    fn_kwargs: dict = field(default_factory=dict)
    batch_rows: int = 8192
    cache_dir: str | None = None
    layout: str = PARQUET.name  # of the input shard


def task_keys(out_name: str, tag: str, index: int) -> tuple[str, str]:
    """(output shard key, work marker key) of input shard ``index`` of a transform run."""
    return f"{shards_prefix(out_name)}xf-{tag}-{index:05d}.arrow", f"datasets/{out_name}/work/{tag}/{index:05d}.json"


def run_prefixes(out_name: str, tag: str) -> list[str]:
    """Key prefixes of everything a transform run with config ``tag`` writes."""
    return [f"{shards_prefix(out_name)}xf-{tag}-", f"datasets/{out_name}/work/{tag}/"]


def marker_output_key(marker_key: str) -> str | None:
    """The output shard a work marker stands for (None: not a work marker key)."""
    parts = marker_key.split("/")
    if len(parts) != 5 or parts[0] != "datasets" or parts[2] != "work" or not parts[4].endswith(".json"):
        return None
    index = parts[4][:-5]
    if not index.isdigit():
        return None
    return task_keys(parts[1], parts[3], int(index))[0]


def portable(store: Store) -> Store | str:
    """What to send to a worker for ``store``: a local store's URL, else the store itself."""
    return store.url if isinstance(store, LocalStore) else store


def resolve_fn(ref: str) -> Callable[..., Any]:
    """``module:function`` -> the function (``ConfigError`` when it does not import)."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"transform function must be 'module:function', got {ref!r}")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"transform function {ref!r} does not import: {exc}") from None
    if not callable(obj):
        raise ConfigError(f"transform function {ref!r} is not callable")
    return obj


def _as_batches(out: Any) -> list[pa.RecordBatch]:
    if isinstance(out, pa.RecordBatch):
        return [out]
    if isinstance(out, pa.Table):
        return out.combine_chunks().to_batches() or [pa.RecordBatch.from_pylist([], schema=out.schema)]
    raise TypeError(f"returned a {type(out).__name__}, not a pyarrow RecordBatch")


def read_marker(store: Store, key: str) -> tuple[ShardInfo, pa.Schema] | None:
    try:
        obj = json.loads(bytes(store.get(key)))
        info = ShardInfo(obj["key"], int(obj["rows"]), int(obj["bytes"]), obj["checksum"])
        return info, schema_from_b64(obj["schema"])
    except NotFoundError:
        return None
    except (ValueError, KeyError, TypeError, TrainstoreError):
        return None  # a damaged marker means "not done"


def task_fn(task: ShardTask) -> Callable[..., Any]:
    """The function a task names: imported by reference, or loaded from the caller's bytes."""
    if task.fn_ref is not None:
        return resolve_fn(task.fn_ref)
    if task.fn_blob is None:
        raise ConfigError(f"transform task for {task.fn_name} carries no function")
    return load_shipped(task.fn_blob)


def run_shard(task: ShardTask, fn: Callable[..., Any] | None = None) -> dict:
    """Transform one shard with ``fn`` (default: the task's function);
    ``{"ok": True, "info", "schema"}`` or ``{"ok": False, "error"}``."""
    try:
        store = open_store(task.store)
        fn = fn or task_fn(task)
        tmp_dir = os.path.join(task.cache_dir or default_cache_dir(), "transform-tmp")
        os.makedirs(tmp_dir, exist_ok=True)
        fd, tmp = create_temp(tmp_dir, "shard.arrow")  # exclusive, unpredictable
        os.close(fd)
        try:
            rows, schema = _stream(store, task, fn, tmp)
            if isinstance(rows, str):
                return {"ok": False, "error": rows, "index": task.index}
            info = ShardInfo(task.out_key, rows, os.path.getsize(tmp), file_checksum(tmp))
            with open(tmp, "rb") as f:
                store.put(task.out_key, f.read())
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        marker = {**asdict(info), "schema": schema_to_b64(schema), "source": task.source.key}
        store.put(task.marker_key, json.dumps(marker).encode())
        return {"ok": True, "index": task.index, "info": asdict(info), "schema": marker["schema"]}
    except TrainstoreError as exc:
        return {"ok": False, "index": task.index, "error": f"shard {task.source.key}: {type(exc).__name__}: {exc}"}


def _stream(store: Store, task: ShardTask, fn: Callable[..., Any], tmp: str) -> tuple[int | str, pa.Schema | None]:
    """Input batches -> fn -> IPC file at ``tmp``. Returns (rows, schema) or (error text, None)."""
    writer = None
    schema = None
    rows_out = 0
    row = 0
    with local_shard(store, task.source, task.cache_dir) as path:
        layout = get_layout(task.layout)
        try:
            batches = layout.open(path).iter_batches(task.batch_rows)
        except (pa.ArrowException, OSError) as exc:
            return f"shard {task.source.key}: input is not readable {layout.title}: {exc}", None
        sink = pa.OSFile(tmp, "wb")
        try:
            for batch in batches:
                where = f"shard {task.source.key} rows {row}-{row + batch.num_rows - 1}"
                try:
                    outs = _as_batches(fn(batch, **task.fn_kwargs))
                except Exception as exc:  # noqa: BLE001 - user code: report, never swallow
                    return f"{task.fn_name} failed on {where}: {type(exc).__name__}: {exc}", None
                for out in outs:
                    if writer is None:
                        schema = out.schema
                        writer = pa.ipc.new_file(sink, schema, options=pa.ipc.IpcWriteOptions(compression=None))
                    elif not out.schema.equals(schema):
                        return (f"{task.fn_name} returned schema {out.schema} on {where}, but "
                                f"{schema} before"), None
                    writer.write_batch(out)
                    rows_out += out.num_rows
                row += batch.num_rows
            if writer is None:
                return f"shard {task.source.key} has no rows to transform", None
            writer.close()
            writer = None
        finally:
            if writer is not None:
                writer.close()
            sink.close()
    return rows_out, schema
