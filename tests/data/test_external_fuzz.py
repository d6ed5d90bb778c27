"""Readers of files trainstore did not write, fuzzed (issue 26 item 6).

``Dataset.open`` reads external data as it is: a Hugging Face ``datasets`` folder
(``state.json``, Arrow IPC streams) or a directory of Parquet files (footers, pages). Whatever
those files hold, only a ``TrainstoreError`` may come out - never a ``TypeError``,
``RecursionError``, a pyarrow error or a crash - and it names the file. The short runs here are
part of ``make test``; the ``stress`` variants run many more examples.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.errors import TrainstoreError

pytestmark = pytest.mark.timeout(600)

ROWS = 40
DATA_FILE = "data-00000-of-00001.arrow"


def _table() -> pa.Table:
    i = np.arange(ROWS, dtype=np.int64)
    return pa.table({
        "i": i,
        "s": [f"row-{k}" for k in range(ROWS)],
        "v": [[float(k)] * (k % 4) for k in range(ROWS)],
        "x": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(i, 3).astype(np.float32)), 3),
    })


def _stream() -> bytes:
    sink = pa.BufferOutputStream()
    table = _table()
    with pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=15):
            w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _parquet(checksums: bool) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(_table(), sink, row_group_size=15, write_page_checksum=checksums)
    return sink.getvalue().to_pybytes()


STREAM = _stream()
PARQUET = {True: _parquet(True), False: _parquet(False)}


def _serve_everything(root: str, cache: str) -> None:
    """Open ``root`` and read every row every way (byte ranges, whole file, the Loader)."""
    ds = Dataset.open(root, cache_dir=cache)
    try:
        for i in range(0, len(ds), 7):
            ds[i]
        ds.take(np.arange(len(ds)))
        loader = Loader(ds, batch_size=16, shuffle=False, rank=0, world_size=1)
        try:
            for _ in loader:
                pass
        finally:
            loader.close()
    finally:
        ds.close()


def _only_named_trainstore_errors(files: dict[str, bytes], named: tuple[str, ...]) -> None:
    """Write ``files`` into a fresh folder and serve it: it either serves or raises a
    ``TrainstoreError`` naming one of ``named``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "ext")
        os.makedirs(root)
        for name, data in files.items():
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)
        try:
            _serve_everything(root, os.path.join(tmp, "hot"))
        except TrainstoreError as exc:
            assert any(n in str(exc) for n in named), f"{type(exc).__name__} does not name the file: {exc}"


# -- strategies ---------------------------------------------------------------------------------
_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_filenames = _json | st.sampled_from(
    [DATA_FILE, "state.json", "../etc/passwd", "/abs.arrow", "a//b.arrow", "", ".", "x\\y", "a\x00b", "missing.arrow"])
_state_objects = st.one_of(
    _json,
    st.fixed_dictionaries({"_data_files": _json}),
    st.fixed_dictionaries({"_data_files": st.lists(st.fixed_dictionaries({"filename": _filenames}), max_size=3)}),
    st.fixed_dictionaries({"_data_files": st.lists(st.dictionaries(st.text(max_size=10), _filenames, max_size=2),
                                                   max_size=3)}),
)
_deep = st.tuples(st.integers(500, 200_000), st.sampled_from(["[", '{"a":'])).map(
    lambda d: (d[1] * d[0] + "1" + ("]" if d[1] == "[" else "}") * d[0]).encode())
STATE_BYTES = st.one_of(
    _state_objects.map(lambda o: json.dumps(o).encode()),
    _deep,
    st.binary(max_size=64),
    st.text(max_size=40).map(str.encode),
)


def _mutated(base: bytes, tail: int | None = None):
    """``base`` with bytes overwritten (anywhere, or in its last ``tail`` bytes), cut short or
    grown, or with a run of bytes repeated."""
    lo = 0 if tail is None else max(0, len(base) - tail)
    pos = st.integers(lo, len(base) - 1)
    flips = st.lists(st.tuples(pos, st.integers(0, 255)), min_size=1, max_size=8).map(
        lambda edits: _apply(base, edits))
    cut = st.integers(0, len(base) - 1).map(lambda n: base[:n])
    grow = st.binary(min_size=1, max_size=32).map(lambda extra: base + extra)
    dup = st.tuples(pos, st.integers(1, 64)).map(lambda p: base[:p[0]] + base[p[0]:p[0] + p[1]] * 2 + base[p[0] + p[1]:])
    return st.one_of(flips, cut, grow, dup)


def _apply(base: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(base)
    for p, b in edits:
        out[p] = b
    return bytes(out)


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
LONG = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


# -- Hugging Face state.json --------------------------------------------------------------------
def _hf_state(state: bytes) -> None:
    _only_named_trainstore_errors({"state.json": state, DATA_FILE: STREAM}, ("state.json",))


@FAST
@given(STATE_BYTES)
def test_hf_state_json_fuzzed(state):
    _hf_state(state)


@pytest.mark.stress
@LONG
@given(STATE_BYTES)
def test_hf_state_json_fuzzed_long(state):
    _hf_state(state)


def test_hf_state_json_cases_that_escaped():
    """The shapes that raised TypeError / RecursionError out of ``Dataset.open``."""
    for state in ({"_data_files": [{"filename": ["a"]}]}, {"_data_files": [{"filename": {"a": 1}}]},
                  {"_data_files": [{"filename": "../x.arrow"}]}, {"_data_files": [{"filename": None}]}):
        _hf_state(json.dumps(state).encode())
    _hf_state(b"[" * 100_000 + b"]" * 100_000)


# -- Arrow IPC streams --------------------------------------------------------------------------
def _hf_stream(data: bytes) -> None:
    state = json.dumps({"_data_files": [{"filename": DATA_FILE}]}).encode()
    _only_named_trainstore_errors({"state.json": state, DATA_FILE: data}, (DATA_FILE,))


@FAST
@given(_mutated(STREAM))
def test_hf_arrow_stream_fuzzed(data):
    _hf_stream(data)


@pytest.mark.stress
@LONG
@given(_mutated(STREAM))
def test_hf_arrow_stream_fuzzed_long(data):
    _hf_stream(data)


def _invalid_streams(count: int) -> list[bytes]:
    """One-byte corruptions of ``STREAM`` that pyarrow reads but whose buffers are invalid
    (offsets out of bounds, child arrays too short): read unchecked, they crash the process."""
    found = []
    for pos in range(len(STREAM)):
        for byte in (0x40, 0xFF):
            data = bytearray(STREAM)
            data[pos] = byte
            try:
                batches = list(pa.ipc.open_stream(pa.py_buffer(bytes(data))))
            except (pa.ArrowException, OSError):
                continue
            try:
                for b in batches:
                    b.validate(full=True)
            except pa.ArrowException:
                found.append(bytes(data))
    assert len(found) >= count
    return found[::len(found) // count][:count]


def test_hf_arrow_stream_with_invalid_buffers_is_refused():
    """The fuzzer's find: such a stream crashed the process (segfault in ``to_pylist``)."""
    for data in _invalid_streams(12):
        _hf_stream(data)
        with tempfile.TemporaryDirectory() as tmp:
            for name, content in {"state.json": json.dumps({"_data_files": [{"filename": DATA_FILE}]}).encode(),
                                  DATA_FILE: data}.items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(content)
            with pytest.raises(TrainstoreError, match=DATA_FILE):
                _serve_everything(tmp, os.path.join(tmp, "hot"))


# -- Parquet footers and pages ------------------------------------------------------------------
def _parquet_dir(data: bytes) -> None:
    _only_named_trainstore_errors({"a.parquet": PARQUET[False], "b.parquet": data}, ("b.parquet",))


_PARQUET_FOOTERS = st.sampled_from([True, False]).flatmap(lambda c: _mutated(PARQUET[c], tail=600))
_PARQUET_ANYWHERE = st.sampled_from([True, False]).flatmap(lambda c: _mutated(PARQUET[c]))


@FAST
@given(_PARQUET_FOOTERS)
def test_parquet_footer_fuzzed(data):
    _parquet_dir(data)


@FAST
@given(_PARQUET_ANYWHERE)
def test_parquet_pages_fuzzed(data):
    _parquet_dir(data)


@pytest.mark.stress
@LONG
@given(st.one_of(_PARQUET_FOOTERS, _PARQUET_ANYWHERE))
def test_parquet_fuzzed_long(data):
    _parquet_dir(data)


def _lies(meta: pq.FileMetaData) -> bool:
    """Whether a footer that parsed does not hold together: its row groups do not add up to its
    row count or have another number of column chunks than the schema has columns, or a column
    name does not decode."""
    try:
        counts = []
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            counts.append(rg.num_rows)
            if rg.num_columns != meta.num_columns:
                return True
        for c in range(meta.num_columns):
            meta.schema.column(c).path  # noqa: B018 - (a column chunk's own accessors can abort)
    except (pa.ArrowException, ValueError):
        return True
    return sum(counts) != meta.num_rows or any(n < 0 for n in counts)


def _lying_footers(count: int) -> list[bytes]:
    """One-byte corruptions of a Parquet footer that still parses but does not hold together."""
    found = []
    for checksums in (False, True):
        base = PARQUET[checksums]
        for pos in range(max(0, len(base) - 1200), len(base) - 8):
            for byte in (0x00, 0x01, 0x40, 0x7F, 0x80, 0xFF):
                data = bytearray(base)
                data[pos] = byte
                try:
                    meta = pq.read_metadata(pa.BufferReader(bytes(data)))
                except (pa.ArrowException, OSError):
                    continue
                if _lies(meta):
                    found.append(bytes(data))
    assert len(found) >= count
    return found[::len(found) // count][:count]


def test_parquet_footers_that_parse_but_do_not_hold_together_are_refused():
    """The fuzzer's finds: such footers raised IndexError (row counts) or UnicodeDecodeError
    (a column name) out of ``ds[i]``."""
    for data in _lying_footers(10):
        with tempfile.TemporaryDirectory() as tmp:
            for name, content in {"a.parquet": PARQUET[False], "b.parquet": data}.items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(content)
            with pytest.raises(TrainstoreError, match=r"b\.parquet"):
                _serve_everything(tmp, os.path.join(tmp, "hot"))


@pytest.mark.parametrize("shape", [b"[[[[", b'{"a": 1}', b'["x", 3]', b"[-1, -3]", b"[" * 5000 + b"]" * 5000, b"\xff"])
def test_parquet_shape_metadata_that_is_not_a_shape(shape):
    """Field metadata ``shape`` (how trainstore gives a flat list a tensor shape) in a file
    from elsewhere is only a claim: a malformed one is a SchemaError naming the folder."""
    field = pa.field("x", pa.list_(pa.float32(), 3), metadata={b"shape": shape})
    table = pa.Table.from_arrays([pa.array([[1.0, 2.0, 3.0]] * 4, field.type)], schema=pa.schema([field]))
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "shaped")
        os.makedirs(root)
        pq.write_table(table, os.path.join(root, "a.parquet"))
        with pytest.raises(TrainstoreError, match=r"shaped.*column 'x'"):
            _serve_everything(root, os.path.join(tmp, "hot"))


def test_parquet_strings_that_are_not_utf8_are_refused():
    """The fuzzer's find: a string page of an external file (no CRC) with bytes that are not
    UTF-8 raised UnicodeDecodeError out of ``ds[i]`` and ``take``."""
    sink = pa.BufferOutputStream()
    pq.write_table(_table(), sink, compression="none", use_dictionary=False, write_statistics=False)
    data = sink.getvalue().to_pybytes()
    at = data.index(b"row-17")
    for read in ("ranges", "whole"):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "b.parquet"), "wb") as f:
                f.write(data[:at] + b"\x80" + data[at + 1:])
            ds = Dataset.open(tmp, cache_dir=os.path.join(tmp, "hot"))
            with pytest.raises(TrainstoreError, match=r"b\.parquet.*column 's'"):
                ds[17] if read == "ranges" else ds.take([17])


# -- input files of ingestion (users' JSONL and Parquet) ----------------------------------------
def _ingested(name: str, data: bytes) -> None:
    """Ingest one file: it is ingested or refused with a ``TrainstoreError`` naming it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        try:
            with Ingestor(open_store(os.path.join(tmp, "s")), "x",
                          config=IngestConfig(wal_dir=os.path.join(tmp, "w"))) as ing:
                ing.ingest_files(path)
                ing.commit()
        except TrainstoreError as exc:
            assert name in str(exc), f"{type(exc).__name__} does not name the file: {exc}"


@FAST
@given(_PARQUET_ANYWHERE)
def test_ingested_parquet_fuzzed(data):
    _ingested("in.parquet", data)


@pytest.mark.stress
@LONG
@given(_PARQUET_ANYWHERE)
def test_ingested_parquet_fuzzed_long(data):
    _ingested("in.parquet", data)


def test_ingest_input_cases_that_escaped():
    """The fuzzer's finds: a Parquet column name that is not UTF-8 (``UnicodeDecodeError``),
    a JSONL line nested past the parser (``RecursionError``)."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"zz_name": [1, 2, 3]}), sink)
    _ingested("in.parquet", sink.getvalue().to_pybytes().replace(b"zz_name", b"\xd3z_name"))
    _ingested("in.jsonl", b'{"a": 1}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n")
