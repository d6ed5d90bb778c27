"""GPU checkpoint and loader benchmark (issue 30 item 4): run by benchmarks/gpu.sh on a GPU machine.

    python3 benchmarks/gpu_bench.py --gib 4 --out gpu_bench.json --budget 240

Side by side in one run, on CUDA state:
- limits: device-to-host and host-to-device GB/s of one plain copy of the same bytes into
  pinned memory (``cudaMemcpy`` through torch; cudaHostAlloc'd and cudaHostRegister'd, as
  trainstore's arena is), and into pageable memory; the time to pin (register) that many bytes.
- (a) a ``--gib`` GiB bf16 state in 16 tensors: trainstore ``CheckpointManager.save`` vs DCP
  ``async_save`` (default stager: pageable, a fresh copy per save; pinned ``DefaultStager``
  reused, synchronous staging; pinned with async staging) vs ``torch.save`` + fsync. Per save:
  ``blocked_s`` (the host held by the call), ``released_s`` (until the training stream may run
  a kernel that modifies the state: an event recorded on it after the call completes), and
  ``durable_s``; the first save of each and the median of the steady ones. D2H GB/s =
  bytes / released_s against the plain pinned copy. Then restore into the GPU (in place for
  trainstore and DCP, ``torch.load(map_location="cuda")``), files cached and evicted
  (``posix_fadvise(DONTNEED)``).
- (b) a small GPT + AdamW training on the GPU: step time while each method's save runs in
  the background vs without one, and each save's blocking / durable time.
- (c) the loader: an epoch of batches to the GPU, ``Loader(device="cuda")`` (pinned,
  non_blocking on a side stream) vs host batches + ``.to("cuda")``.

Phases run in that order and are skipped (said so in the JSON) once ``--budget`` seconds are
spent; the JSON is rewritten after each phase, so a run cut short still reports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch
from pagecache import evict, files_under  # benchmarks/ (this script's folder)

from trainstore import open_store
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset
from trainstore.hostmem import HostBuffer
from trainstore.store.local import LocalStore

GiB = 1 << 30
#: "cuda" on a GPU machine; "cpu" only for a smoke run of the script's plumbing (--gib 0.05)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def log(*a: Any) -> None:
    print(*a, flush=True)


def tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in tensors(v)]
    return []


def state_bytes(state: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(state))


def perturb(state: Any) -> None:
    """Change one element per 4 KiB of every floating tensor (no method can dedup a repeat)."""
    with torch.no_grad():
        for t in tensors(state):
            if t.is_floating_point() and t.numel():
                t.view(-1)[:: max(1, 4096 // t.element_size())] += 1
    sync()


def stream_free(t0: float) -> float:
    """Seconds from t0 until the current stream runs a kernel enqueued now."""
    if DEV != "cuda":
        return time.perf_counter() - t0
    ev = torch.cuda.Event()
    ev.record()
    ev.synchronize()
    return time.perf_counter() - t0


def fsync_tree(path: str) -> None:
    for p in files_under(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def best_of(fn: Any, n: int = 3) -> float:
    out = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return min(out)


# -- limits -----------------------------------------------------------------------------------

def copy_limits(nbytes: int) -> dict:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(7)
    t = time.perf_counter()
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    alloc_pinned_s = time.perf_counter() - t
    t = time.perf_counter()
    registered = HostBuffer(nbytes, huge_pages=False, pin=True)
    register_s = time.perf_counter() - t
    reg_t = registered.tensor()
    reg_t.fill_(0)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pageable.fill_(0)
    res = {"bytes": nbytes, "cudaHostAlloc_s": alloc_pinned_s, "cudaHostRegister_s": register_s,
           "registered": registered.pinned}
    for name, dst in (("d2h_pinned", pinned), ("d2h_registered", reg_t)):
        res[name + "_GBps"] = nbytes / best_of(lambda d=dst: d.copy_(src, non_blocking=True)) / 1e9
    res["d2h_pageable_GBps"] = nbytes / best_of(lambda: pageable.copy_(src), 1) / 1e9
    res["h2d_pinned_GBps"] = nbytes / best_of(lambda: src.copy_(pinned, non_blocking=True)) / 1e9
    res["h2d_pageable_GBps"] = nbytes / best_of(lambda: src.copy_(pageable), 1) / 1e9
    registered.close()  # the rest goes on return (the caller empties torch's cache)
    return res


# -- savers -----------------------------------------------------------------------------------

class Trainstore:
    """Variants that say where time to durable goes: ``wide``: 32 write workers, every core,
    1 GiB in flight instead of the defaults (8 workers, half the cores, 256 MiB): CPU- or
    I/O-bound?; ``raw``: no compression (only hashing); ``bytegroup``: full pieces with the
    delta codec (bf16 randn: 0.66 of raw, where the default shuffle-lz4 keeps 0.885 - just
    under 0.9); ``lz4``: shuffle-lz4 wherever it saves 10% (``raw_above=0.9``, the default
    before it became CPU-aware: on a machine with 8+ cores the default is this);
    ``buffered``: page-cache writes instead of ``O_DIRECT``
    (``LocalStore(direct_io=False)``)."""

    def __init__(self, root: str, state: Any, variant: str = "") -> None:
        self.name = f"trainstore_{variant}" if variant else "trainstore"
        self.state = state
        self.root = os.path.join(root, self.name)
        opts = {"wide": WriteOptions(workers=32, cpu_threads=os.cpu_count(), max_inflight_bytes=GiB),
                "raw": WriteOptions(codec="raw"), "lz4": WriteOptions(raw_above=0.9), "bytegroup": WriteOptions(codec="bytegroup-zstd")}.get(variant)
        store: Any = LocalStore(self.root, direct_io=False) if variant == "buffered" else self.root
        self.mgr = CheckpointManager(store, job="gpu", options=opts,
                                     policy=CheckpointPolicy(full_every=1, incremental_every=None))
        self.step = 0
        self.pending: Any = None

    def start(self) -> tuple[float, Any]:
        self.step += 1
        t0 = time.perf_counter()
        self.pending = self.mgr.save(self.step, self.state)
        return t0, self.pending

    def released(self) -> None:
        pass

    def durable(self, handle: Any) -> None:
        handle.wait()

    def done(self, handle: Any) -> bool:
        return handle.done()

    def restore(self, into: Any) -> Any:
        return self.mgr.restore_into(into, step=self.step).state

    def close(self) -> None:
        self.mgr.close()


class Dcp:
    """DCP async_save; ``mode``: default (its own stager: pageable copies), pinned (a reused
    pinned DefaultStager, synchronous staging), pinned_async (async staging on its thread)."""

    def __init__(self, root: str, state: Any, mode: str) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.name = f"dcp_{mode}"
        self.state = state
        self.root = os.path.join(root, self.name)
        os.makedirs(self.root, exist_ok=True)
        self.stager = None
        self.new_stager = None
        if mode != "default":
            self.new_stager = lambda: DefaultStager(StagingOptions(
                use_pinned_memory=True, use_shared_memory=False, use_async_staging=mode == "pinned_async",
                use_non_blocking_copy=True))
            self.stager = self.new_stager()
        self.fresh_per_save: str | None = None  # set when a reused stager failed (then: a new one per save)
        self.step = 0
        self.staging: Any = None

    def path(self, step: int) -> str:
        return os.path.join(self.root, str(step))

    def start(self) -> tuple[float, Any]:
        import torch.distributed.checkpoint as dcp

        self.step += 1
        shutil.rmtree(self.path(self.step - 2), ignore_errors=True)  # keep the last one for restore
        if self.fresh_per_save:
            self.stager.close()
            self.stager = self.new_stager()
        t0 = time.perf_counter()
        try:
            r = dcp.async_save(self.state, checkpoint_id=self.path(self.step), async_stager=self.stager, no_dist=True)
        except Exception as exc:  # noqa: BLE001 - torch 2.11: a reused DefaultStager failed (KeyError: type)
            if self.stager is None or self.fresh_per_save:
                raise
            self.fresh_per_save = f"the reused stager failed ({type(exc).__name__}: {exc}); a new stager per save"
            log(f"  {self.name}: {self.fresh_per_save}")
            shutil.rmtree(self.path(self.step), ignore_errors=True)
            self.stager.close()
            self.stager = self.new_stager()
            t0 = time.perf_counter()
            r = dcp.async_save(self.state, checkpoint_id=self.path(self.step), async_stager=self.stager, no_dist=True)
        if hasattr(r, "upload_completion"):
            self.staging, fut = r.staging_completion, r.upload_completion
        else:
            self.staging, fut = None, r
        return t0, fut

    def released(self) -> None:
        if self.staging is not None:  # DCP's contract: do not modify the state before staging completes
            self.staging.result()

    def durable(self, fut: Any) -> None:
        fut.result()
        fsync_tree(self.path(self.step))

    def done(self, fut: Any) -> bool:
        return fut.done()

    def restore(self, into: Any) -> Any:
        import torch.distributed.checkpoint as dcp

        dcp.load(into, checkpoint_id=self.path(self.step), no_dist=True)
        return into

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()


class TorchSave:
    name = "torch_save"

    def __init__(self, root: str, state: Any) -> None:
        self.state = state
        self.root = os.path.join(root, "torch")
        os.makedirs(self.root, exist_ok=True)
        self.file = os.path.join(self.root, "state.pt")

    def start(self) -> tuple[float, Any]:
        t0 = time.perf_counter()
        with open(self.file, "wb") as f:
            torch.save(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        return t0, None

    def released(self) -> None:
        pass

    def durable(self, _: Any) -> None:
        pass

    def done(self, _: Any) -> bool:
        return True

    def restore(self, into: Any) -> Any:
        return torch.load(self.file, map_location=DEV, weights_only=True)

    def close(self) -> None:
        pass


def make_savers(root: str, state: Any, names: list[str]) -> list[Any]:
    made = {"trainstore": lambda: Trainstore(root, state), "trainstore_wide": lambda: Trainstore(root, state, "wide"),
            "trainstore_raw": lambda: Trainstore(root, state, "raw"),
            "trainstore_lz4": lambda: Trainstore(root, state, "lz4"),
            "trainstore_bytegroup": lambda: Trainstore(root, state, "bytegroup"),
            "trainstore_buffered": lambda: Trainstore(root, state, "buffered"),
            "dcp_default": lambda: Dcp(root, state, "default"),
            "dcp_pinned": lambda: Dcp(root, state, "pinned"), "dcp_pinned_async": lambda: Dcp(root, state, "pinned_async"),
            "torch_save": lambda: TorchSave(root, state)}
    return [made[n]() for n in names]


def timed_save(s: Any, nbytes: int) -> dict:
    perturb(s.state)
    t0, h = s.start()
    blocked = time.perf_counter() - t0
    s.released()
    released = stream_free(t0)
    s.durable(h)
    durable = time.perf_counter() - t0
    return {"blocked_s": blocked, "released_s": released, "durable_s": durable,
            "d2h_GBps": nbytes / released / 1e9}


# -- (a) a large state --------------------------------------------------------------------------

def big_state(gib: float, n: int = 16) -> dict:
    per = int(gib * GiB) // 2 // n
    g = torch.Generator(device=DEV).manual_seed(0)
    return {"model": {f"w{i}": torch.randn(per, device=DEV, generator=g, dtype=torch.bfloat16) for i in range(n)},
            "step": 1}


def bench_saves(state: Any, savers: list[Any], steady: int, deadline: float) -> dict:
    nbytes = state_bytes(state)
    out: dict[str, Any] = {s.name: {"first": None, "steady": []} for s in savers}
    for s in savers:
        out[s.name]["first"] = timed_save(s, nbytes)
        log(f"  {s.name:<18} first  {fmt(out[s.name]['first'])}")
    for r in range(steady):
        if time.perf_counter() > deadline:
            out["cut_short"] = f"after {r} steady rounds (budget)"
            break
        for s in savers:
            out[s.name]["steady"].append(timed_save(s, nbytes))
            log(f"  {s.name:<18} steady {fmt(out[s.name]['steady'][-1])}")
    for s in savers:
        if getattr(s, "fresh_per_save", None):
            out[s.name]["note"] = s.fresh_per_save
        st = out[s.name]["steady"]
        if st:
            out[s.name]["steady_median"] = {k: statistics.median(x[k] for x in st) for k in st[0]}
    return out


def bench_restores(state: Any, savers: list[Any], deadline: float) -> dict:
    into = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "step": 0}
    out: dict[str, Any] = {}
    for cache in ("cached", "evicted"):
        for s in savers:
            if time.perf_counter() > deadline:
                out["cut_short"] = "budget"
                return out
            if cache == "evicted":
                evict(files_under(s.root))
            sync()
            t = time.perf_counter()
            got = s.restore(into)
            sync()
            out.setdefault(s.name, {})[cache + "_s"] = time.perf_counter() - t
            del got
            log(f"  restore {cache:<8} {s.name:<18} {out[s.name][cache + '_s']:.3f} s")
    return out


def fmt(d: dict) -> str:
    return (f"blocked {d['blocked_s']:.3f} s  released {d['released_s']:.3f} s  durable {d['durable_s']:.3f} s  "
            f"D2H {d['d2h_GBps']:.1f} GB/s")


# -- (b) a small GPT training on the GPU ------------------------------------------------------------

class GPT(torch.nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(ctx, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.head(self.ln(self.blocks(h, mask=mask, is_causal=True)))


def bench_gpt(root: str, names: list[str], deadline: float) -> dict:
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = (dict(vocab=32000, d=768, layers=12, heads=12, ctx=256) if DEV == "cuda"
           else dict(vocab=512, d=64, layers=2, heads=2, ctx=16))
    model = GPT(**cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, cfg["vocab"], (16, cfg["ctx"] + 1), device=DEV)

    def step() -> float:
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(data[:, :-1]).reshape(-1, cfg["vocab"]), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stream_free(t)
        return time.perf_counter() - t

    for _ in range(5):
        step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    nbytes = state_bytes(state)
    base = statistics.median(step() for _ in range(15))
    out: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()), "state_bytes": nbytes,
                           "step_ms": base * 1e3, "methods": {}}
    log(f"  GPT {out['params'] / 1e6:.0f}M params, state {nbytes / GiB:.2f} GiB, step {base * 1e3:.1f} ms")
    for s in make_savers(os.path.join(root, "gpt"), state, names):
        res = []
        for _ in range(2):
            if time.perf_counter() > deadline:
                out["cut_short"] = "budget"
                break
            t0, h = s.start()
            blocked = time.perf_counter() - t0
            s.released()
            steps = []
            while not s.done(h) and len(steps) < 200:
                steps.append(step())
            s.durable(h)
            durable = time.perf_counter() - t0
            res.append({"blocked_s": blocked, "durable_s": durable, "steps_during": len(steps),
                        "first_step_ms": steps[0] * 1e3 if steps else None,
                        "step_ms_during": statistics.mean(steps) * 1e3 if steps else None})
            log(f"  GPT {s.name:<18} blocked {blocked:.3f} s durable {durable:.3f} s, {len(steps)} steps during, "
                f"mean {res[-1]['step_ms_during'] or 0:.1f} ms (first {res[-1]['first_step_ms'] or 0:.1f})")
        out["methods"][s.name] = res
        s.close()
    return out


# -- (c) the loader to the GPU --------------------------------------------------------------------

def bench_loader(root: str) -> dict:
    store = open_store(os.path.join(root, "ds"))
    rows, width = (16384, 4096) if DEV == "cuda" else (1024, 256)  # 256 MiB of float32, batches of 4 MiB
    x = np.random.default_rng(0).standard_normal((rows, width), dtype=np.float32)
    write_arrow_dataset(store, "feat", {"x": x}, 512)
    del x
    ds = Dataset(store, "feat@1", cache_dir=os.path.join(root, "hot"))
    out = {}
    variants = [("host_then_to_device", {"as_torch": True})] + ([("device_cuda", {"device": "cuda"})] if DEV == "cuda" else [])
    for name, kw in variants:
        loader = Loader(ds, 256, seed=1, **kw)
        times = []
        for _ in range(2):  # the second epoch is measured (the hot tier is warm)
            t = time.perf_counter()
            acc = torch.zeros((), device=DEV)
            n = 0
            for b in loader:
                xb = b["x"] if b["x"].device.type == DEV else b["x"].to(DEV)
                acc += xb.float().mean()
                n += 1
            sync()
            times.append(time.perf_counter() - t)
        loader.close()
        out[name] = {"epoch_s": times[-1], "batches": n, "GBps": rows * width * 4 / times[-1] / 1e9}
        log(f"  loader {name:<18} epoch {times[-1]:.3f} s  {out[name]['GBps']:.2f} GB/s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--steady", type=int, default=1, help="steady-state saves per method after the first")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; later phases are skipped past it")
    ap.add_argument("--methods", default="trainstore,trainstore_raw,trainstore_bytegroup,dcp_pinned,torch_save",
                    help="also: trainstore_wide, trainstore_buffered, dcp_default, dcp_pinned_async")
    ap.add_argument("--gpt-methods", default="trainstore,dcp_pinned,torch_save")
    ap.add_argument("--out", default="gpu_bench.json")
    ap.add_argument("--root", default=None, help="where checkpoints are written (default: a temp dir)")
    args = ap.parse_args()
    start = time.perf_counter()
    deadline = start + args.budget
    names = args.methods.split(",")
    root = tempfile.mkdtemp(prefix="ts-gpu-", dir=args.root)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke run)", "torch": torch.__version__,
                           "cpus": os.cpu_count(), "gib": args.gib, "root": root,
                           "disk_free_gib": shutil.disk_usage(root).free / GiB, "phases": {}}

    def dump() -> None:
        res["elapsed_s"] = time.perf_counter() - start
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    try:
        log(f"{res['device']}, torch {res['torch']}, {res['cpus']} CPUs, {res['disk_free_gib']:.0f} GiB free in {root}")
        state = big_state(args.gib)
        nbytes = state_bytes(state)
        res["limits"] = copy_limits(nbytes) if DEV == "cuda" else {}
        if DEV == "cuda":
            torch.cuda.empty_cache()
        log("limits:", {k: round(v, 3) if isinstance(v, float) else v for k, v in res["limits"].items()})
        dump()
        savers = make_savers(root, state, names)
        log(f"(a) {nbytes / GiB:.2f} GiB bf16 state in 16 tensors")
        res["phases"]["saves"] = bench_saves(state, savers, args.steady, deadline - 90)
        dump()
        res["phases"]["restores"] = bench_restores(state, savers, deadline - 60)
        for s in savers:
            s.close()
        del savers, state
        if DEV == "cuda":
            torch.cuda.empty_cache()
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        dump()
        if time.perf_counter() < deadline - 45:
            log("(b) GPT + AdamW on the GPU")
            res["phases"]["gpt"] = bench_gpt(root, args.gpt_methods.split(","), deadline - 20)
            if DEV == "cuda":
                torch.cuda.empty_cache()
        else:
            res["phases"]["gpt"] = "skipped (budget)"
        dump()
        if time.perf_counter() < deadline - 15:
            log("(c) loader to the GPU")
            res["phases"]["loader"] = bench_loader(root)
        else:
            res["phases"]["loader"] = "skipped (budget)"
    finally:
        dump()
        shutil.rmtree(root, ignore_errors=True)
    log(f"done in {res['elapsed_s']:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
