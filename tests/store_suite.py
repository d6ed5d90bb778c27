"""The one store test suite every backend passes (zarr-python style).

``StoreSuite`` holds the contract tests; a test module subclasses it and provides a ``store``
fixture (``tests/test_store_suite.py`` runs it over local, memory:// and s3:// on moto).
A new backend gets the whole contract by adding one fixture parameter.
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trainstore.errors import (
    AlreadyExistsError,
    ConfigError,
    IntegrityError,
    InvalidKeyError,
    NotFoundError,
    TrainstoreError,
)
from trainstore.store import ObjectMeta, Store

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

# Keys whose directory parts ("d0", "d1") never equal a leaf name ("f0".."f3"): a local
# store cannot hold both "x" and "x/y" (see LocalStore), object stores can.
_LEAVES = ["f0", "f1", "f2", "f3"]
_DIRS = ["d0", "d1", "d0/d1"]
MODEL_KEYS = _LEAVES + [f"{d}/{f}" for d in _DIRS for f in _LEAVES]


def as_bytes(buf: object) -> bytes:
    return bytes(memoryview(buf))  # type: ignore[arg-type]


class StoreSuite:
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


# -- property test: the store behaves like a dict ------------------------------------------

_values = st.binary(max_size=64)
_keys = st.sampled_from(MODEL_KEYS)
_prefixes = st.sampled_from(["", "f", "f1", "d", "d0", "d0/", "d0/f", "d0/d1", "d0/d1/", "d1/f2", "x"])


class DictModel(RuleBasedStateMachine):
    """Random sequences of store calls, checked against a plain dict after every step."""

    store: Store  # set by make_model_test

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, bytes] = {}
        for meta in list(self.store.list("")):
            self.store.delete(meta.key)

    @rule(key=_keys, value=_values)
    def put(self, key: str, value: bytes) -> None:
        assert self.store.put(key, value).size == len(value)
        self.model[key] = value

    @rule(key=_keys, value=_values)
    def put_if_absent(self, key: str, value: bytes) -> None:
        if key in self.model:
            with pytest.raises(AlreadyExistsError):
                self.store.put_if_absent(key, value)
        else:
            self.store.put_if_absent(key, value)
            self.model[key] = value

    @rule(key=_keys)
    def delete(self, key: str) -> None:
        self.store.delete(key)
        self.model.pop(key, None)

    @rule(key=_keys)
    def get(self, key: str) -> None:
        if key in self.model:
            assert as_bytes(self.store.get(key)) == self.model[key]
            assert self.store.head(key).size == len(self.model[key])
        else:
            with pytest.raises(NotFoundError):
                self.store.get(key)
            assert not self.store.exists(key)

    @rule(key=_keys, start=st.integers(0, 70), length=st.integers(0, 70))
    def get_range(self, key: str, start: int, length: int) -> None:
        if key not in self.model:
            with pytest.raises(NotFoundError):
                self.store.get_range(key, start, length)
        elif length > 0 and start + length > len(self.model[key]):
            with pytest.raises(IntegrityError):
                self.store.get_range(key, start, length)
        else:
            assert as_bytes(self.store.get_range(key, start, length)) == self.model[key][start : start + length]

    @rule(prefix=_prefixes)
    def list_prefix(self, prefix: str) -> None:
        got = {m.key: m.size for m in self.store.list(prefix)}
        assert got == {k: len(v) for k, v in self.model.items() if k.startswith(prefix)}

    @invariant()
    def same_keys(self) -> None:
        assert sorted(m.key for m in self.store.list("")) == sorted(self.model)


def run_dict_model(store: Store, max_examples: int = 25, steps: int = 25, derandomize: bool = False) -> None:
    """Run the dict-model state machine against ``store`` (modest counts: S3 stays fast)."""
    machine = type("BoundDictModel", (DictModel,), {"store": store})
    test = machine.TestCase
    test.settings = settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=derandomize,
    )
    test().runTest()


class StorePropertySuite:
    """The dict-model property test, for the same ``store`` fixture."""

    def test_behaves_like_a_dict(self, store: Store) -> None:
        run_dict_model(store)
