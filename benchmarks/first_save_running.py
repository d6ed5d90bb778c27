"""A first save in a running process: a new ``CheckpointManager`` each time vs DCP ``async_save``.

Issue 30 item 2 asks for the first save of a job both in a fresh process
(benchmarks/checkpoint_cold.py) and "for a new manager in a running process": a process that
has trained (torch, the state and DCP imported and warm) and now creates a manager and saves
once - e.g. a second job, or an evaluation loop that checkpoints. Each round, in one process,
interleaved: a new ``CheckpointManager`` on a new directory saves the state once (blocking:
``save()`` returned; durable: ``wait()`` returned), and ``dcp.async_save`` saves it to a new
directory (blocking: the call returned; durable: its future done and every file fsynced) -
``checkpoint_cold.save_once``, the fresh-process harness's own two saves.
Neither has staging memory from an earlier save: trainstore's arena is new per manager, DCP
allocates its staging copy per call. Medians over ``--rounds``.

    .venv/bin/python benchmarks/first_save_running.py --state gpt --rounds 5
    .venv/bin/python benchmarks/first_save_running.py --state 1gib --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_cold import flat_tensors, save_once  # noqa: E402
from ready_copies import build  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", choices=("gpt", "1gib"), default="gpt")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    state = build(args.state)
    nbytes = sum(t.nbytes for t in flat_tensors(state).values())
    root = tempfile.mkdtemp(prefix="ts-first-running-")
    runs: dict[str, dict[str, list[float]]] = {m: {"blocking": [], "durable": []} for m in ("trainstore", "dcp_async")}
    try:
        for warm in (True,) + (False,) * args.rounds:  # one untimed round: imports, DCP's first-call setup
            for name in ("trainstore", "dcp_async"):  # the fresh-process harness's two saves
                out = os.path.join(root, name)
                blocking, durable, _ = save_once(name, state, out)
                shutil.rmtree(out, ignore_errors=True)
                if not warm:
                    runs[name]["blocking"].append(blocking)
                    runs[name]["durable"].append(durable)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in runs.items()}
    print(f"state {args.state}: {nbytes / 2**30:.2f} GiB; a new manager / a new async_save per round, medians of "
          f"{args.rounds} interleaved rounds; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for m, r in med.items():
        print(f"  {m:<11} blocking {r['blocking']:.3f} s  durable {r['durable']:.3f} s   "
              f"(blocking: {', '.join(f'{x:.3f}' for x in runs[m]['blocking'])})")
    print(f"  first save blocking, trainstore / DCP async_save: "
          f"{med['trainstore']['blocking'] / med['dcp_async']['blocking']:.2f}x; durable "
          f"{med['trainstore']['durable'] / med['dcp_async']['durable']:.2f}x")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
