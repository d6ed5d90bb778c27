"""Blocking time per save: Hugging Face ``Trainer`` default checkpointing vs ``TrainstoreTrainer``.

    .venv/bin/python benchmarks/integrations_hf.py [--repeats 3] [--steps 40] [--save-steps 5]

The same job (a small GPT-2 built from a config, synthetic tokens, CPU) runs with the
Trainer's own ``save_steps`` checkpointing (``checkpoint-N`` folders: safetensors model,
pickled optimizer/scheduler/RNG, trainer_state.json) and with ``TrainstoreTrainer`` (local
store; full every 20 steps, incremental between). Each ``_save_checkpoint`` call is timed:
that is the time the training loop is blocked. Prints medians per run and overall, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.integrations.hf import TrainstoreTrainer  # noqa: E402


class Timed:
    """Mixin recording the duration of every ``_save_checkpoint`` call."""

    def __init__(self, *a, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*a, **kw)
        self.save_seconds: list[float] = []

    def _save_checkpoint(self, model, trial) -> None:  # noqa: ANN001
        t0 = time.perf_counter()
        super()._save_checkpoint(model, trial)
        self.save_seconds.append(time.perf_counter() - t0)


class TimedTrainer(Timed, Trainer):
    pass


class TimedTrainstoreTrainer(Timed, TrainstoreTrainer):
    pass


def dataset(rows: int, seq: int, vocab: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, vocab, (rows, seq), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": r, "labels": r} for r in ids]


def run(kind: str, steps: int, save_steps: int, root: str) -> dict:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=4096, n_positions=64, n_embd=256, n_layer=4, n_head=4))
    args = TrainingArguments(output_dir=os.path.join(root, "out"), max_steps=steps, per_device_train_batch_size=4,
                             save_strategy="steps", save_steps=save_steps, report_to=[], use_cpu=True,
                             disable_tqdm=True, logging_steps=1000)
    data = dataset(4 * steps, 64, 4096)
    t0 = time.perf_counter()
    if kind == "hf-default":
        trainer = TimedTrainer(model=model, args=args, train_dataset=data)
        trainer.train()
    else:
        mgr = CheckpointManager(f"file://{root}/store", "bench", CheckpointPolicy(full_every=20, incremental_every=1))
        trainer = TimedTrainstoreTrainer(model=model, args=args, train_dataset=data, checkpoints=mgr)
        trainer.train()  # waits for the last save
        mgr.close()
    wall = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    return {"kind": kind, "saves": len(trainer.save_seconds), "median_blocking_s": statistics.median(trainer.save_seconds),
            "max_blocking_s": max(trainer.save_seconds), "train_wall_s": wall, "params": params}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--save-steps", type=int, default=5)
    a = ap.parse_args()
    results = []
    for _ in range(a.repeats):
        for kind in ("hf-default", "trainstore"):
            with tempfile.TemporaryDirectory() as root:
                results.append(run(kind, a.steps, a.save_steps, root))
                print(json.dumps(results[-1]), flush=True)
    summary = {}
    for kind in ("hf-default", "trainstore"):
        rs = [r for r in results if r["kind"] == kind]
        summary[kind] = {"median_blocking_s": statistics.median(r["median_blocking_s"] for r in rs),
                         "median_train_wall_s": statistics.median(r["train_wall_s"] for r in rs)}
    summary["blocking_ratio_default_over_trainstore"] = (summary["hf-default"]["median_blocking_s"]
                                                         / summary["trainstore"]["median_blocking_s"])
    print(json.dumps({"summary": summary}, indent=2))


if __name__ == "__main__":
    main()
