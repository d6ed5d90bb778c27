"""The page-cache state of files, without root - one implementation for the tests and the
benchmarks (``benchmarks/pagecache.py`` re-exports it): ``evict`` (fsync, then
``posix_fadvise(DONTNEED)``), ``resident`` / ``cached`` (``mincore``: asks without reading;
a ``RWF_NOWAIT`` read would start readahead), ``cache`` (read once), and whether a
directory's filesystem takes ``O_DIRECT`` at all (tmpfs before Linux 6.6 does not)."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable

_libc = ctypes.CDLL(None, use_errno=True)  # libc, loaded already
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


def files_under(*paths: str) -> list[str]:
    """Every regular file at or under ``paths`` (missing ones skipped), sorted."""
    out = []
    for p in paths:
        if os.path.isfile(p):
            out.append(p)
        elif os.path.isdir(p):
            for d, _dirs, fs in os.walk(p):
                out.extend(os.path.join(d, f) for f in fs)
    return sorted(out)


def evict(paths: Iterable[str]) -> None:
    """fsync each file (dirty pages cannot be dropped), then drop its pages from the cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(path: str) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages of ``path``)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    pages = (size + PAGE - 1) // PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(b & 1 for b in vec), pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_all(paths: list[str]) -> tuple[int, int]:
    """(resident pages, pages) summed over ``paths``."""
    got = [resident(p) for p in paths]
    return sum(r for r, _ in got), sum(n for _, n in got)


def cached(path: str) -> bool:
    """Whether any page of ``path`` is in the page cache."""
    return resident(path)[0] > 0


def cache(paths: list[str]) -> None:
    """Read every byte of each file once (buffered), so it sits in the page cache."""
    buf = bytearray(8 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def direct_supported(root: str) -> bool:
    """Whether files under ``root`` can be opened with ``O_DIRECT``."""
    try:
        fd = os.open(os.path.join(root, "probe"), os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(os.path.join(root, "probe"))
    return True


__all__ = ["PAGE", "cache", "cached", "direct_supported", "evict", "files_under", "resident", "resident_all"]
