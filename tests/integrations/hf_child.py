"""A real Hugging Face training run (``Trainer`` or an ``accelerate`` loop) of a tiny GPT-2 on CPU,
checkpointing through trainstore.

    python hf_child.py {trainer,accelerate} STORE JOB ROOT OUT [--resume] [--slow-after N]

Prints ``STEP <global_step>`` (flushed) after every optimizer step so a parent can SIGKILL it
mid-epoch. With ``--resume`` it resumes from the newest checkpoint that verifies. At the end it
writes every parameter, the optimizer and scheduler state and the restored step to OUT
(torch.save of plain tensors: test output only) and prints ``DONE``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import DataLoaderConfiguration, set_seed  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments  # noqa: E402
from transformers.optimization import get_linear_schedule_with_warmup  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.integrations.hf import TrainstoreTrainer  # noqa: E402
from trainstore.integrations.hf_accelerate import AcceleratorCheckpoints  # noqa: E402

ROWS, SEQ, VOCAB, BATCH, EPOCHS, SAVE_EVERY = 48, 8, 64, 4, 2, 5  # 12 steps per epoch, 24 in all


class Tokens(Dataset):
    """Synthetic token rows (fixed by a seed)."""

    def __init__(self) -> None:
        self.ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_model() -> GPT2LMHeadModel:
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)  # dropout 0.1 kept
    return GPT2LMHeadModel(cfg)


def beacon(step: int, slow_after: int | None) -> None:
    print(f"STEP {step}", flush=True)
    if slow_after is not None and step >= slow_after:
        time.sleep(0.3)


class Beacon(TrainerCallback):
    def __init__(self, slow_after: int | None) -> None:
        self.slow_after = slow_after

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        beacon(state.global_step, self.slow_after)


def run_trainer(mgr: CheckpointManager, root: str, resume: bool, slow_after: int | None) -> tuple:
    set_seed(0)
    args = TrainingArguments(output_dir=root, num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH,
                             learning_rate=1e-3, warmup_steps=2, save_strategy="steps", save_steps=SAVE_EVERY,
                             logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
                             dataloader_num_workers=0, save_total_limit=3)
    trainer = TrainstoreTrainer(model=tiny_model(), args=args, train_dataset=Tokens(), checkpoints=mgr,
                                callbacks=[Beacon(slow_after)])
    trainer.train(resume_from_checkpoint=True if resume else None)
    restored = trainer.last_restore.step if trainer.last_restore is not None else -1
    return trainer.model, trainer.optimizer, trainer.lr_scheduler, restored, trainer.state.global_step


def accelerate_loop(acc: Accelerator, ckpt: AcceleratorCheckpoints, model: Any, opt: Any, dl: Any, sched: Any,
                    resume: bool, save_every: int, save_args: Callable[[int, torch.Tensor], dict],
                    after_step: Callable[[int], Any]) -> tuple[Any, int, int]:
    """The accelerate loop of these tests (and ``hf_dist_worker``): resumes mid-epoch through
    ``ckpt`` when ``resume``, saves every ``save_every`` steps with ``save_args(epoch, loss)``;
    a true ``after_step(step)`` ends it. Returns ``(resumed, start step, last step)``."""
    resumed = ckpt.load() if resume else None
    start = step = resumed.step if resumed is not None else 0
    model.train()
    for epoch in range(start // len(dl), EPOCHS):
        dl.set_epoch(epoch)
        batches = ckpt.batches(dl, resumed) if resumed is not None and epoch == start // len(dl) else dl
        for batch in batches:
            loss = model(**batch).loss
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            step += 1
            if step % save_every == 0:
                ckpt.save(step, **save_args(epoch, loss))
            if after_step(step):
                return resumed, start, step
    return resumed, start, step


def run_accelerate(mgr: CheckpointManager, resume: bool, slow_after: int | None) -> tuple:
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(0)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total = EPOCHS * (ROWS // BATCH)
    sched = get_linear_schedule_with_warmup(opt, 2, total)
    dl = DataLoader(Tokens(), batch_size=BATCH, shuffle=True)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    ckpt = AcceleratorCheckpoints(acc, mgr, models=[model], optimizers=[opt], schedulers=[sched])
    resumed, start, step = accelerate_loop(acc, ckpt, model, opt, dl, sched, resume, SAVE_EVERY,
                                           lambda epoch, loss: {"metrics": {"loss": loss.item()},
                                                                "position": {"epoch": epoch}},
                                           lambda step: beacon(step, slow_after))
    mgr.wait()
    return acc.unwrap_model(model), opt, sched, (start if resume else -1), step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["trainer", "accelerate"])
    ap.add_argument("store")
    ap.add_argument("job")
    ap.add_argument("root")
    ap.add_argument("out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--slow-after", type=int, default=None)
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    mgr = CheckpointManager(a.store, a.job, CheckpointPolicy(full_every=10, incremental_every=1))
    if a.mode == "trainer":
        model, opt, sched, restored, global_step = run_trainer(mgr, a.root, a.resume, a.slow_after)
    else:
        model, opt, sched, restored, global_step = run_accelerate(mgr, a.resume, a.slow_after)
    mgr.close()
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "optim": opt.state_dict(), "sched": sched.state_dict(), "restored": restored,
                "global_step": global_step}, a.out)
    print("DONE", flush=True)


if __name__ == "__main__":
    sys.exit(main())
