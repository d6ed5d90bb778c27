"""The demo's training run: a small PyTorch text classifier fed by the ``Loader``.

Runs as a worker process (``python -m trainstore.demo.train < SPEC_JSON``) so that the crash
stage can really SIGKILL it; it prints one JSON event per line on stdout (``start``,
``resume``, ``step``, ``save``, ``baseline``, ``done``), which ``run_worker`` turns into
callbacks and progress bars in the parent.

Every checkpoint holds the model, the optimizer, the loader position and every RNG
(``capture_rng``), so a run resumed from any checkpoint continues exactly as an
uninterrupted one: same batches, same dropout masks, same weights bit for bit (threads are
fixed and deterministic algorithms are on). The last step is always saved as a full
checkpoint, which is what the crash stage compares.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError, TrainstoreError
from .config import TrainConfig


@dataclass(frozen=True)
class TrainSpec:
    """Everything one training worker needs (JSON-able: it crosses a process boundary)."""

    store_url: str
    job: str
    train_ref: str
    val_ref: str
    cache_dir: str
    config: TrainConfig
    store_options: dict = field(default_factory=dict)
    baseline_dir: str | None = None   # time a plain torch.save of the final state here
    hot_dir: str | None = None        # checkpoint hot tier (local dir); None: save to the store directly
    hot_keep_last: int = 2
    seq_len: int = 64
    classes: int = 4

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainSpec:
        obj = json.loads(text)
        obj["config"] = TrainConfig(**obj["config"])
        return cls(**obj)


def build_model(config: TrainConfig, seq_len: int, classes: int) -> Any:
    """Byte embedding -> flatten -> MLP: small, but its state is a few MB, like a real layer."""
    import torch
    from torch import nn

    class ByteClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(257, config.embed_dim, padding_idx=0)
            self.hidden = nn.Linear(seq_len * config.embed_dim, config.hidden)
            self.drop = nn.Dropout(config.dropout)
            self.out = nn.Linear(config.hidden, classes)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens).flatten(1)
            return self.out(self.drop(torch.relu(self.hidden(x))))

    return ByteClassifier()


def _emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def train(spec: TrainSpec, emit: Callable[[dict], None] = _emit) -> None:
    """Train (or resume) ``spec.job`` to the end; events go to ``emit``."""
    import random

    import numpy as np
    import torch
    import torch.nn.functional as F

    from ..checkpoint import CheckpointManager, CheckpointPolicy
    from ..checkpoint.rng import capture_rng, restore_rng
    from ..checkpoint.save.writer import WriteOptions
    from ..data import Dataset, Loader
    from ..lifecycle.tiering import Tiering, TierPolicy
    from ..store import open_store

    cfg = spec.config
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)  # every RNG in the checkpoint starts from the seed

    store = open_store(spec.store_url, **spec.store_options)
    train_ds = Dataset(store, spec.train_ref, cache_dir=spec.cache_dir, columns=["tokens", "label"])
    loader = Loader(train_ds, cfg.batch_size, shuffle=True, seed=cfg.seed, prefetch=cfg.prefetch,
                    workers=cfg.loader_workers, as_torch=True, rank=0, world_size=1)
    val_ds = Dataset(store, spec.val_ref, cache_dir=spec.cache_dir, columns=["tokens", "label"])
    val = val_ds.take(np.arange(len(val_ds)))
    val_x, val_y = torch.from_numpy(val["tokens"]), torch.from_numpy(val["label"])

    model = build_model(cfg, spec.seq_len, spec.classes)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    policy = CheckpointPolicy(full_every=cfg.full_every, incremental_every=cfg.incremental_every)
    options = WriteOptions(chunk_bytes=cfg.chunk_bytes, workers=2)
    tiers = None
    if spec.hot_dir:  # commit to the hot tier; copies to the store (durable tier) run behind
        tiers = Tiering(spec.hot_dir, store, policy=TierPolicy(hot_keep_last=spec.hot_keep_last, hot_gc_grace="5s"))
        tiers.sync(spec.job)  # a crashed run may have left hot checkpoints not yet copied
        mgr = tiers.manager(spec.job, policy=policy, options=options)
    else:
        mgr = CheckpointManager(store, spec.job, policy, options=options)
    steps_per_epoch = len(loader)
    total = cfg.epochs * steps_per_epoch
    step = 0
    if mgr.steps():
        res = mgr.restore_with_info()
        st = res.state
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optim"])
        loader.load_state_dict(st["loader"])
        restore_rng(st["rng"])
        step = int(st["step"])
        emit({"type": "resume", "step": step, "kind": res.kind, "reason": res.reason,
              "skipped": [[s, why] for s, why in res.skipped], "seconds": res.seconds})
    emit({"type": "start", "job": spec.job, "step": step, "total_steps": total,
          "steps_per_epoch": steps_per_epoch, "params": sum(p.numel() for p in model.parameters()),
          "pid": os.getpid()})

    def state() -> dict:
        return {"model": model.state_dict(), "optim": opt.state_dict(), "loader": loader.state_dict(),
                "rng": capture_rng(), "step": step}

    def evaluate() -> tuple[float, float]:
        model.eval()
        with torch.no_grad():
            logits = model(val_x)
            loss = F.cross_entropy(logits, val_y).item()
            acc = (logits.argmax(1) == val_y).float().mean().item()
        model.train()
        return loss, acc

    recent: list[float] = []
    last_saved = None
    model.train()
    while loader.epoch < cfg.epochs:
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            logits = model(batch["tokens"])
            loss = F.cross_entropy(logits, batch["label"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            loss_v = loss.item()
            recent = (recent + [loss_v])[-50:]
            t2 = time.perf_counter()
            kind = mgr.should_save(step) or ("full" if step == total else None)
            blocked = eval_s = 0.0
            if kind is not None:
                t_eval = time.perf_counter()
                val_loss, val_acc = evaluate()
                eval_s = time.perf_counter() - t_eval
                metrics = {"train_loss": statistics.fmean(recent), "val_loss": val_loss, "val_acc": val_acc}
                waited = mgr.pending() is not None  # this save will first wait for the previous one
                handle = mgr.save(step, state(), metrics=metrics, config=asdict(cfg), kind=kind,
                                  extra={"dataset": spec.train_ref, "epoch": loader.epoch})
                blocked = handle.blocked_s
                last_saved = step
                emit({"type": "save", "step": step, "kind": kind, "blocked_s": blocked, "waited": waited, **metrics})
            emit({"type": "step", "step": step, "epoch": loader.epoch, "wait_s": t1 - t0,
                  "compute_s": t2 - t1, "ckpt_s": blocked, "eval_s": eval_s, "loss": loss_v})
    if last_saved != step and step not in mgr.steps():  # resumed at the very end: save the final state
        val_loss, val_acc = evaluate()
        mgr.save(step, state(), metrics={"train_loss": statistics.fmean(recent or [0.0]),
                                         "val_loss": val_loss, "val_acc": val_acc}, kind="full")
    t_wait = time.perf_counter()
    mgr.wait()
    if tiers is not None:
        tiers.wait()  # every checkpoint copied to the durable tier
    drain_s = time.perf_counter() - t_wait
    if spec.baseline_dir:
        emit({"type": "baseline", **torch_save_baseline(state(), spec.baseline_dir)})
    emit({"type": "done", "step": step, "drain_s": drain_s, "loader": loader.stats()})
    loader.close()
    mgr.close()
    if tiers is not None:
        tiers.close()


def torch_save_baseline(state: dict, directory: str, repeats: int = 3) -> dict:
    """Median time of a plain ``torch.save`` of ``state`` to a file (what users do instead)."""
    import torch

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "baseline.pt")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.save(state, path)
        times.append(time.perf_counter() - t0)
    size = os.path.getsize(path)
    os.unlink(path)
    return {"torch_save_s": statistics.median(times), "torch_save_bytes": size}


# -- parent side ---------------------------------------------------------------------------
class WorkerKilled(Exception):
    """The worker was SIGKILLed on purpose (``kill_when``)."""


def run_worker(spec: TrainSpec, on_event: Callable[[dict], None],
               kill_when: Callable[[dict], bool] | None = None, log_path: str | None = None) -> dict:
    """Run ``train(spec)`` in a fresh Python process; ``on_event`` gets each event.

    ``kill_when(event)`` true -> the worker is SIGKILLed at once and ``WorkerKilled`` raised.
    Returns the ``done`` event. A worker that fails raises ``TrainstoreError`` with its stderr.
    """
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    err = open(log_path, "w+b") if log_path else subprocess.DEVNULL  # noqa: SIM115
    # the spec (which may hold store credentials) goes through stdin, never the command line
    proc = subprocess.Popen([sys.executable, "-m", "trainstore.demo.train"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, env=env, text=True, bufsize=1)
    done: dict | None = None
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(spec.to_json())
        proc.stdin.close()
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            on_event(event)
            if event.get("type") == "done":
                done = event
            if kill_when is not None and kill_when(event):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                raise WorkerKilled(f"worker {proc.pid} SIGKILLed after {event}")
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if log_path and err is not subprocess.DEVNULL:
            err.close()
    if rc != 0 or done is None:
        tail = ""
        if log_path and os.path.exists(log_path):
            with open(log_path, "rb") as f:
                tail = f.read()[-2000:].decode(errors="replace")
        raise TrainstoreError(f"training worker for job {spec.job!r} failed (exit {rc}): {tail}")
    return done


def main(argv: list[str]) -> None:
    if argv:
        raise SystemExit("usage: python -m trainstore.demo.train < SPEC_JSON")
    try:
        train(TrainSpec.from_json(sys.stdin.read()))
    except (ConfigError, TrainstoreError) as exc:
        sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = ["TrainSpec", "WorkerKilled", "build_model", "run_worker", "torch_save_baseline", "train"]
