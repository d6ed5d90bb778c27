"""A real ``Trainer.fit`` of a tiny LightningModule on CPU, checkpointing through trainstore.

    python lightning_child.py STORE JOB ROOT OUT [--resume] [--slow-after N]

Prints ``STEP <global_step>`` (flushed) after every optimizer step, so a parent can SIGKILL it
mid-epoch; with ``--resume`` it fits with ``ckpt_path="last"``. At the end it writes every
parameter, the optimizer and scheduler state and the restored step to OUT (torch.save of
plain tensors: test output only) and prints ``DONE``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import sys
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from trainstore.checkpoint import CheckpointPolicy
from trainstore.integrations.lightning import TrainstoreCheckpointIO
from trainstore.integrations.torchdata import StatefulSampler

EPOCHS = 2
ROWS = 256
BATCH = 8  # 32 steps per epoch


class Act(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


@dataclasses.dataclass
class Arch:
    hidden: int = 16
    act: Act = Act.RELU


class Tiny(pl.LightningModule):
    def __init__(self, lr: float = 0.01, arch: Arch = Arch(), opts: argparse.Namespace | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, arch.hidden), torch.nn.ReLU(), torch.nn.Linear(arch.hidden, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


class Beacon(pl.Callback):
    """Prints each step; sleeps after ``slow_after`` so a kill lands mid-epoch."""

    def __init__(self, slow_after: int | None) -> None:
        self.slow_after = slow_after

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, outputs: object,
                           batch: list[torch.Tensor], batch_idx: int) -> None:
        print(f"STEP {trainer.global_step} {batch_idx} {float(batch[0].sum()):.6f} {float(outputs['loss']):.9f}", flush=True)
        if self.slow_after is not None and trainer.global_step >= self.slow_after:
            time.sleep(0.2)


def data() -> StatefulDataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    ds = TensorDataset(x, y)
    # trainstore's plan: the order of every epoch follows from (seed, epoch), so a mid-epoch
    # resume continues exactly (torchdata's own RandomSampler reshuffles the next epoch
    # differently after a resume, with Lightning's default checkpointing too)
    return StatefulDataLoader(ds, batch_size=BATCH, sampler=StatefulSampler(ds, BATCH, seed=2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("job")
    ap.add_argument("root")
    ap.add_argument("out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--slow-after", type=int, default=None)
    args = ap.parse_args()
    pl.seed_everything(0, verbose=False)
    io = TrainstoreCheckpointIO(args.store, args.job, policy=CheckpointPolicy(full_every=10, incremental_every=1))
    ckpt = ModelCheckpoint(dirpath=os.path.join(args.root, "ckpts"), every_n_train_steps=4, save_top_k=2,
                           monitor="train_loss", save_last=True)
    trainer = pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", deterministic=True, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, plugins=[io],
                         callbacks=[ckpt, Beacon(args.slow_after)], default_root_dir=args.root)
    model = Tiny(arch=Arch(hidden=16, act=Act.TANH), opts=argparse.Namespace(note="tiny", depth=2))
    trainer.fit(model, data(), ckpt_path="last" if args.resume else None)
    restored = io.last_restore.step if io.last_restore is not None else -1
    opt, sched = trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "optim": opt.state_dict(), "sched": sched.state_dict(), "restored": restored,
                "global_step": trainer.global_step}, args.out)
    print("DONE", flush=True)


if __name__ == "__main__":
    sys.exit(main())
