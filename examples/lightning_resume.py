"""PyTorch Lightning with trainstore checkpoints, end to end (CPU, under a minute).

1. fits a tiny model, checkpointing through ``TrainstoreCheckpointIO`` (async, incremental,
   verified), with ``ModelCheckpoint(save_top_k=2, save_last=True)``;
2. "crashes" mid-epoch (stops the process's fit at step 20 by raising);
3. corrupts the newest checkpoint on purpose;
4. resumes with ``ckpt_path="last"``: trainstore falls back to the newest checkpoint that
   verifies and says which one it chose; training continues mid-epoch in the same data order.

    python examples/lightning_resume.py [WORKDIR]
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.integrations.lightning import TrainstoreCheckpointIO
from trainstore.integrations.torchdata import StatefulSampler


class Tiny(pl.LightningModule):
    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class SimulatedCrash(RuntimeError):
    pass


class CrashAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            raise SimulatedCrash(f"simulated crash at step {self.step}")


def trainer(root: str, io: TrainstoreCheckpointIO, *extra: Callback) -> pl.Trainer:
    ckpt = ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), every_n_train_steps=4, save_top_k=2,
                           monitor="train_loss", save_last=True)
    return pl.Trainer(max_epochs=2, accelerator="cpu", deterministic=True, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, plugins=[io], callbacks=[ckpt, *extra], default_root_dir=root)


def data() -> StatefulDataLoader:
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
    ds = TensorDataset(x, x.sum(1, keepdim=True).sin())
    return StatefulDataLoader(ds, batch_size=8, sampler=StatefulSampler(ds, 8, seed=2))


def main(root: str) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    store = os.path.join(root, "store")  # or "s3://bucket/prefix"
    policy = CheckpointPolicy(full_every=8, incremental_every=4)

    pl.seed_everything(0, verbose=False)
    io = TrainstoreCheckpointIO(store, "tiny-run", policy=policy)
    t = trainer(root, io, CrashAt(20))
    try:
        t.fit(Tiny(), data())
    except SimulatedCrash as exc:
        print(f"1. {exc}")

    with CheckpointManager(store, "tiny-run") as mgr:
        for info in mgr.list():
            print(f"   step {info.step:3d} {info.kind:<11} {info.stored_bytes / 1e3:6.1f} kB stored")
        newest = mgr.latest_step()
        path = os.path.join(store, "jobs", "tiny-run", "checkpoints", f"{newest:012d}", "manifest.json")
    with open(path, "r+b") as f:  # 2. damage the newest checkpoint
        f.seek(10)
        f.write(b"garbage")
    print(f"2. corrupted the manifest of step {newest}")

    pl.seed_everything(0, verbose=False)
    io = TrainstoreCheckpointIO(store, "tiny-run", policy=policy)
    t = trainer(root, io)
    t.fit(Tiny(), data(), ckpt_path="last")
    print(f"3. resumed: {io.last_restore}")
    print(f"4. finished at step {t.global_step}; Lightning's files are pointers: "
          f"{sorted(os.listdir(os.path.join(root, 'ckpts')))}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="trainstore-lightning-"))
