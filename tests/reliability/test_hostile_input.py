"""Hostile input: fuzzed keys, URLs, chunk references, dataset manifests and CLI arguments
produce TrainstoreError subclasses only (never another exception, never a hang), keys
never escape a store's root, and credentials never show in errors, reprs or logs."""

from __future__ import annotations

import json
import logging
import os
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from trainstore import open_store
from trainstore.chunks import ChunkRef
from trainstore.errors import InvalidKeyError, TrainstoreError

pytestmark = pytest.mark.timeout(180)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

# Keys built from the characters that matter for path handling, plus arbitrary text.
_key_alphabet = st.sampled_from(list("ab./\\\x00\n~ :%") + ["..", "/..", "../", "\u2215", "\uff0e"])
hostile_keys = st.one_of(
    st.text(max_size=40),
    st.lists(_key_alphabet, max_size=20).map("".join),
    st.lists(st.sampled_from(["..", ".", "", "a", "b", "~", "/etc", ".tmp.x", "x" * 300]), max_size=6).map("/".join),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)


#: Values that break naive parsers: overflow, NaN, bools-as-ints, escaping keys, nesting.
nasty_values = st.sampled_from([float("inf"), float("-inf"), float("nan"), -1, 2**70, True, 1.5, "1e9",
                                "../../etc/passwd", "/abs", "", None, [], {}, [[[[]]]], "x" * 10_000])


def _tree(path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), path))
    return out


def test_keys_never_escape_a_local_root(tmp_path_factory):
    base = tmp_path_factory.mktemp("escape")
    root = base / "root"
    store = open_store(str(root))
    (base / "sibling").write_text("keep")
    before_outside = _tree(base) - {p for p in _tree(base) if p == "root" or p.startswith("root" + os.sep)}

    @FUZZ
    @given(key=hostile_keys, data=st.binary(max_size=64))
    def check(key, data):
        for op in (lambda: store.put(key, data), lambda: store.put_if_absent(key, data),
                   lambda: store.get(key), lambda: store.head(key), lambda: store.get_range(key, 0, 1),
                   lambda: list(store.list(key)), lambda: store.delete(key), lambda: store.exists(key)):
            try:
                op()
            except TrainstoreError:
                pass

    check()
    after_outside = _tree(base) - {p for p in _tree(base) if p == "root" or p.startswith("root" + os.sep)}
    assert after_outside == before_outside, "a key created something outside the store root"
    assert (base / "sibling").read_text() == "keep"


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\\..\\b", "", "a\x00b",
                                 ".tmp.abc/x"])
def test_escaping_keys_are_rejected(tmp_path, key):
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(InvalidKeyError):
        store.put(key, b"x")
    mem = open_store("memory://hostile-keys")
    if not key.startswith(".tmp."):  # the temp prefix is reserved by local stores only
        with pytest.raises(InvalidKeyError):
            mem.put(key, b"x")


def test_fuzzed_store_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a bare string opens a local directory: keep it in tmp
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    schemes = st.sampled_from(["", "s3://", "gs://", "az://", "memory://", "file://", "http://", "S3://",
                               "s3:/", "ftp://", "s3://bucket", "s3:///", "file:///"])

    @FUZZ
    @given(scheme=schemes, rest=st.text(max_size=40), opts=st.dictionaries(
        st.sampled_from(["endpoint", "region", "allow_http", "max_retries", "timeout_s", "fsync", "bogus",
                         "access_key_id", "secret_access_key"]),
        st.one_of(st.text(max_size=20), st.integers(-5, 5), st.booleans(), st.none(), st.floats()), max_size=3))
    def check(scheme, rest, opts):
        if scheme.startswith("s3") and "access_key_id" not in opts:
            opts = {**opts, "access_key_id": "id", "secret_access_key": "secret"}  # get past the credential check
        try:
            store = open_store(scheme + rest, **opts)
        except TrainstoreError:
            return
        store.close()

    check()


@FUZZ
@given(obj=json_values)
def test_fuzzed_chunk_refs(obj):
    try:
        ChunkRef.from_json(obj)
    except TrainstoreError:
        pass


_VALID_HASH = "ab" * 32


@FUZZ
@given(i=st.integers(0, 4), value=st.one_of(nasty_values, json_values))
def test_near_valid_chunk_refs(i, value):
    ref = [_VALID_HASH, "zstd", 10, 12, 4]
    ref[i] = value
    try:
        parsed = ChunkRef.from_json(ref)
    except TrainstoreError:
        return
    assert parsed.size >= 0 and parsed.stored >= 0


def _valid_manifest() -> dict:
    import pyarrow as pa

    from trainstore.data.versions import DatasetVersion, ShardInfo

    v = DatasetVersion(name="ds", version=1, layout="parquet", schema=pa.schema([("x", pa.int64())]),
                       shards=(ShardInfo("datasets/ds/shards/a.parquet", 10, 100, "00" * 32),))
    return v.to_json()


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@FUZZ
@given(data=st.data(), value=st.one_of(nasty_values, json_values))
def test_fuzzed_dataset_manifests(data, value):
    from trainstore.data.versions import DatasetVersion

    manifest = _valid_manifest()
    paths = [p for p in _paths(manifest) if p]
    path = data.draw(st.sampled_from(paths))
    target = manifest
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    try:
        DatasetVersion.from_json(manifest, where="fuzz")
    except TrainstoreError:
        pass
    try:
        DatasetVersion.from_json(value, where="fuzz")
    except TrainstoreError:
        pass


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                     st.sampled_from([b"[" * 100_000, b'{"a":' * 50_000, b"1e999999", b"\xff\xfe"])))
def test_garbage_manifest_bytes(raw):
    from trainstore.data.versions import load_version

    store = open_store("memory://hostile-manifests")
    store.put("datasets/ds/versions/000001.json", raw)
    try:
        load_version(store, "ds", 1)
    except TrainstoreError:
        pass


def test_fuzzed_cli_arguments(tmp_path, monkeypatch):
    """Random arguments to the CLI: exit 0/1/2 with a message, never a traceback."""
    from typer.testing import CliRunner

    from trainstore.cli.main import app

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    words = st.sampled_from(["store", "ls", "du", "ckpt", "data", "--json", "--prefix", "-d", "--depth",
                             "memory://x", "s3://b/p", "../..", "-1", "abc", "--endpoint", "http://127.0.0.1:1",
                             "--help", "", "\x00"]) | st.text(alphabet=string.printable, max_size=12)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(args=st.lists(words, max_size=6))
    def check(args):
        result = runner.invoke(app, args, catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"args {args!r} raised {result.exception!r}") from result.exception
        assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)

    check()


SECRET = "SuperSecret-Key/Do-Not-Leak+42"


def test_credentials_never_leak(s3_server, caplog, tmp_path, monkeypatch):
    """Open S3 stores with a recognisable secret, cause every kind of error, and look for
    the secret in messages, reprs, chained exceptions, logs and CLI output."""
    caplog.set_level(logging.DEBUG)
    opts = {**s3_server.options(), "secret_access_key": SECRET, "max_retries": 1, "timeout_s": 1.0,
            "retry_timeout_s": 3.0, "connect_timeout_s": 0.5}
    texts: list[str] = []
    stores = [
        open_store("s3://no-such-bucket-xyz/p", **opts),
        open_store("s3://no-such-bucket-xyz/p", **{**opts, "endpoint": "http://127.0.0.1:9"}),
    ]
    for store in stores:
        texts += [repr(store), str(store), repr(vars(store))]
        for call in (lambda: store.get("k"), lambda: store.put("k", b"x"), lambda: store.put_if_absent("k", b"x"),
                     lambda: list(store.list("")), lambda: store.head("k"), lambda: store.delete("k"),
                     lambda: store.get("../x")):
            try:
                call()
            except TrainstoreError as exc:
                chain = exc
                while chain is not None:
                    texts += [str(chain), repr(chain)]
                    chain = chain.__context__ or chain.__cause__
            else:
                raise AssertionError("an operation on a missing bucket succeeded")
    from trainstore.store import S3Options
    texts.append(repr(S3Options(secret_access_key=SECRET, access_key_id="id")))
    # CLI: the secret comes from the environment; errors must not echo it.
    from typer.testing import CliRunner

    from trainstore.cli.main import app

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    result = CliRunner().invoke(app, ["store", "ls", "s3://no-such-bucket-xyz/p", "--endpoint", s3_server.endpoint])
    texts.append(result.output)
    texts.append(caplog.text)
    leaked = [t for t in texts if SECRET in t or "SuperSecret" in t]
    assert not leaked, leaked[:3]


def test_fuzzed_ingest_records(tmp_path):
    """Random records (types, nesting, keys) into one Ingestor: accepted rows or a
    TrainstoreError (SchemaError naming the record/field), never another exception."""
    from trainstore.data.ingest import IngestConfig, Ingestor

    ing = Ingestor(str(tmp_path / "store"), "fuzz", config=IngestConfig(wal_dir=str(tmp_path / "wal")))
    ing.write([{"id": 1, "text": "a", "score": 0.5}])  # fixes the schema
    values = st.one_of(nasty_values, json_values, st.binary(max_size=8))
    records = st.one_of(
        st.lists(st.dictionaries(st.sampled_from(["id", "text", "score", "extra", ""]), values, max_size=4),
                 max_size=5),
        values,
    )

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(batch=records)
    def check(batch):
        try:
            ing.write(batch)
        except TrainstoreError:
            pass

    try:
        check()
        ing.commit()
    finally:
        ing.close()
