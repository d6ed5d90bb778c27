"""Shared fixtures: a real S3-protocol server (moto) on 127.0.0.1, and store factories."""

from __future__ import annotations

import os
import uuid

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server in a subprocess on an ephemeral loopback port, for the whole session."""
    from trainstore.testing.s3server import start_s3_server

    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_url(s3_server):
    """A fresh bucket on the loopback S3 server; returns (url, open_store options)."""
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/prefix", s3_server.options()


@pytest.fixture(params=["local", "memory", "s3"])
def any_store(request, tmp_path):
    """One store of each backend kind, empty."""
    from trainstore import open_store

    if request.param == "local":
        store = open_store(str(tmp_path / "store"))
    elif request.param == "memory":
        store = open_store(f"memory://{uuid.uuid4().hex}")
    else:
        url, opts = request.getfixturevalue("s3_url")
        store = open_store(url, **opts)
    yield store
    store.close()
