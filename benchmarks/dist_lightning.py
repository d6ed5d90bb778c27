"""Multi-process Lightning checkpoints: Lightning's own vs ``TrainstoreCheckpointIO``.

    .venv/bin/python benchmarks/dist_lightning.py                  # 2 and 4 ranks, DDP and FSDP2, 3 repeats
    .venv/bin/python benchmarks/dist_lightning.py --quick          # 2 ranks, tiny model, 1 repeat (smoke)
    .venv/bin/python benchmarks/dist_lightning.py --worlds 2 --modes fsdp --repeats 5 --width 2048

Each run is a real ``torchrun --nproc_per_node N`` job (gloo, CPU) fitting an MLP on synthetic
data with ``ModelCheckpoint(every_n_train_steps=E, save_top_k=-1)``. Two kinds, interleaved
(the order alternates per repeat), medians reported:

* ``lightning``: Lightning's own checkpointing - DDP: rank 0 ``torch.save``s one ``.ckpt``;
  FSDP2 (``ModelParallelStrategy``): its ``.ckpt`` directory (torch DCP ``FileSystemWriter``,
  every rank its shards, rank 0 the metadata file).
* ``trainstore``: ``trainstore_strategy("ddp" | "model_parallel", TrainstoreCheckpointIO(...))``
  into a local store (full every 4th save, incremental between; DDP: rank 0 through the single
  backend; FSDP2: every rank through the ``dcp`` backend).

Per save, on rank 0: **blocking** = the time ``Trainer.save_checkpoint`` held the training
loop (building the dict included, for both; it ends with Lightning's barrier, so it is the
slowest rank's); **durable** = from the save's start until it is committed (``lightning``:
blocking plus an fsync of the files it wrote - its writes are synchronous but never fsynced;
``trainstore``: until the
step's manifest exists in the store). Output: one JSON line per run, then a JSON summary
(medians, ratios trainstore/lightning; goal: blocking <= 0.2x, durable <= 1.0x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from durable import fsync_new_files  # benchmarks/, the script's folder

HERE = os.path.dirname(os.path.abspath(__file__))


# -- one rank (run by torchrun) ----------------------------------------------------------------
def rank_main(a: argparse.Namespace) -> None:
    import pytorch_lightning as pl
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, TensorDataset

    from trainstore.checkpoint import CheckpointPolicy
    from trainstore.checkpoint.format.layout import manifest_key
    from trainstore.integrations.lightning import TrainstoreCheckpointIO, trainstore_strategy
    from trainstore.store import open_store

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            w = a.width
            self.net = torch.nn.Sequential(torch.nn.Linear(256, w), torch.nn.ReLU(), torch.nn.Linear(w, w),
                                           torch.nn.ReLU(), torch.nn.Linear(w, 1))

        def configure_model(self) -> None:
            if a.mode == "fsdp":
                for layer in self.net:
                    if isinstance(layer, torch.nn.Linear):
                        fully_shard(layer, mesh=self.device_mesh["data_parallel"])
                fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    store_url = os.path.join(a.root, "store")
    if a.kind == "trainstore":
        io = TrainstoreCheckpointIO(store_url, "bench", policy=CheckpointPolicy(full_every=4 * a.every,
                                                                               incremental_every=a.every))
        strategy = trainstore_strategy("model_parallel" if a.mode == "fsdp" else "ddp", io)
    else:
        strategy = pl.strategies.ModelParallelStrategy() if a.mode == "fsdp" else "ddp"
    cb = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(a.root, "ckpts"), every_n_train_steps=a.every,
                                      save_top_k=-1)
    trainer = pl.Trainer(max_steps=a.steps, accelerator="cpu", devices=a.world, strategy=strategy, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
                         default_root_dir=a.root)
    blocking: list[float] = []
    durable: list[float] = []
    waiters: list[threading.Thread] = []
    store = open_store(store_url) if a.kind == "trainstore" else None
    inner = trainer.save_checkpoint

    def until_committed(step: int, t0: float) -> None:
        key = manifest_key("bench", step)
        while not store.exists(key):  # type: ignore[union-attr]
            time.sleep(0.002)
        durable.append(time.perf_counter() - t0)

    def save_checkpoint(*args: object, **kwargs: object) -> None:  # the benchmark's probe, on this Trainer only
        t0, wall0 = time.perf_counter(), time.time()
        inner(*args, **kwargs)
        blocking.append(time.perf_counter() - t0)
        if trainer.global_rank != 0:
            return
        if store is None:  # Lightning's files: durable once fsynced (it never does)
            durable.append(blocking[-1] + fsync_new_files(os.path.join(a.root, "ckpts"), wall0))
        else:
            t = threading.Thread(target=until_committed, args=(trainer.global_step, t0), daemon=True)
            t.start()
            waiters.append(t)

    trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.batch * a.world * 8, 256, generator=g)
    loader = DataLoader(TensorDataset(x, x[:, :1].sin()), batch_size=a.batch)
    t_fit = time.perf_counter()
    trainer.fit(MLP(), loader)
    fit_s = time.perf_counter() - t_fit
    for t in waiters:
        t.join(timeout=600)
    if trainer.global_rank == 0:
        params = sum(p.numel() for p in MLP().parameters())
        with open(a.out, "w") as f:
            json.dump({"world": a.world, "mode": a.mode, "kind": a.kind, "params": params, "saves": len(blocking),
                       "blocking_s": blocking, "durable_s": durable, "fit_s": fit_s}, f)
    # as dist_hf.py: a gloo group freed by DDP's Reducer at exit can deadlock on torch 2.13
    sys.stdout.flush()
    os._exit(0)



# -- the driver ---------------------------------------------------------------------------------
def run_one(a: argparse.Namespace, world: int, mode: str, kind: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-dist-lightning-") as root:
        out = os.path.join(root, "out.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), os.path.abspath(__file__), "--rank-main",
               "--world", str(world), "--mode", mode, "--kind", kind, "--root", root, "--out", out,
               "--steps", str(a.steps), "--every", str(a.every), "--width", str(a.width), "--batch", str(a.batch)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
        if p.returncode != 0:
            raise SystemExit(f"run {world} {mode} {kind} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(runs: list[dict]) -> dict:
    out: dict = {}
    for r in runs:
        key = f"{r['world']}ranks/{r['mode']}"
        d = out.setdefault(key, {}).setdefault(r["kind"], {"blocking": [], "durable": []})
        d["blocking"] += r["blocking_s"][1:] or r["blocking_s"]  # the first save also allocates buffers
        d["durable"] += r["durable_s"][1:] or r["durable_s"]
    for key, kinds in out.items():
        for kind, d in kinds.items():
            kinds[kind] = {"median_blocking_s": statistics.median(d["blocking"]),
                           "median_durable_s": statistics.median(d["durable"]), "saves": len(d["blocking"])}
        if {"lightning", "trainstore"} <= kinds.keys():
            lt, ts = kinds["lightning"], kinds["trainstore"]
            kinds["ratio_blocking"] = ts["median_blocking_s"] / lt["median_blocking_s"]
            kinds["ratio_durable"] = ts["median_durable_s"] / lt["median_durable_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="ddp", help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="trainstore", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--modes", default="ddp,fsdp")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--width", type=int, default=1536, help="MLP width (1536: ~2.8 M parameters)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--quick", action="store_true", help="2 ranks, tiny model, 1 repeat (smoke)")
    a = ap.parse_args()
    if a.rank_main:
        rank_main(a)
        return
    if a.quick:
        a.worlds, a.repeats, a.steps, a.every, a.width = "2", 1, 6, 2, 64
    runs = []
    kinds = ["lightning", "trainstore"]
    for rep in range(a.repeats):
        for world in (int(w) for w in a.worlds.split(",")):
            for mode in a.modes.split(","):
                for kind in (kinds if rep % 2 == 0 else kinds[::-1]):  # interleaved, alternating order
                    r = run_one(a, world, mode, kind)
                    r["repeat"] = rep
                    print(json.dumps(r), flush=True)
                    runs.append(r)
    print(json.dumps({"summary": summarize(runs), "args": {k: v for k, v in vars(a).items() if k in (
        "worlds", "modes", "repeats", "steps", "every", "width", "batch")}}, indent=1), flush=True)


if __name__ == "__main__":
    main()
