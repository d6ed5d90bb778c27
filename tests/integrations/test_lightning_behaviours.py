"""Lightning's own checkpoint behaviours with TrainstoreCheckpointIO (issue 26 items 3 and 13),
each in Lightning's terms: a real in-process ``Trainer`` of a tiny module on the CPU."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from trainstore.checkpoint import CheckpointManager
from trainstore.errors import ConfigError
from trainstore.integrations.lightning import TrainstoreCheckpointIO


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def data(seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def trainer(io: TrainstoreCheckpointIO, root: Path, callbacks: list, **kw: object) -> pl.Trainer:
    kw.setdefault("max_steps", 4)
    return pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      plugins=[io], callbacks=callbacks, default_root_dir=str(root), **kw)


def store_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("trainstore")]


def test_same_step_saves_alias_only_identical_content(tmp_path):
    """Issue 26 item 3: ema.ckpt at the step of a top-k file, with other weights, loads its own."""
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    try:
        io.save_checkpoint({"global_step": 5, "w": torch.zeros(64)}, tmp_path / "top.ckpt")
        io.save_checkpoint({"global_step": 5, "w": torch.zeros(64)}, tmp_path / "last.ckpt")  # identical: alias
        io.save_checkpoint({"global_step": 5, "w": torch.full((64,), 7.0)}, tmp_path / "ema.ckpt")
        assert torch.equal(io.load_checkpoint(tmp_path / "ema.ckpt")["w"], torch.full((64,), 7.0))
        assert torch.equal(io.load_checkpoint(tmp_path / "top.ckpt")["w"], torch.zeros(64))
        top, last = (json.loads((tmp_path / n).read_text()) for n in ("top.ckpt", "last.ckpt"))
        assert (top["job"], top["step"]) == (last["job"], last["step"]) == ("job", 5)
    finally:
        io.teardown()
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        assert mgr.steps() == [5]  # the identical save shared the checkpoint


def test_save_checkpoint_after_fit_at_a_step_the_callback_saved(tmp_path):
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    t = trainer(io, tmp_path, [ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=-1)])
    model = Tiny()
    t.fit(model, data())
    t.save_checkpoint(tmp_path / "final.ckpt")  # step 4, saved by the callback already
    loaded = io.load_checkpoint(tmp_path / "final.ckpt")
    assert loaded["global_step"] == 4
    assert torch.equal(loaded["state_dict"]["net.weight"], model.net.weight.detach())
    io.teardown()
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:  # the callback's step 4 is not displaced
        assert list(mgr.store.list("jobs/job/abandoned/")) == [] and 4 in mgr.steps()


def test_a_path_is_visible_and_loadable_when_save_checkpoint_returns(tmp_path):
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    try:
        io.save_checkpoint({"global_step": 3, "w": torch.randn(4_000_000)}, tmp_path / "a.ckpt")
        assert (tmp_path / "a.ckpt").exists()  # as Lightning's own file would be
        assert io.load_checkpoint(tmp_path / "a.ckpt")["global_step"] == 3
    finally:
        io.teardown()


def test_version_suffixes_keep_every_checkpoint(tmp_path):
    """ModelCheckpoint picks ``model-vN.ckpt`` by checking whether the name exists."""
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    cb = ModelCheckpoint(dirpath=tmp_path / "ckpts", filename="model", every_n_train_steps=1, save_top_k=-1,
                         monitor="loss")
    trainer(io, tmp_path, [cb], max_steps=3).fit(Tiny(), data())
    names = sorted(p.name for p in (tmp_path / "ckpts").glob("*.ckpt"))
    assert names == ["model-v1.ckpt", "model-v2.ckpt", "model.ckpt"]
    steps = {n: json.loads((tmp_path / "ckpts" / n).read_text())["step"] for n in names}
    assert steps == {"model.ckpt": 1, "model-v1.ckpt": 2, "model-v2.ckpt": 3}
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        assert mgr.steps() == [1, 2, 3]


def test_weights_only_and_full_checkpoint_at_one_step_resume(tmp_path):
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    weights = ModelCheckpoint(dirpath=tmp_path / "w", every_n_train_steps=2, save_top_k=-1, save_weights_only=True)
    full = ModelCheckpoint(dirpath=tmp_path / "f", every_n_train_steps=2, save_top_k=-1, monitor="loss")
    trainer(io, tmp_path, [weights, full]).fit(Tiny(), data())
    full_ckpt = io.load_checkpoint(tmp_path / "f" / "epoch=0-step=4.ckpt")
    assert "optimizer_states" in full_ckpt
    assert "optimizer_states" not in io.load_checkpoint(tmp_path / "w" / "epoch=0-step=4.ckpt")
    io.teardown()
    io2 = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    t = trainer(io2, tmp_path, [], max_steps=6)
    t.fit(Tiny(), data(), ckpt_path=str(tmp_path / "f" / "epoch=0-step=4.ckpt"))  # resumes with its optimizer
    assert t.global_step == 6 and io2.last_restore is not None


def test_no_thread_left_after_a_post_fit_save(tmp_path):
    before = store_threads()
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    t = trainer(io, tmp_path, [ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2)])
    t.fit(Tiny(), data())
    assert store_threads() == before  # teardown at the end of fit
    t.save_checkpoint(tmp_path / "after.ckpt")
    assert store_threads() == before  # the post-fit save is committed and its manager released
    assert os.path.exists(tmp_path / "after.ckpt")
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        assert 4 in mgr.steps()


def test_a_checkpoint_of_another_framework_or_layout_is_refused_saying_which(tmp_path):
    store = str(tmp_path / "store")
    with CheckpointManager(store, "plain") as mgr:
        mgr.save(1, {"w": torch.ones(3)})
    with CheckpointManager(store, "hf") as mgr:
        mgr.save(1, {"w": torch.ones(3)}, extra={"hf": {"trainer_state": {}}})
    torch.save({"global_step": 1}, tmp_path / "own.ckpt")  # Lightning's own TorchCheckpointIO file
    for job, said in (("plain", "a plain CheckpointManager"), ("hf", "by hf")):
        io = TrainstoreCheckpointIO(store, job)
        try:
            with pytest.raises(ConfigError, match=f"not saved by TrainstoreCheckpointIO .*{said}"):
                io.load_checkpoint("trainstore:latest")
        finally:
            io.teardown()
    io = TrainstoreCheckpointIO(store, "plain")
    try:
        with pytest.raises(ConfigError, match="not a trainstore checkpoint pointer .*TorchCheckpointIO"):
            io.load_checkpoint(tmp_path / "own.ckpt")
    finally:
        io.teardown()


def test_rerun_with_a_new_trainer_in_the_same_job(tmp_path):
    """A fresh run (new Trainer, no ckpt_path) reaching the steps of an earlier run saves its own."""
    finals = []
    for seed in (0, 1):
        pl.seed_everything(seed, verbose=False)
        io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
        model = Tiny()
        trainer(io, tmp_path, [ModelCheckpoint(dirpath=tmp_path / f"ckpts{seed}", every_n_train_steps=2)]).fit(
            model, data())
        finals.append(model.net.weight.detach().clone())
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    try:
        assert torch.equal(io.load_checkpoint(tmp_path / "ckpts1" / "epoch=0-step=4.ckpt")["state_dict"]["net.weight"],
                           finals[1])
        assert torch.equal(io.load_checkpoint("trainstore:latest")["state_dict"]["net.weight"], finals[1])
    finally:
        io.teardown()


def test_resume_from_an_older_ckpt_rolls_back(tmp_path):
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    cb = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=-1)
    trainer(io, tmp_path, [cb], max_steps=6).fit(Tiny(), data())
    io2 = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    model = Tiny()
    cb2 = ModelCheckpoint(dirpath=tmp_path / "ckpts2", every_n_train_steps=2, save_top_k=-1)
    t = trainer(io2, tmp_path, [cb2], max_steps=6)
    t.fit(model, data(seed=5), ckpt_path=str(tmp_path / "ckpts" / "epoch=0-step=2.ckpt"))  # other data: new content
    assert io2.last_restore.step == 2 and t.global_step == 6
    io3 = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    try:
        latest = io3.load_checkpoint("trainstore:latest")
        assert latest["global_step"] == 6
        assert torch.equal(latest["state_dict"]["net.weight"], model.net.weight.detach())
    finally:
        io3.teardown()
