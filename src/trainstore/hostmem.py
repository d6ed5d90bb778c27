"""Host memory for large buffers: huge pages, 4 KiB alignment, optional pinning and pre-touch.

First touch of fresh memory, not the copy, dominates a fresh process's first checkpoint save
and restore: every 4 KiB page faults and is zeroed by the kernel (0.4-7 GB/s on busy VMs
against ~12 GB/s for a copy into touched memory). A ``HostBuffer`` is an anonymous ``mmap``
whose 2 MiB-aligned interior is ``madvise(MADV_HUGEPAGE)``-d, so one fault maps 2 MiB
(transparent huge pages in ``madvise`` mode; with THP off or unsupported it is plain pages,
nothing else changes). It starts 4 KiB-aligned, so slots at 4 KiB offsets are ready for
``O_DIRECT``; it is pinned for CUDA when CUDA is present (``cudaHostRegister`` keeps the
huge pages; ``torch.empty(pin_memory=True)`` would not), and it can be pre-touched in a
background thread (``MADV_POPULATE_WRITE`` through ``ctypes``, which releases the GIL and
leaves the contents alone).

Huge pages pay off when touched off the clock (``touch``): a huge-page fault taken inside a
timed copy ran ~6x slower than plain 4 KiB faults on a loaded VM (benchmarks/first_touch.py;
no compaction involved), so callers that copy into fresh memory on the clock pass
``huge_pages=False`` and ``populate`` first (checkpoint staging does).

Only the sizes past one huge page get huge pages: the tail after the last whole 2 MiB stays in
4 KiB pages, so a buffer never holds more than it was asked for plus one 4 KiB page.

Views: ``array()`` (numpy) and ``tensor()`` (torch, through ``torch.from_numpy``) are all
views of one numpy array over the buffer's bytes and keep it (and the mapping) alive on their
own. A pin follows that array, not the ``HostBuffer`` object (restore keeps only the tensor):
the buffer is unpinned when the last view is gone - before the mapping is released - or on
``close`` (the mapping then stays valid, just unpinned, for views still alive).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import threading
import weakref
from typing import Any

import numpy as np

from .errors import ConfigError

try:
    import torch
except ImportError:  # pragma: no cover - torch is an optional extra
    torch = None  # type: ignore[assignment]

log = logging.getLogger("trainstore.hostmem")

PAGE = 4096
HUGE_PAGE = 2 << 20
#: Linux madvise advice values (Python 3.11's mmap module lacks POPULATE_WRITE).
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
MADV_POPULATE_WRITE = 23
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"

#: the C library, from the symbols already loaded (dlopen(NULL)): ctypes.util.find_library
#: would run `ldconfig -p` in a subprocess at import (5-7 ms per process). CDLL: calls
#: release the GIL
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.madvise.restype = ctypes.c_int


def thp_mode() -> str:
    """The kernel's transparent huge page mode: "always", "madvise", "never" or "unsupported"."""
    try:
        with open(THP_ENABLED) as f:
            text = f.read()
    except OSError:
        return "unsupported"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "unsupported"


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _cuda_available() -> bool:
    return torch is not None and torch.cuda.is_available()


def pins(pin: bool | None) -> bool:
    """Whether a ``HostBuffer(pin=pin)`` made now would be pinned (None: when CUDA is present)."""
    return bool(pin) or (pin is None and _cuda_available())


def _cuda_unregister(address: int) -> None:
    err = torch.cuda.cudart().cudaHostUnregister(address)
    if int(err) != 0:  # pragma: no cover - needs CUDA
        log.warning("cudaHostUnregister(%#x) failed: %s", address, err)


class HostBuffer:
    """``nbytes`` of fresh anonymous host memory, 4 KiB-aligned (see module docstring).

    ``huge_pages``: ask for transparent huge pages (``self.huge_pages`` says whether the kernel
    took the advice). ``pin``: register with CUDA for fast device copies (None: when CUDA is
    available; asking for it without CUDA is a ``ConfigError``). ``touch`` / ``touch_async``
    fault every page in ahead of use; call ``wait_touched`` before writing into a buffer whose
    background touch may still run (the fallback touch of old kernels writes zeros).
    """

    def __init__(self, nbytes: int, *, huge_pages: bool = True, pin: bool | None = None) -> None:
        if int(nbytes) < 0:
            raise ConfigError(f"HostBuffer size must be >= 0 bytes, got {nbytes}")
        self.nbytes = int(nbytes)
        if pin and not _cuda_available():
            raise ConfigError("HostBuffer(pin=True) needs CUDA (torch with a visible GPU); pass pin=None or False")
        size = round_up(max(self.nbytes, 1), PAGE)
        want_huge = huge_pages and self.nbytes >= HUGE_PAGE
        slack = HUGE_PAGE if want_huge else 0  # room to start the data at a 2 MiB boundary
        self._map = mmap.mmap(-1, size + slack, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self.offset = (round_up(base, HUGE_PAGE) - base) if want_huge else 0
        self.address = base + self.offset
        self.huge_pages = False
        if want_huge:
            huge_len = self.nbytes // HUGE_PAGE * HUGE_PAGE
            try:
                self._map.madvise(MADV_HUGEPAGE, self.offset, huge_len)
                self.huge_pages = thp_mode() in ("always", "madvise")
            except OSError as exc:  # kernel without THP: plain pages
                log.debug("madvise(MADV_HUGEPAGE) refused (%s): plain 4 KiB pages", exc)
        #: every view derives from this array; the pin's finalizer is attached to it (an ndarray
        #: runs its weakref callbacks before it releases the mapping)
        self._memory = np.frombuffer(self._map, dtype=np.uint8, count=self.nbytes, offset=self.offset)
        self.pinned = False
        if pins(pin):
            self._pin()
        self._touched = threading.Event()
        self._touch_error: BaseException | None = None
        self._toucher: threading.Thread | None = None

    def _pin(self) -> None:
        err = torch.cuda.cudart().cudaHostRegister(self.address, max(self.nbytes, 1), 0)
        if int(err) != 0:
            log.warning("cudaHostRegister of %d bytes failed (%s): staging stays unpinned", self.nbytes, err)
            return
        self.pinned = True
        self._unpin = weakref.finalize(self._memory, _cuda_unregister, self.address)

    # -- views -------------------------------------------------------------------------------
    def array(self, dtype: Any = np.uint8, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A numpy view of the buffer (uint8 over every byte by default)."""
        dt = np.dtype(dtype)
        count = self.nbytes // dt.itemsize if shape is None else int(np.prod(shape, dtype=np.int64))
        if count * dt.itemsize > self.nbytes:
            raise ConfigError(f"a {dt} array of shape {shape} needs {count * dt.itemsize} bytes; "
                              f"the buffer has {self.nbytes}")
        arr = self._memory[:count * dt.itemsize].view(dt)
        return arr if shape is None else arr.reshape(shape)

    def tensor(self, dtype: Any = None, shape: tuple[int, ...] | None = None) -> Any:
        """A torch view of the buffer (uint8 over every byte by default; any torch dtype,
        bfloat16 included). The tensor keeps the mapping alive."""
        if torch is None:  # pragma: no cover
            raise ConfigError("HostBuffer.tensor() needs torch")
        dt = torch.uint8 if dtype is None else dtype
        itemsize = torch.empty((), dtype=dt).element_size()
        count = self.nbytes // itemsize if shape is None else int(np.prod(shape, dtype=np.int64))
        if count * itemsize > self.nbytes:
            raise ConfigError(f"a {dt} tensor of shape {shape} needs {count * itemsize} bytes; "
                              f"the buffer has {self.nbytes}")
        if count == 0:
            return torch.empty(shape if shape is not None else (0,), dtype=dt)
        t = torch.from_numpy(self._memory[:count * itemsize]).view(dt)
        return t if shape is None else t.view(shape)

    # -- pre-touch ---------------------------------------------------------------------------
    def touch(self) -> None:
        """Fault every page in now (on this thread); the contents stay as they are (zeros if
        nothing was written) except on kernels without ``MADV_POPULATE_WRITE``."""
        try:
            if self.nbytes and not self.populate(0, self.nbytes):
                self.array()[::PAGE] = 0  # old kernels: one write per page (GIL released by numpy)
        except BaseException as exc:
            self._touch_error = exc
            raise
        finally:
            self._touched.set()

    def populate(self, start: int, nbytes: int, threads: int = 1) -> bool:
        """Fault in the pages of bytes ``[start, start + nbytes)`` with ``MADV_POPULATE_WRITE``
        (contents untouched), split over ``threads`` threads; False (nothing done) when the
        kernel lacks it. One ``madvise`` faults a range in ~2x faster than writes page by page
        on a VM (no trap per page; benchmarks/first_touch.py), and the parts run in parallel."""
        lo = start // PAGE * PAGE
        hi = round_up(min(start + nbytes, self.nbytes), PAGE)
        if hi <= lo:
            return True
        step = round_up(-(-(hi - lo) // max(1, threads)), HUGE_PAGE)
        parts = [(a, min(step, hi - a)) for a in range(lo, hi, step)]
        if len(parts) == 1:
            return self._populate(*parts[0])
        # every thread exists before any part starts: creating a thread maps its stack, which
        # waits for the mmap lock a populate in progress holds (a pool starting its threads as
        # parts were submitted spent 16 ms a thread start in a fresh process's first save)
        start_together = threading.Barrier(len(parts))
        done = [False] * len(parts)

        def run(i: int, at: int, n: int) -> None:
            start_together.wait()
            done[i] = self._populate(at, n)

        helpers = [threading.Thread(target=run, args=(i, *p), name="trainstore-hostmem-populate", daemon=True)
                   for i, p in enumerate(parts) if i]
        try:
            for t in helpers:
                t.start()
        except BaseException:
            start_together.abort()  # the helpers started so far leave instead of waiting forever
            raise
        run(0, *parts[0])
        for t in helpers:
            t.join()
        return all(done)

    def _populate(self, start: int, nbytes: int) -> bool:
        if _libc.madvise(ctypes.c_void_p(self.address + start), nbytes, MADV_POPULATE_WRITE) == 0:
            return True
        log.debug("MADV_POPULATE_WRITE refused (errno %d): pages fault in on first write", ctypes.get_errno())
        return False

    def touch_async(self) -> None:
        """Start ``touch`` on a daemon thread (``wait_touched`` joins it)."""
        if self._toucher is not None:
            return
        self._toucher = threading.Thread(target=self._touch_quietly, name="trainstore-hostmem-touch", daemon=True)
        self._toucher.start()

    def _touch_quietly(self) -> None:
        try:
            self.touch()
        except BaseException:  # noqa: BLE001 - kept in _touch_error, raised by wait_touched
            pass

    def wait_touched(self) -> None:
        """Wait for a background touch started by ``touch_async`` (no-op without one); raise
        its error if it failed."""
        if self._toucher is not None:
            self._touched.wait()
        if self._touch_error is not None:
            raise self._touch_error

    @property
    def touched(self) -> bool:
        return self._touched.is_set()

    def close(self) -> None:
        """Unpin now; the memory goes when the last view goes."""
        self.wait_touched()
        if self.pinned:
            self._unpin()
            self.pinned = False


def empty_tensor(shape: tuple[int, ...], dtype: Any, *, huge_pages: bool = True, pin: bool | None = False) -> Any:
    """A fresh torch tensor of ``shape``/``dtype`` on its own ``HostBuffer`` (restore targets).

    Not pinned by default: memory copied to a GPU once is not worth pinning (registering 4 GiB
    took 1.2 s on an H200 machine; one pageable copy of it 0.55 s, a pinned one 0.08 s)."""
    if torch is None:  # pragma: no cover
        raise ConfigError("empty_tensor needs torch")
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = int(np.prod(shape, dtype=np.int64))
    return HostBuffer(count * itemsize, huge_pages=huge_pages, pin=pin).tensor(dtype, tuple(shape))


def empty_array(shape: tuple[int, ...], dtype: Any, *, huge_pages: bool = True) -> np.ndarray:
    """A fresh numpy array of ``shape``/``dtype`` on its own (unpinned) ``HostBuffer``."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return HostBuffer(count * dt.itemsize, huge_pages=huge_pages, pin=False).array(dt, tuple(shape))


__all__ = ["HUGE_PAGE", "PAGE", "HostBuffer", "empty_array", "empty_tensor", "pins", "round_up", "thp_mode"]
