"""Time until durable of a full save and the incrementals after it, in one fresh process.

GPT-2 from a config (6 layers, 384 wide, vocab 50257: 440 MB of model + AdamW state, the tied
embeddings stored twice), one AdamW step between saves, a full save then 4 incrementals; each
save timed until ``SaveHandle.wait()`` returns (the manifest is committed), then ``mgr.wait()``
so the next save starts alone. Prints one JSON line: full and incremental durable seconds and
the stored bytes per checkpoint. Run it several times, interleaved with the tree to compare
first on ``PYTHONPATH`` (docs/benchmarks.md, "Issue 30: time to durable")::

    .venv/bin/python benchmarks/incremental_durable.py [--incompressible-ratio 0.97] [--raw]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.save.writer import WriteOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", action="store_true", help="codec and delta_codec raw")
    ap.add_argument("--incompressible-ratio", type=float, default=None, help="WriteOptions.incompressible_ratio")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir under /tmp)")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(n_embd=384, n_layer=6, n_head=6))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 50257, (2, 64))

    def step() -> None:
        model(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()

    step()
    kw: dict = {"incompressible_ratio": a.incompressible_ratio}
    if a.raw:
        kw.update(codec="raw", delta_codec="raw")
    root = tempfile.mkdtemp(dir=a.dir)
    durable, stored = [], []
    with CheckpointManager(root, job="j", policy=CheckpointPolicy(full_every=100, incremental_every=1),
                           options=WriteOptions(**kw)) as mgr:
        for s in range(1, 6):
            step()
            t = time.perf_counter()
            mgr.save(s, {"model": model.state_dict(), "optim": opt.state_dict()}).wait()
            durable.append(time.perf_counter() - t)
            mgr.wait()
            stored.append(mgr.manifest(s).stored_bytes)
    print(json.dumps({"full": round(durable[0], 3), "incr_median": round(statistics.median(durable[1:]), 3),
                      "incr": [round(v, 3) for v in durable[1:]], "stored": stored}))


if __name__ == "__main__":
    main()
