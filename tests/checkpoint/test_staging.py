"""Staging: no zero-then-copy pass, 4 KiB-aligned large slots, CheckpointManager.reserve."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format.state import flatten
from trainstore.checkpoint.save.staging import (
    Arena,
    Stager,
    plan,
    plan_sizes,
    template_sizes,
)
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.hostmem import thp_mode

pytestmark = pytest.mark.timeout(120)

PAGE = 4096
OPTS = WriteOptions(chunk_bytes=1 << 20, max_inflight_bytes=8 << 20)
FULL_ONLY = CheckpointPolicy(full_every=1, incremental_every=None)
WITH_INCREMENTALS = CheckpointPolicy(full_every=10, incremental_every=1)


def resident_bytes(array: np.ndarray) -> int:
    """How many bytes of ``array``'s pages are in memory (mincore)."""
    start = array.ctypes.data // PAGE * PAGE
    pages = -(-(array.ctypes.data + array.nbytes - start) // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * PAGE), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) * PAGE


def state_of(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(300, generator=g),
                      "h": torch.randn(64, 64, generator=g).to(torch.bfloat16)},
            "optim": {"m": np.random.default_rng(seed).standard_normal(70_000).astype(np.float32), "step": seed},
            "tag": "x"}


def assert_bit_identical(got: dict, want: dict) -> None:
    for name in ("w", "b", "h"):
        a, b = got["model"][name], want["model"][name]
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), name
    assert np.array_equal(got["optim"]["m"].view(np.uint8), want["optim"]["m"].view(np.uint8))
    assert got["optim"]["step"] == want["optim"]["step"] and got["tag"] == want["tag"]


def test_fresh_arena_is_untouched_until_the_copy() -> None:
    """A fresh arena is not zeroed first: its pages are first touched by the copy itself."""
    arena = Arena(16 << 20, pin=False)
    assert resident_bytes(arena.array) == 0
    _, leaves = flatten({"w": torch.arange(1 << 20, dtype=torch.float32)})
    staged = Stager(pin=False).stage(leaves, arena)
    assert np.array_equal(np.frombuffer(staged[0].data, dtype=np.float32), np.arange(1 << 20, dtype=np.float32))
    assert resident_bytes(arena.array[: 4 << 20]) == 4 << 20


def test_large_slots_are_4k_aligned_and_the_total_does_not_depend_on_order() -> None:
    sizes = [100, 1 << 20, 70_000, 3, 65_536, 64]
    offsets, total = plan_sizes(sizes)
    arena = Arena(total, pin=False)
    assert arena.array.ctypes.data % PAGE == 0
    for n, off in zip(sizes, offsets):
        assert off % (PAGE if n >= 64 << 10 else 64) == 0, (n, off)
    spans = sorted((off, off + n) for n, off in zip(sizes, offsets))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))  # no overlap
    assert plan_sizes(list(reversed(sizes)))[1] == total
    assert total == (1 << 20) + 73_728 + 65_536 + 128 + 64 + 64


def test_template_sizes_from_state_specs_and_meta_tensors() -> None:
    state = state_of(0)
    want = sorted(leaf.nbytes for leaf in flatten(state)[1])
    assert sorted(template_sizes(state)) == want
    specs = {"w": ((512, 1024), torch.float32), "b": ((300,), torch.float32), "h": ((64, 64), torch.bfloat16),
             "m": ((70_000,), np.float32)}
    assert sorted(template_sizes(specs)) == want
    with torch.device("meta"):
        meta = {"w": torch.empty(512, 1024), "b": torch.empty(300), "h": torch.empty(64, 64, dtype=torch.bfloat16)}
    assert sorted(template_sizes({"model": meta, "optim": {"m": np.empty(70_000, np.float32)}})) == want


@pytest.mark.parametrize("policy, arenas", [(FULL_ONLY, 1), (WITH_INCREMENTALS, 2)])
def test_reserve_then_saves_allocate_nothing_more(tmp_path, policy, arenas) -> None:
    with CheckpointManager(str(tmp_path), job="r", policy=policy, options=OPTS) as mgr:
        mgr.reserve(state_of(0))
        stager = mgr.backend.stager
        assert stager.allocations == arenas
        for step in range(4):
            state = state_of(step)
            mgr.save(step, state)
            mgr.wait()
            assert_bit_identical(mgr.restore(step), state)
        assert stager.allocations == arenas


def test_reserve_from_a_template_touches_the_staging_memory(tmp_path) -> None:
    with torch.device("meta"):
        model = {"w": torch.empty(512, 1024), "b": torch.empty(300), "h": torch.empty(64, 64, dtype=torch.bfloat16)}
    with CheckpointManager(str(tmp_path), job="t", policy=FULL_ONLY, options=OPTS) as mgr:
        mgr.reserve({"model": model, "optim": {"m": ((70_000,), np.float32), "step": 0}})
        stager = mgr.backend.stager
        arena = stager.acquire(1)
        assert resident_bytes(arena.array) == -(-arena.array.nbytes // PAGE) * PAGE  # touched ahead of the save
        stager.release(arena)
        state = state_of(3)
        mgr.save(3, state)
        mgr.wait()
        assert stager.allocations == 1
        assert_bit_identical(mgr.restore(3), state)


def test_background_reserve_then_an_immediate_save_is_correct(tmp_path) -> None:
    big = {"w": torch.randn(8 << 20), "b": torch.arange(1000, dtype=torch.int64)}  # 32 MiB: the touch takes a while
    with CheckpointManager(str(tmp_path), job="bg", policy=WITH_INCREMENTALS, options=OPTS) as mgr:
        mgr.reserve(big, background=True)
        mgr.save(0, big)
        big2 = {"w": big["w"] + 1, "b": big["b"] * 2}
        mgr.save(1, big2)  # incremental: the second reserved arena
        mgr.wait()
        assert mgr.backend.stager.allocations == 2
        got0, got1 = mgr.restore(0), mgr.restore(1)
    assert torch.equal(got0["w"], big["w"]) and torch.equal(got0["b"], big["b"])
    assert torch.equal(got1["w"], big2["w"]) and torch.equal(got1["b"], big2["b"])


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="needs transparent huge pages")
def test_unreserved_first_save_stages_into_plain_pages_and_reserve_into_huge_pages() -> None:
    """Huge-page faults taken during the first save's copy ran 3-10x slower than plain ones on
    a loaded VM (benchmarks/first_touch.py): a fresh arena copied into on the clock uses plain
    pages, populated before the copy; only ``reserve`` (off the clock) asks for huge pages."""
    state = {"w": torch.randn(5 << 20), "b": torch.arange(1000, dtype=torch.int64)}  # ~20 MiB
    _, leaves = flatten(state)
    total = plan(leaves)[1]
    stager = Stager(pin=False)
    fresh = stager.acquire(total)
    assert not fresh.buffer.huge_pages and resident_bytes(fresh.array) == 0
    staged = stager.stage(leaves, fresh)
    assert resident_bytes(fresh.array[:total]) == -(-total // PAGE) * PAGE
    assert np.array_equal(np.frombuffer(staged[0].data, dtype=np.float32), state["w"].numpy())
    reserving = Stager(pin=False)
    reserving.reserve(total)
    reserved = reserving.acquire(total)
    assert reserved.buffer.huge_pages and resident_bytes(reserved.array) == -(-reserved.capacity // PAGE) * PAGE
    staged = reserving.stage(leaves, reserved)
    assert np.array_equal(np.frombuffer(staged[1].data, dtype=np.int64), np.arange(1000))


def test_a_closed_managers_staging_memory_is_reused_by_the_next_one(tmp_path):
    """A new manager in a running process copies its first save into the touched arena a
    closed one left (``staging.CLOSED_ARENAS``), not into fresh pages; only the largest closed
    arena is kept, and one too small for the state is not used."""
    small = {"w": np.arange(1 << 18, dtype=np.float32)}
    big = {"w": np.arange(1 << 20, dtype=np.float32)}
    with CheckpointManager(str(tmp_path / "a"), "a") as a:
        a.save(1, big).wait()
        assert a.backend.stager.allocations == 1
    with CheckpointManager(str(tmp_path / "b"), "b") as b:
        b.save(1, small).wait()  # the closed 4 MiB arena holds 1 MiB: reused
        assert b.backend.stager.allocations == 0
        assert np.array_equal(b.restore()["w"], small["w"])
    with CheckpointManager(str(tmp_path / "c"), "c") as c:
        c.save(1, big).wait()  # b handed the same arena back: reused again
        assert c.backend.stager.allocations == 0
        assert np.array_equal(c.restore()["w"], big["w"])
    with CheckpointManager(str(tmp_path / "d"), "d") as d:
        d.save(1, {"w": np.zeros(3 << 20, dtype=np.float32)}).wait()  # larger than what was kept
        assert d.backend.stager.allocations == 1
