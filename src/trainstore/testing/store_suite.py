"""The one store test suite every backend passes, shipped in the package (as zarr ships
``zarr.testing.store.StoreTests``).

``StoreSuite`` holds the contract tests (and, through ``StoreViewSuite``, capabilities,
tiers and the read-only view); ``StorePropertySuite`` the dict-model property test. A test
module subclasses them and provides a ``store`` fixture yielding an empty store::

    from trainstore.testing.store_suite import StorePropertySuite, StoreSuite

    class TestMyStore(StoreSuite, StorePropertySuite):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(tmp_path)

``tests/test_store_suite.py`` runs it over local, memory://, s3:// (moto) and tiered stores.
Needs the test extra (pytest, hypothesis, numpy).
"""

from __future__ import annotations

import threading
import time

import pytest

from trainstore.errors import (
    AlreadyExistsError,
    ConfigError,
    IntegrityError,
    InvalidKeyError,
    NotFoundError,
    TrainstoreError,
)
from trainstore.store import ObjectMeta, Store

from .store_model import MODEL_KEYS, StorePropertySuite, as_bytes, run_dict_model
from .store_views import StoreViewSuite

BAD_KEYS = [
    "",
    "/abs",
    "/",
    "..",
    "../x",
    "a/../../x",
    "a/..",
    ".",
    "./a",
    "a/./b",
    "a//b",
    "a/",
    "a\\b",
    "..\\x",
    "a\x00b",
    "a\nb",
    "a\x1fb",
    "a\x7fb",
    "x" * 1025,
]


class StoreSuite(StoreViewSuite):
    """Contract tests. Subclasses provide a ``store`` fixture yielding an empty ``Store``."""

    # -- get / put ---------------------------------------------------------------------------
    def test_put_get_roundtrip(self, store: Store) -> None:
        meta = store.put("a/b/c.bin", b"hello world")
        assert isinstance(meta, ObjectMeta)
        assert meta.key == "a/b/c.bin" and meta.size == 11
        assert as_bytes(store.get("a/b/c.bin")) == b"hello world"

    def test_put_accepts_buffer_protocol(self, store: Store) -> None:
        import numpy as np

        arr = np.arange(1000, dtype=np.float32)
        store.put("arr", arr)
        store.put("view", memoryview(b"xyz"))
        store.put("ba", bytearray(b"\x00\x01"))
        assert as_bytes(store.get("arr")) == arr.tobytes()
        assert as_bytes(store.get("view")) == b"xyz"
        assert as_bytes(store.get("ba")) == b"\x00\x01"

    def test_put_does_not_keep_the_callers_buffer(self, store: Store) -> None:
        # callers reuse buffers (checkpoint staging arenas): a later change must not leak in
        buf = bytearray(b"a" * 64)
        store.put("buf/one", buf)
        store.put_if_absent("buf/two", buf)
        buf[:] = b"b" * 64
        assert bytes(store.get("buf/one")) == b"a" * 64
        assert bytes(store.get("buf/two")) == b"a" * 64

    def test_empty_object(self, store: Store) -> None:
        store.put("empty", b"")
        assert as_bytes(store.get("empty")) == b""
        assert store.head("empty").size == 0
        assert [m.key for m in store.list("")] == ["empty"]

    def test_put_overwrites_atomically(self, store: Store) -> None:
        store.put("k", b"old contents")
        store.put("k", b"new")
        assert as_bytes(store.get("k")) == b"new"
        assert store.head("k").size == 3
        assert [m.key for m in store.list("")] == ["k"]

    def test_concurrent_overwrite_never_mixes(self, store: Store) -> None:
        """Readers racing writers see one complete version, never a mix or a torn object."""
        versions = [bytes([i]) * 200_000 for i in range(4)]
        store.put("obj", versions[0])
        stop = threading.Event()
        seen: list[bytes] = []
        errors: list[BaseException] = []

        def reader() -> None:
            while not stop.is_set():
                try:
                    seen.append(as_bytes(store.get("obj")))
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
                    return

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(1, 12):
                store.put("obj", versions[i % 4])
        finally:
            stop.set()
            t.join(30)
        assert not errors, errors
        assert seen
        for data in seen:
            assert data in versions

    def test_get_missing_is_not_found(self, store: Store) -> None:
        with pytest.raises(NotFoundError) as info:
            store.get("missing/key")
        assert "missing/key" in str(info.value)
        assert isinstance(info.value, FileNotFoundError)

    # -- ranges ------------------------------------------------------------------------------
    def test_get_range(self, store: Store) -> None:
        data = bytes(range(256)) * 4
        store.put("r", data)
        assert as_bytes(store.get_range("r", 0, 10)) == data[:10]
        assert as_bytes(store.get_range("r", 100, 200)) == data[100:300]
        assert as_bytes(store.get_range("r", 1014, 10)) == data[1014:]
        assert as_bytes(store.get_range("r", 5, 0)) == b""

    def test_get_ranges(self, store: Store) -> None:
        data = bytes(range(256)) * 64
        store.put("r", data)
        ranges = [(0, 1), (10, 100), (5000, 3000), (10, 100), (16383, 1), (7, 0)]
        got = store.get_ranges("r", ranges)
        assert [as_bytes(g) for g in got] == [data[s : s + n] for s, n in ranges]
        assert store.get_ranges("r", []) == []

    def test_get_range_past_end_is_integrity_error(self, store: Store) -> None:
        store.put("r", b"0123456789")
        with pytest.raises(IntegrityError):
            store.get_range("r", 5, 10)
        with pytest.raises(IntegrityError):
            store.get_range("r", 20, 1)

    def test_get_range_bad_arguments(self, store: Store) -> None:
        store.put("r", b"0123456789")
        with pytest.raises(ConfigError):
            store.get_range("r", -1, 2)
        with pytest.raises(ConfigError):
            store.get_range("r", 0, -2)

    def test_get_range_missing(self, store: Store) -> None:
        with pytest.raises(NotFoundError):
            store.get_range("nope", 0, 1)

    # -- put_if_absent -----------------------------------------------------------------------
    def test_put_if_absent(self, store: Store) -> None:
        meta = store.put_if_absent("m/manifest.json", b"first")
        assert meta.size == 5
        with pytest.raises(AlreadyExistsError) as info:
            store.put_if_absent("m/manifest.json", b"second")
        assert "m/manifest.json" in str(info.value)
        assert isinstance(info.value, FileExistsError)
        assert as_bytes(store.get("m/manifest.json")) == b"first"

    def test_large_objects(self, store: Store) -> None:
        """Past obstore's 5 MiB multipart threshold: put, conditional create, ranges."""
        big = bytes(range(256)) * (24 * 1024 + 7)  # ~6 MiB
        store.put("big/a", big)
        store.put_if_absent("big/b", big)
        with pytest.raises(AlreadyExistsError):
            store.put_if_absent("big/b", big[:100])
        assert as_bytes(store.get("big/a")) == big and store.head("big/b").size == len(big)
        assert as_bytes(store.get_range("big/b", len(big) - 10, 10)) == big[-10:]

    def test_put_if_absent_after_delete(self, store: Store) -> None:
        store.put_if_absent("k", b"1")
        store.delete("k")
        store.put_if_absent("k", b"2")
        assert as_bytes(store.get("k")) == b"2"

    def test_put_if_absent_race_exactly_one_wins(self, store: Store) -> None:
        n = 8
        barrier = threading.Barrier(n)
        winners: list[int] = []
        losers: list[BaseException] = []
        lock = threading.Lock()

        def contend(i: int) -> None:
            barrier.wait()
            try:
                store.put_if_absent("race/commit", f"writer-{i}".encode() * 1000)
            except BaseException as exc:  # noqa: BLE001 - classified below
                with lock:
                    losers.append(exc)
            else:
                with lock:
                    winners.append(i)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(winners) == 1, (winners, losers)
        assert len(losers) == n - 1
        assert all(isinstance(e, AlreadyExistsError) for e in losers), losers
        assert as_bytes(store.get("race/commit")) == f"writer-{winners[0]}".encode() * 1000
        assert [m.key for m in store.list("race/")] == ["race/commit"]

    # -- head / exists -----------------------------------------------------------------------
    def test_head(self, store: Store) -> None:
        before = time.time()
        store.put("h/obj", b"x" * 1234)
        meta = store.head("h/obj")
        assert meta.key == "h/obj" and meta.size == 1234
        assert meta.etag
        assert meta.mtime is not None and meta.mtime > before - 3600
        with pytest.raises(NotFoundError):
            store.head("h/nope")

    def test_etag_changes_on_overwrite(self, store: Store) -> None:
        store.put("e", b"one")
        first = store.head("e").etag
        store.put("e", b"two-two")
        assert store.head("e").etag != first

    def test_exists(self, store: Store) -> None:
        assert not store.exists("x")
        store.put("x", b"1")
        assert store.exists("x")
        assert not store.exists("x2")
        store.delete("x")
        assert not store.exists("x")

    # -- list --------------------------------------------------------------------------------
    def test_list_prefix_is_plain_string_prefix(self, store: Store) -> None:
        all_keys = ["a/b", "a/bc", "a/bd/c", "a/bd/e/f", "ab", "b/a", "a/x"]
        for key in all_keys:
            store.put(key, key.encode())

        def keys(prefix: str) -> list[str]:
            return sorted(m.key for m in store.list(prefix))

        assert keys("") == sorted(all_keys)
        assert keys("a/b") == ["a/b", "a/bc", "a/bd/c", "a/bd/e/f"]
        assert keys("a/bd/") == ["a/bd/c", "a/bd/e/f"]
        assert keys("a/bd") == ["a/bd/c", "a/bd/e/f"]
        assert keys("a") == ["a/b", "a/bc", "a/bd/c", "a/bd/e/f", "a/x", "ab"]
        assert keys("a/") == ["a/b", "a/bc", "a/bd/c", "a/bd/e/f", "a/x"]
        assert keys("a/bd/e/") == ["a/bd/e/f"]
        assert keys("zzz") == []
        assert keys("nope/deeper/") == []

    def test_list_reports_sizes(self, store: Store) -> None:
        store.put("s/one", b"1")
        store.put("s/three", b"333")
        assert {m.key: m.size for m in store.list("s/")} == {"s/one": 1, "s/three": 3}

    def test_list_many(self, store: Store) -> None:
        for i in range(120):
            store.put(f"many/{i:04d}", b"x")
        assert sorted(m.key for m in store.list("many/")) == [f"many/{i:04d}" for i in range(120)]

    # -- delete ------------------------------------------------------------------------------
    def test_delete_is_idempotent(self, store: Store) -> None:
        store.put("d/k", b"1")
        store.delete("d/k")
        store.delete("d/k")
        store.delete("never/existed")
        assert not store.exists("d/k")
        assert list(store.list("d/")) == []

    # -- keys --------------------------------------------------------------------------------
    @pytest.mark.parametrize("bad", BAD_KEYS)
    def test_bad_keys_rejected(self, store: Store, bad: str) -> None:
        for call in (
            lambda: store.get(bad),
            lambda: store.get_range(bad, 0, 1),
            lambda: store.put(bad, b"x"),
            lambda: store.put_if_absent(bad, b"x"),
            lambda: store.head(bad),
            lambda: store.delete(bad),
            lambda: store.exists(bad),
        ):
            with pytest.raises(InvalidKeyError) as info:
                call()
            assert isinstance(info.value, ValueError)
        assert list(store.list("")) == []

    @pytest.mark.parametrize("bad", [None, 3, b"bytes"])
    def test_non_string_keys_rejected(self, store: Store, bad: object) -> None:
        with pytest.raises(InvalidKeyError):
            store.put(bad, b"x")  # type: ignore[arg-type]

    @pytest.mark.parametrize("bad", ["/a", "../", "a//", "a\\"])
    def test_bad_list_prefix_rejected(self, store: Store, bad: str) -> None:
        with pytest.raises(InvalidKeyError):
            list(store.list(bad))

    def test_unusual_but_valid_keys(self, store: Store) -> None:
        keys = ["with space", "unicodé/ключ", "dots.in.name", "a-b_c=d", "...x", "x..", "%41"]
        for key in keys:
            store.put(key, key.encode())
        for key in keys:
            assert as_bytes(store.get(key)) == key.encode()
        assert sorted(m.key for m in store.list("")) == sorted(keys)

    def test_errors_are_trainstore_errors(self, store: Store) -> None:
        for call in (lambda: store.get("nope"), lambda: store.put("..", b""),
                     lambda: store.get_range("nope", 0, 1)):
            with pytest.raises(TrainstoreError):
                call()


__all__ = ["BAD_KEYS", "MODEL_KEYS", "StorePropertySuite", "StoreSuite", "StoreViewSuite", "as_bytes",
           "run_dict_model"]
