"""Training stages: the uninterrupted run, and a second run SIGKILLed mid-epoch then resumed.

Both runs are the same ``train`` worker with the same config, in their own processes. The
second one (job ``<job>-crash``) is killed with SIGKILL a couple of steps after a checkpoint
save was issued (so a save may well be in flight), mid-epoch; a fresh worker then resumes
from the newest checkpoint that verifies. The proof: the final full checkpoints of both jobs
hold the same bytes, tensor by tensor (model, optimizer, loader position and RNG included).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..checkpoint import CheckpointManager
from ..checkpoint.format.manifest import list_steps
from ..errors import TrainstoreError
from ..store import open_store
from .context import HOT_KEEP_LAST, RunContext
from .train import TrainSpec, WorkerKilled, run_worker

JOB = "demo-train"
CRASH_JOB = "demo-train-crash"


def _spec(ctx: RunContext, job: str, train_ref: str, val_ref: str, baseline: bool) -> TrainSpec:
    return TrainSpec(store_url=ctx.store_url, job=job, train_ref=train_ref, val_ref=val_ref,
                     cache_dir=ctx.paths.data_cache, config=ctx.config.train, store_options=ctx.store_options,
                     baseline_dir=ctx.paths.scratch if baseline else None, seq_len=ctx.config.data.seq_len,
                     hot_dir=ctx.paths.ckpt_hot, hot_keep_last=HOT_KEEP_LAST)


def _log(ctx: RunContext, name: str) -> str:
    os.makedirs(ctx.paths.scratch, exist_ok=True)
    return os.path.join(ctx.paths.scratch, f"{name}.log")


def train_stage(ctx: RunContext, train_ref: str, val_ref: str) -> dict:
    """The uninterrupted run: per-step timings, saves, the torch.save baseline, loader stats."""
    steps: list[dict] = []
    saves: list[dict] = []
    out: dict[str, Any] = {"job": JOB}
    with ctx.stage("train + async checkpoints", total=1, unit="starting") as task:
        def on_event(e: dict) -> None:
            kind = e["type"]
            if kind == "start":
                out.update(total_steps=e["total_steps"], steps_per_epoch=e["steps_per_epoch"], params=e["params"])
                ctx.progress.update(task, total=e["total_steps"], note="")
            elif kind == "step":
                steps.append({k: e[k] for k in ("step", "epoch", "wait_s", "compute_s", "ckpt_s", "eval_s", "loss")})
                ctx.progress.update(task, completed=e["step"], note=f"epoch {e['epoch'] + 1} loss {e['loss']:.3f}")
            elif kind == "save":
                saves.append(e)
            elif kind in ("baseline", "done"):
                out[kind] = e

        run_worker(_spec(ctx, JOB, train_ref, val_ref, baseline=True), on_event, log_path=_log(ctx, JOB))
    out["steps"] = steps
    out["saves"] = [{k: v for k, v in s.items() if k != "type"} for s in saves]
    out["checkpoints"] = checkpoint_table(ctx, JOB, saves)
    ctx.record["train"] = out
    return out


def checkpoint_table(ctx: RunContext, job: str, saves: list[dict]) -> list[dict]:
    """Per committed checkpoint: kind, logical / stored / written bytes, blocking time, metrics."""
    blocked = {s["step"]: s["blocked_s"] for s in saves}
    waited = {s["step"]: s.get("waited", False) for s in saves}
    mgr = CheckpointManager(ctx.store, job)
    try:
        return [{"step": i.step, "kind": i.kind, "base_step": i.base_step, "logical_bytes": i.logical_bytes,
                 "stored_bytes": i.stored_bytes, "written_bytes": i.written_bytes, "tensors": i.tensors,
                 "blocked_s": blocked.get(i.step), "waited": waited.get(i.step, False), "metrics": i.metrics, "created": i.created}
                for i in mgr.list()]
    finally:
        mgr.close()


def crash_stage(ctx: RunContext, train_ref: str, val_ref: str) -> dict:
    """Run, SIGKILL mid-epoch, resume; compare the final state with the uninterrupted run's."""
    spec = _spec(ctx, CRASH_JOB, train_ref, val_ref, baseline=False)
    fraction = ctx.config.crash_fraction
    info: dict[str, Any] = {"job": CRASH_JOB}
    plan: dict[str, int] = {}
    with ctx.stage("crash (SIGKILL) + resume", total=1, unit="starting") as task:
        def kill_when(e: dict) -> bool:
            kind = e["type"]
            if kind == "start":
                plan.update(total=e["total_steps"], per_epoch=e["steps_per_epoch"], pid=e["pid"])
                ctx.progress.update(task, total=e["total_steps"], note="first run")
            elif kind == "save" and "save_step" not in plan and e["step"] >= fraction * plan["total"]:
                plan["save_step"] = e["step"]  # kill a couple of steps later: the save may be in flight
                kill = e["step"] + 2
                if kill % plan["per_epoch"] in (0, 1):  # stay mid-epoch
                    kill += 2
                plan["kill_step"] = min(kill, plan["total"] - 1)
            elif kind == "step":
                ctx.progress.update(task, completed=e["step"])
                if e["step"] >= plan.get("kill_step", 1 << 60):
                    info.update(killed_at_step=e["step"], killed_in_epoch=e["epoch"],
                                batch_in_epoch=e["step"] - e["epoch"] * plan["per_epoch"])
                    return True
            return False

        killed = False
        t_kill = time.perf_counter()
        try:
            run_worker(spec, lambda e: None, kill_when=kill_when, log_path=_log(ctx, CRASH_JOB + "-1"))
        except WorkerKilled:
            killed = True
            t_kill = time.perf_counter()
        if not killed:
            raise TrainstoreError("the crash run finished before it could be killed; raise the data size")
        committed = set(list_steps(ctx.store, CRASH_JOB)) | set(list_steps(open_store(ctx.paths.ckpt_hot), CRASH_JOB))
        info.update(pid=plan["pid"], signal="SIGKILL", save_issued_at_step=plan["save_step"],
                    committed_at_kill=max(committed, default=None),
                    durable_at_kill=max(list_steps(ctx.store, CRASH_JOB), default=None))
        ctx.note(task, f"killed at step {info['killed_at_step']}, resuming")

        def on_resume(e: dict) -> None:
            if e["type"] == "resume":
                info["resume"] = {k: e[k] for k in ("step", "kind", "reason", "skipped", "seconds")}
                info["resume"]["since_kill_s"] = time.perf_counter() - t_kill
                ctx.progress.update(task, completed=e["step"], note=f"resumed from step {e['step']}")
            elif e["type"] == "step":
                ctx.progress.update(task, completed=e["step"])

        run_worker(spec, on_resume, log_path=_log(ctx, CRASH_JOB + "-2"))
        ctx.note(task, "comparing final weights")
        info["compare"] = compare_final(ctx, JOB, CRASH_JOB)
        ctx.note(task, "final weights identical" if info["compare"]["identical"] else "WEIGHTS DIFFER")
        info["checkpoints"] = checkpoint_table(ctx, CRASH_JOB, [])
        info["removed_checkpoints"] = _remove_job(ctx, CRASH_JOB)
    info["steps_redone"] = info["killed_at_step"] - info["resume"]["step"]
    ctx.record["crash"] = info
    return info


def _remove_job(ctx: RunContext, job: str) -> int:
    """The crash run's checkpoints repeat the main run's (its chunks are the same objects,
    shared by content): once compared they are removed; their chunks stay while referenced."""
    from ..lifecycle.deletion import delete_checkpoint

    hot = open_store(ctx.paths.ckpt_hot)
    steps = list_steps(ctx.store, job)
    for tier in (hot, ctx.store):
        for step in list_steps(tier, job):
            delete_checkpoint(tier, job, step)
    return len(steps)


def compare_final(ctx: RunContext, job_a: str, job_b: str) -> dict:
    """Restore the last checkpoint of both jobs; compare every tensor's bytes."""
    states = []
    for job in (job_a, job_b):
        mgr = CheckpointManager(ctx.store, job)
        try:
            step = mgr.latest_step()
            states.append((step, mgr.restore(step=step)))
        finally:
            mgr.close()
    (step_a, a), (step_b, b) = states
    tensors = differing = 0
    max_abs = 0.0
    for part in ("model", "optim", "loader", "rng", "step"):
        for _path, x, y in _pairs(a.get(part), b.get(part), part):
            tensors += 1
            xa, ya = _raw(x), _raw(y)
            if xa is None or ya is None:
                differing += int(x != y)
                continue
            if xa != ya:
                differing += 1
                fx, fy = _floats(x), _floats(y)
                if fx is not None and fy is not None and fx.shape == fy.shape:
                    max_abs = max(max_abs, float(np.max(np.abs(fx - fy), initial=0.0)))
    return {"steps": [step_a, step_b], "values_compared": tensors, "differing": differing,
            "identical": differing == 0 and step_a == step_b, "max_abs_diff": max_abs}


def _pairs(x: Any, y: Any, path: str):  # noqa: ANN202 - generator of (path, a, b)
    if isinstance(x, dict) and isinstance(y, dict):
        keys = list(dict.fromkeys([*x.keys(), *y.keys()]))
        for k in keys:
            yield from _pairs(x.get(k), y.get(k), f"{path}/{k}")
    elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
        for i, (p, q) in enumerate(zip(x, y)):
            yield from _pairs(p, q, f"{path}/{i}")
    else:
        yield path, x, y


def _raw(x: Any) -> tuple[str, tuple, bytes] | None:
    """(dtype, shape, bytes) of an array or tensor, else None."""
    if isinstance(x, np.ndarray):
        return x.dtype.str, x.shape, x.tobytes()
    if hasattr(x, "detach") and hasattr(x, "element_size"):
        t = x.detach().cpu().contiguous()
        return str(t.dtype), tuple(t.shape), t.reshape(-1).view(_bytes_dtype()).numpy().tobytes()
    return None


def _floats(x: Any) -> np.ndarray | None:
    if isinstance(x, np.ndarray):
        return x.astype(np.float64) if x.dtype.kind in "fiu" else None
    if hasattr(x, "detach") and (x.dtype.is_floating_point or not x.dtype.is_complex):
        return x.detach().cpu().double().numpy()
    return None


def _bytes_dtype() -> Any:
    import torch

    return torch.uint8


__all__ = ["CRASH_JOB", "JOB", "checkpoint_table", "compare_final", "crash_stage", "train_stage"]
