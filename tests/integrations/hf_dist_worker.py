"""Rank functions for tests/integrations/test_hf_dist*.py: a tiny GPT-2 trained by the Hugging Face
``Trainer`` (DDP, or FSDP2) or an ``accelerate`` loop (DDP) on real gloo ranks, checkpointing
through trainstore. Run by ``harness.dist.run_ranks`` (the process group is initialised first).

FSDP on CPU: ``TrainingArguments(use_cpu=True)`` makes accelerate run plain DDP even with
``fsdp=`` set (its FSDP type needs an accelerator device). ``CpuFsdpTrainer`` builds the
Trainer's ``Accelerator`` as a GPU run does: FSDP distributed type with the FSDP2 plugin, so
``accelerator.prepare`` really calls ``fully_shard`` (parameters become DTensor shards over gloo).

Each function returns per-parameter SHA-256 of this rank's local tensors (shards under FSDP2)
and of the optimizer state, the restored step and ``str(last_restore)``, and writes the local
tensors to ``<out>.rank<r>.pt`` for tolerance comparisons.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, set_seed  # noqa: E402
from hf_child import BATCH, EPOCHS, Tokens, accelerate_loop, tiny_model  # noqa: E402 - the single-process tests' model, data, loop
from transformers import TrainerCallback, TrainingArguments  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.integrations.hf import TrainstoreTrainer  # noqa: E402
from trainstore.store.local import LocalStore  # noqa: E402

SAVE_EVERY = 4  # 2 ranks: 6 steps per epoch (48 rows, 4 per device), 12 in all


class CpuFsdpTrainer(TrainstoreTrainer):
    """The Trainer's accelerator switched to FSDP2 as on a GPU (see the module docstring)."""

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        self.accelerator.state.distributed_type = DistributedType.FSDP
        self.accelerator.state.fsdp_plugin = fsdp2_plugin()
        self.is_fsdp_enabled = True


def fsdp2_plugin() -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                          transformer_cls_names_to_wrap=["GPT2Block"], reshard_after_forward=True,
                                          state_dict_type="SHARDED_STATE_DICT")


class Stop(TrainerCallback):
    """Ends training after step ``at`` (an interrupted run); records the state right after a resume."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.begin: dict[str, torch.Tensor] | None = None

    def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001, ANN201
        self.begin = {k: _full(v) for k, v in model.state_dict().items()}

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        if self.at is not None and state.global_step >= self.at:
            control.should_training_stop = True


class KillStore(LocalStore):
    """A local store that SIGKILLs this process at its ``after``-th chunk write once armed
    (``Kill`` arms it on the kill rank at the kill step: the save then dies mid-write)."""

    def __init__(self, root: str, after: int = 0) -> None:
        super().__init__(root)
        self.armed, self.after, self.puts = False, after, 0

    def _maybe_kill(self, key: str) -> None:
        if self.armed and key.startswith("chunks/"):
            self.puts += 1
            if self.puts > self.after:
                os.kill(os.getpid(), signal.SIGKILL)

    def put(self, key, data):  # noqa: ANN001, ANN201
        self._maybe_kill(key)
        return super().put(key, data)

    def put_if_absent(self, key, data):  # noqa: ANN001, ANN201
        self._maybe_kill(key)
        return super().put_if_absent(key, data)


class Kill(TrainerCallback):
    def __init__(self, store: KillStore, at: int, mgr: CheckpointManager) -> None:
        self.store, self.at, self.mgr = store, at, mgr

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        if state.global_step == self.at:
            self.mgr.wait()  # the earlier saves committed (on a loaded machine one may still be writing)
            self.store.armed = True  # the save of this step writes its chunks in the background


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor().detach().clone() if hasattr(t, "full_tensor") else t.detach().clone()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _digest(t: torch.Tensor) -> str:
    t = _local(t).detach().contiguous().cpu()
    return hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def trainer(rank: int, world: int, args: dict) -> dict:
    torch.use_deterministic_algorithms(True)
    fsdp = args.get("mode") == "fsdp"
    store = args["store"]
    if args.get("kill_rank") is not None:
        store = KillStore(store.removeprefix("file://"), args.get("kill_after", 0))
    mgr = CheckpointManager(store, args["job"], CheckpointPolicy(full_every=8, incremental_every=1))
    callbacks = [Kill(store, args["kill_step"], mgr)] if args.get("kill_rank") == rank else []
    targs = TrainingArguments(output_dir=args["root"], num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH,
                              learning_rate=1e-3, warmup_steps=2, save_strategy="steps", save_steps=SAVE_EVERY,
                              logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
                              dataloader_num_workers=0, save_total_limit=args.get("limit"))
    cls = CpuFsdpTrainer if fsdp else TrainstoreTrainer
    stop = Stop(args.get("stop_at"))
    set_seed(0)  # the model's initial weights
    model = tiny_model()
    if args.get("freeze"):  # a frozen parameter: not in the optimizer (transformers' frozen-params resume test)
        model.transformer.wpe.weight.requires_grad_(False)
    tr = cls(model=model, args=targs, train_dataset=Tokens(), checkpoints=mgr, callbacks=[stop, *callbacks])
    tr.train(resume_from_checkpoint=True if args.get("resume") else None)
    model = tr.model
    params = {k: _local(v).detach().clone() for k, v in model.state_dict().items()}
    optim = {f"{i}/{k}": _local(v).detach().clone() for i, s in tr.optimizer.state_dict()["state"].items()
             for k, v in s.items()}
    torch.save({"params": params, "optim": optim,
                "begin": stop.begin if args.get("resume") else None}, f"{args['out']}.rank{rank}.pt")
    out = {"params": {k: _digest(v) for k, v in params.items()}, "optim": {k: _digest(v) for k, v in optim.items()},
           "step": tr.state.global_step, "restored": tr.last_restore.step if tr.last_restore else -1,
           "last_restore": str(tr.last_restore) if tr.last_restore else None,
           "sharded": type(next(model.parameters())).__name__ == "DTensor",
           "sched": tr.lr_scheduler.state_dict()["last_epoch"],
           "losses": {e["step"]: e["loss"] for e in tr.state.log_history if "loss" in e}}
    mgr.close()
    return out


def accel(rank: int, world: int, args: dict) -> dict:
    """An accelerate loop under DDP (``Accelerator(cpu=True)`` on gloo ranks) with AcceleratorCheckpoints."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader
    from transformers.optimization import get_linear_schedule_with_warmup

    from trainstore.integrations.hf_accelerate import AcceleratorCheckpoints

    torch.use_deterministic_algorithms(True)
    mgr = CheckpointManager(args["store"], args["job"], CheckpointPolicy(full_every=8, incremental_every=1))
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    if args.get("mode") == "fsdp":  # as CpuFsdpTrainer: the FSDP type and an FSDP2 plugin, as on a GPU
        acc.state.fsdp_plugin = fsdp2_plugin()
        acc.state.distributed_type = DistributedType.FSDP
    set_seed(0)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = get_linear_schedule_with_warmup(opt, 2, 12)
    dl = DataLoader(Tokens(), batch_size=BATCH, shuffle=True)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    ckpt = AcceleratorCheckpoints(acc, mgr, models=[model], optimizers=[opt], schedulers=[sched])
    stop_at = args.get("stop_at")
    resumed, _, step = accelerate_loop(acc, ckpt, model, opt, dl, sched, bool(args.get("resume")), SAVE_EVERY,
                                       lambda epoch, loss: {"position": {"epoch": epoch, "rank": rank}},
                                       lambda step: stop_at is not None and step >= stop_at)
    mgr.wait()
    params = {k: _local(v).detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    optim = {f"{i}/{k}": _local(v).detach().clone() for i, s in opt.state_dict()["state"].items()
             for k, v in s.items()}
    out = {"params": {k: _digest(v) for k, v in params.items()}, "optim": {k: _digest(v) for k, v in optim.items()},
           "step": step, "restored": resumed.step if resumed else -1,
           "position": resumed.position if resumed else None,
           "last_restore": str(resumed.result) if resumed and resumed.result else None,
           "sharded": type(next(model.parameters())).__name__ == "DTensor",
           "sched": sched.state_dict()["last_epoch"]}
    mgr.close()
    return out


def main() -> None:
    """``torchrun ... hf_dist_worker.py FUNCTION JSON_ARGS``: writes ``<out>.rank<r>.json``."""
    import torch.distributed as dist

    fn, args = globals()[sys.argv[1]], json.loads(sys.argv[2])
    dist.init_process_group("gloo")  # torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    value = fn(rank, world, args)
    with open(f"{args['out']}.rank{rank}.json", "w") as f:
        json.dump(value, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
