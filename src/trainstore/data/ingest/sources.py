"""Read input files (JSONL, CSV, Parquet, raw binary) as a stream of Arrow tables.

Each reader streams (bounded memory) through pyarrow's own readers. A file that does not
parse, or a value that would not be stored exactly in the schema's column (``data.exact``),
raises ``SchemaError`` naming the file, the line (JSONL, CSV) or row (Parquet), the field and
the value (found by re-reading the file only after the fast reader failed); a missing file
is ``NotFoundError``; an unreadable one ``StoreError``.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from ...errors import ConfigError, NotFoundError, SchemaError, StoreError
from .exact import Locate
from .records import conform, to_table

FORMATS = ("jsonl", "csv", "parquet", "binary")
_EXT = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
        ".parquet": "parquet", ".pq": "parquet"}
BINARY_SCHEMA = pa.schema([pa.field("name", pa.string(), nullable=False),
                           pa.field("data", pa.binary(), nullable=False)])


def detect_format(path: str) -> str:
    return _EXT.get(os.path.splitext(path)[1].lower(), "binary")


def _open_check(path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise NotFoundError(f"input file {path!r} does not exist") from None
    except OSError as exc:
        raise StoreError(f"cannot read input file {path!r}: {exc}") from None


def read_file(
    path: str, *, format: str | None = None, schema: pa.Schema | None = None,
    batch_bytes: int = 16 << 20, name: str | None = None,
) -> Iterator[pa.Table]:
    """Tables of roughly ``batch_bytes`` from one file (``format`` from the extension if None)."""
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown input format {fmt!r}; use one of {FORMATS}")
    _open_check(path)
    if fmt == "binary":
        with open(path, "rb") as f:
            data = f.read()
        yield pa.table({"name": [name or os.path.basename(path)], "data": [data]}, schema=BINARY_SCHEMA)
    elif fmt == "parquet":
        yield from _conformed(_parquet(path, batch_bytes), schema, lambda row: f"{path}: row {row}")
    elif fmt == "csv":
        yield from _conformed(_csv(path, schema, batch_bytes), schema, lambda row: f"{path}:{_csv_line(path, row)}")
    else:
        yield from _conformed(_jsonl(path, schema, batch_bytes), schema,
                              lambda row: f"{path}:{_jsonl_line(path, row)}")


def _conformed(tables: Iterable[pa.Table], schema: pa.Schema | None, locate: Locate) -> Iterator[pa.Table]:
    """``tables`` conformed exactly to ``schema`` (if any); errors name the file's row."""
    offset = 0
    for table in tables:
        if schema is not None:
            table = conform(table, schema, lambda i, base=offset: locate(base + i))
        offset += table.num_rows
        yield table


def _csv_line(path: str, row: int) -> int:
    """The line number where data row ``row`` (0-based, after the header) starts."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        line = 1
        for index, _ in enumerate(reader):
            if index == row + 1:
                return line
            line = reader.line_num + 1
    return line


def _jsonl_line(path: str, row: int) -> int:
    """The line number of record ``row`` (0-based; blank lines hold no record)."""
    seen = -1
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if raw.strip():
                seen += 1
                if seen == row:
                    return lineno
    return seen + 1


def _parquet(path: str, batch_bytes: int) -> Iterator[pa.Table]:
    try:
        pf = pq.ParquetFile(path)
        meta = pf.metadata
        row_bytes = max(1, meta.serialized_size and sum(
            meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)
        ) // max(1, meta.num_rows))
        for batch in pf.iter_batches(batch_size=max(1, batch_bytes // row_bytes)):
            yield pa.Table.from_batches([batch])
    except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: a name that is not UTF-8
        raise SchemaError(f"{path}: not a readable Parquet file: {exc}") from None


def _csv(path: str, schema: pa.Schema | None, batch_bytes: int) -> Iterator[pa.Table]:
    convert = pacsv.ConvertOptions(column_types={f.name: f.type for f in schema} if schema else None)
    try:
        reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=min(batch_bytes, 1 << 30)),
                                convert_options=convert)
        for batch in reader:
            yield pa.Table.from_batches([batch])
        return
    except (pa.ArrowException, OSError) as exc:
        first_error = exc
    if schema is not None:
        _locate_csv_error(path, schema)
    raise SchemaError(f"{path}: CSV does not parse: {first_error}")


def _locate_csv_error(path: str, schema: pa.Schema) -> None:
    """Re-read every schema column as text and raise naming the first value that does not
    parse as its column's type (returns if none is found)."""
    try:
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
            column_types={f.name: pa.string() for f in schema}, strings_can_be_null=True))
    except (pa.ArrowException, OSError):
        return
    for field in schema:
        if field.name not in table.column_names:
            continue
        text = table.column(field.name).combine_chunks()
        lo, hi = 0, len(text)
        while lo < hi:  # the first row whose prefix does not parse
            mid = (lo + hi) // 2
            try:
                pc.cast(text.slice(0, mid + 1), field.type, safe=True)
                lo = mid + 1
            except pa.ArrowException:
                hi = mid
        if lo < len(text):
            raise SchemaError(f"{path}:{_csv_line(path, lo)}: field {field.name!r} value "
                              f"{text[lo].as_py()!r} is not {field.type}")


def _jsonl(path: str, schema: pa.Schema | None, batch_bytes: int) -> Iterator[pa.Table]:
    parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error" if schema else "infer")
    try:
        reader = pajson.open_json(path, read_options=pajson.ReadOptions(block_size=min(batch_bytes, 1 << 30)),
                                  parse_options=parse)
        for batch in reader:
            yield pa.Table.from_batches([batch])
        return
    except (pa.ArrowException, OSError) as exc:
        first_error = exc
    _locate_jsonl_error(path, schema, first_error)


def _locate_jsonl_error(path: str, schema: pa.Schema | None, exc: BaseException) -> None:
    """Re-read line by line to name the line that is bad; always raises."""
    first_schema = schema
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, RecursionError) as bad:  # RecursionError: nested past the parser
                raise SchemaError(f"{path}:{lineno}: not valid JSON: {type(bad).__name__}: {str(bad)[:200]}") from None
            try:
                table = to_table([rec], first_schema)
            except SchemaError as bad:
                msg = str(bad).removeprefix("record 0: ")
                raise SchemaError(f"{path}:{lineno}: {msg}") from None
            if first_schema is None:
                first_schema = table.schema
    raise SchemaError(f"{path}: JSON lines do not parse: {exc}")
