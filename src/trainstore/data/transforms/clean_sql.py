"""SQL (DuckDB dialect) for cleaning: type names, literals, and the per-column expressions.

Kept apart from ``clean`` so the plan can be read (and tested) as text. Identifiers are
always double-quoted; fill values become typed literals, never string-pasted SQL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ...errors import ConfigError

#: Fill value meaning "drop rows where this column is missing" in ``missing={col: DROP}``.
DROP = "<drop>"

_SIMPLE = [
    (pa.types.is_boolean, "BOOLEAN"), (pa.types.is_int8, "TINYINT"), (pa.types.is_int16, "SMALLINT"),
    (pa.types.is_int32, "INTEGER"), (pa.types.is_int64, "BIGINT"), (pa.types.is_uint8, "UTINYINT"),
    (pa.types.is_uint16, "USMALLINT"), (pa.types.is_uint32, "UINTEGER"), (pa.types.is_uint64, "UBIGINT"),
    (pa.types.is_float16, "FLOAT"), (pa.types.is_float32, "FLOAT"), (pa.types.is_float64, "DOUBLE"),
    (pa.types.is_string, "VARCHAR"), (pa.types.is_large_string, "VARCHAR"),
    (pa.types.is_binary, "BLOB"), (pa.types.is_large_binary, "BLOB"), (pa.types.is_date32, "DATE"),
]


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def duck_type(t: pa.DataType) -> str:
    """The DuckDB type a column is cast to for an Arrow type (``ConfigError`` if none)."""
    for check, name in _SIMPLE:
        if check(t):
            return name
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return duck_type(t.value_type) + "[]"
    if pa.types.is_fixed_size_list(t):
        return f"{duck_type(t.value_type)}[{t.list_size}]"
    raise ConfigError(f"clean cannot enforce Arrow type {t}; use a primitive, string, binary, date, "
                      "timestamp, decimal or list type")


def literal(value: Any, sql_type: str) -> str:
    """A typed SQL literal for a fill value."""
    if value is None:
        text = "NULL"
    elif isinstance(value, bool):
        text = "TRUE" if value else "FALSE"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = f"'{value!r}'::DOUBLE" if not math.isfinite(value) else repr(value)
    elif isinstance(value, str):
        text = "'" + value.replace("'", "''") + "'"
    elif isinstance(value, (bytes, bytearray)):
        text = f"unhex('{bytes(value).hex()}')"
    else:
        raise ConfigError(f"fill value {value!r} must be None, bool, int, float, str or bytes")
    return f"CAST({text} AS {sql_type})"


@dataclass(frozen=True)
class ColumnPlan:
    """How one output column is computed from the source row."""

    name: str
    value: str  # SQL expression of the cleaned value
    reason: str | None  # SQL expression: why the row goes to quarantine, else NULL
    drop_if_missing: bool


def plan_columns(source: pa.Schema, target: pa.Schema | None, missing: Any) -> list[ColumnPlan]:
    """One ``ColumnPlan`` per output column (``target``'s, or the source's when None)."""
    out_schema = target if target is not None else source
    fills: dict[str, Any] = {}
    drop_all = missing == "drop"
    if isinstance(missing, dict):
        for col in missing:
            if col not in out_schema.names:
                raise ConfigError(f"missing-value rule for unknown column {col!r}")
        fills = dict(missing)
    elif missing not in (None, "drop"):
        raise ConfigError(f"missing must be None, 'drop' or a dict column -> fill value / DROP, got {missing!r}")
    plans = []
    for field in out_schema:
        col = ident(field.name)
        in_source = field.name in source.names
        if not in_source and not field.nullable and field.name not in fills:
            raise ConfigError(f"schema column {field.name!r} is not in the data and is not nullable")
        sql_type = duck_type(field.type) if target is not None else None
        needs_cast = target is not None and in_source and not source.field(field.name).type.equals(field.type)
        base = col if in_source else "NULL"
        value = f"TRY_CAST({base} AS {sql_type})" if needs_cast else base
        reasons = []
        if needs_cast:
            reasons.append(
                f"CASE WHEN {col} IS NOT NULL AND {value} IS NULL THEN "
                f"'{field.name.replace(chr(39), chr(39) * 2)}: cannot cast ' || left(CAST({col} AS VARCHAR), 60)"
                f" || ' to {sql_type}' END"
            )
        fill = fills.get(field.name)
        drop = drop_all or fill == DROP
        if fill is not None and fill != DROP:
            value = f"CASE WHEN {base} IS NULL THEN {literal(fill, sql_type or duck_type(field.type))} ELSE {value} END"
        elif not field.nullable and not drop:
            reasons.append(f"CASE WHEN {base} IS NULL THEN '{field.name.replace(chr(39), chr(39) * 2)}: "
                           "null in a non-nullable column' END")
        plans.append(ColumnPlan(field.name, value, " , ".join(reasons) or None, drop and in_source))
    return plans


def reason_expr(plans: list[ColumnPlan]) -> str:
    parts = [p.reason for p in plans if p.reason]
    return f"NULLIF(concat_ws('; ', {', '.join(parts)}), '')" if parts else "CAST(NULL AS VARCHAR)"


def drop_expr(plans: list[ColumnPlan]) -> str:
    parts = [f"{ident(p.name)} IS NULL" for p in plans if p.drop_if_missing]
    return " OR ".join(parts) if parts else "FALSE"
