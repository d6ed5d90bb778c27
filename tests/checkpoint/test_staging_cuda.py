"""Staging CUDA state: side-stream copies into the pinned arena, ordered by events.

The CPU tests run everywhere. The GPU tests are skipped where torch sees no CUDA device -
in CI too, on purpose: CI machines have no GPU (an allowed, explicit skip, not a missing
dependency); ``benchmarks/gpu.sh`` runs them on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainstore.checkpoint import CheckpointManager
from trainstore.checkpoint.format.state import flatten
from trainstore.checkpoint.save.staging import Arena, Stager, plan
from trainstore.devicecopy import cuda_available, to_host
from trainstore.errors import ConfigError
from trainstore.hostmem import HostBuffer

pytestmark = pytest.mark.timeout(120)

#: explicit GPU skip, allowed in CI (no GPU there); see the module docstring
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device (CI has none; "
                                "benchmarks/gpu.sh runs these on a GPU machine)")
no_cuda = pytest.mark.skipif(cuda_available(), reason="checks the behaviour without a CUDA device")


def stage(state, stager=None, busy_ms: float = 0):
    """Stage ``state`` into a fresh arena, after ``busy_ms`` of work queued on the current stream
    (queued after the arena is made: pinning it may synchronize the device)."""
    stager = stager or Stager()
    _, leaves = flatten(state)
    arena = stager.acquire(plan(leaves)[1])
    if busy_ms:
        busy(busy_ms)
    return stager.stage(leaves, arena), arena


def staged_bytes(t) -> bytes:
    return bytes(t.data)


def host_bytes(x: torch.Tensor) -> bytes:
    return x.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# -- CPU: runs everywhere ----------------------------------------------------------------------

def test_cuda_wait_must_be_known() -> None:
    with pytest.raises(ConfigError, match="cuda_wait"):
        Stager(cuda_wait="device")


def test_host_tensors_stage_without_a_fence() -> None:
    """Host leaves are copied on the caller's thread: nothing in flight, no fence to wait on."""
    state = {"w": torch.arange(1 << 16, dtype=torch.float32), "t": torch.arange(12.0).reshape(3, 4).t(),
             "n": np.arange(100, dtype=np.int16)}
    staged, arena = stage(state, Stager(pin=False))
    assert arena.copying is None and all(t.fence is None for t in staged)
    by = {t.name: t for t in staged}
    assert staged_bytes(by["w"]) == host_bytes(state["w"])
    assert staged_bytes(by["t"]) == host_bytes(state["t"])  # non-contiguous: torch copy_
    assert staged_bytes(by["n"]) == state["n"].tobytes()


def test_to_host_takes_cuda_sources_only() -> None:
    with pytest.raises(ConfigError, match="CUDA"):
        to_host([(torch.empty(4), torch.zeros(4))])


@no_cuda
def test_pinning_needs_cuda() -> None:
    """Without CUDA an arena is plain memory, and asking for a pin is a clear error."""
    assert not Arena(1 << 20).pinned
    with pytest.raises(ConfigError, match="needs CUDA"):
        HostBuffer(1 << 20, pin=True)


# -- GPU ---------------------------------------------------------------------------------------

def busy(ms: float) -> None:
    """Queue ~ms of spinning on the current stream (work the training queued before the save)."""
    torch.cuda._sleep(int(ms * 2e6))  # cycles at ~2 GHz


def gpu_state(mib: int = 64) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    n = (mib << 20) // 2
    return {"model": {"w": torch.randn(n, device="cuda", generator=g, dtype=torch.bfloat16),
                      "b": torch.randn(1000, device="cuda", generator=g),
                      "t": torch.randn(64, 48, device="cuda", generator=g).t()},  # non-contiguous
            "step": 7, "host": torch.arange(10)}


@needs_cuda
def test_stage_does_not_sync_the_device(monkeypatch) -> None:
    """The save orders its copies by events: no device-wide synchronize (which would wait for
    every stream's queued work, the training's next steps included)."""
    state = gpu_state()
    want = {k: host_bytes(v) for k, v in state["model"].items()}

    def refuse() -> None:
        raise AssertionError("torch.cuda.synchronize() called while staging")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    staged, _ = stage(state)
    by = {t.name: t for t in staged}
    for k, v in want.items():
        assert staged_bytes(by[f"model/{k}"]) == v, k


@needs_cuda
def test_stage_returns_before_the_copy_ran() -> None:
    """With cuda_wait='stream' the host is released once the copies are enqueued: behind 300 ms
    of queued training work the copy has not run when stage returns; the bytes are right once
    the writer reads them (StagedTensor.data waits for the copy-done event)."""
    state = gpu_state()
    want = host_bytes(state["model"]["w"])
    staged, arena = stage(state, busy_ms=300)
    assert arena.copying is not None and not arena.copying.done()
    w = next(t for t in staged if t.name == "model/w")
    assert staged_bytes(w) == want and arena.copying.done()


@needs_cuda
@pytest.mark.parametrize("cuda_wait", ["stream", "host"])
def test_training_after_the_save_does_not_change_the_saved_bytes(cuda_wait) -> None:
    """The optimizer step enqueued right after the save (on the training stream) runs after the
    copy: the staged bytes are the state as of the save."""
    state = gpu_state(256)
    want = host_bytes(state["model"]["w"])
    staged, arena = stage(state, Stager(cuda_wait=cuda_wait), busy_ms=50)
    if cuda_wait == "host":
        assert arena.copying.done()
    state["model"]["w"].add_(1.0)  # the next optimizer step
    w = next(t for t in staged if t.name == "model/w")
    assert staged_bytes(w) == want
    assert host_bytes(state["model"]["w"]) != want


@needs_cuda
def test_a_source_freed_after_the_save_is_not_reused_before_its_copy() -> None:
    """The caller drops its tensors right after the save and allocates new ones: the caching
    allocator must not hand the sources' memory out before their copy ran (record_stream)."""
    state = gpu_state(128)
    want = host_bytes(state["model"]["w"])
    staged, _ = stage(state, busy_ms=50)
    n = state["model"]["w"].numel()
    del state
    fresh = [torch.full((n,), 3.0, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    w = next(t for t in staged if t.name == "model/w")
    assert staged_bytes(w) == want
    del fresh


@needs_cuda
def test_arena_reuse_waits_for_the_copy_in_flight() -> None:
    """A save that reuses an arena whose copy is still in flight waits for it first."""
    stager = Stager()
    staged, arena = stage(gpu_state(), stager, busy_ms=200)
    fence = arena.copying
    stager.release(arena)
    again = stager.acquire(plan(flatten(gpu_state())[1])[1])
    assert again is arena and fence.done() and arena.copying is None


@needs_cuda
def test_manager_saves_and_restores_cuda_state(tmp_path) -> None:
    """End to end: CUDA state saved twice (the second after a step) and restored into CUDA tensors."""
    state = gpu_state()
    with CheckpointManager(str(tmp_path / "ckpt"), "job") as mgr:
        mgr.save(1, state)
        first = host_bytes(state["model"]["w"])
        state["model"]["w"].mul_(2)
        mgr.save(2, state)
        mgr.wait()
        into = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "step": 0,
                "host": torch.zeros(10, dtype=torch.int64)}
        got = mgr.restore_into(into, step=1).state
    assert got["model"]["w"].device.type == "cuda" and host_bytes(got["model"]["w"]) == first
    assert host_bytes(got["model"]["t"]) == host_bytes(state["model"]["t"]) and got["step"] == 7
