"""The page-cache state of test files, without root: ``evict`` (fsync, then
``posix_fadvise(DONTNEED)``), ``cached`` (``mincore``: asks without reading), and whether a
directory's filesystem takes ``O_DIRECT`` at all (tmpfs before Linux 6.6 does not)."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable


def evict(paths: Iterable[str]) -> None:
    """Drop each file's pages from the page cache (written back first)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached(path: str) -> bool:
    """Whether any page of ``path`` is in the page cache (mincore: asks without reading; a
    RWF_NOWAIT read would start readahead)."""
    size = os.path.getsize(path)
    pages = -(-size // 4096)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        vec = (ctypes.c_ubyte * pages)()
        try:
            assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        return any(v & 1 for v in vec)
    finally:
        os.close(fd)


def direct_supported(root: str) -> bool:
    """Whether files under ``root`` can be opened with ``O_DIRECT``."""
    try:
        fd = os.open(os.path.join(root, "probe"), os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(os.path.join(root, "probe"))
    return True


def files_under(root: str) -> list[str]:
    """Every file under ``root``, sorted."""
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


__all__ = ["cached", "direct_supported", "evict", "files_under"]
