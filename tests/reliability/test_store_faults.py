"""The store through a flaky network: every operation succeeds via bounded retries; a
permanent outage is a clear StoreUnavailableError within a bounded time; nothing
half-committed. Real moto S3 server behind the fault-injecting proxy."""

from __future__ import annotations

import os
import threading
import time

import pytest

from trainstore import open_store
from trainstore.errors import AlreadyExistsError, StoreUnavailableError
from trainstore.store import RetryOptions

from .conftest import record

pytestmark = pytest.mark.timeout(240)


def _workload(store, n_ops: int, seed: int) -> dict:
    """put / get / get_ranges / head / put_if_absent / list / delete, checked for content."""
    import random

    rng = random.Random(seed)
    expected: dict[str, bytes] = {}
    committed: set[str] = set()
    for i in range(n_ops):
        op = rng.choice(["put", "put", "get", "ranges", "head", "pia", "list", "delete"])
        if op == "put" or not expected:
            key = f"obj/{rng.randrange(20):02d}"
            data = os.urandom(rng.choice([1, 100, 5000, 70_000]))
            store.put(key, data)
            expected[key] = data
        elif op == "get":
            key = rng.choice(sorted(expected))
            assert bytes(store.get(key)) == expected[key], key
        elif op == "ranges":
            key = rng.choice(sorted(expected))
            data = expected[key]
            ranges = [(0, min(3, len(data))), (len(data) // 2, len(data) - len(data) // 2)]
            got = store.get_ranges(key, ranges)
            assert [bytes(g) for g in got] == [data[s:s + n] for s, n in ranges], key
        elif op == "head":
            key = rng.choice(sorted(expected))
            assert store.head(key).size == len(expected[key])
        elif op == "pia":
            key = f"manifest/{i:05d}.json"
            data = f'{{"step": {i}}}'.encode()
            store.put_if_absent(key, data)  # must win: nobody else writes this key
            committed.add(key)
            expected[key] = data
            with pytest.raises(AlreadyExistsError):
                store.put_if_absent(key, b"another writer's bytes")
        elif op == "list":
            keys = {m.key for m in store.list("")}
            assert keys == set(expected), sorted(keys ^ set(expected))
        elif op == "delete":
            key = rng.choice(sorted(expected))
            store.delete(key)
            del expected[key]
            committed.discard(key)
    # Final state is exactly what was acknowledged.
    assert {m.key for m in store.list("")} == set(expected)
    for key, data in expected.items():
        assert bytes(store.get(key)) == data
    return {"ops": n_ops}


def _run_flaky(fault_proxy, flaky_s3, n_ops: int, seed: int) -> dict:
    url, opts = flaky_s3
    store = open_store(url, **opts)
    fault_proxy.configure(rate=0.1, seed=seed)
    t0 = time.monotonic()
    _workload(store, n_ops, seed)
    elapsed = time.monotonic() - t0
    fault_proxy.configure(rate=0.0)
    counts = fault_proxy.counts
    assert fault_proxy.injected > 0, "the proxy injected nothing: the test would prove nothing"
    return {"ops": n_ops, "requests": fault_proxy.requests, "faults": counts,
            "injected": fault_proxy.injected, "seconds": round(elapsed, 1)}


def test_store_ops_survive_faults(fault_proxy, flaky_s3):
    figures = _run_flaky(fault_proxy, flaky_s3, n_ops=150, seed=7)
    # Every fault kind was exercised at least once across the run.
    kinds = {k.split("-")[0] for k in figures["faults"]}
    assert {"500", "503", "reset"} <= kinds, figures
    record("store_faults", **figures)


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_store_ops_survive_faults_stress(fault_proxy, flaky_s3):
    figures = _run_flaky(fault_proxy, flaky_s3, n_ops=1000, seed=11)
    assert {"500", "503", "reset", "stall", "truncate"} <= {k.split("-")[0] for k in figures["faults"]}
    record("store_faults_stress", **figures)


@pytest.mark.parametrize("fault", ["reset", "stall", "truncate"])
def test_put_if_absent_lost_response_is_own_win(fault_proxy, flaky_s3, fault):
    """The PUT reaches the server, the answer is lost: the retry sees the key taken by
    its own bytes, which is a win; different bytes stay an AlreadyExistsError."""
    url, opts = flaky_s3
    store = open_store(url, **opts)
    fault_proxy.configure(rate=1.0, faults=(fault,), after_share=1.0, methods=frozenset({"PUT"}))
    _heal_after(fault_proxy, 1)
    meta = store.put_if_absent("commit/000001.json", b'{"mine": 1}')
    assert meta.size == len(b'{"mine": 1}')
    assert bytes(store.get("commit/000001.json")) == b'{"mine": 1}'
    # Now a different writer's payload arrives after a lost response: not a win.
    store.put("other/seed", b"x")
    fault_proxy.configure(rate=1.0, faults=(fault,), after_share=1.0, methods=frozenset({"PUT"}))
    _heal_after(fault_proxy, 1)
    with pytest.raises(AlreadyExistsError):
        store.put_if_absent("commit/000001.json", b'{"theirs": 2}')
    assert bytes(store.get("commit/000001.json")) == b'{"mine": 1}'


def _heal_after(proxy, n: int) -> None:
    """Turn faults off once ``n`` more requests arrived (one injected fault)."""
    start = proxy.injected

    def heal():
        deadline = time.monotonic() + 30
        while proxy.injected < start + n and time.monotonic() < deadline:
            time.sleep(0.002)
        proxy.configure(rate=0.0)

    threading.Thread(target=heal, daemon=True).start()


@pytest.mark.parametrize("fault", ["reset", "stall"])
def test_delete_and_list_are_retried(fault_proxy, flaky_s3, fault):
    url, opts = flaky_s3
    store = open_store(url, **opts)
    for i in range(3):
        store.put(f"k/{i}", b"v")
    fault_proxy.configure(rate=1.0, faults=(fault,), methods=frozenset({"POST", "DELETE"}))
    _heal_after(fault_proxy, 1)
    store.delete("k/0")
    fault_proxy.configure(rate=1.0, faults=("truncate",), methods=frozenset({"GET"}))
    _heal_after(fault_proxy, 1)
    assert sorted(m.key for m in store.list("k/")) == ["k/1", "k/2"]


@pytest.mark.parametrize("mode", ["reset", "stall"])
def test_permanent_outage_is_clear_and_bounded(fault_proxy, flaky_s3, mode):
    """Every operation fails with StoreUnavailableError within a bound derived from the
    retry settings; a put_if_absent that failed left nothing committed."""
    url, opts = flaky_s3
    retry = RetryOptions(max_retries=2, retry_timeout_s=3.0, init_backoff_s=0.05,
                         max_backoff_s=0.3, timeout_s=0.4, connect_timeout_s=0.4)
    store = open_store(url, **{**opts, "retry": retry})
    store.put("exists", b"data")
    fault_proxy.outage = mode
    # Bound: no retry starts after retry_timeout_s; the last attempt may itself take
    # (retries + 1) timeouts plus the backoff sleeps; one second of slack.
    bound = (retry.retry_timeout_s + (retry.max_retries + 1) * retry.timeout_s
             + retry.max_retries * retry.max_backoff_s + 1)
    times = {}
    for name, call in [
        ("get", lambda: store.get("exists")),
        ("head", lambda: store.head("exists")),
        ("put", lambda: store.put("new", b"x")),
        ("put_if_absent", lambda: store.put_if_absent("manifest.json", b"{}")),
        ("list", lambda: list(store.list(""))),
        ("delete", lambda: store.delete("exists")),
    ]:
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            call()
        times[name] = round(time.monotonic() - t0, 2)
        assert times[name] < bound, (name, times[name], bound)
        assert url.split("/")[2] in str(info.value)  # names the bucket
    fault_proxy.outage = False
    keys = {m.key for m in store.list("")}
    assert "manifest.json" not in keys and "new" not in keys
    record(f"outage_{mode}", seconds_to_error=times, bound_s=bound,
           retry={"max_retries": retry.max_retries, "timeout_s": retry.timeout_s})
