"""Lightning under DDP and FSDP2 (ModelParallelStrategy) with trainstore: real gloo ranks on the CPU.

Each case trains 6 steps, stops, resumes from its trainstore checkpoint (``ckpt_path="last"``)
to step 12 and is compared with an uninterrupted 12-step run of the same world size (started
once per module, in the background). Launchers: torchrun and Lightning's own subprocess one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness.dist import free_port

from trainstore.checkpoint import CheckpointManager
from trainstore.errors import ConfigError
from trainstore.integrations.lightning import TrainstoreCheckpointIO, trainstore_strategy

from .test_lightning import assert_bit_identical

WORKER = str(Path(__file__).with_name("lightning_dist_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}


def launch(tmp: Path, out: str, strategy: str, *, devices: int = 2, torchrun: bool = True, steps: int = 12,
           resume: bool = False, run: str = "run", plain: bool = False, unified: bool = False) -> subprocess.Popen:
    args = [WORKER, str(tmp / "store"), "job", str(tmp / run), str(tmp / out), "--strategy", strategy,
            "--devices", str(devices), "--max-steps", str(steps)] + (["--resume"] if resume else []) \
        + (["--plain"] if plain else [])
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(devices),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]
        env = ENV
    else:  # Lightning's DDP launcher (subprocess) starts the other ranks itself
        cmd = [sys.executable, *args]
        env = {**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    if unified:
        env = {**env, "LIGHTNING_NS": "lightning"}
    # a session of its own: a hung job is killed whole, ranks included (killing the launcher
    # alone left them holding the output pipe, and communicate() waited on it for ever)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp),
                            start_new_session=True)


def communicate(p: subprocess.Popen, timeout: float) -> str:
    """The job's output; after ``timeout`` its whole process group is killed first."""
    try:
        return p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        return p.communicate()[0] + f"\n[killed after {timeout} s]"


def finish(p: subprocess.Popen, what: str) -> None:
    out = communicate(p, 240)
    assert p.returncode == 0 and "DONE rank 0" in out, f"{what} failed:\n{out[-4000:]}"


class Reference:
    """DDP: an uninterrupted 12-step run. FSDP2: Lightning's own checkpointing (its DCP directory),
    stopped at step 6 and resumed to 12 - the uninterrupted run is no reference there: on this CPU
    build Lightning's own FSDP2 resume departs from it too (the parameters its step-6 checkpoint
    holds differ from those the run continues with), and ours is compared with that resume."""

    def __init__(self, tmp: Path, strategy: str) -> None:
        self.dir, self.done = tmp, False
        if strategy == "fsdp":
            cmd = [sys.executable, "-c", "import subprocess, sys; [subprocess.run(a, check=True) for a in "
                   f"{[launch_args(tmp, 'part.pt', strategy, 6, False), launch_args(tmp, 'ref.pt', strategy, 12, True)]!r}]"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                                         cwd=str(tmp), start_new_session=True)
        else:
            self.proc = launch(tmp, "ref.pt", strategy)

    def result(self) -> dict:
        if not self.done:
            out = communicate(self.proc, 300)
            assert self.proc.returncode == 0, f"reference run failed:\n{out[-4000:]}"
            self.done = True
        return torch.load(self.dir / "ref.pt", weights_only=True)


def launch_args(tmp: Path, out: str, strategy: str, steps: int, resume: bool) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), WORKER, str(tmp / "store"), "job", str(tmp / "run"), str(tmp / out),
            "--strategy", strategy, "--max-steps", str(steps), "--plain"] + (["--resume"] if resume else [])


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    refs: dict[str, Reference] = {}

    def get(strategy: str) -> Reference:
        if strategy not in refs:
            refs[strategy] = Reference(tmp_path_factory.mktemp(f"lightning-{strategy}-ref"), strategy)
        return refs[strategy]

    yield get
    for r in refs.values():
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()


def check_resumed(tmp: Path, ref: dict, name: str) -> dict:
    got = torch.load(tmp / name, weights_only=True)
    assert got["restored"] == 6 and got["global_step"] == ref["global_step"] == 12, got["last_restore"]
    assert_bit_identical(ref["params"], got["params"], "params")
    assert_bit_identical(ref["optim"], got["optim"], "optim")
    return got


def test_ddp_resume_is_bit_identical_subprocess_and_torchrun_launchers(tmp_path, references):
    ref = references("ddp")
    finish(launch(tmp_path, "part.pt", "ddp", steps=6, torchrun=False), "6 steps, Lightning's subprocess launcher")
    finish(launch(tmp_path, "resumed.pt", "ddp", resume=True), "resume, torchrun")
    check_resumed(tmp_path, ref.result(), "resumed.pt")
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        m = mgr.manifest(12)
        assert "dcp" not in m.metadata and m.metadata["extra"]["lightning"]["layout"] == "full"  # rank 0 wrote it once
        assert all(r.ok for r in mgr.verify())


def test_unified_namespace_spawn_launcher_then_pytorch_lightning_resume(tmp_path, references):
    """``lightning.pytorch`` with the spawn launcher saves; ``pytorch_lightning`` under torchrun
    resumes the same job: bit-identical to the uninterrupted run."""
    ref = references("ddp")
    finish(launch(tmp_path, "part.pt", "ddp_spawn", steps=6, torchrun=False, unified=True),
           "6 steps, lightning.pytorch, spawn launcher")
    finish(launch(tmp_path, "resumed.pt", "ddp", resume=True), "resume, pytorch_lightning, torchrun")
    check_resumed(tmp_path, ref.result(), "resumed.pt")


def test_fsdp2_resume_through_the_dcp_backend(tmp_path, references):
    ref = references("fsdp")
    finish(launch(tmp_path, "part.pt", "fsdp", steps=6), "6 steps")
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        m = mgr.manifest(6)
        assert m.metadata["dcp"]["world_size"] == 2 and m.metadata["extra"]["lightning"]["layout"] == "sharded"
    finish(launch(tmp_path, "resumed.pt", "fsdp", resume=True), "resume")
    ref_out = ref.result()
    assert ref_out["restored"] == -1  # Lightning's own load (no trainstore restore)
    got = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert got["restored"] == 6 and got["global_step"] == ref_out["global_step"] == 12, got["last_restore"]
    assert_bit_identical(ref_out["after_restore"], got["after_restore"], "restored")
    assert_bit_identical(ref_out["params"], got["params"], "params")
    assert_bit_identical(ref_out["optim"], got["optim"], "optim")
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")  # the full-layout plugin (one device, DDP)
    try:
        with pytest.raises(ConfigError, match=r"sharded layout \(FSDP.*resume with the strategy that saved it"):
            io.load_checkpoint(tmp_path / "run" / "ckpts" / "last.ckpt")
        with pytest.raises(ConfigError, match="is a directory .*Lightning's own sharded layout"):
            io.load_checkpoint(ref.dir / "run" / "ckpts" / "last.ckpt")  # Lightning's own FSDP2 directory
    finally:
        io.teardown()


@pytest.mark.parametrize("devices", [1, 3])
def test_ddp_checkpoint_of_2_ranks_resumes_on_another_world_size(tmp_path, devices, references):
    src = references("ddp")
    src.result()
    shutil.copytree(src.dir / "store", tmp_path / "store")
    shutil.copytree(src.dir / "run", tmp_path / "run")
    # the reference's last save is step 12: resume it to 16 on another world size
    finish(launch(tmp_path, "other.pt", "ddp", devices=devices, steps=16, resume=True, torchrun=devices > 1),
           f"resume on {devices} rank(s)")
    got = torch.load(tmp_path / "other.pt", weights_only=True)
    assert got["restored"] == 12 and got["global_step"] == 16 and got["world"] == devices
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    try:
        saved = io.load_checkpoint("trainstore:12")["state_dict"]
    finally:
        io.teardown()
    assert_bit_identical(dict(saved), got["after_restore"], "restored")


def test_unsupported_strategies_are_refused_by_name(tmp_path):
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    for name in ("deepspeed", "fsdp", "xla"):
        with pytest.raises(ConfigError, match=rf"strategy '{name}'.*ModelParallelStrategy"):
            trainstore_strategy(name, io)


def test_fsdp2_checkpoint_of_2_ranks_resumes_on_1_and_3(tmp_path):
    """The sharded checkpoint is resharded by DCP: the restored parameters are the saved ones."""
    finish(launch(tmp_path, "part.pt", "fsdp", steps=6), "6 steps on 2 ranks")
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        saved = mgr.restore(6)["state_dict"]  # whole tensors, read in one process
    for devices in (1, 3):
        d = tmp_path / f"on{devices}"
        shutil.copytree(tmp_path / "store", d / "store")
        shutil.copytree(tmp_path / "run", d / "run")
        finish(launch(d, "out.pt", "fsdp", devices=devices, steps=8, resume=True), f"resume on {devices} rank(s)")
        got = torch.load(d / "out.pt", weights_only=True)
        assert got["restored"] == 6 and got["global_step"] == 8 and got["world"] == devices
        assert_bit_identical(dict(saved), got["after_restore"], f"restored on {devices}")
