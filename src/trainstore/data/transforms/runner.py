"""Feature engineering: ``transform(store, "name@v", fn)`` -> a new arrow-ipc dataset version.

``fn`` maps a ``pa.RecordBatch`` to a ``pa.RecordBatch`` (or ``pa.Table``). Each input shard
is one task: a worker streams it batch by batch (``batch_rows``) and writes one output shard
sequentially, an uncompressed Arrow IPC file (the training-serving layout: random access by
row, memory-mappable). ``engine="local"`` runs in this process (``workers=1``) or a pool of
spawned processes; ``engine="ray"`` runs Ray tasks. Both run the same ``run_shard`` and give
byte-identical shards.

Resumable: output shard keys and per-shard markers are derived from the config hash (input
version, the fingerprint of ``fn``, kwargs, ``batch_rows``, the trainstore/pyarrow/numpy
versions and the caller's ``version``) and the input shard, so a re-run skips shards whose
marker and bytes verify, and never reuses shards made by other code (``fn_identity``). The
version manifest is committed only after every shard succeeded: a failure
(``TransformError`` naming the shard and row range) publishes nothing.

``fn`` is any function: a top-level one or ``"module:function"`` travels to workers by
import; one defined in ``__main__``/a notebook, a lambda or a closure is sent to the caller's
own worker processes with cloudpickle (in-process runs use it directly).

Feature-shard contract (what ``data.serve`` reads): layout ``"arrow-ipc"``; each shard is an
uncompressed Arrow IPC file, ``ShardInfo.checksum`` = BLAKE3 of the file bytes; tensor columns
are ``fixed_size_list`` (nested for more dimensions) or ``FixedShapeTensor`` of a primitive
type; ``version.extra["columns"][name] = {"arrow": str, "dtype": numpy dtype name or None,
"shape": per-row shape list ([] for scalars) or None}``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ...errors import ConfigError, SchemaError, TransformError
from ...store import Store, open_store
from ..layouts import ARROW_IPC
from ..leases import run_lease, wait_for_data_sweeps
from ..lineage import config_hash
from ..shardio import verify_local_file
from ..versions import (
    DatasetVersion,
    ShardInfo,
    check_name,
    derive,
    load_version,
    parse_ref,
    read_shard,
    schema_from_b64,
    tensor_layout,
)
from .engines import run_tasks
from .fn_identity import fn_fingerprint, fn_name, importable_ref, library_versions, ship_fn
from .shard_task import ShardTask, portable, read_marker, resolve_fn, run_prefixes, task_keys


@dataclass(frozen=True)
class TransformConfig:
    """How a transform runs. Only ``batch_rows`` changes the output (and the config hash).
    ``store_shared``: a local-directory store is on a file system every Ray node mounts at
    the same path (else a multi-node Ray refuses it)."""

    engine: str = "local"
    workers: int = 1
    batch_rows: int = 8192
    cache_dir: str | None = None
    store_shared: bool = False


def _describe_fn(fn: Callable[..., Any] | str,
                 ship: bool) -> tuple[Callable[..., Any], str, str | None, bytes | None]:
    """(function, name, import reference or None, cloudpickle bytes or None)."""
    if isinstance(fn, str):
        return resolve_fn(fn), fn, fn, None
    if not callable(fn):
        raise ConfigError(f"transform function must be callable or 'module:function', got {fn!r}")
    ref = importable_ref(fn)
    blob = ship_fn(fn) if ship and ref is None else None
    return fn, fn_name(fn), ref, blob


def column_info(schema: pa.Schema) -> dict[str, dict]:
    """Per column: numpy ``dtype`` and tensor ``shape`` (``[]`` for scalars) where the column
    maps zero-copy to numpy (primitive, or nested fixed_size_list of primitive); else
    ``dtype``/``shape`` None. ``arrow`` is the Arrow type as text."""
    out = {}
    for f in schema:
        t, shape, primitive = tensor_layout(f.type)
        dtype = t.to_pandas_dtype().__name__ if primitive and not pa.types.is_boolean(t) else None
        if pa.types.is_boolean(t):
            dtype = None  # Arrow booleans are bit-packed: not zero-copy
        out[f.name] = {"arrow": str(f.type), "dtype": dtype, "shape": shape if dtype else None}
    return out


def _done(store: Store, task: ShardTask) -> tuple[ShardInfo, pa.Schema] | None:
    found = read_marker(store, task.marker_key)
    if found is None or found[0].key != task.out_key:
        return None
    info, schema = found
    try:
        path = store.local_path(info.key)
        if path is not None:
            verify_local_file(path, info)
        else:
            read_shard(store, info)
    except Exception:  # noqa: BLE001 - anything wrong means "redo this shard"
        return None
    return info, schema


def transform(
    store: Store | str,
    ref: str,
    fn: Callable[..., Any] | str,
    *,
    engine: str = "local",
    workers: int = 1,
    output: str | None = None,
    fn_kwargs: dict | None = None,
    config: TransformConfig | None = None,
    version: str | int | None = None,
    progress: Callable[[int, int], None] | None = None,
    **store_options: object,
) -> DatasetVersion:
    """Run ``fn`` over every shard of ``ref`` and commit the result as a new version of
    ``output`` (default ``<name>.features``). ``progress(done, total)`` after each shard.
    ``version``: bump it to recompute when something ``fn`` depends on changed in a way its
    fingerprint cannot see (data files it reads, a remote service)."""
    config = config or TransformConfig(engine=engine, workers=workers)
    store = open_store(store, **store_options)
    name, ver = parse_ref(ref)
    source = load_version(store, name, ver)
    out_name = check_name(output or f"{name}.features")
    in_process = config.engine == "local" and config.workers == 1
    fn_obj, name_of_fn, fn_ref, fn_blob = _describe_fn(fn, ship=not in_process)
    kwargs = dict(fn_kwargs or {})
    cfg = {"input": source.id, "fn": name_of_fn, "fn_fingerprint": fn_fingerprint(fn_obj),
           "fn_kwargs": kwargs, "batch_rows": config.batch_rows, "version": version,
           "libraries": library_versions()}
    try:
        digest = config_hash(cfg)
    except TypeError as exc:
        raise ConfigError(f"fn_kwargs must be JSON-serialisable: {exc}") from None
    tag = digest[:16]
    tasks = [
        ShardTask(
            store=portable(store), index=i, source=s, out_key=task_keys(out_name, tag, i)[0],
            marker_key=task_keys(out_name, tag, i)[1], layout=source.layout,
            fn_name=name_of_fn, fn_ref=fn_ref, fn_blob=fn_blob, fn_kwargs=kwargs,
            batch_rows=config.batch_rows, cache_dir=config.cache_dir,
        )
        for i, s in enumerate(source.shards) if s.rows > 0
    ]
    # a data gc sweep keeps what this run writes (or resumes) until the version is committed
    with run_lease(store, "transform", out_name, run_prefixes(out_name, tag)):
        results = _resumable(store, tasks)
        skipped = len(results)
        if progress:
            progress(len(results), len(tasks))
        todo = [t for t in tasks if t.index not in results]
        with closing(run_tasks(todo, config.engine, config.workers, fn=fn_obj,
                               store_shared=config.store_shared)) as finished:
            for res in finished:
                if not res["ok"]:
                    raise TransformError(f"transform of {source.id} failed, nothing published: {res['error']}")
                info = res["info"]
                results[res["index"]] = (ShardInfo(info["key"], info["rows"], info["bytes"], info["checksum"]),
                                         schema_from_b64(res["schema"]))
                if progress:
                    progress(len(results), len(tasks))
        return _commit(store, source, out_name, tasks, results, cfg, digest, config, skipped)


def _resumable(store: Store, tasks: list[ShardTask]) -> dict[int, tuple[ShardInfo, pa.Schema]]:
    """Shards an earlier run already finished. They predate this run's lease, so a data gc
    sweep that listed before it may still delete them: when there are any, wait for running
    sweeps to end and check again that they exist (what is gone by then is redone)."""
    found = {t.index: done for t in tasks if (done := _done(store, t)) is not None}
    if found:
        wait_for_data_sweeps(store)
        found = {i: done for i, done in found.items() if store.exists(done[0].key)}
    return found


def _commit(store: Store, source: DatasetVersion, out_name: str, tasks: list[ShardTask],
            results: dict[int, tuple[ShardInfo, pa.Schema]], cfg: dict, digest: str,
            config: TransformConfig, skipped: int) -> DatasetVersion:
    ordered = [results[t.index] for t in tasks]
    schema = ordered[0][1] if ordered else pa.schema([])
    for task, (_, s) in zip(tasks, ordered):
        if not s.equals(schema):
            raise SchemaError(
                f"transform output of shard {task.source.key} has schema {s}, but shard "
                f"{tasks[0].source.key} has {schema}; fn must return one schema"
            )
    return derive(store, (source,), "transform", cfg, [info for info, _ in ordered], name=out_name,
                  layout=ARROW_IPC.name, schema=schema, digest=digest,
                  extra={"columns": column_info(schema), "engine": config.engine, "workers": config.workers,
                         "resumed_shards": skipped})
