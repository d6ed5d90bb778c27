"""trainstore.hostmem: huge-page, 4 KiB-aligned host buffers, views, pre-touch, pinning."""

from __future__ import annotations

import ctypes
import gc
import re

import numpy as np
import pytest
import torch

from trainstore.errors import ConfigError
from trainstore.hostmem import (
    HUGE_PAGE,
    PAGE,
    HostBuffer,
    empty_array,
    empty_tensor,
    round_up,
    thp_mode,
)

THP_ON = thp_mode() in ("always", "madvise")


def mapping_kib(address: int, nbytes: int = 1) -> dict[str, int]:
    """The /proc/self/smaps counters (kB) summed over the mappings overlapping
    [address, address + nbytes) (madvise splits one mmap into several)."""
    text = open("/proc/self/smaps").read()
    header = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ", re.M)
    starts = list(header.finditer(text))
    total: dict[str, int] = {}
    for i, m in enumerate(starts):
        lo, hi = int(m.group(1), 16), int(m.group(2), 16)
        if lo < address + nbytes and address < hi:
            body = text[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
            for k, v in re.findall(r"^(\w+):\s+(\d+) kB", body, re.M):
                total[k] = total.get(k, 0) + int(v)
    assert total, f"no mapping holds {address:#x}"
    return total


def resident_bytes(address: int, nbytes: int) -> int:
    """How many bytes of [address, address + nbytes) are in memory (mincore, page granular)."""
    pages = -(-nbytes // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(pages * PAGE), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) * PAGE


def test_large_buffer_is_2mib_aligned_and_backed_by_huge_pages() -> None:
    buf = HostBuffer(8 * HUGE_PAGE + 12345)
    assert buf.address % HUGE_PAGE == 0
    buf.touch()
    counters = mapping_kib(buf.address, buf.nbytes)
    assert resident_bytes(buf.address, buf.nbytes) >= buf.nbytes
    if THP_ON:
        assert buf.huge_pages
        # the 8 whole 2 MiB pages are huge; the 12345-byte tail stays in 4 KiB pages
        assert counters["AnonHugePages"] * 1024 >= 8 * HUGE_PAGE
    else:
        assert not buf.huge_pages


@pytest.mark.skipif(thp_mode() != "madvise", reason="needs THP in madvise mode to tell the two apart")
def test_huge_pages_off_gives_plain_pages() -> None:
    buf = HostBuffer(4 * HUGE_PAGE, huge_pages=False)
    buf.touch()
    assert buf.address % PAGE == 0 and not buf.huge_pages
    assert mapping_kib(buf.address, buf.nbytes)["AnonHugePages"] == 0


def test_small_buffer_gets_no_huge_page_and_no_slack() -> None:
    buf = HostBuffer(10_000)
    assert buf.address % PAGE == 0 and not buf.huge_pages and buf.offset == 0
    buf.touch()
    assert resident_bytes(buf.address, buf.nbytes) == 3 * PAGE  # 10 000 bytes: 3 plain pages


def test_views_share_memory_and_outlive_the_buffer() -> None:
    buf = HostBuffer(3 * HUGE_PAGE)
    arr = buf.array(np.float32)
    arr[:] = np.arange(arr.size, dtype=np.float32)
    t = buf.tensor(torch.float32, (3, arr.size // 3))
    assert t.data_ptr() == buf.address
    t[0, 0] = -7.0
    assert arr[0] == -7.0
    del buf, arr
    gc.collect()
    expected = np.arange(3 * HUGE_PAGE // 4, dtype=np.float32)
    expected[0] = -7.0
    assert np.array_equal(t.reshape(-1).numpy(), expected)  # the mapping lives as long as a view


def test_touch_keeps_contents_and_background_touch_completes() -> None:
    buf = HostBuffer(4 * HUGE_PAGE)
    buf.array()[: 5 * PAGE] = 7
    buf.touch()
    assert buf.touched and int(buf.array()[: 5 * PAGE].min()) == 7 and int(buf.array()[5 * PAGE:].max()) == 0
    fresh = HostBuffer(4 * HUGE_PAGE)
    assert resident_bytes(fresh.address, fresh.nbytes) == 0
    fresh.touch_async()
    fresh.wait_touched()
    assert fresh.touched and resident_bytes(fresh.address, fresh.nbytes) == fresh.nbytes


def test_typed_helpers_cover_dtypes_numpy_lacks() -> None:
    t = empty_tensor((5, 7), torch.bfloat16)
    assert t.shape == (5, 7) and t.dtype == torch.bfloat16 and t.data_ptr() % PAGE == 0
    a = empty_array((4, 3), np.int64)
    assert a.shape == (4, 3) and a.dtype == np.int64 and a.ctypes.data % PAGE == 0
    assert empty_tensor((0, 3), torch.float32).shape == (0, 3)


def test_bad_requests_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match=">= 0 bytes"):
        HostBuffer(-1)
    buf = HostBuffer(100)
    with pytest.raises(ConfigError, match="needs 800 bytes; the buffer has 100"):
        buf.array(np.float64, (100,))
    with pytest.raises(ConfigError, match="needs 400 bytes"):
        buf.tensor(torch.float32, (10, 10))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="needs CUDA"):
            HostBuffer(100, pin=True)
        assert not HostBuffer(100).pinned  # default: pinned only when CUDA is present


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_buffer_takes_async_device_copies() -> None:
    buf = HostBuffer(2 * HUGE_PAGE)
    assert buf.pinned
    host = buf.tensor(torch.float32)
    assert host.is_pinned()
    dev = torch.arange(host.numel(), dtype=torch.float32, device="cuda")
    host.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(host, dev.cpu())
    buf.close()
    assert not buf.pinned and not host.is_pinned()


def test_populate_faults_in_just_the_range_on_threads_and_keeps_contents() -> None:
    buf = HostBuffer(12 * HUGE_PAGE + 123, huge_pages=False, pin=False)
    arr = buf.array()
    arr[PAGE + 5] = 42  # one page of the range already written
    assert buf.populate(PAGE, 9 * HUGE_PAGE, threads=3)
    assert resident_bytes(buf.address + PAGE, 9 * HUGE_PAGE) == 9 * HUGE_PAGE
    assert resident_bytes(buf.address + PAGE + 9 * HUGE_PAGE, 2 * HUGE_PAGE) == 0  # past the range: untouched
    assert arr[PAGE + 5] == 42 and not arr[PAGE:PAGE + 5].any() and not arr[PAGE + 6:PAGE + 9 * HUGE_PAGE].any()
    assert buf.populate(11 * HUGE_PAGE, 10 * HUGE_PAGE)  # clipped at the end of the buffer
    assert resident_bytes(buf.address + 11 * HUGE_PAGE, buf.nbytes - 11 * HUGE_PAGE) == round_up(123, PAGE) + HUGE_PAGE
