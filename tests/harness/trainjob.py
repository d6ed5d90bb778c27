"""A small, deterministic training job: Loader + CheckpointManager + a tiny MLP on CPU.

Used by the deterministic-recovery tests (kill it at random steps, resume each time from
the newest valid checkpoint, compare the final weights with an uninterrupted run bit for
bit) and reusable by demos. Everything that decides the next step is checkpointed: model
and optimizer state, every RNG (dropout draws from torch's), and the loader position.

    python -m harness.trainjob prepare STORE          # write the feature dataset
    python -m harness.trainjob train STORE JOB CACHE_DIR OUT.npz [--steps N] [--optimizer plain-adam]

``train`` prints ``READY``, then ``STEP n`` after each optimizer step, ``SAVED n`` when the
checkpoint of step ``n`` is durable, and ``DONE`` after writing the final weights to
``OUT.npz``. Started again after a crash, it resumes from the newest checkpoint that
verifies (``RESUMED n``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

DATASET = "trainjob-features"


@dataclass(frozen=True)
class JobConfig:
    rows: int = 1536
    features: int = 16
    hidden: int = 32
    classes: int = 4
    rows_per_shard: int = 256
    batch_size: int = 64
    steps: int = 60  # 2.5 epochs at 24 batches per epoch
    save_every: int = 4
    full_every: int = 12
    seed: int = 7
    lr: float = 1e-2
    #: "torch-adam" (torch.optim.Adam) or "plain-adam" (the same update written out here:
    #: torch.optim's first use imports torch._dynamo, ~5 s per process on a busy 2-core box,
    #: too slow for dozens of restarted processes in the short suite).
    optimizer: str = "torch-adam"


class PlainAdam:
    """Adam (Kingma & Ba) with ``state_dict``/``load_state_dict`` like torch.optim's."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        import torch

        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        import torch

        self.step_count += 1
        b1, b2 = self.betas
        with torch.no_grad():
            for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = m / (1 - b1 ** self.step_count)
                v_hat = v / (1 - b2 ** self.step_count)
                p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))

    def state_dict(self) -> dict:
        return {"step": self.step_count, "exp_avg": list(self.exp_avg), "exp_avg_sq": list(self.exp_avg_sq),
                "lr": self.lr, "betas": self.betas, "eps": self.eps}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step"])
        with __import__("torch").no_grad():
            for dst, src in zip(self.exp_avg + self.exp_avg_sq, list(state["exp_avg"]) + list(state["exp_avg_sq"])):
                dst.copy_(src)


def prepare(store_url: str, cfg: JobConfig = JobConfig(), **store_options: object) -> str:
    """Write the job's feature dataset (deterministic) and return its reference."""
    import numpy as np

    from trainstore.data.serve import write_arrow_dataset
    from trainstore.data.versions import list_versions
    from trainstore.store import open_store

    store = open_store(store_url, **store_options)
    if not list_versions(store, DATASET):
        rng = np.random.default_rng(cfg.seed)
        x = rng.standard_normal((cfg.rows, cfg.features), dtype=np.float32)
        w = rng.standard_normal((cfg.features, cfg.classes), dtype=np.float32)
        y = (x @ w).argmax(axis=1).astype(np.int64)
        write_arrow_dataset(store, DATASET, {"x": x, "y": y}, rows_per_shard=cfg.rows_per_shard)
    return f"{DATASET}@{list_versions(store, DATASET)[-1]}"


def _model(cfg: JobConfig):  # noqa: ANN202 - torch imported lazily
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(cfg.features, cfg.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.2),
        torch.nn.Linear(cfg.hidden, cfg.classes),
    )


def train(store_url: str, job: str, cache_dir: str, out: str, cfg: JobConfig = JobConfig(),
          log=print, **store_options: object) -> dict:
    """Train to ``cfg.steps`` (resuming from the newest valid checkpoint); save final weights."""
    import numpy as np
    import torch

    from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
    from trainstore.checkpoint.rng import capture_rng, restore_rng
    from trainstore.data.serve import Dataset, Loader
    from trainstore.errors import NoCheckpointError
    from trainstore.store import open_store

    torch.set_num_threads(1)  # bitwise-reproducible CPU kernels
    store = open_store(store_url, **store_options)
    ref = prepare(store, cfg)
    dataset = Dataset(store, ref, cache_dir=cache_dir)
    loader = Loader(dataset, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed, workers=1, prefetch=2)
    torch.manual_seed(cfg.seed)
    model = _model(cfg)
    optim = torch.optim.Adam(model.parameters(), lr=cfg.lr) if cfg.optimizer == "torch-adam" \
        else PlainAdam(model.parameters(), lr=cfg.lr)
    mgr = CheckpointManager(store, job, CheckpointPolicy(full_every=cfg.full_every,
                                                         incremental_every=cfg.save_every))
    step = 0
    try:
        state = mgr.restore()
    except NoCheckpointError:  # a fresh start; all checkpoints corrupt is an error, raised
        state = None
    if state is not None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        loader.load_state_dict(state["loader"])
        restore_rng(state["rng"])
        step = int(state["step"])
        log(f"RESUMED {step}")
    log("READY")
    sys.stdout.flush()
    model.train()
    while step < cfg.steps:
        for batch in loader:
            x = torch.from_numpy(np.ascontiguousarray(batch["x"]))
            y = torch.from_numpy(np.ascontiguousarray(batch["y"]))
            optim.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optim.step()
            step += 1
            log(f"STEP {step}")
            if step % cfg.save_every == 0:
                mgr.save(step, {"model": model.state_dict(), "optim": optim.state_dict(),
                                "loader": loader.state_dict(), "rng": capture_rng(), "step": step},
                         metrics={"loss": float(loss.detach())}, blocking=True)
                log(f"SAVED {step}")
            if step >= cfg.steps:
                break
    mgr.close()
    loader.close()
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    tmp = out + ".tmp.npz"
    np.savez(tmp, **weights)
    import os

    os.replace(tmp, out)
    log("DONE")
    return weights


def main(argv: list[str]) -> None:
    import json
    import os

    opts = json.loads(os.environ.get("TRAINSTORE_CRASHKIT_STORE_OPTIONS", "{}"))
    if argv[0] == "prepare":
        print(prepare(argv[1], **opts))
        return
    if argv[0] == "train":
        changes: dict = {}
        for flag, field, cast in (("--steps", "steps", int), ("--optimizer", "optimizer", str)):
            if flag in argv:
                i = argv.index(flag)
                changes[field] = cast(argv[i + 1])
                argv = argv[:i] + argv[i + 2:]
        cfg = JobConfig(**changes)
        train(argv[1], argv[2], argv[3], argv[4], cfg, log=lambda m: print(m, flush=True), **opts)
        return
    raise SystemExit(f"usage: python -m harness.trainjob prepare|train ...; got {argv!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
