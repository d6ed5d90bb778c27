"""Extra bytes of opt-in replicas (``RedundancyPolicy(min_refs=2)``) for two states, 7 checkpoints each.

Run: .venv/bin/python benchmarks/redundancy_bytes.py   (figures: docs/checkpoints.md "Repair")
"""

from __future__ import annotations

import tempfile

import numpy as np
import torch

from trainstore import CheckpointManager, CheckpointPolicy, open_store
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.chunks import REPLICA_SUFFIX
from trainstore.demo.config import TrainConfig
from trainstore.demo.train import build_model
from trainstore.lifecycle.redundancy import Redundancy, RedundancyPolicy


def measure(name: str, policy: CheckpointPolicy, states: list[tuple[int, dict]]) -> None:
    store = open_store(tempfile.mkdtemp())
    red = Redundancy(RedundancyPolicy(min_refs=2, registered=False))
    with CheckpointManager(store, "m", policy, options=WriteOptions(workers=2), hooks=[red.hook]) as mgr:
        for step, st in states:
            mgr.save(step, st, blocking=True)
        n = len(mgr.steps())
    metas = list(store.list("chunks/"))
    primary = sum(m.size for m in metas if not m.key.endswith(REPLICA_SUFFIX))
    replicas = sum(m.size for m in metas if m.key.endswith(REPLICA_SUFFIX))
    print(f"{name}: {n} checkpoints, chunks stored {primary / 1e6:.2f} MB, replicas {replicas / 1e6:.2f} MB "
          f"(+{100 * replicas / primary:.0f}%)")


def frozen_backbone() -> list[tuple[int, dict]]:
    """Fine-tuning: 32 MiB frozen fp32 backbone, 4 MiB head, 8 MiB optimizer state."""
    frozen = np.random.default_rng(0).standard_normal(8 << 20).astype(np.float32)
    out = []
    for step in range(7):
        r = np.random.default_rng(step + 1)
        out.append((step, {"backbone": frozen, "head": r.standard_normal(1 << 20).astype(np.float32),
                           "optim": r.standard_normal(2 << 20).astype(np.float32), "step": step}))
    return out


def demo_model(every: int = 40) -> list[tuple[int, dict]]:
    """The demo's ByteClassifier (hidden 768) with AdamW on random bytes, a state every ``every`` steps."""
    torch.manual_seed(0)
    model = build_model(TrainConfig(hidden=768), 64, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for step in range(7 * every):
        x = torch.randint(1, 257, (32, 64))
        y = torch.randint(0, 4, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            params = list(model.parameters())
            out.append((step, {"model": {k: v.clone() for k, v in model.state_dict().items()},
                               "optim": {"m": [opt.state[p]["exp_avg"].clone() for p in params],
                                         "v": [opt.state[p]["exp_avg_sq"].clone() for p in params]},
                               "step": step}))
    return out


if __name__ == "__main__":
    measure("frozen backbone, 7 full", CheckpointPolicy(full_every=1, incremental_every=None), frozen_backbone())
    measure("demo model + AdamW, full every 200, incremental every 40",
            CheckpointPolicy(full_every=200, incremental_every=40), demo_model())
