"""Turn what users hand to ``Ingestor.write`` into an Arrow table of one schema.

Accepted: a list of dicts, an Arrow ``RecordBatch`` / ``Table`` (or a list of batches), a
pandas or polars ``DataFrame``. Every value is stored exactly as given or the write is
refused (``data.exact``): the ``SchemaError`` names the record, the field and the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SchemaError
from .exact import Locate, cast_exact, record_at, short, values_to_array


def _from_frame(data: Any) -> pa.Table | None:
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise SchemaError(f"pandas DataFrame does not convert to Arrow: {exc}") from None
    if module == "polars":
        return data.to_arrow()
    return None


def _from_dicts(records: Sequence[Any], schema: pa.Schema | None) -> pa.Table:
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise SchemaError(f"record {i} is a {type(rec).__name__}, not a dict")
    if schema is None:
        names = list(dict.fromkeys(k for rec in records for k in rec))  # every key, first seen first
        for name in names:
            if not isinstance(name, str):
                raise SchemaError(f"field name {short(name)} is not a string")
        arrays = [values_to_array([rec.get(n) for rec in records], n, None) for n in names]
        return pa.Table.from_arrays(arrays, names=names)
    names = set(schema.names)
    for i, rec in enumerate(records):
        extra = [k for k in rec if k not in names]
        if extra:
            raise SchemaError(f"record {i}: field {extra[0]!r} is not in the schema ({', '.join(schema.names)})")
        for field in schema:
            if not field.nullable and rec.get(field.name) is None:
                raise SchemaError(f"record {i}: field {field.name!r} is missing or null (not nullable)")
    arrays = [values_to_array([rec.get(f.name) for rec in records], f.name, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def conform(table: pa.Table, schema: pa.Schema, locate: Locate = record_at) -> pa.Table:
    """``table`` with ``schema``'s column order and types, every value exactly as given
    (``data.exact``); ``SchemaError`` naming what does not fit, where ``locate(row)`` says."""
    if table.schema.equals(schema, check_metadata=False):
        return table.replace_schema_metadata(schema.metadata)
    names = set(schema.names)
    for name in table.column_names:
        if name not in names:
            raise SchemaError(f"field {name!r} is not in the schema ({', '.join(schema.names)})")
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            if not field.nullable:
                raise SchemaError(f"field {field.name!r} is missing (not nullable)")
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        col = cast_exact(table.column(field.name), field, locate)
        if not field.nullable and col.null_count:
            index = pc.index(pc.is_null(col), True).as_py()
            raise SchemaError(f"{locate(index)}: field {field.name!r} is null (not nullable)")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def to_table(data: Any, schema: pa.Schema | None) -> pa.Table:
    """Convert ``data`` to a table; with ``schema``, conform to it (cast, reorder, check)."""
    if isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    elif (frame := _from_frame(data)) is not None:
        table = frame
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes, bytearray)):
        if data and all(isinstance(b, pa.RecordBatch) for b in data):
            table = pa.Table.from_batches(list(data))
        else:
            return _from_dicts(data, schema)
    else:
        raise SchemaError(
            f"cannot ingest a {type(data).__name__}: pass a list of dicts, an Arrow RecordBatch "
            "or Table, or a pandas / polars DataFrame"
        )
    return table if schema is None else conform(table, schema)
