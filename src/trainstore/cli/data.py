"""``trainstore data ingest|clean|transform|ls|show|lineage|verify|gc``: datasets from the shell."""

from __future__ import annotations

import json

import pyarrow as pa
import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import ConfigError, IntegrityError, NotFoundError
from .common import (
    CliGroup,
    JsonOpt,
    StoreFlags,
    console,
    emit_json,
    handle_errors,
    print_table,
    store_contents,
    with_store_flags,
)

data_app = typer.Typer(help="Datasets: ingest, clean, transform, inspect and verify versions.",
                       no_args_is_help=True, cls=CliGroup)



def _progress(quiet: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, disable=quiet, transient=True)


def _version_json(v) -> dict:
    out = v.to_json()
    out["schema"] = [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in v.schema]
    return out


def _parse_type(text: str) -> pa.DataType:
    try:
        return pa.type_for_alias(text)
    except ValueError:
        raise ConfigError(f"unknown Arrow type {text!r} (use e.g. int64, float32, string, binary)") from None


@data_app.command("ingest")
@handle_errors
@with_store_flags
def ingest(
    url: str, dataset: str, paths: list[str],
    format: str | None = typer.Option(None, "--format", help="jsonl | csv | parquet | binary (default: by extension)"),
    durability: str = typer.Option("wal", "--durability", help="wal | shard"),
    wal_dir: str | None = typer.Option(None, "--wal-dir", help="write-ahead log directory"),
    allow_duplicate_files: bool = typer.Option(
        False, "--allow-duplicate-files", help="ingest files whose content the dataset already holds"),
    json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags(),
) -> None:
    """Ingest files (paths or globs) into DATASET and commit a new version.

    All or nothing: if one file fails, nothing of the command is committed. A file whose
    content (BLAKE3) the dataset already holds is skipped, so a retry never duplicates."""
    from ..data.ingest import IngestConfig, Ingestor, expand_paths

    files = expand_paths(paths)
    store = flags.open(url, create=True)
    with Ingestor(store, dataset, config=IngestConfig(durability=durability, wal_dir=wal_dir)) as ing, \
            _progress(json_out) as bar:
        task = bar.add_task(f"ingest {dataset}", total=len(files))
        ing.ingest_files(files, format=format, progress=lambda _p, _r: bar.advance(task),
                         allow_duplicate_files=allow_duplicate_files)
        bar.update(task, completed=len(files))
        version = ing.commit()
        skipped = ing.skipped_files
    if json_out:
        emit_json({**_version_json(version), "skipped_files": [{"path": p, "in": w} for p, w in skipped]})
    else:
        for path, where in skipped:
            console.print(f"skipped {escape(path)}: its content is already in {escape(where)} "
                          "(--allow-duplicate-files ingests it again)")
        console.print(f"committed [bold]{version.id}[/bold]: {version.rows:,} rows, {len(version.shards)} shards")


@data_app.command("clean")
@handle_errors
@with_store_flags
def clean_cmd(
    url: str, ref: str,
    dedup: str | None = typer.Option(None, "--dedup", help="'row' or comma-separated key columns"),
    drop_missing: bool = typer.Option(False, "--drop-missing", help="drop rows with any null"),
    fill: list[str] = typer.Option([], "--fill", help="COL=JSON_VALUE fill nulls (repeatable)"),
    drop_null: list[str] = typer.Option([], "--drop-null", help="drop rows where COL is null (repeatable)"),
    cast: list[str] = typer.Option([], "--cast", help="COL=TYPE schema enforcement (repeatable)"),
    output: str | None = typer.Option(None, "--output", "-o", help="output dataset name"),
    memory_limit: str = typer.Option("2GB", "--memory-limit", help="DuckDB memory limit (spills past it)"),
    json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags(),
) -> None:
    """Dedup, handle missing values and enforce a schema; failing rows go to quarantine."""
    from ..data.transforms import DROP, CleanConfig, clean
    from ..data.versions import load_version, parse_ref

    store = flags.open(url)
    missing: object = "drop" if drop_missing else None
    if fill or drop_null:
        if drop_missing:
            raise ConfigError("--drop-missing cannot be combined with --fill / --drop-null")
        rules: dict = {}
        for item in fill:
            col, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"--fill wants COL=VALUE, got {item!r}")
            try:
                rules[col] = json.loads(value)
            except ValueError:
                rules[col] = value
        rules.update({col: DROP for col in drop_null})
        missing = rules
    schema = None
    if cast:
        name, ver = parse_ref(ref)
        schema = load_version(store, name, ver).schema
        for item in cast:
            col, sep, type_name = item.partition("=")
            if not sep or col not in schema.names:
                raise ConfigError(f"--cast wants COL=TYPE with COL a column, got {item!r}")
            i = schema.get_field_index(col)
            schema = schema.set(i, pa.field(col, _parse_type(type_name)))
    keys = None if dedup is None else ("row" if dedup == "row" else dedup.split(","))
    with console.status("cleaning", spinner="dots") if not json_out else _null():
        version = clean(store, ref, dedup=keys, missing=missing, schema=schema, output=output,
                        config=CleanConfig(memory_limit=memory_limit))
    if json_out:
        emit_json(_version_json(version))
    else:
        e = version.extra
        console.print(f"committed [bold]{version.id}[/bold]: {e['output_rows']:,} rows kept, "
                      f"{e['duplicates']:,} duplicates, {e['dropped_missing']:,} dropped for missing values, "
                      f"{e['quarantined_rows']:,} quarantined" + (f" -> {e['quarantine']}" if e["quarantine"] else ""))


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@data_app.command("transform")
@handle_errors
@with_store_flags
def transform_cmd(
    url: str, ref: str, fn: str = typer.Argument(..., help="module:function mapping RecordBatch -> RecordBatch"),
    engine: str = typer.Option("local", "--engine", help="local | ray"),
    workers: int = typer.Option(1, "--workers", "-w"),
    kwargs: str = typer.Option("{}", "--kwargs", help="JSON object of keyword arguments for fn"),
    output: str | None = typer.Option(None, "--output", "-o", help="output dataset name"),
    json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags(),
) -> None:
    """Run FN over every shard (resumable) into an Arrow IPC feature dataset."""
    from ..data.transforms import transform

    try:
        fn_kwargs = json.loads(kwargs)
    except ValueError as exc:
        raise ConfigError(f"--kwargs is not JSON: {exc}") from None
    store = flags.open(url)
    with _progress(json_out) as bar:
        task = bar.add_task(f"transform {ref}", total=None)
        version = transform(store, ref, fn, engine=engine, workers=workers, output=output, fn_kwargs=fn_kwargs,
                            progress=lambda done, total: bar.update(task, completed=done, total=total))
    if json_out:
        emit_json(_version_json(version))
    else:
        console.print(f"committed [bold]{version.id}[/bold]: {version.rows:,} rows, {len(version.shards)} shards "
                      f"({version.extra.get('resumed_shards', 0)} resumed)")


@data_app.command("ls")
@handle_errors
@with_store_flags
def ls(url: str, json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Datasets and their versions."""
    from ..data.versions import list_datasets, list_versions, load_version

    store = flags.open(url, read_only=True)
    names = list_datasets(store)
    if not names:
        raise NotFoundError(f"no datasets in {store.url}: {store_contents(store)}")
    rows = []
    for name in names:
        for ver in list_versions(store, name):
            v = load_version(store, name, ver)
            rows.append({"id": v.id, "layout": v.layout, "rows": v.rows, "bytes": v.bytes,
                         "shards": len(v.shards), "operation": v.operation, "parents": list(v.parents),
                         "created": v.created})
    if json_out:
        emit_json(rows)
        return
    table = Table("version", "layout", "rows", "bytes", "shards", "operation", "parents", title=store.url)
    for r in rows:
        table.add_row(r["id"], r["layout"], f"{r['rows']:,}", f"{r['bytes']:,}", str(r["shards"]),
                      r["operation"], ", ".join(r["parents"]))
    print_table(table)


@data_app.command("show")
@handle_errors
@with_store_flags
def show(url: str, ref: str, json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """One version's manifest: schema, shards, lineage fields."""
    from ..data.versions import load_version, parse_ref

    store = flags.open(url, read_only=True)
    v = load_version(store, *parse_ref(ref))
    if json_out:
        emit_json(_version_json(v))
        return
    console.print(f"[bold]{v.id}[/bold] {v.layout}, {v.rows:,} rows, {v.bytes:,} bytes, {len(v.shards)} shards")
    console.print(f"operation {v.operation}, parents {', '.join(v.parents) or '-'}, config {v.config_hash[:16]}")
    console.print(f"code {v.code_version}, trainstore {v.trainstore_version}", soft_wrap=True, highlight=False)
    schema = Table("column", "type", "nullable")
    for f in v.schema:
        schema.add_row(f.name, str(f.type), str(f.nullable))
    print_table(schema)
    shards = Table("shard", "rows", "bytes", "blake3")
    for s in v.shards:
        shards.add_row(s.key, f"{s.rows:,}", f"{s.bytes:,}", s.checksum[:16])
    print_table(shards)


@data_app.command("lineage")
@handle_errors
@with_store_flags
def lineage(url: str, ref: str, json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """The version and all its ancestors."""
    from ..data.versions import iter_lineage

    store = flags.open(url, read_only=True)
    chain = [{"id": v.id, "operation": v.operation, "parents": list(v.parents), "config_hash": v.config_hash,
              "config": v.config, "code_version": v.code_version,
              "trainstore_version": v.trainstore_version, "rows": v.rows} for v in iter_lineage(store, ref)]
    if json_out:
        emit_json(chain)
        return
    table = Table("version", "operation", "parents", "config hash", "code", "trainstore", "rows")
    for c in chain:
        table.add_row(c["id"], c["operation"], ", ".join(c["parents"]), c["config_hash"][:16],
                      str(c["code_version"]), str(c["trainstore_version"]), f"{c['rows']:,}")
    print_table(table)


@data_app.command("verify")
@handle_errors
@with_store_flags
def verify(url: str, ref: str, json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Re-check every shard's size and BLAKE3 checksum; exit 2 if any is bad."""
    from ..data.versions import load_version, parse_ref, read_shard

    store = flags.open(url, read_only=True)
    v = load_version(store, *parse_ref(ref))
    bad = []
    with _progress(json_out) as bar:
        task = bar.add_task(f"verify {v.id}", total=len(v.shards))
        for s in v.shards:
            try:
                read_shard(store, s)
            except Exception as exc:  # noqa: BLE001 - every failure is reported per shard
                bad.append({"shard": s.key, "error": f"{type(exc).__name__}: {exc}"})
            bar.advance(task)
    if json_out:
        emit_json({"version": v.id, "shards": len(v.shards), "bad": bad, "ok": not bad})
    elif not bad:
        console.print(f"{v.id}: all {len(v.shards)} shards verify")
    if bad:
        raise IntegrityError(f"{v.id}: {len(bad)} of {len(v.shards)} shards fail: "
                             + "; ".join(f"{b['shard']}: {b['error']}" for b in bad[:5]))


@data_app.command("gc")
@handle_errors
@with_store_flags
def gc_cmd(url: str,
           dry_run: bool = typer.Option(False, "--dry-run", help="report what would be deleted, delete nothing"),
           grace: str = typer.Option("1h", "--grace", help="only delete shards older than this (e.g. 90s, 1h, 7d)"),
           ignore_unreadable: bool = typer.Option(False, "--ignore-unreadable",
                                                  help="sweep even if a version manifest is unreadable"),
           json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Delete shards no committed dataset version references (safe while writers run)."""
    from ..data.gc import DataGcOptions, collect_garbage

    store = flags.open(url)
    report = collect_garbage(store, DataGcOptions(grace=grace, ignore_unreadable=ignore_unreadable),
                             dry_run=dry_run)
    if json_out:
        emit_json(report.to_json())
        return
    verb = "would delete" if dry_run else "deleted"
    console.print(f"{report.shards} shards ({report.shard_bytes / 1e6:.1f} MB) in {report.datasets} datasets: "
                  f"{report.referenced} referenced, {report.leased} held by writers, {report.too_young} within "
                  f"grace; {verb} {report.deleted} ({report.bytes_reclaimed / 1e6:.1f} MB)"
                  + (f", {report.markers_deleted} work markers" if report.markers_deleted else ""))
    if report.missing:
        console.print(f"[yellow]{report.missing} referenced shards are missing: run `trainstore data verify`[/yellow]")


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
