"""Checkpoint benchmark: trainstore CheckpointManager vs torch.save, safetensors and torch DCP.

    .venv/bin/python benchmarks/checkpoint.py            # (a) 2 GiB float32, (b) 25M+ GPT + AdamW
    .venv/bin/python benchmarks/checkpoint.py --quick    # smoke run (small sizes, 1 repeat)
    .venv/bin/python benchmarks/checkpoint.py --cold --gib 1 --repeats 3   # + fresh-process figures
    .venv/bin/python benchmarks/checkpoint.py --cold --cold-only --methods trainstore,torch_save

``--cold`` adds, before the steady-state parts, the fresh-process figures of
benchmarks/checkpoint_cold.py (every save and restore method in its own new process: first
save blocking, time to durable, restore into fresh memory) for the (a) state and for a GPT +
AdamW state, with the first-touch speed of fresh memory measured beside them.

(a) 2 GiB of float32 tensors, interleaved repetitions (median reported) of: plain copy into
preallocated touched buffers (the floor for blocking time), torch.save+fsync, safetensors
save_file+fsync, torch.distributed.checkpoint async_save (blocking and durable), trainstore
save(blocking=False) (blocking and durable); then restore vs torch.load(weights_only=True).
Before every timed save one element per 4 KiB is changed, so no method benefits from dedup
of the previous repetition.

(b) a GPT-style transformer trained with AdamW for 100 steps, checkpoint every 10 steps
(full at step 0 and 100, incrementals between): bytes stored vs 11x the torch.save size,
the training step slowdown while a background save runs, and the same blocking / durable /
restore comparisons on the final model + optimizer state.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.checkpoint.save.writer import WriteOptions  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from checkpoint_cold import CACHE_STATES, RESTORE_METHODS, SAVE_METHODS, run_cold  # noqa: E402


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def flat_tensors(state, prefix="") -> dict[str, torch.Tensor]:
    out = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(flat_tensors(v, f"{prefix}{k}."))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(flat_tensors(v, f"{prefix}{i}."))
    elif isinstance(state, torch.Tensor):
        out[prefix.rstrip(".")] = state.contiguous()
    return out


def perturb(state) -> None:
    for t in flat_tensors(state).values():
        if t.is_floating_point() and t.numel():
            t.view(-1)[::1024] += 1.0


class Methods:
    """Each method saves ``state`` once and returns (blocking seconds, durable seconds)."""

    def __init__(self, root: str, state):
        self.root = root
        self.state = state
        self.n = 0
        tensors = flat_tensors(state)
        self.copy_bufs = {k: torch.empty_like(v) for k, v in tensors.items()}
        for b in self.copy_bufs.values():
            b.view(-1).view(torch.uint8).zero_()
        self.mgr = CheckpointManager(os.path.join(root, "ts"), job="bench",
                                     policy=CheckpointPolicy(full_every=1, incremental_every=None))
        self.torch_file = None

    def _path(self, name):
        self.n += 1
        return os.path.join(self.root, f"{name}-{self.n}")

    def copy(self):
        t = time.perf_counter()
        for k, v in flat_tensors(self.state).items():
            self.copy_bufs[k].copy_(v)
        d = time.perf_counter() - t
        return d, d

    def torch_save(self):
        p = self._path("torch.pt")
        t = time.perf_counter()
        with open(p, "wb") as f:
            torch.save(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        d = time.perf_counter() - t
        if self.torch_file:
            os.unlink(self.torch_file)
        self.torch_file = p
        return d, d

    def safetensors(self):
        from safetensors.torch import save_file

        p = self._path("st.safetensors")
        t = time.perf_counter()
        save_file(flat_tensors(self.state), p)
        fsync_path(p)
        d = time.perf_counter() - t
        os.unlink(p)
        return d, d

    def dcp_async(self):
        import torch.distributed.checkpoint as dcp

        p = self._path("dcp")
        t = time.perf_counter()
        fut = dcp.async_save(self.state, checkpoint_id=p)
        blocking = time.perf_counter() - t
        fut.result()
        for d, _, fs in os.walk(p):
            for f in fs:
                fsync_path(os.path.join(d, f))
        durable = time.perf_counter() - t
        shutil.rmtree(p, ignore_errors=True)
        return blocking, durable

    def trainstore(self):
        self.n += 1
        t = time.perf_counter()
        h = self.mgr.save(self.n, self.state)
        blocking = time.perf_counter() - t
        h.wait()
        return blocking, time.perf_counter() - t


def compare(label: str, state, repeats: int, root: str) -> dict:
    m = Methods(root, state)
    names = ["copy", "torch_save", "safetensors", "dcp_async", "trainstore"]
    res: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    errors = {}
    m.trainstore()  # warm-up: allocates + touches the staging arena once (steady state is reuse)
    m.trainstore()
    for _ in range(repeats):
        for n in names:
            if n in errors:
                continue
            perturb(state)
            try:
                res[n].append(getattr(m, n)())
            except Exception as exc:  # noqa: BLE001 - report unavailable baselines
                errors[n] = f"{type(exc).__name__}: {exc}"
    med = {n: (statistics.median(b for b, _ in v), statistics.median(d for _, d in v)) for n, v in res.items() if v}
    ts = med["torch_save"][1]
    print(f"\n[{label}] save: median of {repeats} interleaved repeats")
    print(f"  {'method':<14}{'blocking s':>12}{'durable s':>12}{'block/torch':>13}{'durable/torch':>15}")
    for n, (b, d) in med.items():
        print(f"  {n:<14}{b:>12.3f}{d:>12.3f}{b / ts:>13.3f}{d / ts:>15.3f}")
    for n, e in errors.items():
        print(f"  {n:<14} unavailable: {e[:150]}")
    tb = med["trainstore"][0]
    print(f"  trainstore blocking / plain copy: {tb / med['copy'][0]:.2f}x")
    # restore
    perturb(state)
    m.torch_save()
    step = m.n + 1
    m.mgr.save(step, state, blocking=True)
    rt, rts = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        torch.load(m.torch_file, weights_only=True)
        rt.append(time.perf_counter() - t)
        t = time.perf_counter()
        m.mgr.restore(step=step)
        rts.append(time.perf_counter() - t)
    r_t, r_s = statistics.median(rt), statistics.median(rts)
    print(f"  restore full: torch.load {r_t:.3f}s  trainstore {r_s:.3f}s  ratio {r_s / r_t:.2f}x")
    m.mgr.close()
    return {"median": med, "restore": (r_t, r_s), "torch_file": m.torch_file}


def bench_tensors(gib: float, repeats: int, root: str) -> None:
    n_tensors = 16
    per = int(gib * (1 << 30)) // 4 // n_tensors
    state = {f"t{i}": torch.randn(per) for i in range(n_tensors)}
    compare(f"(a) {gib:g} GiB float32 in {n_tensors} tensors", state, repeats, root)


class GPT(torch.nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(ctx, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        h = self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
        return self.head(self.ln(h))


def gpt_config(quick: bool) -> dict:
    return dict(vocab=2048, d=128, layers=2, heads=4, ctx=16) if quick else dict(vocab=2048, d=512, layers=8, heads=8, ctx=16)


def trained_gpt_state(quick: bool, steps: int = 10) -> dict:
    """Model + AdamW state of the (b) GPT after ``steps`` steps (same seed and sizes)."""
    torch.manual_seed(0)
    cfg = gpt_config(quick)
    model = GPT(**cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, cfg["vocab"], (1024, cfg["ctx"] + 1))
    for _ in range(steps):
        batch = data[torch.randint(0, data.shape[0], (2,))]
        loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, cfg["vocab"]), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def bench_gpt(quick: bool, repeats: int, root: str, nice: int = 0, delta_codec: str | None = None,
              full_codec: str | None = None, incompressible_ratio: float | None = None) -> None:
    torch.manual_seed(0)
    # >= 25M parameters, but few tokens per step (batch 2 x 16): 100 AdamW steps take minutes, not
    # hours, on 2 shared cores. The training loop uses 1 torch thread (2 threads spin against each
    # other on an oversubscribed machine); the background save gets the other core.
    cfg = gpt_config(quick)
    batch_size = 2
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = GPT(**cfg)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    steps, every = (20, 5) if quick else (100, 10)
    data = torch.randint(0, cfg["vocab"], (1024, cfg["ctx"] + 1))
    store_dir = os.path.join(root, "gpt-ts")
    mgr = CheckpointManager(store_dir, job="gpt", policy=CheckpointPolicy(full_every=steps, incremental_every=every),
                            options=WriteOptions(nice=nice, **({"delta_codec": delta_codec} if delta_codec else {}),
                                                 **({"codec": full_codec, "raw_above": 1.0} if full_codec else {}),
                                                 incompressible_ratio=incompressible_ratio))
    step_times, busy, blocked = [], [], []
    for step in range(steps + 1):
        busy_now = mgr.pending() is not None
        t = time.perf_counter()
        batch = data[torch.randint(0, data.shape[0], (batch_size,))]
        loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, cfg["vocab"]), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - t)
        busy.append(busy_now or mgr.pending() is not None)
        if step % every == 0:
            t = time.perf_counter()
            mgr.save(step, {"model": model.state_dict(), "optim": opt.state_dict()}, metrics={"loss": loss.item()})
            blocked.append(time.perf_counter() - t)
    mgr.wait()
    torch.set_num_threads(threads)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    tfile = os.path.join(root, "gpt.pt")
    torch.save(state, tfile)
    tsize = os.path.getsize(tfile)
    stored = dir_bytes(store_dir)
    n_ckpt = steps // every + 1
    infos = mgr.list()
    print(f"\n[(b) GPT {params / 1e6:.1f}M params + AdamW, {steps} steps, checkpoint every {every}, "
          f"background nice={nice}, delta codec {mgr.options.delta_codec}, full codec {mgr.options.codec} "
          f"(raw above {mgr.options.raw_above or 'auto'}), incremental pieces raw above "
          f"{mgr.options.incompressible_ratio or 'auto'}]")
    print(f"  torch.save size {tsize / 1e6:.1f} MB; {n_ckpt}x = {n_ckpt * tsize / 1e6:.1f} MB")
    print(f"  trainstore stored {stored / 1e6:.1f} MB for {len(infos)} checkpoints = "
          f"{stored / (n_ckpt * tsize):.3f}x of {n_ckpt}x torch.save")
    for i in infos:
        print(f"    step {i.step:>4} {i.kind:<12} stored {i.stored_bytes / 1e6:7.1f} MB ({i.stored_bytes / i.logical_bytes:.3f} of raw)")
    quiet = [s for s, b in zip(step_times[1:], busy[1:]) if not b]
    loud = [s for s, b in zip(step_times[1:], busy[1:]) if b]
    if quiet and loud:
        q, lo = statistics.median(quiet), statistics.median(loud)
        print(f"  train step: {q * 1e3:.0f} ms idle, {lo * 1e3:.0f} ms during a background save "
              f"({lo / q:.2f}x, n={len(loud)})")
    print(f"  blocking time per save (median): {statistics.median(blocked[1:]) * 1e3:.1f} ms")
    # restore of an incremental vs torch.load
    inc = [i.step for i in infos if i.kind == "incremental"]
    if inc:
        rt, ri = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            torch.load(tfile, weights_only=True)
            rt.append(time.perf_counter() - t)
            t = time.perf_counter()
            mgr.restore(step=inc[-1])
            ri.append(time.perf_counter() - t)
        print(f"  restore incremental step {inc[-1]}: torch.load {statistics.median(rt):.3f}s trainstore "
              f"{statistics.median(ri):.3f}s ratio {statistics.median(ri) / statistics.median(rt):.2f}x")
    mgr.close()
    compare("(b) GPT model + AdamW state, full saves", state, repeats, os.path.join(root, "cmp"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--gib", type=float, default=None)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir under /tmp)")
    ap.add_argument("--nice", type=int, default=0, help="WriteOptions.nice for the (b) training run")
    ap.add_argument("--only-b", action="store_true", help="skip (a) (e.g. to compare --nice settings)")
    ap.add_argument("--delta-codec", default=None, help="WriteOptions.delta_codec for the (b) training run")
    ap.add_argument("--full-codec", default=None, help="WriteOptions.codec (with raw_above=1.0) for the (b) run")
    ap.add_argument("--incompressible-ratio", type=float, default=None,
                    help="WriteOptions.incompressible_ratio for the (b) run (default: auto; 0.97 = what a "
                         "writer with 4+ CPU threads gets)")
    ap.add_argument("--cold", action="store_true", help="also fresh-process figures (checkpoint_cold.py)")
    ap.add_argument("--cold-only", action="store_true", help="only the fresh-process figures")
    ap.add_argument("--cache", default=",".join(CACHE_STATES),
                    help="page-cache states of the fresh-process restores: evicted, cached (comma separated)")
    ap.add_argument("--size", type=float, default=None, help="alias of --gib (e.g. --size 0.05 for a smoke run)")
    ap.add_argument("--methods", default=",".join(SAVE_METHODS + RESTORE_METHODS),
                    help="fresh-process methods to run (comma separated): " + ", ".join(SAVE_METHODS + RESTORE_METHODS))
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    gib = args.gib or args.size or (0.125 if args.quick else 2.0)
    cache_states = tuple(c for c in args.cache.split(",") if c)
    if set(cache_states) - set(CACHE_STATES):
        raise SystemExit(f"unknown --cache {args.cache!r}: evicted, cached")
    torch.set_num_threads(2)
    root = tempfile.mkdtemp(prefix="ts-ckpt-bench-", dir=args.dir)
    try:
        print(f"trainstore checkpoint benchmark: torch {torch.__version__}, {os.cpu_count()} CPUs, dir {root}, "
              f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        os.makedirs(os.path.join(root, "cmp"), exist_ok=True)
        if args.cold or args.cold_only:
            methods = [m for m in args.methods.split(",") if m]
            unknown = set(methods) - set(SAVE_METHODS + RESTORE_METHODS)
            if unknown:
                raise SystemExit(f"unknown --methods {sorted(unknown)}")
            if not args.only_b:
                torch.manual_seed(0)
                per = int(gib * (1 << 30)) // 4 // 16
                state = {f"t{i}": torch.randn(per) for i in range(16)}
                run_cold(f"(a) {gib:g} GiB float32 in 16 tensors", state, os.path.join(root, "cold-a"), repeats, methods,
                         cache_states)
                del state
                shutil.rmtree(os.path.join(root, "cold-a"), ignore_errors=True)
            run_cold("(b) GPT model + AdamW state (after 10 steps)", trained_gpt_state(args.quick),
                     os.path.join(root, "cold-b"), repeats, methods, cache_states)
            shutil.rmtree(os.path.join(root, "cold-b"), ignore_errors=True)
        if args.cold_only:
            return
        if not args.only_b:
            bench_tensors(gib, repeats, root)
        bench_gpt(args.quick, repeats, root, args.nice, args.delta_codec, args.full_codec, args.incompressible_ratio)
        print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    np.random.seed(0)
    main()
