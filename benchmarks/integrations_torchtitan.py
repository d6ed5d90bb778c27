"""Blocking time per save: torchtitan's CheckpointManager (DCP FileSystemWriter) vs
trainstore's TrainstoreCheckpointManager, same tiny 2-rank FSDP2 job (CPU, gloo).

    .venv/bin/python benchmarks/integrations_torchtitan.py --repeats 3

Each rank: an MLP of ``--width`` x ``--layers`` (FSDP2-sharded over 2 ranks), torchtitan's
OptimizersContainer (AdamW) and LR schedulers, a save every ``--interval`` steps. Timed: each
``checkpointer.save(step)`` call, i.e. what torchtitan's training loop waits for (with
``async_mode="async"`` that includes waiting for the previous save, as in torchtitan).
Modes: torchtitan default (``disabled``: synchronous ``dcp.save``), torchtitan ``async``
(``dcp.async_save``), trainstore ``disabled`` and ``async``. Runs interleave; medians printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_job(rank: int, world: int, args: dict) -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig

    from trainstore.integrations.torchtitan import TrainstoreCheckpointManager

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    layers = []
    for _ in range(args["layers"]):
        layers += [torch.nn.Linear(args["width"], args["width"]), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    fully_shard(model, mesh=mesh)
    optim = OptimizersContainer(OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-4})],
        implementation="foreach"), model_parts=[model])
    lr = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optim, training_steps=args["steps"])
    common = {"enable": True, "interval": args["interval"], "keep_latest_k": 0, "async_mode": args["async_mode"],
              "folder": "ckpt"}
    if args["impl"] == "trainstore":
        cfg = TrainstoreCheckpointManager.Config(**common, job="bench", full_every=args["full_every"])
    else:
        cfg = CheckpointManager.Config(**common)
    ckpt = cfg.build(dataloader=None, model_parts=[model], optimizers=optim, lr_schedulers=lr, states={},
                     sd_adapter=None, base_folder=args["dump"])
    x = torch.randn(16, args["width"])
    blocked, t_run = [], time.perf_counter()
    for step in range(1, args["steps"] + 1):
        for _ in range(args["compute"]):  # the training work between saves
            model(x).pow(2).mean().backward()
            optim.step()
            optim.zero_grad()
        lr.step()
        t0 = time.perf_counter()
        ckpt.save(step)
        if step % args["interval"] == 0:
            blocked.append(time.perf_counter() - t0)
    ckpt.maybe_wait_for_saving()
    ckpt.close()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # params + 2 AdamW moments
    return {"blocked": blocked, "wall": time.perf_counter() - t_run, "state_mb": nbytes / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--interval", type=int, default=2)
    ap.add_argument("--compute", type=int, default=3)
    ap.add_argument("--full-every", type=int, default=6)
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the test harness: harness.dist
    from harness.dist import run_ranks

    variants = [("torchtitan", "disabled"), ("torchtitan", "async"), ("trainstore", "disabled"),
                ("trainstore", "async")]
    results: dict[tuple[str, str], list[dict]] = {v: [] for v in variants}
    for _ in range(a.repeats):
        for impl, mode in variants:
            with tempfile.TemporaryDirectory(prefix="titan-bench-") as tmp:
                args = {"impl": impl, "async_mode": mode, "dump": tmp, "width": a.width, "layers": a.layers,
                        "steps": a.steps, "interval": a.interval, "compute": a.compute, "full_every": a.full_every}
                res = run_ranks("integrations_torchtitan:rank_job", world=2, args=args, timeout_s=600,
                                pythonpath=[HERE])
                bad = [r for r in res if not r.ok]
                if bad:
                    raise SystemExit(f"{impl}/{mode} failed: {bad[0].error}\n{bad[0].stderr[-2000:]}")
                results[(impl, mode)].append(res[0].value)  # rank 0's timings (both ranks block alike)
    base = statistics.median(b for r in results[("torchtitan", "disabled")] for b in r["blocked"])
    state_mb = results[variants[0]][0]["state_mb"]
    print(f"state: {state_mb:.0f} MB (params + AdamW), 2 ranks, {a.steps // a.interval} saves per run, "
          f"{a.repeats} runs")
    print("| manager | async_mode | saves | median blocking per save | p90 | vs torchtitan default | run wall (median) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for impl, mode in variants:
        runs = results[(impl, mode)]
        allb = sorted(b for r in runs for b in r["blocked"])
        med = statistics.median(allb)
        p90 = allb[min(len(allb) - 1, int(0.9 * len(allb)))]
        wall = statistics.median(r["wall"] for r in runs)
        print(f"| {impl} | {mode} | {len(allb)} | {med * 1e3:.1f} ms | {p90 * 1e3:.1f} ms | {med / base:.2f}x | "
              f"{wall:.1f} s |")


if __name__ == "__main__":
    main()
