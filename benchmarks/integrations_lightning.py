"""Lightning: blocking time per checkpoint save, trainstore's CheckpointIO vs Lightning's own.

The same tiny job (an MLP of ~2.6 M parameters + AdamW state, ~31 MB per checkpoint, CPU) is
fitted three times, saving every ``--every`` steps through:

* ``TorchCheckpointIO``: Lightning's default (``torch.save`` on the training thread),
* ``AsyncCheckpointIO(TorchCheckpointIO)``: Lightning's thread wrapper (clones every tensor,
  then ``torch.save`` in a thread),
* ``TrainstoreCheckpointIO``: trainstore (host copy, then hash/compress/write in the background;
  every 5th save full, the others incremental).

Blocking time = how long ``checkpoint_io.save_checkpoint`` held the training loop (the part of
a save every plugin shares, building the checkpoint dict, is not in it). Reported: median and
p90 per save, ratio to the default, and the fit's wall time. Usage::

    python benchmarks/integrations_lightning.py [--steps 60] [--every 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from torch.utils.data import DataLoader, TensorDataset

from trainstore.checkpoint import CheckpointPolicy
from trainstore.integrations.lightning import TrainstoreCheckpointIO


class MLP(pl.LightningModule):
    def __init__(self, width: int = 1024) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(512, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                       torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def timed(io: object, times: list[float]) -> object:
    """Record the caller-blocking time of every ``save_checkpoint`` of ``io``."""
    inner = io.save_checkpoint

    def save_checkpoint(*args: object, **kwargs: object) -> None:
        t0 = time.perf_counter()
        inner(*args, **kwargs)
        times.append(time.perf_counter() - t0)

    io.save_checkpoint = save_checkpoint  # type: ignore[method-assign]
    return io


def fit(kind: str, root: str, steps: int, every: int) -> tuple[list[float], float]:
    pl.seed_everything(0, verbose=False)
    times: list[float] = []
    if kind == "torch":
        io = TorchCheckpointIO()
    elif kind == "async":
        io = AsyncCheckpointIO(TorchCheckpointIO())
    else:
        io = TrainstoreCheckpointIO(os.path.join(root, "store"), "bench",
                                    policy=CheckpointPolicy(full_every=5 * every, incremental_every=every))
    timed(io, times)
    x = torch.randn(4096, 512)
    data = DataLoader(TensorDataset(x, x[:, :1].sin()), batch_size=64, shuffle=True)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, plugins=[io], default_root_dir=root,
                         callbacks=[ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), every_n_train_steps=every,
                                                    save_top_k=-1)])
    t0 = time.perf_counter()
    trainer.fit(MLP(), data)  # teardown waits for the last background save
    return times, time.perf_counter() - t0


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    torch.set_num_threads(2)
    results: dict[str, tuple[list[float], list[float]]] = {}
    for _ in range(args.repeats):
        for kind in ("torch", "async", "trainstore"):  # interleaved: machine noise hits all alike
            with tempfile.TemporaryDirectory() as root:
                times, wall = fit(kind, root, args.steps, args.every)
            per, walls = results.setdefault(kind, ([], []))
            per.extend(times)
            walls.append(wall)
    base = statistics.median(results["torch"][0])
    print(f"Lightning {pl.__version__}, torch {torch.__version__}: {args.steps} steps, a save every "
          f"{args.every} steps, {args.repeats} repeats")
    print(f"{'CheckpointIO':<34}{'saves':>6}{'median ms':>11}{'p90 ms':>9}{'vs default':>12}{'fit s':>8}")
    names = {"torch": "TorchCheckpointIO (default)", "async": "AsyncCheckpointIO(TorchCheckpointIO)",
             "trainstore": "TrainstoreCheckpointIO"}
    for kind, (per, walls) in results.items():
        med = statistics.median(per)
        p90 = sorted(per)[int(0.9 * (len(per) - 1))]
        print(f"{names[kind]:<34}{len(per):>6}{med * 1e3:>11.1f}{p90 * 1e3:>9.1f}{med / base:>11.2f}x"
              f"{statistics.median(walls):>8.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
