"""One failing rank in a multi-process Hugging Face run (real gloo ranks).

* SIGKILL of one rank (not all) while its background save of step 8 is writing chunks, under
  ``torchrun``: the job dies as torchrun makes it (the agent stops the other rank); the
  restarted job restores step 4, the newest checkpoint every rank committed, and it verifies;
  step 8 was never committed, so it is never chosen. A longer loop over kill points is
  ``stress``.
* A rank whose save fails before the collective (a bad state) leaves the other rank waiting:
  that wait is bounded by the checkpoint process group's timeout (``TRAINSTORE_CKPT_TIMEOUT_S``)
  and the error names it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require  # tests/conftest.py: optional dependencies

require("transformers", install="pip install 'trainstore[hf]'")
require("accelerate", install="pip install 'trainstore[hf]'")

from harness import child_env  # noqa: E402
from harness.dist import free_port, run_ranks  # noqa: E402

from trainstore.checkpoint import CheckpointManager  # noqa: E402
from trainstore.dcp.coordination import TIMEOUT_ENV, group_timeout_s  # noqa: E402
from trainstore.errors import ConfigError  # noqa: E402

HERE = Path(__file__).parent
WORKER = HERE / "hf_dist_worker.py"


def torchrun(tmp: Path, name: str, **args) -> tuple[int, str, list[dict | None]]:
    """``torchrun --nproc_per_node 2`` of the Trainer worker; (rc, output, each rank's JSON or None)."""
    a = {"store": f"file://{tmp / 'store'}", "job": "run", "root": str(tmp / name), "out": str(tmp / name),
         "mode": "ddp", **args}
    env = child_env({**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", TIMEOUT_ENV: "60"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "--max_restarts", "0", str(WORKER), "trainer", json.dumps(a)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    outs = []
    for r in range(2):
        f = Path(f"{tmp / name}.rank{r}.json")
        outs.append(json.loads(f.read_text()) if f.exists() else None)
    return p.returncode, p.stdout + p.stderr, outs


def kill_and_restart(tmp: Path, kill_rank: int, kill_step: int, kill_after: int) -> None:
    rc, out, ranks = torchrun(tmp, "killed", kill_rank=kill_rank, kill_step=kill_step, kill_after=kill_after)
    assert rc != 0 and ranks == [None, None], out[-3000:]  # the whole job ended, no rank finished
    assert re.search(r"exitcode\s*:\s*-9|Signal 9 \(SIGKILL\)", out), out[-3000:]  # torchrun saw the kill
    committed = [s for s in range(4, 13, 4) if s < kill_step]
    with CheckpointManager(f"file://{tmp / 'store'}", "run") as mgr:
        assert mgr.steps() == committed, out[-4000:]  # the half-written step is not a checkpoint
    rc, out, ranks = torchrun(tmp, "restarted", resume=True)
    assert rc == 0, out[-3000:]
    assert [v["restored"] for v in ranks] == [committed[-1]] * 2
    assert [v["step"] for v in ranks] == [12, 12]
    with CheckpointManager(f"file://{tmp / 'store'}", "run") as mgr:
        assert all(r.ok for r in mgr.verify(committed[-1]))


def test_sigkill_of_one_rank_mid_async_save_restarts_from_the_newest_committed_step(tmp_path):
    kill_and_restart(tmp_path, kill_rank=1, kill_step=8, kill_after=1)


@pytest.mark.stress
# kill points inside one save's chunk writes: with small tensors packed (DCP names too, since
# 2026-12-07), a rank writes only a few chunks per save of this tiny model; a later kill point
# would land in the next save (the test then sees step 8 committed, as it should be)
@pytest.mark.parametrize("kill_rank,kill_step,kill_after", [(0, 8, 0), (1, 8, 1), (0, 12, 2), (1, 12, 0)])
def test_sigkill_of_one_rank_loop(tmp_path, kill_rank, kill_step, kill_after):
    kill_and_restart(tmp_path, kill_rank, kill_step, kill_after)


def test_a_rank_failing_before_the_collective_fails_the_other_within_the_named_timeout(tmp_path):
    t0 = time.monotonic()
    res = run_ranks("hf_dist_ranks_worker:one_rank_fails_first", world=2,
                    args={"store": f"file://{tmp_path / 'store'}", "linger": 15}, timeout_s=120, pg_timeout_s=120,
                    pythonpath=[str(HERE)], env={TIMEOUT_ENV: "4"})
    assert all(r.ok for r in res), [(r.error, r.stderr[-2000:]) for r in res]
    bad, waiting = res[1].value, res[0].value
    assert "must be a dict" in bad["error"]
    # on_busy="wait" puts no collective on the caller's clock: the save thread's first DCP
    # collective times out, and the manager raises that at wait() as a BackgroundError
    assert waiting["type"] == "BackgroundError" and "DistributedError" in waiting["error"], waiting
    assert f"waits 4 s for the other ranks ({TIMEOUT_ENV}" in waiting["error"], waiting
    assert waiting["seconds"] < 30, waiting  # bounded by the 4 s group timeout, not gloo's 30 min
    assert time.monotonic() - t0 < 110


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "nan"])
def test_a_bad_group_timeout_is_a_config_error_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(TIMEOUT_ENV, raw)
    with pytest.raises(ConfigError, match=TIMEOUT_ENV):
        group_timeout_s()
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert group_timeout_s() == 2.5


def test_a_chosen_step_that_fails_to_load_is_recorded_bad_and_the_restart_falls_back(tmp_path):
    """Saves at 4 and 8 (2 ranks); a chunk only step 8 holds is corrupted. The resume (1 rank:
    the sharded layout reshards) chooses 8 by its TrainerState, fails loading the model: a clear
    IntegrityError saying it is recorded bad. The restart then resumes from step 4."""
    store = f"file://{tmp_path / 'store'}"
    common = {"store": store, "job": "run", "root": str(tmp_path / "r"), "out": str(tmp_path / "r"), "mode": "ddp"}
    res = run_ranks("hf_dist_worker:trainer", world=2, args={**common, "stop_at": 9}, timeout_s=240,
                    pg_timeout_s=60, pythonpath=[str(HERE)])
    assert all(r.ok for r in res), [(r.error, r.stderr[-2000:]) for r in res]
    with CheckpointManager(store, "run") as mgr:
        assert mgr.steps() == [4, 8]
        older = {c.ref.key() for t in mgr.manifest(4).tensors.values() for c in t.chunks}
        entry = mgr.manifest(8).tensors["model.transformer.h.0.mlp.c_fc.weight@0,0"]
        key = entry.chunks[0].ref.key()
        assert key not in older
    path = tmp_path / "store" / key
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    first = run_ranks("hf_dist_worker:trainer", world=1, args={**common, "resume": True}, timeout_s=240,
                      pg_timeout_s=60, pythonpath=[str(HERE)])[0]
    assert first.error is not None and "step 8" in first.error and "recorded bad" in first.error, \
        (first.error, first.stderr[-2000:])
    again = run_ranks("hf_dist_worker:trainer", world=1, args={**common, "resume": True}, timeout_s=240,
                      pg_timeout_s=60, pythonpath=[str(HERE)])[0]
    assert again.ok, (again.error, again.stderr[-2000:])
    assert again.value["restored"] == 4 and "skipped 8" in again.value["last_restore"]
