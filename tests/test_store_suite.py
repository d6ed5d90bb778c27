"""Runs the shared store contract (``trainstore.testing.store_suite``) on every backend: a
local directory, memory://, s3:// against the moto server on 127.0.0.1, and tiered stores
(write-through over memory:// and s3://, write-back as the checkpoint hot tier uses it, and
with an archive tier), plus read-only views of them."""

from __future__ import annotations

import uuid

import pytest

from trainstore import open_store
from trainstore.store import TieredStore
from trainstore.testing.store_suite import StorePropertySuite, StoreSuite, run_dict_model

TIERED = ["tiered", "tiered-s3", "tiered-write-back", "tiered-archive"]


def _tiered(kind: str, request, tmp_path) -> TieredStore:
    hot = open_store(str(tmp_path / "hot"))
    if kind == "tiered-s3":
        url, opts = request.getfixturevalue("s3_url")
        return TieredStore(hot, open_store(url, **opts))
    durable = open_store(f"memory://{uuid.uuid4().hex}")
    if kind == "tiered-write-back":
        return TieredStore(hot, durable, write_back=True)
    if kind == "tiered-archive":
        return TieredStore(hot, durable, open_store(f"memory://{uuid.uuid4().hex}"))
    return TieredStore(hot, durable)


@pytest.fixture(params=["local", "memory", "s3", *TIERED])
def store(request, tmp_path):
    """One empty store of each kind: the plain backends and the tiered variants."""
    if request.param == "local":
        s = open_store(str(tmp_path / "store"))
    elif request.param == "memory":
        s = open_store(f"memory://{uuid.uuid4().hex}")
    elif request.param == "s3":
        url, opts = request.getfixturevalue("s3_url")
        s = open_store(url, **opts)
    else:
        s = _tiered(request.param, request, tmp_path)
    yield s
    s.close()


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
    buggy = _PrefixSegmentStore(open_store(f"memory://{uuid.uuid4().hex}"))
    with pytest.raises(AssertionError):
        run_dict_model(buggy, max_examples=100, steps=20, derandomize=True)
