"""Disk full on the hot tier: a clear CapacityError, nothing half-committed (no partial
object visible, no temp file left), the previous objects intact."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from trainstore import open_store
from trainstore.errors import BackgroundError, CapacityError
from trainstore.store.local import TEMP_PREFIX

pytestmark = pytest.mark.timeout(120)


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _check_full(root: str) -> None:
    store = open_store(root)
    store.put("keep/a.bin", b"a" * 1_000_000)
    store.put_if_absent("manifests/000001.json", b'{"step": 1}')
    before = _files(root)
    big = os.urandom(12 << 20)
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
        from trainstore.errors import BackgroundError, CapacityError
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


def _ckpt_disk_full(root: str, fill, free) -> dict:
    """Save, run out of space during the next save, check the error and the store, free
    space, restore the previous checkpoint and continue training (saving again)."""
    from harness.crashkit import ckpt_options, ckpt_state, states_equal

    from trainstore.checkpoint import CheckpointManager
    from trainstore.checkpoint.format import manifest as mf
    from trainstore.errors import TrainstoreError

    store = open_store(root)
    mgr = CheckpointManager(store, "full", options=ckpt_options())
    mgr.save(0, ckpt_state(0), kind="full", blocking=True)
    fill()
    try:
        mgr.save(1, ckpt_state(1), kind="full", blocking=True)
        mgr.wait()
    except TrainstoreError as exc:
        error = exc
    else:
        raise AssertionError("a save onto a full disk succeeded")
    # the background save's failure, raised at the next call, caused by the full disk
    assert isinstance(error, BackgroundError) and "step 1" in str(error), repr(error)
    assert isinstance(error.__cause__, CapacityError), repr(error.__cause__)
    assert mf.list_steps(store, "full") == [0], "a manifest of the failed save is visible"
    leftovers = [f for f in _files(root) if os.path.basename(f).startswith(TEMP_PREFIX)]
    assert not leftovers, leftovers
    free()
    # Training continues: a fresh manager (or the same one) restores step 0 and saves on.
    mgr2 = CheckpointManager(store, "full", options=ckpt_options())
    assert states_equal(mgr2.restore(), ckpt_state(0))
    mgr2.save(2, ckpt_state(2), kind="full", blocking=True)
    mgr2.close()
    assert states_equal(CheckpointManager(store, "full").restore(), ckpt_state(2))
    try:
        mgr.close()
    except TrainstoreError:
        pass  # the failed save is reported again on close; that is expected
    return {"error": f"{type(error).__name__}: {str(error)[:160]}"}


def test_checkpoint_save_on_full_hot_tier(small_fs, tmp_path):
    if small_fs is not None:
        ballast = small_fs / "ballast"

        def fill() -> None:  # leave ~1 MiB: less than one full checkpoint (~2.3 MB)
            st = os.statvfs(small_fs)
            with open(ballast, "wb") as f:
                f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - (1 << 20)))

        figures = _ckpt_disk_full(str(small_fs / "store"), fill, lambda: os.unlink(ballast))
    else:
        code = textwrap.dedent(f"""
            import resource, signal, sys
            sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            from reliability.test_disk_full import _ckpt_disk_full
            lim = lambda n: resource.setrlimit(resource.RLIMIT_FSIZE, (n, resource.RLIM_INFINITY))
            print(_ckpt_disk_full({str(tmp_path / "store")!r}, lambda: lim(64 << 10),
                                  lambda: lim(resource.RLIM_INFINITY)))
        """)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
        assert res.returncode == 0, res.stderr[-3000:]
        figures = {"error": res.stdout.strip()[-200:]}
    from .conftest import record

    record("ckpt_disk_full", tmpfs=small_fs is not None, **figures)
