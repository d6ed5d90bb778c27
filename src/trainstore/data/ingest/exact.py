"""Exact conversion into a column type: a value is stored as given or rejected, never changed.

* A value never changes kind: numbers (int, float, decimal) stay numbers, strings stay
  strings, bytes stay bytes, bools stay bools, timestamps stay timestamps (with or without a
  time zone, as given), lists stay lists, and so on (``compatible``).
* Within a kind a cast is made with pyarrow's safe cast and accepted only if every value
  survives it: casting back gives the same values (``cast_exact``). So int64 -> float64 only
  up to 2**53, float -> int only for whole numbers, no integer overflow, no timestamp
  precision lost, float64 -> float32 only for values float32 holds exactly.
* Python values (lists of dicts) are converted by pyarrow's inference, then cast as above;
  where inference itself would change a value (an int past 2**53 next to floats, a str next
  to bytes) or a target cannot be reached from the inferred type (dicts into a map column),
  every value is compared with what would be stored (``values_to_array``).

A refused value is a ``SchemaError`` naming where (the record, or the file and line), the
field, the value, and what it would have become.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SchemaError

Locate = Callable[[int], str]
_PYTHON_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)


def record_at(i: int) -> str:
    return f"record {i}"


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        return _kind(t.value_type)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t)):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_time(t):
        return "time"
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return "list"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_map(t):
        return "map"
    return str(t)  # bool, null, duration, ...: their own kind


def compatible(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether values of ``src`` may be cast to ``dst`` at all (same kind, recursively)."""
    if pa.types.is_null(src):
        return True
    if pa.types.is_dictionary(src):
        return compatible(src.value_type, dst)
    if pa.types.is_dictionary(dst):
        return compatible(src, dst.value_type)
    if _kind(src) != _kind(dst):
        return False
    if _kind(src) == "list":
        return compatible(src.value_type, dst.value_type)
    if pa.types.is_map(src):
        return compatible(src.key_type, dst.key_type) and compatible(src.item_type, dst.item_type)
    if pa.types.is_struct(src):
        names = {f.name: f.type for f in src}
        return all(compatible(names[f.name], f.type) for f in dst if f.name in names)
    return True


def _first_changed(orig: pa.Array, back: pa.Array) -> int | None:
    """Index of the first value of ``orig`` that ``back`` does not equal (NaN equals NaN)."""
    t = orig.type
    if pa.types.is_primitive(t) or _kind(t) in ("string", "binary"):
        eq = pc.fill_null(pc.equal(orig, back), False)
        if pa.types.is_floating(t):
            eq = pc.or_(eq, pc.fill_null(pc.and_(pc.is_nan(orig), pc.is_nan(back)), False))
        ok = pc.or_(eq, pc.and_(pc.is_null(orig), pc.is_null(back)))
        index = pc.index(ok, False).as_py()
        return None if index < 0 else index
    for i, (a, b) in enumerate(zip(orig.to_pylist(), back.to_pylist(), strict=True)):
        if not same(a, b):
            return i
    return None


def _single(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def cast_exact(col: pa.Array | pa.ChunkedArray, field: pa.Field,
               locate: Locate = record_at) -> pa.Array | pa.ChunkedArray:
    """``col`` as ``field.type``; ``SchemaError`` if any value would change or change kind."""
    src, dst = col.type, field.type
    if src.equals(dst):
        return col
    col = _single(col)
    if pa.types.is_null(src):
        return pa.nulls(len(col), dst)
    if not compatible(src, dst):
        valid = pc.index(pc.is_valid(col), True).as_py()
        where = locate(max(valid, 0))
        value = short(col[valid].as_py()) if valid >= 0 else "null"
        raise SchemaError(f"{where}: field {field.name!r} value {value} is {_kind(src)} ({src}), "
                          f"not {dst}: a value never changes kind")
    try:
        out = _exact(col, dst)
    except pa.ArrowNotImplementedError as exc:
        raise SchemaError(f"field {field.name!r}: {src} cannot be converted to {dst}: {exc}") from None
    if out is not None:
        return out
    lo, hi = 0, len(col) - 1  # the first row whose prefix does not convert exactly
    while lo < hi:
        mid = (lo + hi) // 2
        if _exact(_prefix(col, mid + 1), dst) is None:
            hi = mid
        else:
            lo = mid + 1
    value = col[lo]
    try:
        became = f" (it would be stored as {short(pc.cast(col.take([lo]), dst, safe=False)[0].as_py())})"
    except pa.ArrowException:
        became = ""
    raise SchemaError(f"{locate(lo)}: field {field.name!r} value {short(value.as_py())} "
                      f"is not exactly a {dst}{became}")


def _prefix(col: pa.Array, n: int) -> pa.Array:
    """The first ``n`` values as a compact array (a cast of a sliced nested array may look at
    child values outside the slice)."""
    return col.take(pa.array(range(n), pa.int64()))


def _exact(col: pa.Array, dst: pa.DataType) -> pa.Array | None:
    """``col`` cast to ``dst`` if every value survives (cast back, compare), else None."""
    src = col.type
    try:
        out = pc.cast(col, dst, safe=True)
    except pa.ArrowInvalid:
        if not (pa.types.is_integer(src) and pa.types.is_floating(dst)):
            return None
        out = pc.cast(col, dst, safe=False)  # pyarrow checks a range (2**53); the round trip is exact
    try:
        back = pc.cast(out, src, safe=True)
    except pa.ArrowInvalid:
        return None
    return out if _first_changed(col, back) is None else None


# -- Python values -----------------------------------------------------------------------------
def same(value: Any, stored: Any) -> bool:
    """Whether ``stored`` (read back from Arrow) is ``value``: equal, and the same kind; an
    int may come back as an equal float or decimal, a whole float as an equal int."""
    if value is None:
        return stored is None
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return isinstance(stored, bool) and stored == value
    if isinstance(value, numbers.Number) and not isinstance(value, complex):
        if isinstance(stored, bool) or not isinstance(stored, (int, float, Decimal)):
            return False
        if value != value:  # NaN
            return stored != stored
        return stored == value
    if isinstance(value, str):
        return isinstance(stored, str) and stored == value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return isinstance(stored, bytes) and stored == bytes(value)
    if isinstance(value, Mapping):
        if isinstance(stored, list):  # a map column reads back as (key, value) pairs
            stored = dict(stored)
        return isinstance(stored, dict) and all(
            same(value.get(k), stored.get(k)) for k in {*value.keys(), *stored.keys()})
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        return (isinstance(stored, list) and len(stored) == len(value)
                and all(same(a, b) for a, b in zip(value, stored, strict=True)))
    return type(stored) is type(value) and stored == value


def _has_leaf(t: pa.DataType, test: Callable[[pa.DataType], bool]) -> bool:
    if test(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_leaf(f.type, test) for f in t)
    if pa.types.is_map(t):
        return _has_leaf(t.key_type, test) or _has_leaf(t.item_type, test)
    if _kind(t) == "list":
        return _has_leaf(t.value_type, test)
    return False


def _changed_by_inference(values: Sequence[Any], arr: pa.Array) -> int | None:
    """Index of a value pyarrow's inference changed (bools or ints past 2**53 among floats,
    str among bytes), or None. Checked only where the inferred type allows such a change."""
    t = arr.type
    if pa.types.is_floating(t):
        for i, v in enumerate(values):
            if isinstance(v, bool) or type(v).__name__ == "bool_":
                return i  # pyarrow reads False among floats as 0.0
            if isinstance(v, numbers.Integral) and int(float(v)) != v:
                return i
        return None
    if pa.types.is_binary(t):
        return next((i for i, v in enumerate(values) if isinstance(v, str)), None)
    if pa.types.is_primitive(t) or _kind(t) in ("string", "binary"):
        return None
    if not _has_leaf(t, lambda x: pa.types.is_floating(x) or pa.types.is_binary(x)):
        return None
    return _first_changed_values(values, arr)


def _first_changed_values(values: Sequence[Any], arr: pa.Array) -> int | None:
    for i, (v, b) in enumerate(zip(values, arr.to_pylist(), strict=True)):
        if not same(v, b):
            return i
    return None


def values_to_array(values: Sequence[Any], name: str, target: pa.DataType | None,
                    locate: Locate = record_at) -> pa.Array:
    """Python values of field ``name`` as an array of type ``target`` (None: inferred)."""
    try:
        inferred: pa.Array | None = pa.array(values)
    except _PYTHON_ERRORS as exc:
        if target is None:
            raise SchemaError(f"field {name!r} does not have one type: {exc}") from None
        inferred = None
    if inferred is not None:
        index = _changed_by_inference(values, inferred)
        if index is not None:
            raise SchemaError(
                f"{locate(index)}: field {name!r} value {short(values[index])} would be stored as "
                f"{short(inferred[index].as_py())} ({inferred.type}): mixed kinds in one field")
        if target is None:
            return inferred
        try:
            return cast_exact(inferred, pa.field(name, target), locate)
        except SchemaError:
            if compatible(inferred.type, target):
                raise
            # e.g. dicts into a map column: inference cannot say map, so convert directly
    assert target is not None
    try:
        arr = pa.array(values, type=target)
    except _PYTHON_ERRORS as exc:
        raise _value_error(values, name, target, exc, locate) from None
    index = _first_changed_values(values, arr)
    if index is not None:
        raise SchemaError(f"{locate(index)}: field {name!r} value {short(values[index])} is not exactly "
                          f"a {target} (it would be stored as {short(arr[index].as_py())})")
    return arr


def _value_error(values: Sequence[Any], name: str, target: pa.DataType, exc: Exception,
                 locate: Locate) -> SchemaError:
    """Find the first value of ``values`` that does not convert to ``target``."""
    for i, value in enumerate(values):
        try:
            pa.array([value], type=target)
        except _PYTHON_ERRORS as inner:
            return SchemaError(f"{locate(i)}: field {name!r} value {short(value)} is not {target}: {inner}")
    return SchemaError(f"field {name!r} does not convert to {target}: {exc}")
