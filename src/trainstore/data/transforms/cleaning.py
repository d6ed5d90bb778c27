"""Cleaning: ``clean(store, "name@v", dedup=..., missing=..., schema=...)`` -> a new version.

Runs in DuckDB over the version's Parquet shards: a local store's files in place; a remote
store's shards streamed one at a time through a bounded hot tier (``CleanConfig.cache_bytes``)
into a temporary DuckDB database, so a dataset larger than the cache works. DuckDB streams, and spills sorts and aggregations to ``temp_dir`` past ``memory_limit``, so
datasets larger than memory work. Per row, in this order:

1. **schema** (``pa.Schema``): columns are projected to the schema and cast (``TRY_CAST``);
   a row with a value that does not cast, or a null in a non-nullable column, goes to the
   quarantine dataset ``<output>.quarantine`` with its original columns, a ``_reason``
   and where it came from (``_source_shard``, ``_source_row``).
2. **missing**: ``"drop"`` drops rows with a null in any column; a dict maps a column to
   a fill value, or to ``DROP`` to drop rows where that column is null.
3. **dedup**: ``"row"`` keeps the first of rows equal in every column; a column name or
   list of names keeps the first row per key. "First" is in (shard, row) order, across all
   shards, and the output keeps that order, so a run is deterministic.

The cleaned version (Parquet, zstd) records its parent, the operation, a config hash, the
code version, and in ``extra`` the counts and the quarantine version.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ...chunks import content_hash
from ...errors import ConfigError, SchemaError
from ...fileio import create_temp, create_temp_dir
from ...store import Store, open_store
from ..layouts import PARQUET
from ..leases import run_lease
from ..lineage import config_hash
from ..shardio import DEFAULT_CACHE_BYTES, default_cache_dir, local_shard, verify_local_file
from ..versions import (
    DatasetVersion,
    ShardInfo,
    check_name,
    derive,
    load_version,
    parse_ref,
    schema_to_b64,
    shards_prefix,
)
from .clean_sql import DROP, drop_expr, ident, plan_columns, reason_expr

__all__ = ["CleanConfig", "DROP", "clean"]


@dataclass(frozen=True)
class CleanConfig:
    """Resources of a cleaning run (none of these change the output)."""

    memory_limit: str = "2GB"
    temp_dir: str | None = None
    threads: int | None = None
    shard_rows: int = 1_000_000
    cache_dir: str | None = None
    compression: str = "zstd"
    #: hot-tier bytes for a remote source (shards are streamed through it one at a time)
    cache_bytes: int = DEFAULT_CACHE_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.cache_bytes, int) or isinstance(self.cache_bytes, bool) or self.cache_bytes <= 0:
            raise ConfigError(f"cache_bytes must be a positive int, got {self.cache_bytes!r}")


def _dedup_keys(dedup: Any, columns: list[str]) -> list[str] | None:
    if dedup is None or dedup is False:
        return None
    if dedup in ("row", True):
        return columns
    keys = [dedup] if isinstance(dedup, str) else list(dedup)
    for k in keys:
        if k not in columns:
            raise ConfigError(f"dedup key {k!r} is not a column ({', '.join(columns)})")
    if not keys:
        raise ConfigError("dedup needs 'row' or at least one key column")
    return keys


def _connect(config: CleanConfig, cache_dir: str, database: str = ":memory:") -> Any:
    import duckdb

    temp = config.temp_dir or os.path.join(cache_dir, "duckdb-tmp")
    os.makedirs(temp, exist_ok=True)
    con = duckdb.connect(database)
    con.execute(f"SET memory_limit = '{config.memory_limit}'")
    con.execute(f"SET temp_directory = '{temp}'")
    if config.threads:
        con.execute(f"SET threads = {int(config.threads)}")
    return con


class _ShardWriter:
    """Roll a stream of batches into Parquet shards of ``shard_rows`` and upload each."""

    def __init__(self, store: Store, prefix: str, schema: pa.Schema, config: CleanConfig, tmp_dir: str):
        self.store, self.schema, self.config = store, schema, config
        self.prefix = prefix
        self.tmp_dir, self.tmp = tmp_dir, ""
        self.shards: list[ShardInfo] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        table = pa.Table.from_batches([batch]).cast(self.schema)
        start = 0
        while start < table.num_rows:
            if self._writer is None:
                fd, self.tmp = create_temp(self.tmp_dir, "shard.parquet")  # exclusive, unpredictable
                os.close(fd)
                self._writer = pq.ParquetWriter(self.tmp, self.schema, compression=self.config.compression,
                                                write_page_checksum=True)  # range readers verify pages
            piece = table.slice(start, self.config.shard_rows - self._rows)
            self._writer.write_table(piece)
            self._rows += piece.num_rows
            start += piece.num_rows
            if self._rows >= self.config.shard_rows:
                self._finish()

    def _finish(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        with open(self.tmp, "rb") as f:
            data = f.read()
        os.unlink(self.tmp)
        key = f"{self.prefix}{len(self.shards):05d}.parquet"
        self.store.put(key, data)
        self.shards.append(ShardInfo(key, self._rows, len(data), content_hash(data)))
        self._rows = 0

    def close(self) -> list[ShardInfo]:
        self._finish()
        return self.shards


def _stream(con: Any, sql: str) -> Iterator[pa.RecordBatch]:
    yield from con.sql(sql).to_arrow_reader(65536)


def clean(
    store: Store | str,
    ref: str,
    *,
    dedup: str | list[str] | None = None,
    missing: str | dict[str, Any] | None = None,
    schema: pa.Schema | None = None,
    output: str | None = None,
    config: CleanConfig | None = None,
    progress: Callable[[str], None] | None = None,
    **store_options: object,
) -> DatasetVersion:
    """Clean ``ref`` into a new version of ``output`` (default ``<name>.clean``)."""
    config = config or CleanConfig()
    store = open_store(store, **store_options)
    name, ver = parse_ref(ref)
    source = load_version(store, name, ver)
    if source.layout != PARQUET.name:  # DuckDB reads the shard files themselves
        raise ConfigError(f"clean reads {PARQUET.title} datasets; {source.id} is {source.layout}")
    out_name = check_name(output or f"{name}.clean")
    plans = plan_columns(source.schema, schema, missing)
    out_schema = schema if schema is not None else source.schema
    keys = _dedup_keys(dedup, [p.name for p in plans])
    cfg = {"input": source.id, "dedup": keys, "missing": missing,
           "schema": schema_to_b64(schema) if schema is not None else None}
    digest = config_hash(cfg)
    cache_dir = config.cache_dir or default_cache_dir()
    tmp_dir = os.path.join(cache_dir, "clean-tmp")
    os.makedirs(tmp_dir, exist_ok=True)
    say = progress or (lambda _msg: None)
    run = f"clean-{digest[:12]}-{secrets.token_hex(4)}-"
    prefixes = [f"{shards_prefix(out_name)}{run}", f"{shards_prefix(out_name + '.quarantine')}{run}"]
    # a data gc sweep keeps this run's shards until its versions are committed
    with run_lease(store, "clean", out_name, prefixes), contextlib.ExitStack() as stack:
        con = stack.enter_context(_source_relation(store, source, config, cache_dir, tmp_dir, say))
        counts = _run(con, store, source, plans, keys, out_schema, prefixes, config, tmp_dir, say)
        quarantine_ref = None
        if counts["quarantine_shards"]:
            qversion = derive(store, (source,), "clean-quarantine", cfg, counts["quarantine_shards"],
                              name=f"{out_name}.quarantine", layout=PARQUET.name,
                              schema=counts["quarantine_schema"], digest=digest, extra={"rows_of": out_name})
            quarantine_ref = qversion.id
        for k in ("quarantine_shards", "quarantine_schema"):
            counts.pop(k)
        shards = counts.pop("shards")
        return derive(store, (source,), "clean", cfg, shards, name=out_name, layout=PARQUET.name,
                      schema=out_schema, digest=digest, extra={**counts, "quarantine": quarantine_ref})


@contextlib.contextmanager
def _source_relation(store: Store, source: DatasetVersion, config: CleanConfig, cache_dir: str, tmp_dir: str,
                     say: Callable[[str], None]) -> Iterator[Any]:
    """A DuckDB connection with view ``src``: every source row with ``__shard``, ``__row``
    (row number in its shard) and ``__key`` (the shard's key).

    A local store's shards are read in place. Any other store's shards are streamed one at a
    time through the hot tier (at most ``cache_bytes``, one shard pinned at once) into a
    DuckDB table in a temporary database file, so a dataset larger than the cache (or than
    memory) can be cleaned; the rows and so the output are the same either way."""
    local = [store.local_path(info.key) for info in source.shards]
    if all(p is not None for p in local):
        for path, info in zip(local, source.shards):
            verify_local_file(path, info)  # type: ignore[arg-type]
        with contextlib.closing(_connect(config, cache_dir)) as con:
            _view_over_files(con, source, local)  # type: ignore[arg-type]
            yield con
        return
    db_dir = create_temp_dir(tmp_dir, "duckdb")  # exclusive: DuckDB never opens a planted database
    db = os.path.join(db_dir, "src.duckdb")
    try:
        with contextlib.closing(_connect(config, cache_dir, db)) as con:
            for i, info in enumerate(source.shards):
                with local_shard(store, info, cache_dir, config.cache_bytes) as path:
                    _append_shard(con, i, info.key, path, create=i == 0)
                say(f"staged shard {i + 1}/{len(source.shards)}")
            if not source.shards:
                raise ConfigError(f"{source.id} has no shards to clean")
            con.execute("CREATE TEMP VIEW src AS SELECT * FROM src_rows")
            yield con
    finally:
        shutil.rmtree(db_dir, ignore_errors=True)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _view_over_files(con: Any, source: DatasetVersion, paths: list[str]) -> None:
    files = pa.table({"__path": paths, "__shard": list(range(len(paths))),
                      "__key": [s.key for s in source.shards]})
    con.register("__files", files)
    names = ", ".join(ident(n) for n in source.schema.names)
    file_list = "[" + ", ".join(_quote(p) for p in paths) + "]"
    con.execute(
        f"CREATE TEMP VIEW src AS SELECT {names}, f.__shard AS __shard, t.file_row_number AS __row, "
        f"f.__key AS __key FROM read_parquet({file_list}, filename='__file', file_row_number=true) t "
        f"JOIN __files f ON t.__file = f.__path"
    )


def _append_shard(con: Any, index: int, key: str, path: str, create: bool) -> None:
    select = (f"SELECT * EXCLUDE (file_row_number), {index}::BIGINT AS __shard, file_row_number AS __row, "
              f"{_quote(key)} AS __key FROM read_parquet({_quote(path)}, file_row_number=true)")
    con.execute(f"CREATE TABLE src_rows AS {select}" if create else f"INSERT INTO src_rows {select}")


def _run(con: Any, store: Store, source: DatasetVersion, plans: list, keys: list[str] | None,
         out_schema: pa.Schema, prefixes: list[str], config: CleanConfig, tmp_dir: str,
         say: Callable[[str], None]) -> dict:
    names = ", ".join(ident(n) for n in source.schema.names)
    reason = reason_expr(plans)
    drop = drop_expr(plans)
    values = ", ".join(f"{p.value} AS {ident(p.name)}" for p in plans)
    con.execute(f"CREATE TEMP VIEW staged AS SELECT __shard, __row, {reason} AS __reason, ({drop}) AS __drop, "
                f"{values} FROM src")
    out_cols = ", ".join(ident(p.name) for p in plans)
    good = "SELECT * FROM staged WHERE __reason IS NULL AND NOT __drop"
    if keys is not None:
        key_cols = ", ".join(ident(k) for k in keys)
        good = (f"SELECT * FROM (SELECT DISTINCT ON ({key_cols}) * FROM ({good}) "
                f"ORDER BY {key_cols}, __shard, __row)")
    say("cleaning")
    writer = _ShardWriter(store, prefixes[0], out_schema, config, tmp_dir)
    for batch in _stream(con, f"SELECT {out_cols} FROM ({good}) ORDER BY __shard, __row"):
        try:
            writer.write(batch)
        except (pa.ArrowException, ValueError) as exc:
            raise SchemaError(f"cleaned rows do not fit the schema: {exc}") from None
    shards = writer.close()
    quarantined, dropped = con.execute(
        "SELECT count(*) FILTER (WHERE __reason IS NOT NULL), "
        "count(*) FILTER (WHERE __reason IS NULL AND __drop) FROM staged").fetchall()[0]
    kept = sum(s.rows for s in shards)
    counts = {"input_rows": source.rows, "output_rows": kept, "quarantined_rows": quarantined,
              "dropped_missing": dropped, "duplicates": source.rows - quarantined - dropped - kept,
              "shards": shards, "quarantine_shards": [], "quarantine_schema": None}
    if quarantined:
        say("writing quarantine")
        qschema = pa.schema([*source.schema, pa.field("_reason", pa.string()),
                             pa.field("_source_shard", pa.string()), pa.field("_source_row", pa.int64())])
        qwriter = _ShardWriter(store, prefixes[1], qschema, config, tmp_dir)
        for batch in _stream(con, f"SELECT {names}, {reason} AS _reason, __key AS _source_shard, "
                                  f"__row AS _source_row FROM src WHERE {reason} IS NOT NULL "
                                  f"ORDER BY __shard, __row"):
            qwriter.write(batch)
        counts["quarantine_shards"] = qwriter.close()
        counts["quarantine_schema"] = qschema
    return counts
