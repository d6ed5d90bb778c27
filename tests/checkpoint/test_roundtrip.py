"""Round trips: every dtype and nesting, incrementals bit-exact, restore_into in place, errors."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import AlreadyExistsError, BackgroundError, ConfigError, UnsupportedTypeError

pytestmark = pytest.mark.timeout(120)

TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
                torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2]

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 20)


def _tensor(dtype, shape=(3, 5)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a, b.view(-1).view(torch.uint8) if b.numel() else b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def full_state():
    return {
        "torch": {str(dt): _tensor(dt) for dt in TORCH_DTYPES},
        "scalar0d": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "noncontig": torch.arange(20.0).reshape(4, 5).t(),
        "big": torch.randn(5000),  # several chunks of 4 KiB
        "numpy": [np.arange(6, dtype=np.int32).reshape(2, 3), np.ones(3, dtype=">f8"), np.array([True, False])],
        "np_scalars": (np.float32(1.25), np.int64(-7), np.bool_(True)),
        "nested": OrderedDict(a=[1, 2.5, None, "s", b"bytes", (True, False)], b={1: "int key", None: 0, 2.5: "f"}),
        "floats": [float("inf"), float("-inf"), float("nan"), -0.0],
        "big_bytes": bytes(range(256)) * 300,
        "meta": {"dtype": torch.bfloat16, "device": torch.device("cpu"), "size": torch.Size([2, 3])},
    }


def test_roundtrip_every_dtype_and_nesting(any_store):
    state = full_state()
    with CheckpointManager(any_store, job="rt", options=SMALL) as mgr:
        mgr.save(7, state, metrics={"loss": 1.0}, config={"lr": 0.1}, blocking=True)
        back = mgr.restore()
        assert mgr.last_restore.step == 7
    assert _equal(state["noncontig"].contiguous(), back["noncontig"])
    state["noncontig"] = state["noncontig"].contiguous()
    assert _equal(state, back)


def test_incremental_is_bit_exact_and_smaller(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # deltas that save a few % kept on any machine (auto keeps only those that halve on 2 cores)
    mgr = CheckpointManager(str(tmp_path), job="inc", policy=CheckpointPolicy(full_every=10, incremental_every=2),
                            options=WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 20, incompressible_ratio=0.97))
    snapshots = {}
    for step in range(0, 9):
        model(torch.randn(8, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if mgr.should_save(step):
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            mgr.save(step, state)
            snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
    mgr.wait()
    infos = {i.step: i for i in mgr.list()}
    assert infos[0].kind == "full" and infos[8].kind == "incremental" and infos[8].base_step == 0
    assert infos[8].stored_bytes < infos[0].stored_bytes
    for step, snap in snapshots.items():
        back = mgr.restore(step=step)
        for k, v in snap.items():
            assert torch.equal(back["model"][k], v), (step, k)
    mgr.close()


def test_frozen_params_cost_nothing_in_incremental(tmp_path):
    frozen = torch.randn(64, 1024)
    mgr = CheckpointManager(str(tmp_path), job="ft", policy=CheckpointPolicy(full_every=100, incremental_every=1),
                            options=SMALL)
    head = torch.randn(16)
    mgr.save(0, {"frozen": frozen, "head": head}, blocking=True)
    head += 1
    mgr.save(1, {"frozen": frozen, "head": head}, blocking=True)
    m = mgr.manifest(1)
    assert m.kind == "incremental"
    assert all(c.same_as_base for c in m.tensors["frozen"].chunks)
    assert m.stored_bytes < 200  # only the head tensor's piece
    assert m.written_bytes < 200
    assert torch.equal(mgr.restore()["frozen"], frozen)
    mgr.close()


def test_incremental_without_base_in_memory_reads_store(tmp_path):
    pol = CheckpointPolicy(full_every=10, incremental_every=1, keep_base_in_memory=False)
    w = torch.randn(4096)
    opts = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 20, pack_below=0)  # XOR deltas: not packed
    with CheckpointManager(str(tmp_path), job="j", policy=pol, options=opts) as mgr:
        mgr.save(0, {"w": w}, blocking=True)
    w2 = w + 1e-4
    with CheckpointManager(str(tmp_path), job="j", policy=pol, options=opts) as mgr:  # fresh process-like
        mgr.save(1, {"w": w2}, blocking=True)
        assert mgr.manifest(1).kind == "incremental"
        assert any(c.is_delta for c in mgr.manifest(1).tensors["w"].chunks)
        assert torch.equal(mgr.restore()["w"], w2)


def test_restore_into_fills_tensors_in_place(tmp_path):
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    model(torch.randn(2, 32)).sum().backward()
    opt.step()
    with CheckpointManager(str(tmp_path), job="into", options=SMALL) as mgr:
        mgr.save(1, {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}, blocking=True)
        model2 = torch.nn.Linear(32, 32)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
        model2(torch.randn(2, 32)).sum().backward()
        opt2.step()
        target = {"model": model2.state_dict(), "optim": opt2.state_dict(), "epoch": 0}
        ptr = target["model"]["weight"].data_ptr()
        result = mgr.restore_into(target)
    assert result.step == 1 and target["epoch"] == 3
    assert target["model"]["weight"].data_ptr() == ptr
    assert torch.equal(model2.weight, model.weight)  # the module's own parameter was filled
    assert target["optim"]["param_groups"][0]["lr"] == 0.5
    opt2.load_state_dict(target["optim"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_restore_into_mismatch_is_clear(tmp_path):
    with CheckpointManager(str(tmp_path), job="mm", options=SMALL) as mgr:
        mgr.save(1, {"w": torch.zeros(3)}, blocking=True)
        with pytest.raises(ConfigError, match=r"state\['w'\]"):
            mgr.restore_into({"w": torch.zeros(4)})


def test_unsupported_leaf_names_path(tmp_path):
    with CheckpointManager(str(tmp_path), job="bad") as mgr:
        with pytest.raises(UnsupportedTypeError, match=r"state\['optim'\]\['param_groups'\]\[0\]\['foo'\]"):
            mgr.save(1, {"optim": {"param_groups": [{"foo": object()}]}})
        with pytest.raises(UnsupportedTypeError, match="object"):
            mgr.save(2, {"x": np.array([object()])})
        assert mgr.steps() == []


def test_existing_step_and_unknown_metric(tmp_path):
    with CheckpointManager(str(tmp_path), job="dup") as mgr:
        mgr.save(5, {"w": torch.ones(2)}, metrics={"val_loss": 0.3}, blocking=True)
        with pytest.raises(AlreadyExistsError, match="step 5"):
            mgr.save(5, {"w": torch.ones(2)})
        with pytest.raises(ConfigError, match="accuracy.*val_loss"):
            mgr.restore(best="accuracy")


def test_best_metric_and_step(tmp_path):
    with CheckpointManager(str(tmp_path), job="best") as mgr:
        for step, loss in [(1, 0.5), (2, 0.2), (3, 0.4)]:
            mgr.save(step, {"step": step}, metrics={"val_loss": loss})
        mgr.wait()
        assert mgr.restore(best="val_loss")["step"] == 2
        assert (mgr.last_restore.step, mgr.last_restore.reason) == (2, "best val_loss=0.2 (min)")
        assert mgr.restore(best="val_loss", mode="max")["step"] == 1
        assert (mgr.last_restore.step, mgr.last_restore.reason) == (1, "best val_loss=0.5 (max)")
        assert mgr.restore(step=1)["step"] == 1
        assert (mgr.last_restore.step, mgr.last_restore.reason) == (1, "step 1 was asked for")


def test_background_error_surfaces_at_next_call(tmp_path):
    calls = []

    class Boom(Exception):
        pass

    mgr = CheckpointManager(str(tmp_path), job="bg", options=SMALL)
    real_put = mgr.chunks.put

    def failing_put(*a, **k):
        calls.append(1)
        raise OSError("disk on fire")

    mgr.chunks.put = failing_put
    h = mgr.save(1, {"w": torch.randn(100)})
    with pytest.raises(OSError):
        h.wait()
    mgr.chunks.put = real_put
    with pytest.raises(BackgroundError, match="step 1.*disk on fire"):
        mgr.save(2, {"w": torch.randn(100)})
    assert mgr.steps() == []  # nothing half-written became visible
    mgr.save(3, {"w": torch.randn(100)})
    mgr.wait()
    assert mgr.steps() == [3]
    mgr.close()
    assert calls


def test_background_error_surfaces_at_wait_and_close(tmp_path):
    mgr = CheckpointManager(str(tmp_path), job="bg2", options=SMALL)
    mgr.chunks.put = lambda *a, **k: (_ for _ in ()).throw(OSError("nope"))
    mgr.save(1, {"w": torch.randn(100)})
    with pytest.raises(BackgroundError):
        mgr.wait()
    mgr.save(2, {"w": torch.randn(100)})
    with pytest.raises(BackgroundError):
        mgr.close()


def test_staging_buffers_are_reused(tmp_path):
    w = torch.randn(10000)
    with CheckpointManager(str(tmp_path), job="reuse", policy=CheckpointPolicy(full_every=5, incremental_every=1),
                           options=SMALL) as mgr:
        for step in range(12):
            w += 0.01
            mgr.save(step, {"w": w})
        mgr.wait()
        assert mgr.backend.stager.allocations == 2  # base + staging, whatever the number of saves
        assert torch.equal(mgr.restore()["w"], w)


def test_busy_skip_warns(tmp_path):
    pol = CheckpointPolicy(on_busy="skip")
    with CheckpointManager(str(tmp_path), job="skip", policy=pol, options=SMALL) as mgr:
        import threading
        gate = threading.Event()
        real = mgr.chunks.put
        mgr.chunks.put = lambda *a, **k: (gate.wait(10), real(*a, **k))[1]
        mgr.save(1, {"w": torch.randn(100)})
        with pytest.warns(RuntimeWarning, match="skipped"):
            h = mgr.save(2, {"w": torch.randn(100)})
        assert h.skipped
        gate.set()
        mgr.wait()
        assert mgr.steps() == [1]


def test_rng_roundtrip(tmp_path):
    import random

    from trainstore.checkpoint import capture_rng, restore_rng

    with CheckpointManager(str(tmp_path), job="rng") as mgr:
        mgr.save(1, {"rng": capture_rng()}, blocking=True)
        expected = (random.random(), np.random.rand(), torch.rand(3))
        restore_rng(mgr.restore()["rng"])
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert expected[0] == got[0] and expected[1] == got[1] and torch.equal(expected[2], got[2])
