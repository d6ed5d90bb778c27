"""The dict-model property test of the store suite: random call sequences vs a plain dict.

``StorePropertySuite`` runs it on a ``store`` fixture; ``run_dict_model`` runs it on any
store (``tests/test_store_suite.py`` shows it catches a store whose ``list`` matches whole
path segments only).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trainstore.errors import AlreadyExistsError, IntegrityError, NotFoundError
from trainstore.store import Store

# Keys whose directory parts ("d0", "d1") never equal a leaf name ("f0".."f3"): a local
# store cannot hold both "x" and "x/y" (see LocalStore), object stores can.
_LEAVES = ["f0", "f1", "f2", "f3"]
_DIRS = ["d0", "d1", "d0/d1"]
MODEL_KEYS = _LEAVES + [f"{d}/{f}" for d in _DIRS for f in _LEAVES]


def as_bytes(buf: object) -> bytes:
    return bytes(memoryview(buf))  # type: ignore[arg-type]


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


__all__ = ["MODEL_KEYS", "DictModel", "StorePropertySuite", "as_bytes", "run_dict_model"]
