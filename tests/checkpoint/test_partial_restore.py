"""Issue 19 item 4: restore part of a checkpoint and re-initialise the rest (only= / reset=)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format.state import NOT_LOADED
from trainstore.errors import ConfigError, IntegrityError, NoValidCheckpointError

pytestmark = pytest.mark.timeout(120)


def _train(steps: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        loss = model(torch.randn(8, 32)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def _fresh(lr: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)


@pytest.fixture
def saved(tmp_path):
    model, opt = _train()
    mgr = CheckpointManager(str(tmp_path / "store"), "job", CheckpointPolicy(full_every=1, incremental_every=None))
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "scheduler": {"last_epoch": 7, "lr": [0.1]},
             "rng": {"seed": np.arange(4, dtype=np.int64)}}
    mgr.save(10, state, blocking=True)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = {k: v["momentum_buffer"].clone() for k, v in opt.state_dict()["state"].items()}
    yield mgr, expected, momentum
    mgr.close()


def _chunk_keys(mgr: CheckpointManager, step: int, under: str) -> set[str]:
    m = mgr.manifest(step)

    def keys(pred) -> set[str]:
        return {r.key(mgr.chunks.prefix) for n, t in m.tensors.items() if pred(n) for p in t.chunks for r in p.refs()}

    return keys(lambda n: n.startswith(under + "/")) - keys(lambda n: not n.startswith(under + "/"))


def test_model_only_with_a_fresh_optimizer(saved):
    """The recipe: load the model, build a fresh optimizer with a new LR."""
    mgr, expected, _momentum = saved
    model, opt = _fresh(lr=0.01)
    result = mgr.restore_into({"model": model.state_dict()}, only=["model"])
    for k, v in model.state_dict().items():
        assert v.dtype == expected[k].dtype and torch.equal(v.view(torch.uint8), expected[k].view(torch.uint8))
    assert opt.state_dict()["state"] == {} and opt.param_groups[0]["lr"] == 0.01
    assert mgr.last_restore is result and result.step == 10
    p = result.partial
    assert set(p.loaded) == {f"model/{k}" for k in expected} and set(p.not_loaded) == {"optim/state/0/momentum_buffer",
                                                                    "optim/state/1/momentum_buffer",
                                                                    "optim/state/2/momentum_buffer",
                                                                    "optim/state/3/momentum_buffer", "rng/seed"}
    m = mgr.manifest(10)
    assert p.read_stored_bytes + p.skipped_stored_bytes == sum(  # a pack of small tensors counts once
        r.stored for r in {r for t in m.tensors.values() for piece in t.chunks for r in piece.refs()})
    assert p.skipped_stored_bytes > 0 and "partial restore" in str(result)


def test_skipped_chunks_are_not_read(saved):
    mgr, expected, _ = saved
    gone = _chunk_keys(mgr, 10, "optim")
    assert gone
    for key in gone:  # the optimizer's chunks are lost: a full restore cannot load step 10
        mgr.store.delete(key)
    state = mgr.restore(only="model")
    assert list(state) == ["model"]
    for k, v in state["model"].items():
        assert torch.equal(v.view(torch.uint8), expected[k].view(torch.uint8))
    with pytest.raises(IntegrityError):
        mgr.restore(step=10)


def test_reset_keeps_the_targets_entries(saved):
    mgr, expected, momentum = saved
    model, opt = _fresh(lr=0.01)
    loss = model(torch.randn(8, 32)).square().mean()
    loss.backward()
    opt.step()  # the fresh optimizer has its own momentum now
    fresh_state = {k: v["momentum_buffer"].clone() for k, v in opt.state_dict()["state"].items()}
    target = {"model": model.state_dict(), "optim": opt.state_dict(), "scheduler": {"last_epoch": 0, "lr": [0.01]},
              "rng": {"seed": np.zeros(4, dtype=np.int64)}}
    result = mgr.restore_into(target, reset=["optim/state", "scheduler"])
    for k, v in target["model"].items():
        assert torch.equal(v, expected[k])
    for k, v in target["optim"]["state"].items():  # untouched: not the checkpoint's momentum
        assert torch.equal(v["momentum_buffer"], fresh_state[k]) and not torch.equal(v["momentum_buffer"], momentum[k])
    assert target["optim"]["param_groups"][0]["lr"] == 0.1 and target["optim"]["param_groups"][0]["momentum"] == 0.9
    assert target["scheduler"] == {"last_epoch": 0, "lr": [0.01]}
    assert target["rng"]["seed"].tolist() == [0, 1, 2, 3]
    assert result.partial.reset == ("optim/state", "scheduler")


def test_list_items_left_out_stay_in_the_target(tmp_path):
    with CheckpointManager(str(tmp_path), "job") as mgr:
        mgr.save(1, {"layers": [np.full(3, 1.0), np.full(3, 2.0)], "meta": ("a", 5)}, blocking=True)
        got = mgr.restore(only=["layers/1"])
        assert got["layers"][0] is NOT_LOADED and got["layers"][1].tolist() == [2.0] * 3 and "meta" not in got
        target = {"layers": [np.zeros(3), np.zeros(3)], "meta": ("b", 6)}
        mgr.restore_into(target, reset=["layers/0", "meta/1"])
        assert target["layers"][0].tolist() == [0.0] * 3 and target["layers"][1].tolist() == [2.0] * 3
        assert target["meta"] == ("a", 6)


def test_partial_restore_verifies_and_stays_transactional(saved):
    mgr, expected, _ = saved
    key = sorted(_chunk_keys(mgr, 10, "model"))[0]
    data = bytearray(bytes(memoryview(mgr.store.get(key))))
    data[len(data) // 2] ^= 0xFF
    mgr.store.put(key, bytes(data))
    mgr.chunks.forget()
    model, _opt = _fresh(lr=0.01)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(IntegrityError):
        mgr.restore_into({"model": model.state_dict()}, step=10, only="model")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    with pytest.raises(NoValidCheckpointError):
        mgr.restore(only="model")  # the only candidate is bad now


def test_selector_naming_nothing_is_a_config_error(saved):
    mgr, _, _ = saved
    with pytest.raises(ConfigError, match="'modle'.*top-level names include"):
        mgr.restore(only=["modle"])
    with pytest.raises(ConfigError, match="only="):
        mgr.restore(only=[""])
