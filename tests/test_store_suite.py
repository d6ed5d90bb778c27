"""Runs the shared store contract (tests/store_suite.py) on every backend: a local
directory, memory:// and s3:// against the moto server on 127.0.0.1."""

from __future__ import annotations

import pytest
from store_suite import StorePropertySuite, StoreSuite


@pytest.fixture
def store(any_store):
    return any_store


class TestStoreContract(StoreSuite):
    pass


class TestStoreProperties(StorePropertySuite):
    pass


class _PrefixSegmentStore:
    """A memory store whose list() has the classic bug: prefixes match whole segments only."""

    def __new__(cls, inner):
        class Buggy(type(inner)):
            def list(self, prefix=""):
                for m in super().list(prefix):
                    if not prefix or m.key == prefix or m.key.startswith(prefix.rstrip("/") + "/"):
                        yield m

        obj = Buggy.__new__(Buggy)
        obj.__dict__.update(inner.__dict__)
        return obj


def test_dict_model_catches_a_buggy_store():
    """The property test is not vacuous: a store with segment-only prefixes fails it."""
    import uuid

    from store_suite import run_dict_model

    from trainstore import open_store

    buggy = _PrefixSegmentStore(open_store(f"memory://{uuid.uuid4().hex}"))
    with pytest.raises(AssertionError):
        run_dict_model(buggy, max_examples=100, steps=20, derandomize=True)
