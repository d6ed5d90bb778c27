"""A saving process for the GC stress test: saves recurring states, applies retention."""

import sys

import numpy as np

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.lifecycle.retention import RetentionPolicy, retention_hook

root, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
seed = int.from_bytes(job.encode(), "little") % (1 << 32)  # as job_pool in test_gc.py
POOL = [np.random.default_rng([seed, i]).standard_normal(16384).astype(np.float32) for i in range(5)]
opts = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)
with CheckpointManager(root, job, CheckpointPolicy(full_every=2, incremental_every=1), options=opts,
                       hooks=[retention_hook(RetentionPolicy(keep_last=2))]) as mgr:
    for step in range(n):
        state = {"a": POOL[step % 5], "step": step}  # as recurring_state in test_gc.py
        mgr.save(step, state, blocking=True)
        print(step, flush=True)
