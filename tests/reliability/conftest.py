"""Fixtures of the reliability suite: a fault-injecting proxy in front of the S3 server,
fast retry settings, and the trial counts of the short (make test) and long (make stress)
runs."""

from __future__ import annotations

import uuid

import pytest

from trainstore.store import RetryOptions

#: Client settings for fault tests: short timeouts so a stall costs ~1 s, enough retries
#: that ten percent of failing requests practically never exhaust them (0.1**7).
FAST_RETRY = RetryOptions(
    max_retries=6, retry_timeout_s=30.0, init_backoff_s=0.02, max_backoff_s=0.3,
    timeout_s=1.0, connect_timeout_s=1.0,
)
#: The proxy stalls longer than the client timeout.
STALL_S = 1.5


@pytest.fixture
def fault_proxy(s3_server):
    """A FaultProxy (10% faults, seeded per test) in front of the session's S3 server."""
    from harness.faultproxy import FaultConfig, FaultProxy

    proxy = FaultProxy(s3_server.endpoint, FaultConfig(rate=0.0, seed=1234, stall_s=STALL_S),
                       max_lifetime_s=600)
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def flaky_s3(s3_server, fault_proxy):
    """(url, options) of a fresh bucket reached through the fault proxy (faults off until
    the test turns them on with ``fault_proxy.configure(rate=0.1)``)."""
    bucket = f"rel-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/rel", {**fault_proxy.options(s3_server.options()), "retry": FAST_RETRY}


def record(name: str, **figures: object) -> None:
    """Append one result line (JSON) to $TRAINSTORE_RELIABILITY_OUT, if set, and print it.

    ``make stress`` runs set it; docs/reliability.md is written from those lines."""
    import json
    import os
    import time

    line = json.dumps({"test": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **figures}, default=str)
    print(f"[reliability] {line}")
    path = os.environ.get("TRAINSTORE_RELIABILITY_OUT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@pytest.fixture
def small_fs(tmp_path):
    """An 8 MiB filesystem (tmpfs mounted here when running as root), else None: tests then
    fall back to a per-process file-size limit (RLIMIT_FSIZE) in a subprocess."""
    import os
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or os.environ.get("TRAINSTORE_TEST_NO_TMPFS"):
        yield None
        return
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        yield None
        return
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
