"""One rank of a tiny torchtitan-style training job (run by test_torchtitan via harness.dist).

Built the way torchtitan's Trainer builds it: an FSDP2-sharded (``fully_shard``) model over a
CPU device mesh, torchtitan's ``OptimizersContainer`` (AdamW) and ``LRSchedulersContainer``
(warmup), its ``ParallelAwareDataloader`` (``StatefulDataLoader``) over a deterministic stream,
a train-state ``Stateful``, and the checkpoint manager built from its config class with the
same keyword arguments the Trainer passes. The loop mirrors ``Trainer.train``: ``load`` first,
``save(step, last_step=...)`` after every step, ``close`` at the end.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

from trainstore.integrations.torchtitan import TrainstoreCheckpointManager

DIM = 32
INTERVAL = 2


class Stream(IterableDataset):
    """Endless deterministic samples, different per data-parallel rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self):  # noqa: ANN204
        i = 0
        while True:
            g = torch.Generator().manual_seed(10_000 * self.rank + i)
            yield torch.randn(DIM, generator=g)
            i += 1


class TrainState:
    """What torchtitan's Trainer registers as ``states={"train_state": self}``."""

    def __init__(self) -> None:
        self.step = 0
        self.samples_seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "samples_seen": self.samples_seen}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.samples_seen = sd["step"], sd["samples_seen"]


def build(rank: int, world: int, args: dict) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 64), torch.nn.GELU(), torch.nn.Linear(64, DIM))
    fully_shard(model, mesh=mesh)
    optimizers = OptimizersContainer(
        OptimizersContainer.Config(
            param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                                           optimizer_kwargs={"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8,
                                                             "weight_decay": 0.1})],
            implementation="for-loop"),
        model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=3).build(optimizers=optimizers,
                                                                      training_steps=args["steps"])
    dataloader = ParallelAwareDataloader(Stream(rank), dp_rank=rank, dp_world_size=world, batch_size=4)
    train_state = TrainState()
    config = TrainstoreCheckpointManager.Config(
        enable=True, interval=INTERVAL, keep_latest_k=args.get("keep", 3), async_mode=args.get("async_mode", "async"),
        last_save_model_only=False, store=args["store"], job="titan", full_every=args.get("full_every", 0))
    ckpt = config.build(dataloader=dataloader, model_parts=[model], optimizers=optimizers,
                        lr_schedulers=lr_schedulers, states={"train_state": train_state}, sd_adapter=None,
                        base_folder=args["dump"])
    return {"model": model, "optimizers": optimizers, "lr": lr_schedulers, "dataloader": dataloader,
            "train_state": train_state, "ckpt": ckpt}


def train(job: dict, rank: int, until: int, args: dict) -> dict:
    """torchtitan's Trainer.train loop: load, then step + save until ``until``."""
    ckpt, ts = job["ckpt"], job["train_state"]
    ckpt.load(step=-1)
    restored = ckpt.last_restore
    data = iter(job["dataloader"])
    committed_at_return = True
    while ts.step < until:
        ts.step += 1
        batch = next(data)
        loss = job["model"](batch).pow(2).mean()
        loss.backward()
        job["optimizers"].step()
        job["lr"].step()
        job["optimizers"].zero_grad()
        ts.samples_seen += batch.shape[0]
        ckpt.save(ts.step, last_step=ts.step == args["steps"])
        if ts.step % INTERVAL == 0:
            if args.get("async_mode") == "disabled":
                committed_at_return &= ts.step in ckpt.checkpoints.steps()
            if rank == 0:
                print(f"SAVED {ts.step}", flush=True)
        if args.get("slow_after") and ts.step >= args["slow_after"]:
            time.sleep(0.5)  # the test SIGKILLs the job about here
    return {"loaded": None if restored is None else restored.step,
            "skipped": [] if restored is None else [s for s, _ in restored.skipped],
            "next_batch": next(data), "committed_at_return": committed_at_return}


def final_state(job: dict, next_batch: torch.Tensor, world: int) -> dict:
    """Everything a resumed run must reproduce, as full tensors and plain values."""
    def full(v: Any) -> Any:
        return v.full_tensor() if isinstance(v, DTensor) else v

    out: dict[str, Any] = {f"model.{k}": full(v) for k, v in job["model"].state_dict().items()}
    for k, v in job["optimizers"].state_dict().items():
        out[f"optim.{k}"] = full(v) if isinstance(v, torch.Tensor) else repr(v)
    out["lr.last_epoch"] = job["lr"].state_dict()["last_epoch"]
    out["lr.value"] = repr(job["lr"].schedulers[0].get_last_lr())
    out.update({f"train_state.{k}": v for k, v in job["train_state"].state_dict().items()})
    batches = [torch.empty_like(next_batch) for _ in range(world)]
    dist.all_gather(batches, next_batch)
    out["data.next_batches"] = torch.stack(batches)  # each rank's dataloader position
    return out


def run(rank: int, world: int, args: dict) -> dict:
    job = build(rank, world, args)
    result: dict[str, Any] = {}
    if args["mode"] == "fallback":
        train(job, rank, args["stop"], args)
        job["ckpt"].maybe_wait_for_saving()
        job["ckpt"].checkpoints.wait()
        dist.barrier()  # the coordinator's retention hook ran for every save
        result["before"] = job["ckpt"].checkpoints.steps()
        if rank == 0:
            corrupt_a_chunk(job["ckpt"].checkpoints, args["stop"], args["store"])
        dist.barrier()
        job["ckpt"].close()
        job = build(rank, world, args)  # a fresh job in the same ranks: new model, optimizer, data
    out = train(job, rank, args["steps"], args)
    job["ckpt"].maybe_wait_for_saving()
    job["ckpt"].checkpoints.wait()
    dist.barrier()
    result["kinds"] = [(i.step, i.kind) for i in job["ckpt"].checkpoints.list()]
    state = final_state(job, out.pop("next_batch"), world)
    job["ckpt"].close()
    if rank == 0:
        torch.save(state, args["out"] + ".tmp")
        os.replace(args["out"] + ".tmp", args["out"])
    return {**result, **out, "step": job["train_state"].step}


def corrupt_a_chunk(mgr: Any, step: int, store_dir: str) -> None:
    """Flip a byte of a chunk only ``step`` references (older checkpoints stay intact)."""
    older = {c.ref.key() for s in mgr.steps() if s < step for t in mgr.manifest(s).tensors.values() for c in t.chunks}
    for t in sorted(mgr.manifest(step).tensors.values(), key=lambda t: -t.nbytes):
        for c in t.chunks:
            if c.ref.key() not in older:
                path = os.path.join(store_dir, c.ref.key())
                data = bytearray(open(path, "rb").read())
                data[len(data) // 2] ^= 0xFF
                with open(path, "wb") as f:
                    f.write(bytes(data))
                return
    raise AssertionError(f"step {step} has no chunk of its own")
