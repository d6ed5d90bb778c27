"""Packs of small tensors: time to durable of full saves of the GPT + AdamW state, packed vs not.

    .venv/bin/python benchmarks/checkpoint_packs.py [repeats]      # default 9

The (b) state of benchmarks/checkpoint.py (27M-parameter GPT + AdamW after 10 steps: ~400
tensors, ~300 of them under 1 MiB). Interleaved (order alternating), every method after a
``perturb`` (one element per 4 KiB changes, so nothing dedups): torch.save+fsync, trainstore
full save with packs (default ``WriteOptions``) and without (``pack_below=0``), each to durable.
Prints medians, the ratio to torch.save+fsync of every repeat, and chunk files per save.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint import Methods, perturb, trained_gpt_state  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.checkpoint.save.writer import WriteOptions  # noqa: E402


def main(repeats: int) -> None:
    state = trained_gpt_state(False)
    policy = CheckpointPolicy(full_every=1, incremental_every=None)
    with tempfile.TemporaryDirectory() as root:
        baseline = Methods(root, state)
        managers = {"packs": CheckpointManager(os.path.join(root, "packs"), "b", policy=policy),
                    "no_packs": CheckpointManager(os.path.join(root, "no_packs"), "b", policy=policy,
                                                  options=WriteOptions(pack_below=0))}
        steps = {k: 0 for k in managers}

        def durable(name: str) -> float:
            steps[name] += 1
            t = time.perf_counter()
            managers[name].save(steps[name], state).wait()
            return time.perf_counter() - t

        for name in managers:  # warm-up: staging arenas allocated and touched
            durable(name)
            durable(name)
        res: dict[str, list[float]] = {"torch_save": [], "packs": [], "no_packs": []}
        for i in range(repeats):
            for name in (["torch_save", "packs", "no_packs"] if i % 2 == 0 else ["no_packs", "packs", "torch_save"]):
                perturb(state)
                res[name].append(baseline.torch_save()[1] if name == "torch_save" else durable(name))
        t0 = statistics.median(res["torch_save"])
        print(f"GPT + AdamW full save to durable, median of {repeats} interleaved repeats")
        for name, v in res.items():
            ratios = " ".join(f"{x / y:.2f}" for x, y in zip(v, res["torch_save"]))
            print(f"  {name:<11} {statistics.median(v):.3f} s  durable/torch {statistics.median(v) / t0:.3f}  "
                  f"per repeat: {ratios}")
        for name, mgr in managers.items():
            files = sum(len(f) for _, _, f in os.walk(os.path.join(root, name, "chunks")))
            print(f"  {name}: {files / steps[name]:.0f} chunk files per save")
            mgr.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
