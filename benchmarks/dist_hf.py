"""Multi-process Hugging Face ``Trainer`` checkpoints: its own folders vs ``TrainstoreTrainer``.

    .venv/bin/python benchmarks/dist_hf.py                      # 2 and 4 ranks, DDP and FSDP2, 3 repeats
    .venv/bin/python benchmarks/dist_hf.py --quick              # 2 ranks, tiny model, 1 repeat (smoke)
    .venv/bin/python benchmarks/dist_hf.py --worlds 2 --modes fsdp --repeats 5 --embd 512 --layers 8

Each run is a real ``torchrun --nproc_per_node N`` job (gloo, CPU) training a GPT-2 built from
a config on synthetic tokens with ``save_steps``. Two kinds, interleaved (the order alternates
per repeat), medians reported:

* ``hf``: the plain ``Trainer``'s ``save_strategy="steps"`` folders (``checkpoint-N``): under
  DDP rank 0 writes safetensors + pickled optimizer/scheduler, every rank its RNG file; under
  FSDP2 the Trainer's ``save_fsdp_model``/``save_fsdp_optimizer`` with
  ``SHARDED_STATE_DICT`` (torch DCP ``FileSystemWriter`` folders, every rank its shards).
* ``trainstore``: ``TrainstoreTrainer`` into a local store (full every 4th save, incremental
  between; the ``dcp`` backend).

Per save, on rank 0: **blocking** = the time ``_save_checkpoint`` held the training loop
(the slowest rank's is reported too); **durable** = from the save's start until it is
committed (``hf``: blocking plus an fsync of the files it wrote - its writes are synchronous
but never fsynced, so without that they are not durable; the unsynced figure is blocking;
``trainstore``: until the save handle completes: every rank's chunks written, manifest
committed). FSDP2 on CPU: accelerate has no CPU FSDP path (``use_cpu`` runs DDP), so the
Trainer's accelerator is switched to FSDP2 as a GPU run builds it (``force_fsdp2``), as in the
tests. Output: one JSON line per run, then a JSON summary (medians, ratios trainstore/hf).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from durable import fsync_new_files  # benchmarks/, the script's folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))


# -- one rank (run by torchrun) ----------------------------------------------------------------
def force_fsdp2(trainer) -> None:  # noqa: ANN001
    """Give ``trainer``'s accelerator the FSDP type and an FSDP2 plugin (CPU: see module docstring)."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    trainer.accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["GPT2Block"],
        reshard_after_forward=True, state_dict_type="SHARDED_STATE_DICT")
    trainer.accelerator.state.distributed_type = DistributedType.FSDP
    trainer.is_fsdp_enabled = True


def rank_main(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
    from trainstore.checkpoint.save.writer import WriteOptions
    from trainstore.integrations.hf import TrainstoreTrainer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    class Timed:
        def __init__(self, *args, **kw) -> None:  # noqa: ANN002, ANN003
            super().__init__(*args, **kw)
            self.blocking: list[float] = []
            self.durable: list[float] = []
            self.waiters: list[threading.Thread] = []

        def _save_checkpoint(self, model, trial) -> None:  # noqa: ANN001
            t0, wall0 = time.perf_counter(), time.time()
            super()._save_checkpoint(model, trial)
            self.blocking.append(time.perf_counter() - t0)
            handle = getattr(self, "last_save", None)
            if handle is None:  # the Trainer's folder: durable once its files are fsynced (it never does)
                self.durable.append(self.blocking[-1] + fsync_new_files(self.args.output_dir, wall0))
                return
            slot = len(self.durable)
            self.durable.append(float("nan"))

            def wait() -> None:
                handle.wait()
                self.durable[slot] = time.perf_counter() - t0
            self.waiters.append(threading.Thread(target=wait, daemon=True))
            self.waiters[-1].start()

    class TimedTrainer(Timed, Trainer):
        pass

    class TimedTrainstoreTrainer(Timed, TrainstoreTrainer):
        pass

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.embd, n_layer=a.layers,
                                       n_head=4))
    rows = a.steps * a.batch * world
    ids = torch.randint(0, a.vocab, (rows, a.seq), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(output_dir=os.path.join(a.root, "out"), max_steps=a.steps,
                             per_device_train_batch_size=a.batch, save_strategy="steps", save_steps=a.save_steps,
                             report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=1000)
    mgr = None
    if a.kind == "hf":
        trainer = TimedTrainer(model=model, args=args, train_dataset=data)
    else:
        policy = CheckpointPolicy(full_every=4 * a.save_steps, incremental_every=1) if a.policy == "incremental" \
            else CheckpointPolicy(full_every=1, incremental_every=None)
        options = WriteOptions(codec="raw", delta_codec="raw") if a.codecs == "raw" else None
        mgr = CheckpointManager(f"file://{a.root}/store", "bench", policy, options=options)
        trainer = TimedTrainstoreTrainer(model=model, args=args, train_dataset=data, checkpoints=mgr)
    if a.mode == "fsdp":
        force_fsdp2(trainer)
    t0 = time.perf_counter()
    trainer.train()  # TrainstoreTrainer: waits for the last save
    wall = time.perf_counter() - t0
    for w in trainer.waiters:
        w.join()
    if mgr is not None:
        mgr.close()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, trainer.blocking)
    if rank == 0:
        slowest = [max(per_rank[i] for per_rank in gathered) for i in range(len(trainer.blocking))]
        out = {"kind": a.kind, "mode": a.mode, "world": world, "saves": len(trainer.blocking),
               "params": sum(p.numel() for p in model.parameters()),
               "median_blocking_s": statistics.median(trainer.blocking),
               "median_blocking_slowest_rank_s": statistics.median(slowest),
               "median_durable_s": statistics.median(trainer.durable), "train_wall_s": wall}
        with open(a.out, "w") as f:
            json.dump(out, f)
    # torch 2.13's gloo group deadlocks at exit when DDP's Reducer frees it while a worker thread
    # still has to drop the last collectives' Python tensors (that needs the GIL the freeing thread
    # holds): every rank past the gather, then a pause without the GIL lets the workers finish
    dist.barrier()
    time.sleep(0.5)
    dist.destroy_process_group()



# -- the driver --------------------------------------------------------------------------------
def launch(a: argparse.Namespace, kind: str, mode: str, world: int) -> dict:
    with tempfile.TemporaryDirectory() as root, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # a free port for this job's rendezvous
        s.close()
        out = os.path.join(root, "result.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr",
               "127.0.0.1", "--master_port", str(port), "--max_restarts", "0", os.path.abspath(__file__), "--rank-run",
               "--kind", kind, "--mode", mode, "--root", root, "--out", out, "--steps", str(a.steps),
               "--save-steps", str(a.save_steps), "--batch", str(a.batch), "--embd", str(a.embd),
               "--layers", str(a.layers), "--policy", a.policy, "--codecs", a.codecs, "--vocab", str(a.vocab), "--seq", str(a.seq)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
        if p.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"{kind}/{mode}/{world} ranks failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")
        with open(out) as f:
            return json.load(f)


def summarize(results: list[dict]) -> dict:
    summary: dict = {}
    for key in sorted({(r["mode"], r["world"]) for r in results}):
        cell = {}
        for kind in ("hf", "trainstore"):
            rs = [r for r in results if (r["mode"], r["world"]) == key and r["kind"] == kind]
            cell[kind] = {m: statistics.median(r[m] for r in rs) for m in
                          ("median_blocking_s", "median_blocking_slowest_rank_s", "median_durable_s", "train_wall_s")}
        cell["blocking_ratio_trainstore_over_hf"] = (cell["trainstore"]["median_blocking_s"]
                                                     / cell["hf"]["median_blocking_s"])
        cell["durable_ratio_trainstore_over_hf"] = (cell["trainstore"]["median_durable_s"]
                                                    / cell["hf"]["median_durable_s"])
        summary[f"{key[0]}/{key[1]} ranks"] = cell
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kind", choices=["hf", "trainstore"])
    ap.add_argument("--root")
    ap.add_argument("--out")
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--modes", nargs="+", choices=["ddp", "fsdp"], default=["ddp", "fsdp"])
    ap.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--save-steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--policy", choices=["incremental", "full"], default="incremental",
                    help="trainstore: a full save every 4th, incremental between (default), or every save full")
    ap.add_argument("--codecs", choices=["default", "raw"], default="default",
                    help="trainstore: the default codecs (full shuffle-lz4 where it pays, deltas bytegroup-zstd) or none")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 ranks, tiny model, 1 repeat")
    a = ap.parse_args()
    if a.rank_run:
        return rank_main(a)
    if a.quick:
        a.worlds, a.repeats, a.steps, a.save_steps, a.embd, a.layers, a.vocab, a.seq = [2], 1, 4, 2, 32, 2, 256, 8
    results = []
    for rep in range(a.repeats):
        for world in a.worlds:
            for mode in a.modes:
                kinds = ("hf", "trainstore") if rep % 2 == 0 else ("trainstore", "hf")
                for kind in kinds:
                    results.append(launch(a, kind, mode, world))
                    print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"summary": summarize(results)}, indent=2))
    return None


if __name__ == "__main__":
    main()
