"""Turn what users hand to ``Ingestor.write`` into an Arrow table of one schema.

Accepted: a list of dicts, an Arrow ``RecordBatch`` / ``Table`` (or a list of batches), a
pandas or polars ``DataFrame``. Conversion is columnar (fast path); only when it fails do we
walk the offending column value by value, so the ``SchemaError`` names the record index and
field that did not fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SchemaError


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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


def _column_error(values: Sequence[Any], field: pa.Field, exc: Exception, offset: int = 0) -> SchemaError:
    """Find the first value of ``values`` that does not convert to ``field.type``."""
    for i, value in enumerate(values):
        try:
            pa.array([value], type=field.type)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as inner:
            return SchemaError(
                f"record {offset + i}: field {field.name!r} value {_short(value)} is not "
                f"{field.type}: {inner}"
            )
    return SchemaError(f"field {field.name!r} does not convert to {field.type}: {exc}")


def _from_dicts(records: Sequence[Any], schema: pa.Schema | None) -> pa.Table:
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise SchemaError(f"record {i} is a {type(rec).__name__}, not a dict")
    if schema is None:
        try:
            return pa.Table.from_pylist(list(records))
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            raise SchemaError(f"records do not share one type per field: {exc}") from None
    names = set(schema.names)
    for i, rec in enumerate(records):
        extra = [k for k in rec if k not in names]
        if extra:
            raise SchemaError(f"record {i}: field {extra[0]!r} is not in the schema ({', '.join(schema.names)})")
        for field in schema:
            if not field.nullable and rec.get(field.name) is None:
                raise SchemaError(f"record {i}: field {field.name!r} is missing or null (not nullable)")
    arrays = []
    for field in schema:
        values = [rec.get(field.name) for rec in records]
        try:
            arrays.append(pa.array(values, type=field.type))
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            raise _column_error(values, field, exc) from None
    return pa.Table.from_arrays(arrays, schema=schema)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s column order and types; ``SchemaError`` naming what does not fit."""
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
        col = table.column(field.name)
        if not col.type.equals(field.type):
            try:
                col = pc.cast(col, field.type, safe=True)
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise _column_error(table.column(field.name).to_pylist(), field, exc) from None
        if not field.nullable and col.null_count:
            index = pc.index(pc.is_null(col), True).as_py()
            raise SchemaError(f"record {index}: field {field.name!r} is null (not nullable)")
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
