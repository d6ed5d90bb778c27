"""Shared fixtures: a real S3-protocol server (moto) on 127.0.0.1, and store factories; and
``require``: the one way a test depends on an optional package or program."""

from __future__ import annotations

import importlib
import os
import uuid
from types import ModuleType

import pytest


def in_ci() -> bool:
    """CI runs every test (``.ci/run`` sets ``CI=1``): a missing dependency fails there."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _missing(what: str, install: str) -> None:
    msg = f"{what} is not installed; install it with: {install}"
    if in_ci():
        pytest.fail(f"{msg} (CI must run every test: `make venv` / `make test` should install it)", pytrace=False)
    pytest.skip(msg, allow_module_level=True)


def require(module: str, *, install: str) -> ModuleType:
    """Import an optional package for a test: locally a visible skip naming ``install`` when it
    is missing, in CI a failure (a test never skips silently there)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        _missing(f"the Python package {module!r}", install)
        raise  # unreachable: skip/fail raise


def require_program(name: str, path: str | None, *, install: str) -> str:
    """``path`` of a program a test needs (found by the caller), with ``require``'s behaviour
    when it is None."""
    if path is None:
        _missing(f"the program {name!r}", install)
    assert path is not None
    return path

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
