"""The save writers' threads (and the buffers they keep touched) outlive a save; a failed
save returns only once none of its tasks still reads the caller's staged bytes."""

from __future__ import annotations

import mmap
import os
import threading
import time

import numpy as np
import pytest

from trainstore import fileio
from trainstore.checkpoint.save import pool
from trainstore.checkpoint.save.staging import StagedTensor
from trainstore.checkpoint.save.writer import WriteOptions, write_tensors
from trainstore.chunks import ChunkStore
from trainstore.store.local import LocalStore

OPTS = WriteOptions(chunk_bytes=1 << 20, workers=3, codec="raw", pack_below=0)


def unaligned(seed: int, n: int = 4) -> list[StagedTensor]:
    """``n`` 1 MiB float32 tensors that do not start on a 4 KiB boundary (bounced by write_direct)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        raw = np.empty((1 << 20) + 64, dtype=np.uint8)
        off = next(o for o in range(0, 64, 16) if raw[o:].ctypes.data % fileio.DIRECT_ALIGN)
        view = raw[off:off + (1 << 20)]
        view[:] = rng.integers(0, 255, view.nbytes, dtype=np.uint8)
        out.append(StagedTensor(f"model/w{i}", "float32", (1 << 18,), 4, memoryview(view)))
    return out


class _CountingMmap:
    """Stands in for the ``mmap`` module in ``fileio``: counts new mappings (bounce buffers)."""

    def __init__(self) -> None:
        self.made = 0

    def mmap(self, *args, **kwargs):  # noqa: ANN002, ANN003
        self.made += 1
        return mmap.mmap(*args, **kwargs)


def test_a_second_save_reuses_the_threads_and_their_bounce_buffers(tmp_path, monkeypatch):
    counting = _CountingMmap()
    monkeypatch.setattr(fileio, "mmap", counting)
    chunks = ChunkStore(LocalStore(str(tmp_path)))
    seen: list[set[int]] = []  # the threads that wrote, per save
    write_direct = fileio.write_direct

    def recording(fd, data):  # noqa: ANN001
        seen[-1].add(threading.get_ident())
        return write_direct(fd, data)

    monkeypatch.setattr("trainstore.store.local.write_direct", recording)
    for seed in (1, 2):
        seen.append(set())
        before = counting.made
        entries, _ = write_tensors(chunks, unaligned(seed), OPTS)
        assert len(entries) == 4 and seen[-1]
    assert counting.made == before  # the second save faulted in no new bounce buffer
    alive = {t.ident for t in threading.enumerate()}
    # the first save's writer threads live on, and both saves ran on one pool of `workers` threads
    assert seen[0] <= alive and len(seen[0] | seen[1]) <= OPTS.workers


class _SlowThenFailing(LocalStore):
    """The first put fails at once; the others take ``delay`` seconds (still writing then)."""

    def __init__(self, root: str, delay: float) -> None:
        super().__init__(root)
        self.delay, self.calls, self.finished = delay, 0, []
        self.lock = threading.Lock()

    def put_if_absent(self, key, data):  # noqa: ANN001
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            raise OSError("disk gone")
        time.sleep(self.delay)
        out = super().put_if_absent(key, data)
        self.finished.append(time.monotonic())
        return out


def test_a_failed_save_returns_after_its_running_tasks_finish(tmp_path):
    store = _SlowThenFailing(str(tmp_path), delay=0.3)
    with pytest.raises(Exception, match="disk gone"):
        write_tensors(ChunkStore(store), unaligned(3), OPTS)
    raised = time.monotonic()
    assert store.finished and max(store.finished) <= raised  # nothing still wrote after the error


def test_a_forked_child_starts_with_no_pools():
    pool.shared_pool("test-fork", 1, 0).submit(lambda: None).result()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's pool threads do not exist here; a new pool works
        try:
            ok = pool.shared_pool("test-fork", 1, 0).submit(lambda: 7).result(timeout=10) == 7
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
