"""LocalStore writes large 4 KiB-aligned buffers with O_DIRECT (no page cache), content exact,
falling back to buffered writes cleanly; a failed direct write leaves nothing visible."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format.delta import scratch
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.fileio import BOUNCE_BYTES, direct_eligible
from trainstore.hostmem import HostBuffer
from trainstore.store import local as local_mod
from trainstore.store.local import TEMP_PREFIX, LocalStore

PAGE = 4096
SIZE = (3 << 20) + 1234  # a 4 KiB-multiple head plus a tail that is not


def aligned_data(nbytes: int = SIZE, seed: int = 0) -> np.ndarray:
    arr = HostBuffer(nbytes).array()
    arr[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return arr


def cached_bytes(path: str) -> int:
    """Bytes of ``path`` in the page cache (mincore over a read-only mapping)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    view = np.frombuffer(m, dtype=np.uint8)
    try:
        pages = -(-size // PAGE)
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(pages * PAGE), vec)
        assert rc == 0, ctypes.get_errno()
        return sum(v & 1 for v in vec) * PAGE
    finally:
        del view
        m.close()


def test_large_aligned_put_bypasses_the_page_cache_and_is_exact(tmp_path) -> None:
    store = LocalStore(tmp_path / "s")
    data = aligned_data()
    store.put("a/big", data)
    path = store.local_path("a/big")
    assert cached_bytes(path) <= PAGE  # only the buffered tail page, the 3 MiB head went direct
    assert store.get("a/big") == data.tobytes()
    store.put_if_absent("a/big2", data[PAGE:PAGE + (2 << 20)])  # an aligned slice of exactly 2 MiB
    assert cached_bytes(store.local_path("a/big2")) == 0
    assert store.get("a/big2") == data[PAGE:PAGE + (2 << 20)].tobytes()


def test_small_or_opted_out_writes_stay_buffered(tmp_path) -> None:
    data = aligned_data()
    store = LocalStore(tmp_path / "s")
    store.put("small", data[: 64 << 10])  # under DIRECT_MIN_BYTES: buffered
    store.put("small_unaligned", data[64:(1 << 20) + 63])  # one byte short of DIRECT_MIN_BYTES
    off = LocalStore(tmp_path / "o", direct_io=False)
    off.put("big", data)
    for st, key, want in ((store, "small", data[: 64 << 10]), (store, "small_unaligned", data[64:(1 << 20) + 63]),
                          (off, "big", data)):
        assert cached_bytes(st.local_path(key)) >= want.nbytes // PAGE * PAGE
        assert st.get(key) == want.tobytes()


def test_filesystem_refusing_o_direct_falls_back_once_per_directory(tmp_path, monkeypatch) -> None:
    """A filesystem refusing O_DIRECT at open (EINVAL, as tmpfs did before Linux 6.6)."""
    real_open = os.open
    direct_opens = []

    def refusing_open(path, flags, mode=0o777, **kw):
        if flags & os.O_DIRECT:
            direct_opens.append(path)
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(local_mod.os, "open", refusing_open)
    store = LocalStore(tmp_path / "s")
    data = aligned_data()
    store.put("d/one", data)
    store.put("d/two", data)
    assert len(direct_opens) == 1  # probed once for directory d, then buffered
    assert store.get("d/one") == data.tobytes() and store.get("d/two") == data.tobytes()


def test_direct_write_refused_midway_is_rewritten_buffered_exactly(tmp_path, monkeypatch) -> None:
    """A filesystem that opens with O_DIRECT but refuses the aligned write itself."""
    def refusing_write(fd, data):
        os.write(fd, memoryview(data)[: 1 << 20])  # some bytes went out, then EINVAL
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(local_mod, "write_direct", refusing_write)
    store = LocalStore(tmp_path / "s")
    data = aligned_data(seed=1)
    store.put("x", data)
    assert store.get("x") == data.tobytes()
    assert os.path.dirname(store.local_path("x")) in store._direct_refused


def test_tmpfs_store_round_trips_large_aligned_pieces() -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        store = LocalStore(d)
        data = aligned_data(seed=2)
        store.put("k", data)
        store.put_if_absent("k2", data)
        assert store.get("k") == data.tobytes() and store.get("k2") == data.tobytes()


def test_failing_direct_write_leaves_nothing_visible(tmp_path) -> None:
    """A real kernel error mid-write (the file-size limit: EFBIG, reported like ENOSPC) in a
    child process: CapacityError, no object, no temp file."""
    root = tmp_path / "s"
    code = textwrap.dedent(f"""
        import resource, signal, sys
        import numpy as np
        from trainstore.errors import CapacityError
        from trainstore.hostmem import HostBuffer
        from trainstore.store.local import LocalStore
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        store = LocalStore({str(root)!r})
        data = HostBuffer(8 << 20).array()
        data[:] = 7
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, resource.RLIM_INFINITY))
        for put in (store.put, store.put_if_absent):
            try:
                put("c/big", data)
            except CapacityError as exc:
                print("capacity:", exc)
            else:
                sys.exit("the write past the limit succeeded")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr + res.stdout
    assert res.stdout.count("capacity: no space left while writing 'c/big'") == 2
    left = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    assert left == [], left
    assert not any(name.startswith(TEMP_PREFIX) for name in left)


def test_large_unaligned_put_goes_direct_through_the_bounce_buffer(tmp_path) -> None:
    """A codec's output is a new ``bytes`` (never 4 KiB aligned): it is copied through the
    thread's aligned bounce buffer a segment at a time (here 3 segments and a tail) and
    bypasses the page cache all the same; a memoryview at an odd offset too."""
    store = LocalStore(tmp_path / "s")
    data = np.random.default_rng(1).integers(0, 256, 2 * BOUNCE_BYTES + SIZE, dtype=np.uint8).tobytes()
    store.put("a/unaligned", data)
    path = store.local_path("a/unaligned")
    assert cached_bytes(path) <= PAGE  # only the tail's page
    assert store.get("a/unaligned") == data
    odd = memoryview(data)[7:7 + (2 << 20)]  # 2 MiB exactly, starting 7 bytes in
    store.put("a/odd", odd)
    assert cached_bytes(store.local_path("a/odd")) == 0
    assert store.get("a/odd") == odd.tobytes()


def test_checkpoint_round_trip_writes_every_large_piece_direct(tmp_path) -> None:
    """A whole checkpoint through a LocalStore with O_DIRECT on: large raw pieces (from 4 KiB
    staging slots) and large compressed pieces (new, unaligned buffers, through the bounce
    buffer) bypass the page cache; small compressed ones are written buffered; the restore
    and a deep verify give back every byte."""
    g = torch.Generator().manual_seed(3)
    state = {"w": torch.randn(3 << 20, generator=g),  # 12 MiB random float32: raw pieces (8 + 4 MiB)
             "odd": torch.randn((5 << 18) + 3, generator=g),  # 5 MiB + 12 bytes: a buffered tail
             "halves": torch.randn(4 << 20, generator=g).half().float(),  # 16 MiB, compresses to ~0.6
             "zeros": torch.zeros(2 << 20),  # 8 MiB that compress to almost nothing: buffered
             "steps": torch.arange(1 << 20, dtype=torch.int64)}  # 8 MiB, compresses
    root = tmp_path / "ckpt"
    store = LocalStore(root)
    with CheckpointManager(store, job="j", policy=CheckpointPolicy(full_every=1, incremental_every=None),
                           options=WriteOptions(pack_below=0, raw_above=0.9)) as mgr:
        mgr.save(1, state, blocking=True)
        manifest = mgr.manifest(1)
        raw, packed = [], []
        for name, entry in manifest.tensors.items():
            for c in entry.chunks:
                (raw if c.ref.codec == "raw" else packed).append((name, c.ref))
        assert {n for n, _ in raw} == {"w", "odd"}, raw
        assert {n for n, _ in packed} == {"halves", "zeros", "steps"}, packed
        for name, ref in raw:  # written with O_DIRECT: at most the unaligned tail's page is cached
            path = os.path.join(root, ref.key())
            assert ref.size >= 1 << 20 and cached_bytes(path) <= PAGE, (name, ref, cached_bytes(path))
        for name, ref in packed:
            path = os.path.join(root, ref.key())
            assert ref.stored < ref.size, (name, ref)
            if ref.stored >= 1 << 20:  # direct through the bounce buffer
                assert name == "halves" and cached_bytes(path) <= PAGE, (name, ref, cached_bytes(path))
            else:  # small: buffered, every page of the file in the cache
                assert cached_bytes(path) == -(-os.path.getsize(path) // PAGE) * PAGE, (name, ref)
        assert sum(1 for name, ref in packed if name == "halves" and ref.stored >= 1 << 20) == 2, packed
        got = mgr.restore(1)
        for name, want in state.items():
            assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
            assert torch.equal(got[name].view(torch.uint8), want.view(torch.uint8)), name
        assert all(r.ok for r in mgr.verify(1, deep=True))


def test_xor_deltas_of_an_incremental_bypass_the_page_cache(tmp_path) -> None:
    """An incremental's XOR deltas are written with O_DIRECT like a full save's pieces
    (compressed ones through the bounce buffer), and the per-thread XOR scratch they are made
    and restored in is 4 KiB aligned (``direct_eligible``: reads into it can go direct)."""
    assert direct_eligible(scratch(3 << 20)) and direct_eligible(scratch(5 << 20))
    g = torch.Generator().manual_seed(5)
    w = torch.randn(3 << 20, generator=g)  # 12 MiB: pieces of 8 + 4 MiB
    root = tmp_path / "ckpt"
    store = LocalStore(root)
    opts = WriteOptions(pack_below=0, incompressible_ratio=0.97)  # keep the deltas on 2 cores too
    with CheckpointManager(store, job="j", policy=CheckpointPolicy(full_every=10, incremental_every=1),
                           options=opts) as mgr:
        mgr.save(1, {"w": w}, blocking=True)
        w2 = w + torch.randn(w.shape, generator=g) * 1e-3
        mgr.save(2, {"w": w2}, blocking=True)
        deltas = [c for c in mgr.manifest(2).tensors["w"].chunks if c.base is not None]
        assert len(deltas) == 2 and all(c.ref.stored >= 1 << 20 for c in deltas), deltas
        for c in deltas:
            path = os.path.join(root, c.ref.key())
            assert cached_bytes(path) <= PAGE, (c.ref, cached_bytes(path))
        got = mgr.restore(2)
        assert torch.equal(got["w"].view(torch.uint8), w2.view(torch.uint8))
