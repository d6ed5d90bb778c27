"""What restore-ready copies cost a save: incremental saves with ``ready_copies`` on and off.

Two managers in one process, each on its own local directory, save the same state: a full
checkpoint at step 0, then incrementals of a state moved a little every step (every float
scaled by 1 + 1e-4: XOR deltas everywhere, as AdamW makes them). Their incrementals alternate
(on, off, on, off, ...); for each: seconds blocked in ``save()``, seconds until ``wait()``
returned (committed, copies written), bytes written for the checkpoint and for the copies
(the ``ready_copies_written`` event) and the local directory's size after the last save; and
when the manifest was committed (the ``save_committed`` event: the checkpoint is durable then,
the copies are written after it).
Medians over ``--repeats`` saves of each.

    .venv/bin/python benchmarks/ready_copies.py --state gpt --repeats 5
    .venv/bin/python benchmarks/ready_copies.py --state 1gib --repeats 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint import dir_bytes, trained_gpt_state  # noqa: E402
from checkpoint_cold import stepped  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402


def build(kind: str) -> dict:
    if kind == "gpt":
        return trained_gpt_state(quick=False)
    per = (1 << 30) // 4 // 16
    return {f"t{i}": torch.randn(per) for i in range(16)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", choices=("gpt", "1gib"), default="gpt")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    state = build(args.state)
    root = tempfile.mkdtemp(prefix="ts-ready-bench-")
    try:
        mgrs, events = {}, {}
        for name, copies in (("on", True), ("off", False)):
            mgr = CheckpointManager(os.path.join(root, name), job="r",
                                    policy=CheckpointPolicy(full_every=10**9, incremental_every=1, ready_copies=copies))
            seen: list[dict] = []
            mgr.observers.append(lambda event, fields, seen=seen: seen.append(
                {**fields, "at": time.perf_counter()}) if event in ("ready_copies_written", "save_committed") else None)
            mgrs[name], events[name] = mgr, seen
            mgr.save(0, state, blocking=True, kind="full")
        for seen in events.values():
            seen.clear()
        runs: dict[str, dict[str, list[float]]] = {n: {"blocked": [], "committed": [], "durable": [], "written": []}
                                                   for n in mgrs}
        for step in range(1, args.repeats + 1):
            state = stepped(state)
            for name, mgr in mgrs.items():
                t = time.perf_counter()
                handle = mgr.save(step, state, kind="incremental")
                blocked = time.perf_counter() - t
                mgr.wait()
                runs[name]["blocked"].append(blocked)
                runs[name]["durable"].append(time.perf_counter() - t)
                runs[name]["committed"].append(next(e["at"] for e in reversed(events[name]) if "kind" in e) - t)
                runs[name]["written"].append(mgr.list()[-1].written_bytes)
                del handle
        logical = sum(t.nbytes for t in _tensors(state))
        print(f"state {args.state}: {logical / 2**30:.2f} GiB; incremental saves, medians of {args.repeats} "
              f"interleaved; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        for name, r in runs.items():
            copy = [e["bytes"] for e in events[name] if "bytes" in e]
            copy_s = [e["seconds"] for e in events[name] if "bytes" in e]
            print(f"  ready_copies={name:<3}  blocked {statistics.median(r['blocked']):.3f} s  "
                  f"committed {statistics.median(r['committed']):.3f} s  until wait() {statistics.median(r['durable']):.3f} s  "
                  f"checkpoint written {statistics.median(r['written']) / 1e6:.1f} MB  "
                  f"copies {statistics.median(copy) / 1e6 if copy else 0:.1f} MB in "
                  f"{statistics.median(copy_s) if copy_s else 0:.3f} s  "
                  f"dir {dir_bytes(os.path.join(root, name)) / 1e6:.1f} MB")
        on, off = (statistics.median(runs[n]["durable"]) for n in ("on", "off"))
        print(f"  until wait(), on / off: {on / off:.2f}x")
        for mgr in mgrs.values():
            mgr.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _tensors(state):
    if isinstance(state, dict):
        for v in state.values():
            yield from _tensors(v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            yield from _tensors(v)
    elif isinstance(state, torch.Tensor):
        yield state


if __name__ == "__main__":
    main()
