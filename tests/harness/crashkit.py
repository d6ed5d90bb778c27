"""Child processes for crash tests: they work until the test SIGKILLs them.

Each child prints ``READY`` once its imports are done and one ``ACK <what>`` line (flushed)
after every operation trainstore reported durable, so the parent knows exactly what was
acknowledged before the kill. Run as::

    python -m harness.crashkit ckpt STORE_URL JOB START [--no-torch]
    python -m harness.crashkit ingest STORE_URL DATASET WAL_DIR START
    python -m harness.crashkit registry STORE_URL JOB MODEL STEPS

``--no-torch`` hides torch from the child (numpy-only states) so that each of hundreds of
trials starts in about a second instead of four; the checkpoint code path is the same.
"""

from __future__ import annotations

import sys

# Deterministic checkpoint states -----------------------------------------------------------
N_TENSORS = 3
NUMEL = 200_000  # 0.8 MB of float32 per tensor: several chunks at CHUNK_BYTES
CHUNK_BYTES = 256 << 10


def ckpt_state(step: int) -> dict:
    """The state saved at ``step``: a fixed base plus a step-dependent region, so
    incrementals store real XOR deltas, and plain values that change every step."""
    import numpy as np

    base = np.random.default_rng(0)
    state: dict = {"step": step, "tag": f"step-{step}", "nested": {"loss": 1.0 / (step + 1), "hist": [step] * 3}}
    for i in range(N_TENSORS):
        a = base.standard_normal(NUMEL, dtype=np.float32)
        rng = np.random.default_rng(1000 * step + i)
        lo = int(rng.integers(0, NUMEL - 5000))
        a[lo:lo + 5000] = rng.standard_normal(5000, dtype=np.float32)
        state[f"t{i}"] = a
    state["counter"] = np.array([step], dtype=np.int64)
    return state


def states_equal(a: object, b: object) -> bool:
    import numpy as np

    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return type(a) is type(b) and a == b


def ckpt_policy():  # noqa: ANN201 - lazy import
    from trainstore.checkpoint import CheckpointPolicy

    return CheckpointPolicy(full_every=4, incremental_every=1)


def ckpt_options():  # noqa: ANN201
    from trainstore.checkpoint.save.writer import WriteOptions

    return WriteOptions(chunk_bytes=CHUNK_BYTES, workers=2)


def _ckpt_child(url: str, job: str, start: int, store_options: dict) -> None:
    from trainstore.checkpoint import CheckpointManager

    mgr = CheckpointManager(url, job, ckpt_policy(), options=ckpt_options(), store_options=store_options)
    print("READY", flush=True)
    step = start
    while True:
        mgr.save(step, ckpt_state(step), blocking=True)
        print(f"ACK {step}", flush=True)
        step += 1


# Ingestion ---------------------------------------------------------------------------------
def _ingest_child(url: str, dataset: str, wal_dir: str, start: int, store_options: dict) -> None:
    import random

    from trainstore.data.ingest import IngestConfig, Ingestor

    rng = random.Random(start)
    config = IngestConfig(wal_dir=wal_dir, shard_bytes=16 << 10, max_buffered_bytes=64 << 10, upload_workers=2)
    ing = Ingestor(url, dataset, config=config, **store_options)
    print("READY", flush=True)
    i = start
    while True:
        n = rng.randint(1, 200)
        ing.write([{"id": j, "payload": "p" * rng.randint(0, 64)} for j in range(i, i + n)])
        print(f"ACK {i} {i + n - 1}", flush=True)
        i += n
        if rng.random() < 0.25:
            print(f"COMMIT {ing.commit().version}", flush=True)


# Registry ----------------------------------------------------------------------------------
def _registry_child(url: str, job: str, model: str, steps: int) -> None:
    from trainstore.lifecycle.registry import Registry

    reg = Registry(url)
    print("READY", flush=True)
    i = 0
    while True:
        mv = reg.register(job, i % steps, model, aliases=("latest",))
        reg.promote(model, mv.version)
        print(f"ACK {mv.version}", flush=True)
        i += 1


def main(argv: list[str]) -> None:
    import json
    import os

    if "--no-torch" in argv:
        argv = [a for a in argv if a != "--no-torch"]
        sys.modules["torch"] = None  # type: ignore[assignment]
    opts = json.loads(os.environ.get("TRAINSTORE_CRASHKIT_STORE_OPTIONS", "{}"))
    kind = argv[0]
    if kind == "ckpt":
        _ckpt_child(argv[1], argv[2], int(argv[3]), opts)
    elif kind == "ingest":
        _ingest_child(argv[1], argv[2], argv[3], int(argv[4]), opts)
    elif kind == "registry":
        _registry_child(argv[1], argv[2], argv[3], int(argv[4]))
    else:
        raise SystemExit(f"unknown child kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
