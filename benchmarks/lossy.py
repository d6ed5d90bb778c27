"""Lossy optimizer moments: bytes saved and what resuming from them does to training.

    .venv/bin/python benchmarks/lossy.py            # the 27.3M-param GPT of checkpoint.py (b)
    .venv/bin/python benchmarks/lossy.py --quick    # small GPT, 20 + 10 steps (smoke)

1. Trains the GPT + AdamW of ``benchmarks/checkpoint.py`` (b) for ``--steps`` steps (1 torch
   thread), checkpointing every ``--every`` steps (full at 0 and at the end, incrementals
   between) into three stores at once: lossless (the default policy),
   ``optimizer_moments="bf16"`` and ``"int8-blockwise"``. Reports the stored bytes of each
   against ``n`` x torch.save of the final state.
2. Resumes from the step ``--resume-at`` checkpoint of each store and trains ``--more`` steps
   with the same batches (order A), and once more from the lossless one with other batches
   (order B): the run-to-run noise of data order. Each run's loss on a fixed held-out set is
   taken every ``--eval-every`` steps. Reports, against the lossless order-A run, the max and
   final difference of the held-out loss, next to the lossless order B's (the noise).

The data is a fixed random Markov chain over the vocabulary (each token has 4 likely
successors), so the loss really falls within 100 steps, unlike uniform random tokens.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
from checkpoint import GPT, dir_bytes, gpt_config  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402

MODES = ("lossless", "bf16", "int8-blockwise")


def markov_data(vocab: int, ctx: int, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` sequences of ``ctx + 1`` tokens from a fixed chain with 4 likely successors each."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 4), generator=g)
    seq = torch.empty(n, ctx + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for i in range(1, ctx + 1):
        pick = torch.randint(0, 4, (n,), generator=g)
        noise = torch.rand(n, generator=g) < 0.1
        nxt = succ[seq[:, i - 1], pick]
        seq[:, i] = torch.where(noise, torch.randint(0, vocab, (n,), generator=g), nxt)
    return seq


def loss_of(model: torch.nn.Module, batch: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, vocab), batch[:, 1:].reshape(-1))


def train(model, opt, data, steps: int, order_seed: int, vocab: int, evalset, eval_every: int,
          on_step=None) -> list[float]:
    """``steps`` AdamW steps on batches of 2 drawn with ``order_seed``; held-out losses."""
    g = torch.Generator().manual_seed(order_seed)
    curve = []
    for step in range(1, steps + 1):
        batch = data[torch.randint(0, data.shape[0], (2,), generator=g)]
        loss_of(model, batch, vocab).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step(step, model, opt)
        if step % eval_every == 0 or step == steps:
            with torch.no_grad():
                curve.append(loss_of(model, evalset, vocab).item())
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--resume-at", type=int, default=50)
    ap.add_argument("--more", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.every, a.resume_at, a.more = 20, 5, 10, 10
    torch.set_num_threads(1)
    cfg = gpt_config(a.quick)
    vocab = cfg["vocab"]
    data = markov_data(vocab, cfg["ctx"], 4096, seed=0)
    evalset = markov_data(vocab, cfg["ctx"], 64, seed=1)
    root = tempfile.mkdtemp(prefix="ts-lossy-")
    try:
        torch.manual_seed(0)
        model = GPT(**cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        params = sum(p.numel() for p in model.parameters())
        mgrs = {mode: CheckpointManager(os.path.join(root, mode), "gpt", CheckpointPolicy(
            full_every=a.steps, incremental_every=a.every, optimizer_moments=mode)) for mode in MODES}

        def save(step, model, opt):
            if step % a.every == 0:
                state = {"model": model.state_dict(), "optim": opt.state_dict()}
                for mgr in mgrs.values():
                    mgr.save(step, state, blocking=True)

        save(0, model, opt)
        train(model, opt, data, a.steps, 0, vocab, evalset, a.eval_every, on_step=save)
        tfile = os.path.join(root, "final.pt")
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, tfile)
        tsize, n = os.path.getsize(tfile), a.steps // a.every + 1
        print(f"GPT {params / 1e6:.1f}M params + AdamW, {a.steps} steps, checkpoint every {a.every} "
              f"(full at 0 and {a.steps}); torch.save {tsize / 1e6:.1f} MB, {n}x = {n * tsize / 1e6:.1f} MB")
        stored = {mode: dir_bytes(os.path.join(root, mode)) for mode in MODES}
        for mode in MODES:
            infos = mgrs[mode].list()
            per = ", ".join(f"{i.stored_bytes / i.logical_bytes:.3f}" for i in infos)
            print(f"  {mode:<15} stored {stored[mode] / 1e6:8.1f} MB = {stored[mode] / (n * tsize):.3f}x of {n}x "
                  f"torch.save, {stored[mode] / stored['lossless']:.3f}x lossless; per checkpoint of raw: {per}")
        curves = {}
        for name, mode, order in (("lossless A", "lossless", 1), ("lossless B", "lossless", 2),
                                  ("bf16 A", "bf16", 1), ("int8-blockwise A", "int8-blockwise", 1)):
            state = mgrs[mode].restore(step=a.resume_at)
            torch.manual_seed(0)
            m = GPT(**cfg)
            o = torch.optim.AdamW(m.parameters(), lr=3e-4)
            m.load_state_dict(state["model"])
            o.load_state_dict(state["optim"])
            with torch.no_grad():
                start = loss_of(m, evalset, vocab).item()
            curves[name] = [start] + train(m, o, data, a.more, 100 + order, vocab, evalset, a.eval_every)
        print(f"resume at step {a.resume_at}, {a.more} more steps; held-out loss (64 sequences) every "
              f"{a.eval_every} steps")
        ref = curves["lossless A"]
        for name, c in curves.items():
            diffs = [abs(x - y) for x, y in zip(c, ref)]
            print(f"  {name:<17} start {c[0]:.5f} final {c[-1]:.5f}  vs lossless A: max |diff| {max(diffs):.2e}, "
                  f"final |diff| {diffs[-1]:.2e}")
        noise = abs(curves["lossless B"][-1] - ref[-1])
        for mode in ("bf16", "int8-blockwise"):
            d = abs(curves[f"{mode} A"][-1] - ref[-1])
            verdict = "within" if d <= noise else "OUTSIDE"
            print(f"  {mode}: final difference {d:.2e} {verdict} the run-to-run noise {noise:.2e}; bytes "
                  f"{stored[mode] / (n * tsize):.3f}x of {n}x torch.save (goal <= 0.4x)")
        for mgr in mgrs.values():
            mgr.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
