"""``trainstore ckpt export`` defaults (issue 29 item 5), through the CLI in a subprocess: a
model version exports its weights (optimizer, RNG and other training state only with
``--all``), and the file and its ``.sha256`` get the same file mode."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import torch
from safetensors.torch import load_file

from trainstore import CheckpointManager, open_store
from trainstore.lifecycle.registry import Registry


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainstore", "ckpt", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "100"})


def test_export_is_weights_only_by_default_with_matching_modes(tmp_path):
    root = str(tmp_path / "s")
    state = {"model": {"w": torch.ones(4), "b": torch.zeros(2)}, "optimizer": {"state": {"0": {"exp_avg": torch.ones(4)}}},
             "rng": {"torch": torch.zeros(8, dtype=torch.uint8)}, "step": torch.tensor(3)}
    with CheckpointManager(root, "run") as mgr:
        mgr.save(3, state, blocking=True)
    Registry(open_store(root)).register("run", 3, "llm", aliases=("latest",))
    out = tmp_path / "out" / "m.safetensors"
    proc = cli("export", root, "llm@latest", "--to", str(out))
    assert proc.returncode == 0, proc.stderr
    assert set(load_file(str(out))) == {"model/w", "model/b", "step"}
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (str(out), f"{out}.sha256")}
    assert len(set(modes.values())) == 1, modes
    proc = cli("export", root, "llm@latest", "--to", str(out), "--all")
    assert proc.returncode == 0, proc.stderr
    assert {"optimizer/state/0/exp_avg", "rng/torch"} <= set(load_file(str(out)))
