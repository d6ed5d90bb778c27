"""Lightning: a real Trainer.fit checkpointing through TrainstoreCheckpointIO, SIGKILLed
mid-epoch, resumed with ckpt_path="last" in a new process: bit-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainstore.checkpoint import CheckpointManager
from trainstore.errors import ConfigError, NotFoundError, UnsupportedTypeError
from trainstore.integrations.lightning import LATEST, TrainstoreCheckpointIO, aliases_key

CHILD = str(Path(__file__).with_name("lightning_child.py"))
STEPS_PER_EPOCH = 32


def child(store: Path, root: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, CHILD, str(store), "job", str(root), str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def finish(p: subprocess.Popen, what: str) -> str:
    out, _ = p.communicate(timeout=240)
    assert p.returncode == 0 and "DONE" in out, f"{what} failed:\n{out[-3000:]}"
    return out


def assert_bit_identical(a: object, b: object, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_bit_identical(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bit_identical(x, y, f"{where}/{i}")
    else:
        assert a == b, where


def pointers(root: Path) -> dict[str, int]:
    return {p.name: json.loads(p.read_text())["step"] for p in (root / "ckpts").glob("*.ckpt")}


class Reference:
    """The uninterrupted run, started once per module and running alongside the first test."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.proc = child(tmp / "store", tmp / "run", tmp / "out.pt")
        self.done = False

    def result(self) -> Path:
        if not self.done:
            finish(self.proc, "reference run")
            self.done = True
        return self.dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = Reference(tmp_path_factory.mktemp("lightning-ref"))
    yield ref
    if ref.proc.poll() is None:
        ref.proc.kill()
        ref.proc.wait()


def test_sigkill_mid_epoch_then_resume_last_is_bit_identical(tmp_path, reference):
    victim = child(tmp_path / "store", tmp_path / "run", tmp_path / "killed.pt", "--slow-after", "10")
    killed_at = None
    for line in victim.stdout:  # type: ignore[union-attr]
        if line.startswith("STEP ") and int(line.split()[1]) >= 14:
            os.kill(victim.pid, signal.SIGKILL)  # real SIGKILL, mid-epoch 0
            killed_at = int(line.split()[1])
            break
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL and killed_at is not None and killed_at < STEPS_PER_EPOCH
    assert not (tmp_path / "killed.pt").exists()
    assert "last.ckpt" in pointers(tmp_path / "run")

    finish(child(tmp_path / "store", tmp_path / "run", tmp_path / "resumed.pt", "--resume"), "resume")
    ref_dir = reference.result()
    ref_out = torch.load(ref_dir / "out.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert ref_out["restored"] == -1 and ref_out["global_step"] == 2 * STEPS_PER_EPOCH
    assert 4 <= resumed["restored"] <= killed_at and resumed["restored"] % 4 == 0  # resumed mid-epoch 0
    assert resumed["global_step"] == ref_out["global_step"]
    for part in ("params", "optim", "sched"):
        assert_bit_identical(ref_out[part], resumed[part], part)

    # ModelCheckpoint(save_top_k=2) removals became retention: the store keeps exactly the
    # checkpoints a pointer names, plus the full bases of kept incrementals
    for run, store in ((ref_dir / "run", ref_dir / "store"), (tmp_path / "run", tmp_path / "store")):
        named = pointers(run)
        assert len(named) == 3 and named["last.ckpt"] == 2 * STEPS_PER_EPOCH, named
        with CheckpointManager(str(store), "job") as mgr:
            steps = set(mgr.steps())
            bases = {mgr.manifest(s).base_step for s in named.values()} - {None}
            assert steps == set(named.values()) | bases, (steps, named)
            assert all(r.ok for r in mgr.verify())


def test_last_falls_back_past_a_corrupt_newest_checkpoint(reference, tmp_path, monkeypatch):
    saved = reference.result()
    store = tmp_path / "store"
    shutil.copytree(saved / "store", store)
    newest = max(pointers(saved / "run").values())
    manifest = next((store / "jobs" / "job" / "checkpoints").glob(f"*{newest}/manifest.json"))
    manifest.write_bytes(manifest.read_bytes()[:-40] + b"x" * 40)  # torn / corrupt manifest
    last = saved / "run" / "ckpts" / "last.ckpt"
    io = TrainstoreCheckpointIO(str(store), "job")
    try:
        # the run's hyper-parameters hold classes of its __main__; loading imports nothing
        with pytest.raises(UnsupportedTypeError, match="hyper_parameters/arch: __main__:Arch is not a dataclass"):
            io.load_checkpoint(last)
        monkeypatch.syspath_prepend(str(Path(CHILD).parent))
        lightning_child = __import__("lightning_child")
        for name in ("Arch", "Act"):  # as in the training script that resumes
            monkeypatch.setattr(sys.modules["__main__"], name, getattr(lightning_child, name), raising=False)
        ckpt = io.load_checkpoint(last)
        assert io.last_restore.step < newest and newest in [s for s, _ in io.last_restore.skipped]
        assert ckpt["global_step"] == io.last_restore.step
        assert ckpt["hyper_parameters"]["opts"].note == "tiny"  # Namespace back, no pickle
        named = min(pointers(saved / "run").values())
        exact = io.load_checkpoint(next(p for p in (saved / "run" / "ckpts").glob("epoch=*")
                                        if json.loads(p.read_text())["step"] == named))
        assert exact["global_step"] == named
        assert io.load_checkpoint(LATEST)["global_step"] == io.last_restore.step < newest
        with pytest.raises(NotFoundError, match="no Lightning checkpoint"):
            io.load_checkpoint(saved / "run" / "ckpts" / "nope.ckpt")
        with pytest.raises(ConfigError, match="job 'job'"):
            TrainstoreCheckpointIO(str(store), "other").load_checkpoint(last)
    finally:
        io.teardown()


def test_save_rejects_an_unsupported_leaf_by_path(tmp_path):
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    try:
        with pytest.raises(UnsupportedTypeError, match=r"hyper_parameters/model: .*allow_pickle_paths"):
            io.save_checkpoint({"global_step": 3, "hyper_parameters": {"model": object()}}, tmp_path / "a.ckpt")
        assert not (tmp_path / "a.ckpt").exists()
    finally:
        io.teardown()
    assert CheckpointManager(str(tmp_path / "store"), "job").steps() == []


def test_removal_waits_for_the_newer_save_and_spares_shared_steps(tmp_path):
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    state = {"global_step": 0, "w": torch.zeros(1000)}
    try:
        io.save_checkpoint({**state, "global_step": 5}, tmp_path / "a.ckpt")
        io.save_checkpoint({**state, "global_step": 5}, tmp_path / "last.ckpt")  # same step: an alias
        io.save_checkpoint({**state, "global_step": 9, "w": torch.ones(1000)}, tmp_path / "b.ckpt")
        io.remove_checkpoint(tmp_path / "a.ckpt")  # step 5 still named by last.ckpt
        io.save_checkpoint({**state, "global_step": 9, "w": torch.ones(1000)}, tmp_path / "last.ckpt")  # identical
        io.manager.wait()
    finally:
        io.teardown()
    assert pointers_in(tmp_path) == {"b.ckpt": 9, "last.ckpt": 9}
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        assert mgr.steps() == [9] or (mgr.steps() == [5, 9] and mgr.manifest(9).base_step == 5)
        doc = json.loads(bytes(mgr.store.get(aliases_key("job"))))
    assert sorted(map(tuple, doc["aliases"].values())) == [("job", 9), ("job", 9)]


def pointers_in(d: Path) -> dict[str, int]:
    return {p.name: json.loads(p.read_text())["step"] for p in d.glob("*.ckpt")}


def test_last_ckpt_sharing_the_top_k_checkpoint_loads_as_last(tmp_path):
    """ModelCheckpoint saves the top-k file, then sets last_model_path and saves last.ckpt at the
    same step (one shared checkpoint): loading last.ckpt must give the callback its own path,
    else the resumed callback does not recognise last.ckpt and starts last-v1.ckpt."""
    d = str(tmp_path / "ckpts")
    cb = {"ModelCheckpoint{'monitor': 'loss'}": {"dirpath": d, "last_model_path": "", "best_model_path": "x"}}
    io = TrainstoreCheckpointIO(str(tmp_path / "store"), "job")
    try:
        io.save_checkpoint({"global_step": 4, "callbacks": cb, "w": torch.ones(3)}, os.path.join(d, "epoch=0-step=4.ckpt"))
        io.save_checkpoint({"global_step": 4, "callbacks": cb, "w": torch.ones(3)}, os.path.join(d, "last.ckpt"))
        loaded = io.load_checkpoint(os.path.join(d, "last.ckpt"))
        top_k = io.load_checkpoint(os.path.join(d, "epoch=0-step=4.ckpt"))
    finally:
        io.teardown()
    assert loaded["callbacks"]["ModelCheckpoint{'monitor': 'loss'}"]["last_model_path"] == os.path.join(d, "last.ckpt")
    assert top_k["callbacks"]["ModelCheckpoint{'monitor': 'loss'}"]["last_model_path"] == ""
