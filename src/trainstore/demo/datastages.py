"""Data stages of the demo: ingest the dirty raw records, clean them, make features.

Each stage uses the public data API (``Ingestor``, ``clean``, ``transform``) and records in
the run record what it did (versions, row counts, bytes), which the summary, the report and
the tests read.
"""

from __future__ import annotations

import pyarrow as pa

from ..data.ingest import IngestConfig, Ingestor
from ..data.transforms import DROP, CleanConfig, TransformConfig, clean, transform
from .context import RunContext
from .synthetic import RAW_SCHEMA, batches, generate

RAW = "tickets.raw"
CLEAN = "tickets.clean"
TRAIN = "tickets.train"
VAL = "tickets.val"
FEATURE_FN = "trainstore.demo.features:split_tokens"

CLEAN_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("text", pa.string()),
    pa.field("label", pa.int64()),
])


def ingest(ctx: RunContext) -> str:
    """Synthetic raw records -> ``tickets.raw`` (durable: WAL, Parquet shards, one commit)."""
    dc = ctx.config.data
    table, dirt = generate(dc)
    shard_bytes = max(64 << 10, table.nbytes // dc.ingest_shards + 1)
    parts = list(batches(table, dc.write_batches))
    with ctx.stage("ingest raw records", total=len(parts), unit="writes") as task:
        config = IngestConfig(wal_dir=ctx.paths.wal, shard_bytes=shard_bytes, upload_workers=2)
        with Ingestor(ctx.store, RAW, RAW_SCHEMA, config=config) as ing:
            for part in parts:
                ing.write(part)
                ctx.advance(task, note=f"{part.num_rows:,} records")
            version = ing.commit(extra={"source": "trainstore.demo.synthetic"})
    ctx.record["data"] = {"dirt": {**dirt.__dict__, "delivered": dirt.delivered},
                          "raw": _version_info(version)}
    return version.id


def clean_stage(ctx: RunContext, raw_ref: str) -> str:
    """Cast labels to int (malformed -> quarantine), drop rows missing text/label, fill a
    missing source, drop duplicate ids."""
    with ctx.stage("clean (DuckDB)", total=1, unit="") as task:
        version = clean(ctx.store, raw_ref, dedup=["id"], schema=CLEAN_SCHEMA,
                        missing={"text": DROP, "label": DROP, "source": "unknown"}, output=CLEAN,
                        config=CleanConfig(shard_rows=max(1, -(-ctx.config.data.records // ctx.config.data.clean_shards)),
                                           cache_dir=ctx.paths.data_cache, threads=2, memory_limit="1GB"),
                        progress=lambda msg: ctx.note(task, msg))
    info = _version_info(version)
    info.update({k: version.extra.get(k) for k in ("input_rows", "output_rows", "quarantined_rows",
                                                    "dropped_missing", "duplicates", "quarantine")})
    ctx.record["data"]["clean"] = info
    return version.id


def features(ctx: RunContext, clean_ref: str) -> tuple[str, str]:
    """Train and validation features (byte tokens, Arrow IPC) on a process pool."""
    dc = ctx.config.data
    out: dict[str, str] = {}
    shards = len(ctx.record["data"]["clean"]["shards"])
    with ctx.stage("features (transform)", total=2 * shards, unit="shards") as task:
        for split, name in (("train", TRAIN), ("val", VAL)):
            done = [0]

            def progress(n: int, _total: int, done: list[int] = done) -> None:
                ctx.advance(task, n - done[0], note=f"{split} split")
                done[0] = n

            version = transform(ctx.store, clean_ref, FEATURE_FN, output=name,
                                fn_kwargs={"split": split, "val_every": dc.val_every, "length": dc.seq_len},
                                config=TransformConfig(workers=dc.transform_workers, cache_dir=ctx.paths.data_cache),
                                progress=progress)
            ctx.record["data"][split] = _version_info(version)
            out[split] = version.id
    return out["train"], out["val"]


def _version_info(version) -> dict:  # noqa: ANN001 - DatasetVersion
    return {"id": version.id, "rows": version.rows, "bytes": version.bytes, "layout": version.layout,
            "parents": list(version.parents), "operation": version.operation,
            "shards": [s.key for s in version.shards]}


__all__ = ["CLEAN", "CLEAN_SCHEMA", "FEATURE_FN", "RAW", "TRAIN", "VAL", "clean_stage", "features", "ingest"]
