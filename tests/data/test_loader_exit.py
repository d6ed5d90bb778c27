"""A process whose loaders were left unclosed mid-epoch exits (no fill thread keeps it alive).

Three block-mode loaders share a node cache three shards large; each is abandoned after two
batches. Their fill-ahead workers wait for room that never comes; with non-daemon
(ThreadPoolExecutor) workers the interpreter waited for them forever at exit (seen: the
whole `make test` run hung after its last test)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from harness import child_env

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from trainstore import open_store
    from trainstore.data import Dataset, Loader
    from trainstore.data.serve import write_arrow_dataset
    root = sys.argv[1]
    store = open_store(root + "/durable")
    n = 800
    write_arrow_dataset(store, "feat", {"idx": np.arange(n, dtype=np.int64),
                                        "x": np.ones((n, 256), np.float32)}, 20)
    probe = Dataset(store, "feat@1", cache_dir=root + "/probe").max_shard_bytes
    ds = Dataset(store, "feat@1", cache_dir=root + "/hot", cache_limit=probe * 3)
    its = [iter(Loader(ds, 10, seed=k, shuffle_mode="block", block_shards=2)) for k in range(3)]
    for it in its:
        for _ in range(2):
            next(it)
    print("abandoned", flush=True)
""")


def test_process_exits_with_loaders_left_open_mid_epoch(tmp_path):
    script = tmp_path / "abandon.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=child_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "abandoned" in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
