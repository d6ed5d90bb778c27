"""How fast an XOR delta of a training state decodes, per codec, and the byte-plane interleave.

The newest checkpoint of a job is usually incremental: its restore decodes an XOR delta on top
of the base (benchmarks/restore_profile.py --gpt shows the split). This measures, on one core,
the delta of the GPT + AdamW state of benchmarks/checkpoint.py (b) against itself scaled by
(1 + 1e-4) (the first ``--mb`` MiB): stored fraction and decode GB/s of trainstore's
``bytegroup-zstd`` container against plain zstd frames (levels 1 and -1), and the interleave of
four byte planes back into float32 values by numpy strided copies, torch strided copies and
``torch.stack(out=)``. Best of 5 repeats each.

    .venv/bin/python benchmarks/delta_decode.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import zstandard as zstd
from checkpoint import trained_gpt_state  # benchmarks/, the script's folder
from checkpoint_cold import flat_tensors, stepped

from trainstore import codecs_bytegroup


def best_gbps(fn, nbytes: int, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return nbytes / min(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    state = trained_gpt_state(False)
    a, b = flat_tensors(state), flat_tensors(stepped(state))
    delta = np.concatenate([(a[k].reshape(-1).view(torch.int32).numpy() ^ b[k].reshape(-1).view(torch.int32).numpy())
                            for k in a if a[k].dtype == torch.float32]).view(np.uint8)[:args.mb << 20]
    n = delta.nbytes
    print(f"XOR delta of the GPT + AdamW state, first {n / 2**20:.0f} MiB; zero bytes {np.mean(delta == 0):.0%}; "
          "one core, best of 5")
    out = np.empty_like(delta)
    raw = delta.tobytes()
    codecs = [
        ("bytegroup-zstd (trainstore)", lambda: codecs_bytegroup.encode(memoryview(delta), 4, 1),
         lambda s: codecs_bytegroup.decode(s, n, "delta", memoryview(out))),
        ("zstd level 1", lambda: zstd.ZstdCompressor(level=1).compress(raw), zstd.ZstdDecompressor().decompress),
        ("zstd level -1", lambda: zstd.ZstdCompressor(level=-1).compress(raw), zstd.ZstdDecompressor().decompress),
    ]
    for name, enc, dec in codecs:
        stored = enc()
        print(f"  {name:<30} stored {len(stored) / n:.2f}x  decode {best_gbps(lambda d=dec, s=stored: d(s), n):.2f} GB/s")
    planes = [delta.reshape(-1, 4)[:, k].copy() for k in range(4)]
    tp, to = [torch.from_numpy(p) for p in planes], torch.from_numpy(out)

    def numpy_strided() -> None:
        by = out.reshape(-1, 4)
        for k in range(4):
            by[:, k] = planes[k]

    def torch_strided() -> None:
        v = to.view(-1, 4)
        for k in range(4):
            v[:, k].copy_(tp[k])

    def torch_stack() -> None:
        torch.stack(tp, dim=1, out=to.view(-1, 4))

    for name, fn in (("numpy strided copies", numpy_strided), ("torch strided copy_", torch_strided),
                     ("torch.stack(out=)", torch_stack)):
        print(f"  interleave, {name:<22} {best_gbps(fn, n):.2f} GB/s")


if __name__ == "__main__":
    main()
