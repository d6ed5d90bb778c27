"""Bad input gets a clear error from the TrainstoreError hierarchy, in bounded time."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest

import trainstore.errors as E
from trainstore import open_store
from trainstore.chunks import ChunkStore
from trainstore.store import RetryOptions
from trainstore.testing.s3server import free_port

FAST_RETRY = RetryOptions(max_retries=2, retry_timeout_s=3.0, init_backoff_s=0.05, max_backoff_s=0.2,
                          timeout_s=1.0, connect_timeout_s=1.0)
CREDS = {"access_key_id": "k", "secret_access_key": "s"}

# (class, the built-in it must also be)
HIERARCHY = [
    (E.ConfigError, ValueError), (E.InvalidKeyError, ValueError), (E.NotFoundError, FileNotFoundError),
    (E.AlreadyExistsError, FileExistsError), (E.ConflictError, RuntimeError),
    (E.IntegrityError, ValueError), (E.ChunkCorruptError, E.IntegrityError),
    (E.ManifestError, E.IntegrityError), (E.StoreError, OSError),
    (E.StoreUnavailableError, ConnectionError), (E.StoreUnavailableError, E.StoreError),
    (E.CredentialsError, PermissionError), (E.CapacityError, E.StoreError),
    (E.UnsupportedTypeError, TypeError), (E.SchemaError, ValueError),
    (E.NoValidCheckpointError, E.NotFoundError), (E.BackgroundError, RuntimeError),
    (E.DistributedError, RuntimeError),
]


@pytest.mark.parametrize("cls,builtin", HIERARCHY, ids=lambda c: getattr(c, "__name__", str(c)))
def test_every_class_is_a_trainstore_error_and_its_builtin(cls, builtin):
    assert issubclass(cls, E.TrainstoreError)
    assert issubclass(cls, builtin)
    exc = cls("message")
    assert str(exc) == "message"


def test_every_class_also_inherits_a_builtin():
    """Classes added later keep the invariant: each one is also a specific built-in."""
    classes = [c for c in vars(E).values() if isinstance(c, type) and issubclass(c, E.TrainstoreError)]
    assert len(classes) >= len(HIERARCHY)
    for cls in classes:
        if cls is E.TrainstoreError:
            continue
        builtins = [b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (Exception, BaseException, object)]
        assert builtins, f"{cls.__name__} inherits no specific built-in exception"


@pytest.mark.parametrize("url", ["ftp://host/x", "http://127.0.0.1/x", "hdfs://nn/x", "s3:/bucket",
                                 "s3:bucket", "memory:x", ""])
def test_unknown_or_malformed_url(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(E.ConfigError) as info:
        open_store(url)
    assert isinstance(info.value, ValueError)
    assert list(tmp_path.iterdir()) == []  # no stray local directory named like the URL


def test_bad_options():
    with pytest.raises(E.ConfigError, match="unknown options"):
        open_store("s3://bucket/x", endpointt="http://x", **CREDS)
    with pytest.raises(E.ConfigError, match="unknown options"):
        open_store("memory://x", region="eu")
    with pytest.raises(E.ConfigError, match="retry"):
        open_store("s3://bucket/x", retry={"max_retries": 1}, **CREDS)
    with pytest.raises(E.ConfigError, match="no bucket"):
        open_store("s3:///x", **CREDS)
    with pytest.raises(E.ConfigError, match="allow_http"):
        open_store("s3://b/x", endpoint="http://127.0.0.1:1", allow_http=False, **CREDS)
    with pytest.raises(E.InvalidKeyError):
        open_store("s3://b/../x", **CREDS)


def test_bad_key():
    store = open_store(f"memory://{uuid.uuid4().hex}")
    with pytest.raises(E.InvalidKeyError, match=r"'\.\.'"):
        store.put("a/../../b", b"x")
    with pytest.raises(E.InvalidKeyError, match="absolute"):
        store.get("/etc/passwd")


def test_missing_bucket(s3_server):
    store = open_store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p", **s3_server.options())
    for call in (lambda: store.get("k"), lambda: store.put("k", b"x"), lambda: store.put_if_absent("k", b"x"),
                 lambda: list(store.list("")), lambda: store.delete("k"),
                 lambda: store.get_range("k", 0, 1)):
        with pytest.raises(E.NotFoundError, match="bucket .* does not exist"):
            call()
    # S3 answers HEAD with a bare 404, so a missing bucket looks like a missing object there.
    with pytest.raises(E.NotFoundError):
        store.head("k")


def test_missing_credentials(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(var, raising=False)
    started = time.monotonic()
    with pytest.raises(E.CredentialsError) as info:
        open_store("s3://bucket/prefix", endpoint="http://127.0.0.1:9")
    assert time.monotonic() - started < 2  # decided locally, no metadata-endpoint probing
    assert isinstance(info.value, PermissionError)
    assert "AWS_ACCESS_KEY_ID" in str(info.value)
    with pytest.raises(E.CredentialsError):
        open_store("s3://bucket/prefix", access_key_id="only-the-id")
    # Credentials from the environment are picked up.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    assert open_store("s3://bucket/prefix").url == "s3://bucket/prefix"
    # Anonymous access to a public bucket needs none.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    open_store("s3://bucket/prefix", skip_signature=True)


def test_credentials_never_in_repr():
    store = open_store("s3://bucket/p", access_key_id="AKIDSECRETID", secret_access_key="TOPSECRET")
    assert "TOPSECRET" not in repr(store) and "TOPSECRET" not in store.url
    from trainstore.store import S3Options

    assert "TOPSECRET" not in repr(S3Options(secret_access_key="TOPSECRET"))


def test_corrupted_chunk():
    chunks = ChunkStore(open_store(f"memory://{uuid.uuid4().hex}"))
    ref = chunks.put(b"weights" * 1000, codec="shuffle-zstd", itemsize=4).ref
    blob = bytearray(memoryview(chunks.store.get(ref.key())))
    blob[len(blob) // 2] ^= 0xFF
    chunks.store.put(ref.key(), blob)
    with pytest.raises(E.ChunkCorruptError) as info:
        chunks.get(ref)
    assert ref.key() in str(info.value)
    assert isinstance(info.value, E.IntegrityError) and isinstance(info.value, ValueError)


def _unreachable_store(port: int):
    return open_store("s3://bucket/p", endpoint=f"http://127.0.0.1:{port}", retry=FAST_RETRY, **CREDS)


def _ops(store):
    return {
        "get": lambda: store.get("k"),
        "put": lambda: store.put("k", b"x" * 100),
        "put_if_absent": lambda: store.put_if_absent("k", b"x"),
        "head": lambda: store.head("k"),
        "list": lambda: list(store.list("")),
        "get_range": lambda: store.get_range("k", 0, 1),
        "delete": lambda: store.delete("k"),
    }


def test_unreachable_endpoint_fails_fast_and_clearly():
    store = _unreachable_store(free_port())  # nothing listens there: connection refused
    for name, call in _ops(store).items():
        started = time.monotonic()
        with pytest.raises(E.StoreUnavailableError) as info:
            call()
        elapsed = time.monotonic() - started
        assert elapsed < 10, (name, elapsed)
        assert "s3://bucket/p" in str(info.value) and isinstance(info.value, ConnectionError)


def test_silent_endpoint_times_out():
    """An endpoint that accepts connections and never answers: bounded by timeout_s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_hold() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept_and_hold, daemon=True)
    t.start()
    try:
        store = _unreachable_store(port)
        for name in ("get", "put"):
            started = time.monotonic()
            with pytest.raises(E.StoreUnavailableError):
                _ops(store)[name]()
            elapsed = time.monotonic() - started
            assert elapsed < 15, (name, elapsed)
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        listener.close()
