"""Disk full on the hot tier: a clear CapacityError, nothing half-committed (no partial
object visible, no temp file left), the previous objects intact."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from trainstore import open_store
from trainstore.errors import CapacityError
from trainstore.store.local import TEMP_PREFIX

pytestmark = pytest.mark.timeout(120)


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _check_full(root: str) -> None:
    store = open_store(root)
    store.put("keep/a.bin", b"a" * 1_000_000)
    store.put_if_absent("manifests/000001.json", b'{"step": 1}')
    before = _files(root)
    big = os.urandom(8 << 20)
    with pytest.raises(CapacityError) as info:
        store.put("chunks/big.bin", big)
    assert "chunks/big.bin" in str(info.value)
    with pytest.raises(CapacityError):
        store.put_if_absent("manifests/000002.json", big)
    with pytest.raises(CapacityError):
        store.put("keep/a.bin", big)  # replacing an object keeps the old one on failure
    after = _files(root)
    assert after == before, set(after) ^ set(before)
    assert not [f for f in after if os.path.basename(f).startswith(TEMP_PREFIX)]
    assert bytes(store.get("keep/a.bin")) == b"a" * 1_000_000
    assert not store.exists("chunks/big.bin") and not store.exists("manifests/000002.json")
    # Space freed -> writes work again.
    store.delete("keep/a.bin")
    store.put("chunks/small.bin", b"s" * 100_000)


def test_local_store_disk_full(small_fs, tmp_path):
    if small_fs is not None:
        _check_full(str(small_fs / "store"))
        return
    # Fallback: a 4 MiB file-size limit on a subprocess (EFBIG instead of ENOSPC).
    code = textwrap.dedent(f"""
        import resource, signal, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
        from reliability.test_disk_full import _check_full
        _check_full({str(tmp_path / "store")!r})
        print("OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-2000:]


def test_rlimit_fallback_maps_to_capacity_error(tmp_path):
    """EFBIG (a per-file size limit) is reported like a full disk."""
    code = textwrap.dedent(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        from trainstore import open_store
        from trainstore.errors import CapacityError
        s = open_store({str(tmp_path / "store")!r})
        try:
            s.put("x", b"0" * (2 << 20))
        except CapacityError as e:
            print("CAPACITY", e)
        print(sorted(__import__("os").listdir({str(tmp_path / "store")!r})))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "CAPACITY" in res.stdout, (res.stdout, res.stderr[-2000:])
    assert res.stdout.strip().endswith("[]"), res.stdout
