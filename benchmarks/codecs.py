"""Codec benchmark: zipnn vs trainstore's shuffle-zstd / bytegroup-zstd / shuffle-lz4 on real
training state.

    .venv/bin/python benchmarks/codecs.py               # GPT + AdamW, 100 steps; 32 MiB per kind
    .venv/bin/python benchmarks/codecs.py --quick       # small model, 20 steps, 8 MiB per kind

Trains the GPT + AdamW of benchmarks/checkpoint.py (same sizes, seed, lr) and takes, at the
middle step and at step 0 (the base full checkpoint of the incrementals between): float32
weights, the same weights as bf16, AdamW's exp_avg and exp_avg_sq, and the XOR deltas of
each against step 0 (what an incremental checkpoint stores). Each kind is cut into 8 MiB
pieces as the checkpoint writer does. Per kind and codec, on one thread: stored/raw ratio,
encode and decode GB/s (median of --reps), and whether the codec releases the GIL: the speed
of a pure-Python loop on the main thread while another thread encodes, relative to alone
(~1.0 on an idle machine: released; ~0.5 or less: held). On a busy machine a GIL-free thread
still takes CPU from the loop, so the run prints two calibration rows: next to BLAKE3 (releases
the GIL) and next to a pure-Python thread (holds it).

zipnn (the ZipNN paper's library, pip ``zipnn``) runs with ``threads=1`` and the dtype of the
data (float32 / bfloat16); XOR deltas are given to it as the same dtype.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import blake3
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from checkpoint import GPT  # noqa: E402

from trainstore import codecs  # noqa: E402

PIECE = 8 << 20
TS_CODECS = ("shuffle-zstd", "bytegroup-zstd", "shuffle-lz4")


def train_states(quick: bool) -> tuple[dict, dict, int]:
    """(state at step 0, state at the middle step, middle step) of the checkpoint.py GPT run."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = dict(vocab=2048, d=128, layers=2, heads=4, ctx=16) if quick else dict(vocab=2048, d=512, layers=8, heads=8, ctx=16)
    model = GPT(**cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, cfg["vocab"], (1024, cfg["ctx"] + 1))
    mid = 10 if quick else 50
    snaps = {}
    for step in range(mid + 1):
        batch = data[torch.randint(0, data.shape[0], (2,))]
        loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, cfg["vocab"]), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step in (0, mid):
            ps = list(model.parameters())
            snaps[step] = {
                "weights": torch.cat([p.detach().reshape(-1) for p in ps]).clone(),
                "exp_avg": torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in ps]).clone(),
                "exp_avg_sq": torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in ps]).clone(),
            }
    return snaps[0], snaps[mid], mid


def _bytes(t: torch.Tensor, limit: int) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()[:limit].copy()


def _xor(a: torch.Tensor, b: torch.Tensor, limit: int) -> np.ndarray:
    return np.bitwise_xor(_bytes(a, limit), _bytes(b, limit))


def kinds(base: dict, now: dict, limit: int) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (bytes, dtype name) for every kind of data measured."""
    wb, w0b = now["weights"].bfloat16(), base["weights"].bfloat16()
    return {
        "weights f32": (_bytes(now["weights"], limit), "float32"),
        "weights bf16": (_bytes(wb, limit), "bfloat16"),
        "exp_avg f32": (_bytes(now["exp_avg"], limit), "float32"),
        "exp_avg_sq f32": (_bytes(now["exp_avg_sq"], limit), "float32"),
        "xor weights f32": (_xor(now["weights"], base["weights"], limit), "float32"),
        "xor weights bf16": (_xor(wb, w0b, limit), "bfloat16"),
        "xor exp_avg f32": (_xor(now["exp_avg"], base["exp_avg"], limit), "float32"),
        "xor exp_avg_sq f32": (_xor(now["exp_avg_sq"], base["exp_avg_sq"], limit), "float32"),
    }


class Codec:
    """encode/decode of one codec on one piece, single-threaded."""

    def __init__(self, name: str, dtype: str):
        self.name, self.itemsize = name, 2 if dtype == "bfloat16" else 4
        self.zipnn = None
        if name == "zipnn":
            from zipnn import ZipNN

            self.zipnn = ZipNN(bytearray_dtype=dtype, threads=1)

    def encode(self, piece: np.ndarray) -> bytes:
        if self.zipnn is not None:
            return self.zipnn.compress(piece.tobytes())
        return codecs.encode(memoryview(piece), self.name, self.itemsize, level=1, threads=1)

    def decode(self, enc: bytes, out: np.ndarray) -> None:
        if self.zipnn is not None:
            out[:] = np.frombuffer(self.zipnn.decompress(enc), dtype=np.uint8)
        else:
            codecs.decode(enc, self.name, out.nbytes, out=memoryview(out), threads=1)


def python_loop_rate(seconds: float) -> float:
    """Iterations per second of a pure-Python loop (needs the GIL)."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n / seconds


def gil_factor(work, seconds: float = 1.0) -> float:
    """Python loop speed while another thread runs ``work()`` over and over, vs alone."""
    alone = python_loop_rate(seconds)
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            work()

    t = threading.Thread(target=hammer)
    t.start()
    time.sleep(0.05)
    try:
        busy = python_loop_rate(seconds)
    finally:
        stop.set()
        t.join()
    return busy / alone


def measure(data: np.ndarray, codec: Codec, reps: int) -> dict:
    pieces = [data[i:i + PIECE] for i in range(0, data.nbytes, PIECE)]
    out = np.empty(PIECE, dtype=np.uint8)
    encs = [codec.encode(p) for p in pieces]  # warm-up (touches scratch buffers) + check
    for p, e in zip(pieces, encs):
        codec.decode(e, out[:p.nbytes])
        assert np.array_equal(out[:p.nbytes], p), f"{codec.name} is not lossless"
    te, td = [], []
    for _ in range(reps):
        t = time.perf_counter()
        for p in pieces:
            codec.encode(p)
        te.append(time.perf_counter() - t)
        t = time.perf_counter()
        for p, e in zip(pieces, encs):
            codec.decode(e, out[:p.nbytes])
        td.append(time.perf_counter() - t)
    stored = sum(len(e) for e in encs)
    return {"ratio": stored / data.nbytes, "enc": data.nbytes / statistics.median(te) / 1e9,
            "dec": data.nbytes / statistics.median(td) / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mib", type=int, default=None, help="MiB measured per kind (default 32; quick 8)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--codecs", default="shuffle-zstd,bytegroup-zstd,shuffle-lz4,zipnn")
    args = ap.parse_args()
    limit = (args.mib or (8 if args.quick else 32)) << 20
    names = args.codecs.split(",")
    print(f"codec benchmark: torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    t = time.perf_counter()
    base, now, mid = train_states(args.quick)
    print(f"trained to step {mid} in {time.perf_counter() - t:.0f} s; {limit >> 20} MiB per kind, "
          f"pieces of {PIECE >> 20} MiB, 1 thread, medians of {args.reps}")
    print(f"\n{'kind':<20}{'codec':<16}{'ratio':>8}{'enc GB/s':>10}{'dec GB/s':>10}{'py loop':>9}")
    # calibration: on a busy machine a GIL-free thread still takes CPU from the loop
    piece = np.random.default_rng(0).integers(0, 255, PIECE, dtype=np.uint8)
    free = gil_factor(lambda: blake3.blake3(piece, max_threads=1).digest())
    held = gil_factor(lambda: sum(range(200_000)))
    print(f"py loop next to BLAKE3 (releases the GIL) {free:.2f}x, next to Python (holds it) {held:.2f}x")
    gil_done: dict[tuple[str, str], float] = {}
    for kind, (data, dtype) in kinds(base, now, limit).items():
        for name in names:
            codec = Codec(name, dtype)
            r = measure(data, codec, args.reps)
            key = (name, dtype)
            if key not in gil_done:  # once per codec and dtype: it does not depend on the values
                gil_done[key] = gil_factor(lambda c=codec, p=data[:PIECE]: c.encode(p))
            print(f"{kind:<20}{name:<16}{r['ratio']:>8.4f}{r['enc']:>10.2f}{r['dec']:>10.2f}"
                  f"{gil_done[key]:>8.2f}x", flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
