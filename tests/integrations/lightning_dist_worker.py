"""A real multi-process ``Trainer.fit`` (gloo, CPU) checkpointing through trainstore.

    [LIGHTNING_NS=lightning] python lightning_dist_worker.py STORE JOB ROOT OUT
        --strategy ddp|ddp_spawn|fsdp --devices N [--max-steps S] [--resume] [--plain]

Launched either by ``torchrun`` (Lightning sees the torchelastic environment) or plainly, when
Lightning's own DDP launcher starts the other ranks (``ddp``: subprocess, it re-runs this
script; ``ddp_spawn``: multiprocessing spawn, pickling the module classes below).
``fsdp``: ``TrainstoreModelParallelStrategy`` with FSDP2 ``fully_shard`` in ``configure_model``.
``LIGHTNING_NS=lightning``: the unified ``lightning.pytorch`` namespace. ``--plain``: Lightning's
own checkpointing (a baseline). Rank 0 writes OUT (torch.save of full tensors: test output
only): every parameter and the optimizer state at the end, the parameters right after the
restore, the restored step and ``last_restore``; then prints ``DONE``.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from trainstore.integrations.torchdata import StatefulSampler

UNIFIED = os.environ.get("LIGHTNING_NS") == "lightning"
pl = importlib.import_module("lightning.pytorch" if UNIFIED else "pytorch_lightning")
ts = importlib.import_module("trainstore.integrations.lightning_unified" if UNIFIED else "trainstore.integrations.lightning")

ROWS = 64
BATCH = 4


def _destroy_process_groups() -> None:
    """Every process group goes before the interpreter shuts down, as torch asks of a script.
    Lightning registers this only for NCCL; a gloo group left to finalization can abort the
    process with "terminate called without an active exception" (pytorch#190489, #65231): CI
    saw it once in a ``ddp_spawn`` child. Registered at import, so the spawned children (which
    re-import this module) run it too."""
    if dist.is_initialized():
        dist.destroy_process_group()


atexit.register(_destroy_process_groups)


class Tiny(pl.LightningModule):
    def __init__(self, shard: bool) -> None:
        super().__init__()
        self.shard = shard
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def configure_model(self) -> None:
        if self.shard:
            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def train_dataloader(self) -> StatefulDataLoader:
        # built once torch.distributed runs: trainstore's plan splits each epoch across the
        # ranks from (seed, epoch) and resumes mid-epoch from rank 0's saved position, on any
        # world size (torch's DistributedSampler reshuffles after a mid-epoch resume)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(ROWS, 8, generator=g)
        ds = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
        return StatefulDataLoader(ds, batch_size=BATCH, sampler=StatefulSampler(ds, BATCH, seed=2))

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)}


class Probe(pl.Callback):
    """The parameters at the start of training (right after a restore)."""

    def __init__(self) -> None:
        self.after_restore: dict | None = None

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.after_restore = full_params(module)


def full_params(module: torch.nn.Module) -> dict:
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.detach().clone() for k, v in get_model_state_dict(module, options=opts).items()}


def report(trainer: pl.Trainer, model: Tiny, probe: Probe, io: object, out: str) -> None:
    params = full_params(model)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optim = get_optimizer_state_dict(model, trainer.optimizers[0], options=opts)
    if trainer.global_rank == 0:
        last = getattr(io, "last_restore", None)  # None with Lightning's own checkpointing
        torch.save({"params": params, "optim": optim, "after_restore": probe.after_restore,
                    "restored": last.step if last is not None else -1, "global_step": trainer.global_step,
                    "world": trainer.world_size, "last_restore": str(last)}, out)


def main() -> None:
    ap = argparse.ArgumentParser()
    for a in ("store", "job", "root", "out"):
        ap.add_argument(a)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--plain", action="store_true", help="Lightning's own checkpointing (a baseline)")
    args = ap.parse_args()
    pl.seed_everything(0, verbose=False)
    io = ts.TrainstoreCheckpointIO(args.store, args.job)
    strategy = ts.trainstore_strategy("model_parallel" if args.strategy == "fsdp" else args.strategy, io)
    if args.plain:
        strategy = pl.strategies.ModelParallelStrategy() if args.strategy == "fsdp" else args.strategy
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(args.root, "ckpts"), every_n_train_steps=2,
                                        save_top_k=2, monitor="step", mode="max", save_last=True)
    probe = Probe()
    trainer = pl.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=args.devices, strategy=strategy,
                         deterministic=True, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[ckpt, probe], default_root_dir=args.root, use_distributed_sampler=False)
    model = Tiny(shard=args.strategy == "fsdp")
    trainer.fit(model, ckpt_path="last" if args.resume else None)
    if args.strategy == "ddp_spawn":  # the fit ran in spawned processes; this one only launched them
        trainer.strategy.checkpoint_io.teardown()
        print("DONE rank 0", flush=True)
        return
    report(trainer, model, probe, trainer.strategy.checkpoint_io, args.out)
    if dist.is_initialized():
        dist.barrier()
    print(f"DONE rank {trainer.global_rank}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
