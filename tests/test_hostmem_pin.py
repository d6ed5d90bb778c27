"""A pinned ``HostBuffer`` stays pinned while any view of its memory lives, and is unpinned
(``cudaHostUnregister``) once the last one goes - before the memory is unmapped. Restore
keeps only the tensor (``hostmem.empty_tensor``), so the ``HostBuffer`` object itself is
collected at once; the pin must follow the memory, not that object.

No CUDA on the CI machines: the CUDA runtime's register/unregister calls are replaced by a
recorder (the lifetime logic under test is hostmem's, not the driver's)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from trainstore import hostmem


def _mapped(address: int) -> bool:
    """Whether ``address`` lies in one of this process's mappings (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


class _FakeCudart:
    """Records cudaHostRegister / cudaHostUnregister, and whether the memory was still mapped
    when it was unregistered."""

    def __init__(self) -> None:
        self.pinned: set[int] = set()
        self.unpinned: list[tuple[int, bool]] = []  # (address, still mapped)

    def cudaHostRegister(self, address: int, nbytes: int, flags: int) -> int:  # noqa: N802 - CUDA's name
        self.pinned.add(address)
        return 0

    def cudaHostUnregister(self, address: int) -> int:  # noqa: N802
        self.pinned.discard(address)
        self.unpinned.append((address, _mapped(address)))
        return 0


@pytest.fixture
def cudart(monkeypatch) -> _FakeCudart:
    fake = _FakeCudart()
    monkeypatch.setattr(hostmem, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


def test_restored_tensor_stays_pinned_until_it_is_gone(cudart) -> None:
    t = hostmem.empty_tensor((3, 1 << 18), torch.bfloat16, huge_pages=False, pin=True)
    address = t.data_ptr()
    gc.collect()  # the HostBuffer behind it is unreachable now
    assert cudart.pinned == {address} and cudart.unpinned == []
    half = t[1:]  # a view of a view keeps it pinned too
    del t
    gc.collect()
    assert cudart.pinned == {address}
    half.fill_(1.5)
    assert float(half[0, 0]) == 1.5
    del half
    gc.collect()
    assert cudart.pinned == set()
    assert cudart.unpinned == [(address, True)]  # unpinned once, while still mapped


def test_array_views_keep_the_pin_and_close_unpins_once(cudart) -> None:
    buf = hostmem.HostBuffer(4 << 20, huge_pages=False, pin=True)
    a = buf.array(np.float32)
    address = a.ctypes.data
    del buf
    gc.collect()
    assert cudart.pinned == {address}
    del a
    gc.collect()
    assert cudart.unpinned == [(address, True)]

    buf = hostmem.HostBuffer(1 << 20, huge_pages=False, pin=True)
    view = buf.tensor(torch.float32)
    buf.close()  # unpins now; the memory stays valid for the view
    assert cudart.pinned == set() and cudart.unpinned[-1] == (buf.address, True)
    view.fill_(2.0)
    del view, buf
    gc.collect()
    assert len(cudart.unpinned) == 2  # not unpinned a second time


# -- restore destinations (pinning 4 GiB took 1.2-2 s on an H200 machine; one pageable copy 0.6 s) --

def test_restore_buffers_are_not_pinned_by_default(cudart) -> None:
    """A fresh restore destination is copied to a GPU at most once: not worth pinning."""
    t = hostmem.empty_tensor((1 << 20,), torch.float32, huge_pages=False)
    assert cudart.pinned == set() and not t.is_pinned()
    pinned = hostmem.empty_tensor((1 << 20,), torch.float32, huge_pages=False, pin=True)
    assert len(cudart.pinned) == 1 and pinned.numel() == 1 << 20

