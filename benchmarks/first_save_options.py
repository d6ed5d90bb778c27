"""The GPT + AdamW first save in a fresh process under ``WriteOptions`` variants, beside the
floor of time to durable (one plain sequential write + fsync of the same bytes, in its own fresh
process): where the durable time goes (codec CPU, CPU threads, packing of small tensors).

    .venv/bin/python benchmarks/first_save_options.py 5      # rounds (interleaved, rotated)

Each figure is a new process that loads the state, then saves once with ``checkpoint_cold.save_once``
(the fresh-process harness's own saves); medians of the rounds, ratios to the floor's median.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "src")]

import torch  # noqa: E402

VARIANTS = ["floor", "default", "lz4", "raw", "cpu2", "raw_cpu2", "nopack"]


def child(variant, src, out):
    from checkpoint_cold import save_once

    from trainstore.checkpoint.save.writer import WriteOptions
    state = torch.load(src, weights_only=True)
    if variant == "floor":
        b, d, _ = save_once("plain_write", state, out)
    else:
        opts = {"default": {}, "lz4": {"raw_above": 0.9}, "raw": {"codec": "raw"}, "cpu2": {"cpu_threads": 2},
                "raw_cpu2": {"codec": "raw", "cpu_threads": 2}, "nopack": {"pack_below": 0}}[variant]
        b, d, _ = save_once("trainstore", state, out, WriteOptions(**opts))
    return {"blocking": b, "durable": d}


def main():
    if sys.argv[1:2] == ["child"]:
        print(json.dumps(child(sys.argv[2], sys.argv[3], sys.argv[4])))
        return
    from checkpoint import trained_gpt_state
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    root = tempfile.mkdtemp(prefix="ts-first-save-options-", dir=os.environ.get("BENCH_DIR", os.path.join(HERE, "..")))
    src = os.path.join(root, "state.pt")
    torch.save(trained_gpt_state(False), src)
    res = {v: [] for v in VARIANTS}
    try:
        for r in range(rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for v in order:
                out = os.path.join(root, f"out-{v}-{r}")
                p = subprocess.run([sys.executable, __file__, "child", v, src, out], capture_output=True, text=True)
                if p.returncode:
                    sys.exit(p.stderr[-2000:])
                res[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
                if os.path.isdir(out):
                    shutil.rmtree(out, ignore_errors=True)
                else:
                    os.unlink(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    fl = statistics.median(x["durable"] for x in res["floor"])
    print(f"GPT+AdamW first save, fresh process, medians of {rounds}; load {os.getloadavg()[0]:.1f}")
    for v in VARIANTS:
        d = statistics.median(x["durable"] for x in res[v])
        b = statistics.median(x["blocking"] for x in res[v])
        print(f"  {v:9} blocking {b:.3f} s  durable {d:.3f} s  ({d/fl:.2f}x floor)  raw: {[round(x['durable'],3) for x in res[v]]}")


if __name__ == "__main__":
    main()
